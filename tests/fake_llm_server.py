"""A local stand-in for the model APIs: OpenAI Chat Completions (and the servers that
copy it: Ollama, Gemini's compatibility endpoint) and Anthropic's Messages API.

It listens on 127.0.0.1 (a free port), speaks the real wire protocol (JSON bodies, and
server-sent events over chunked HTTP/1.1 when the request asks to stream), records
every request (method, path, headers, JSON body), and answers from a script: a queue
of `Reply`s, or functions of the request that return one. The reply builders below
reproduce the shapes those APIs send (ids, envelopes, usage, finish reasons, the way
streamed tool calls are split across deltas), so the plugins are tested against what
they will meet.

    with FakeLLMServer() as server:
        server.push(openai_tool_calls(("transferMoney", {"amount": 500}, "call_1")),
                    openai_text("Done."))
        ... point OPENAI_BASE_URL at f"{server.url}/v1" ...
        assert server.requests[1].body["messages"][-1]["tool_call_id"] == "call_1"
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "FakeLLMServer",
    "Received",
    "Reply",
    "anthropic_error",
    "anthropic_message",
    "anthropic_stream",
    "anthropic_text",
    "anthropic_tool_pairs",
    "anthropic_tool_use",
    "openai_chunk",
    "openai_completion",
    "openai_error",
    "openai_stream",
    "openai_text",
    "openai_tool_calls",
    "openai_tool_pairs",
    "split",
]

CREATED = 1_741_569_952


@dataclass
class Received:
    """One request as the server got it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any


@dataclass
class Reply:
    """One scripted answer: a JSON body, or server-sent events (`(event, data)` pairs,
    data being JSON or a raw string such as "[DONE]")."""

    status: int = 200
    body: Any = None
    events: list[tuple[str | None, Any]] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # before the status line
    event_delay: float = 0.0  # between events


Script = Reply | Callable[[Received], Reply]


class FakeLLMServer:
    """The server; use it as a context manager (it stops and releases delayed replies)."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._script: deque[Script] = deque()
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def push(self, *replies: Script) -> None:
        """Queue replies, answered in order, one per request."""
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        return len(self._script)

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            item = self._script.popleft() if self._script else None
        if item is None:
            return Reply(500, {"error": {"message": "fake server: no scripted reply left"}})
        return item(received) if callable(item) else item


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a kept-alive connection must not hold up stop()
    fake: FakeLLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up: nothing to report


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        received = Received(
            method="POST",
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        reply = fake._next(received)
        if reply.delay and fake.stopping.wait(reply.delay):
            return
        try:
            self._send(reply, fake)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send(self, reply: Reply, fake: FakeLLMServer) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.events is None:
            data = (
                reply.body
                if isinstance(reply.body, bytes)
                else json.dumps(reply.body).encode()
                if not isinstance(reply.body, str)
                else reply.body.encode()
            )
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, (event, data) in enumerate(reply.events):
            if i and reply.event_delay and fake.stopping.wait(reply.event_delay):
                return
            text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
            frame = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
            self._chunk(frame.encode())
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def split(text: str, size: int) -> list[str]:
    """`text` in pieces of `size` characters (the way deltas cut JSON anywhere)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# -- OpenAI Chat Completions ----------------------------------------------------------------

OPENAI_MODEL = "gpt-4o-mini-2024-07-18"


def _openai_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def openai_completion(
    *,
    content: str | None = None,
    tool_calls: Sequence[dict[str, Any]] = (),
    refusal: str | None = None,
    finish_reason: str = "stop",
    usage: tuple[int, int] = (81, 17),
    model: str = OPENAI_MODEL,
) -> Reply:
    """A non-streamed `chat.completion` as OpenAI sends it."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": refusal,
        "annotations": [],
    }
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    return Reply(
        body={
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": _openai_usage(*usage),
            "service_tier": "default",
            "system_fingerprint": "fp_06737a9306",
        }
    )


def openai_chunk(
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    *,
    usage: tuple[int, int] | None = None,
    model: str = OPENAI_MODEL,
) -> dict[str, Any]:
    """One `chat.completion.chunk`; `delta=None` is the usage-only last chunk."""
    chunk: dict[str, Any] = {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        "usage": _openai_usage(*usage) if usage else None,
    }
    return chunk


def openai_stream(chunks: Iterable[dict[str, Any]], *, done: bool = True, **kw: Any) -> Reply:
    """SSE of these chunks, closed by `data: [DONE]`."""
    events: list[tuple[str | None, Any]] = [(None, c) for c in chunks]
    if done:
        events.append((None, "[DONE]"))
    return Reply(events=events, **kw)


def _call(name: str, args: Any, call_id: str) -> tuple[str, str, str]:
    return name, args if isinstance(args, str) else json.dumps(args), call_id


def openai_text(text: str, *, finish_reason: str = "stop", piece: int = 4) -> Script:
    """A text answer: streamed word-ish pieces if the request streams, else one JSON body."""

    def reply(req: Received) -> Reply:
        if not (req.body or {}).get("stream"):
            return openai_completion(content=text, finish_reason=finish_reason)
        chunks = [openai_chunk({"role": "assistant", "content": "", "refusal": None})]
        chunks += [openai_chunk({"content": p}) for p in split(text, piece)]
        chunks.append(openai_chunk({}, finish_reason))
        chunks.append(openai_chunk(None, usage=(81, 17)))
        return openai_stream(chunks)

    return reply


def openai_tool_calls(
    *calls: tuple[str, Any, str], text: str | None = None, piece: int = 7
) -> Script:
    """Tool calls `(name, arguments, call_id)` (arguments a dict or a raw JSON string).
    Streamed as OpenAI does: id, type and name only in a call's first delta, arguments
    cut every `piece` characters, mid-JSON."""

    def reply(req: Received) -> Reply:
        wire = [_call(*c) for c in calls]
        if not (req.body or {}).get("stream"):
            return openai_completion(
                content=text,
                tool_calls=[
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for n, a, i in wire
                ],
                finish_reason="tool_calls",
            )
        chunks = [openai_chunk({"role": "assistant", "content": text and "", "refusal": None})]
        if text:
            chunks += [openai_chunk({"content": p}) for p in split(text, 5)]
        for index, (name, args, call_id) in enumerate(wire):
            first = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            chunks.append(openai_chunk({"tool_calls": [first]}))
            chunks += [
                openai_chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
                for p in split(args, piece)
            ]
        chunks.append(openai_chunk({}, "tool_calls"))
        chunks.append(openai_chunk(None, usage=(120, 41)))
        return openai_stream(chunks)

    return reply


def openai_error(
    status: int, message: str, *, type: str, code: str | None = None, **kw: Any
) -> Reply:
    """An error as OpenAI sends it."""
    return Reply(
        status,
        {"error": {"message": message, "type": type, "param": None, "code": code}},
        **kw,
    )


# -- Anthropic Messages API ------------------------------------------------------------------

ANTHROPIC_MODEL = "claude-test-20260101"


def _anthropic_usage(inputs: int, outputs: int) -> dict[str, Any]:
    return {
        "input_tokens": inputs,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": outputs,
        "service_tier": "standard",
    }


def anthropic_message(
    content: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    usage: tuple[int, int] = (472, 89),
) -> Reply:
    """A non-streamed `message`."""
    return Reply(
        body={
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": ANTHROPIC_MODEL,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": _anthropic_usage(*usage),
        },
        headers={"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"},
    )


def anthropic_stream(
    content: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    usage: tuple[int, int] = (472, 89),
    piece: int = 6,
    **kw: Any,
) -> Reply:
    """The SSE events of a message, as Anthropic sends them: message_start, a ping, each
    block's start, deltas (text, or partial JSON cut every `piece` characters) and stop,
    message_delta with the stop reason and usage, message_stop."""
    events: list[tuple[str | None, Any]] = []

    def add(name: str, data: dict[str, Any]) -> None:
        events.append((name, {"type": name, **data}))

    start = anthropic_message([], stop_reason=stop_reason).body
    start.update(stop_reason=None, usage=_anthropic_usage(usage[0], 1))
    add("message_start", {"message": start})
    for index, block in enumerate(content):
        if block["type"] == "text":
            add(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            if index == 0:
                events.append(("ping", {"type": "ping"}))
            for p in split(block["text"], piece):
                add(
                    "content_block_delta",
                    {"index": index, "delta": {"type": "text_delta", "text": p}},
                )
        elif block["type"] == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            add("content_block_start", {"index": index, "content_block": head})
            raw = block.get("raw") or json.dumps(block["input"])
            for p in ["", *split(raw, piece)]:
                add(
                    "content_block_delta",
                    {"index": index, "delta": {"type": "input_json_delta", "partial_json": p}},
                )
        add("content_block_stop", {"index": index})
    add(
        "message_delta",
        {
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": usage[1]},
        },
    )
    add("message_stop", {})
    return Reply(events=events, headers={"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"}, **kw)


def _anthropic_reply(content: list[dict[str, Any]], stop_reason: str) -> Script:
    def reply(req: Received) -> Reply:
        if (req.body or {}).get("stream"):
            return anthropic_stream(content, stop_reason=stop_reason)
        plain = [{k: v for k, v in b.items() if k != "raw"} for b in content]
        return anthropic_message(plain, stop_reason=stop_reason)

    return reply


def anthropic_text(text: str, *, stop_reason: str = "end_turn") -> Script:
    return _anthropic_reply([{"type": "text", "text": text}], stop_reason)


def anthropic_tool_use(*calls: tuple[str, Any, str], text: str | None = None) -> Script:
    """tool_use blocks `(name, input, id)`, after an optional text block."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for n, a, i in calls]
    return _anthropic_reply(content, "tool_use")


def anthropic_error(status: int, type: str, message: str, **kw: Any) -> Reply:
    return Reply(
        status,
        {"type": "error", "error": {"type": type, "message": message}, "request_id": "req_011C"},
        **kw,
    )


# -- checks on what the server received -------------------------------------------------------


def openai_tool_pairs(body: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Every tool call id of a Chat Completions request, each with the id of the tool
    result that answers it (None when nothing does); asserts that every tool result
    answers a call made before it in the same request, exactly once."""
    calls: dict[str, str | None] = {}
    for message in body["messages"]:
        for call in message.get("tool_calls") or []:
            assert call["id"] not in calls, f"tool call {call['id']} sent twice"
            calls[call["id"]] = None
        if message["role"] == "tool":
            ref = message["tool_call_id"]
            assert ref in calls, f"tool result {ref} answers no earlier tool call"
            assert calls[ref] is None, f"tool call {ref} answered twice"
            calls[ref] = ref
    return list(calls.items())


def anthropic_tool_pairs(body: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The same for a Messages API request (tool_use / tool_result blocks)."""
    calls: dict[str, str | None] = {}
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block["type"] == "tool_use":
                assert message["role"] == "assistant"
                assert block["id"] not in calls, f"tool use {block['id']} sent twice"
                calls[block["id"]] = None
            elif block["type"] == "tool_result":
                ref = block["tool_use_id"]
                assert message["role"] == "user"
                assert ref in calls, f"tool result {ref} answers no earlier tool use"
                assert calls[ref] is None, f"tool use {ref} answered twice"
                calls[ref] = ref
    return list(calls.items())
