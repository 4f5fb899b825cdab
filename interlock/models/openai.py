"""The `openai` provider (OpenAI Chat Completions), and presets that reuse it: `ollama`
and `googleai` (Gemini's OpenAI-compatible endpoint).

    openai/gpt-4o-mini            OPENAI_API_KEY, OPENAI_BASE_URL (https://api.openai.com/v1)
    ollama/llama3.1               OLLAMA_BASE_URL (http://localhost:11434/v1), no key
    googleai/gemini-flash-latest  GEMINI_API_KEY (or GOOGLE_API_KEY), GEMINI_BASE_URL

Any other OpenAI-compatible server (vLLM, LM Studio, a gateway) is one line away:
`ai.register_provider("vllm", openai.provider("vllm", base_url="http://gpu:8000/v1"))`.

Why plain HTTP over httpx, not the `openai` SDK: httpx is already a dependency, so the
provider costs no extra install; the wire mapping must be exact (tool call ids are our
refs, tool results must pair with them, interrupted calls must never look completed,
Gemini's `extra_content` thought signatures must round-trip), which is easiest to get
right and to test when we build the JSON ourselves; streamed tool-call deltas (id and
name in the first delta, arguments split anywhere) are assembled here, by rules we can
see; and errors map to our `Status` codes, with retries only before the first chunk
reached the caller, which an SDK's own retry loop cannot know about.

Mapping, ours → Chat Completions: system messages → `system`; user text and images →
`user`; a model message → one `assistant` message (text, and `tool_calls` whose ids are
the parts' refs); a tool message → one `tool` message per response, `tool_call_id` =
ref. Reasoning parts are not sent back. Tools → `tools: [{"type": "function", ...}]`
with the input JSON Schema as `parameters` (an input that is not an object travels as
the one field `input` of one: `_wire.object_schema`; the output schema has no place
there and is left out). Config: Genkit's `temperature`, `maxOutputTokens`, `topP`, `stopSequences`
are translated; any other key goes into the request body as it is (`seed`,
`reasoning_effort`, ...); `stream: false` turns streaming off.

Reply → ours: text, `reasoning_content`/`reasoning` as reasoning parts, tool calls as
tool requests (ref = the call id, input parsed from the JSON arguments; see
`_wire.parse_arguments` for malformed JSON), a refusal as a text part with finish
reason `blocked`. Finish reasons: stop → stop, length → length, tool_calls → stop (the
turn loop decides by the tool requests), content_filter → blocked, others → other.
"""

from __future__ import annotations

import inspect
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from schemas import (
    FinishReason,
    Message,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    Part,
    Status,
    ToolDefinition,
    ToolRequest,
    Usage,
)

from ..errors import StatusError
from ._http import (
    ModelError,
    RetryPolicy,
    call_with_retries,
    env_first,
    error_text,
    is_retryable_http,
    missing_key,
    retry_after_seconds,
    status_for_http,
    timeout_from_env,
)
from ._wire import (
    WRAPPED_INPUT,
    check_history,
    dump_input,
    dump_output,
    new_ref,
    object_schema,
    parse_arguments,
    text_of,
    unwrap_input,
    wrapped_tools,
)
from .base import ChunkCallback

__all__ = ["PRESETS", "OpenAIModel", "Preset", "provider"]

_EXTRA = "openai"  # part metadata key for provider data that must round-trip


@dataclass(frozen=True)
class Preset:
    """An OpenAI-compatible service reached by name: where it is and which key it needs."""

    provider: str
    base_url: str
    base_url_env: tuple[str, ...] = ()
    key_env: tuple[str, ...] = ()
    key_required: bool = True
    max_tokens_field: str = "max_tokens"

    def model(self, name: str) -> OpenAIModel:
        """The model `provider/name`, configured from the environment. Raises
        UNAUTHENTICATED, naming the variable, when a required key is missing."""
        full = f"{self.provider}/{name}"
        key = env_first(self.key_env)
        if key is None and self.key_required:
            raise missing_key(self.key_env, full)
        base_url = env_first(self.base_url_env) or self.base_url
        if self.provider == "ollama":
            base_url = _ollama_v1(base_url)
        return OpenAIModel(
            full,
            base_url=base_url,
            api_key=key,
            key_env=self.key_env,
            max_tokens_field=self.max_tokens_field,
        )


def _ollama_v1(url: str) -> str:
    """Ollama's OpenAI endpoint lives under /v1; accept the server's root URL too."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


PRESETS: dict[str, Preset] = {
    "openai": Preset(
        "openai",
        "https://api.openai.com/v1",
        base_url_env=("OPENAI_BASE_URL",),
        key_env=("OPENAI_API_KEY",),
        max_tokens_field="max_completion_tokens",
    ),
    "ollama": Preset(
        "ollama",
        "http://localhost:11434/v1",
        base_url_env=("OLLAMA_BASE_URL",),
        key_env=("OLLAMA_API_KEY",),
        key_required=False,
    ),
    "googleai": Preset(
        "googleai",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        base_url_env=("GEMINI_BASE_URL",),
        key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    ),
}


def provider(
    name: str = "openai",
    *,
    base_url: str,
    api_key: str | None = None,
    **options: Any,
) -> Callable[[str], OpenAIModel]:
    """A provider factory for `ai.register_provider(name, ...)`: every `name/<model>`
    becomes an `OpenAIModel` on `base_url` (options as for `OpenAIModel`; one it does not
    take is a TypeError now, not at the first model's lookup)."""
    inspect.signature(OpenAIModel).bind(name, base_url=base_url, api_key=api_key, **options)

    def factory(model: str) -> OpenAIModel:
        return OpenAIModel(f"{name}/{model}", base_url=base_url, api_key=api_key, **options)

    return factory


# -- the model ----------------------------------------------------------------------------


class OpenAIModel:
    """A Chat Completions model. Streams (SSE) when the caller takes chunks."""

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        key_env: tuple[str, ...] = (),
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        stream: bool = True,
        max_tokens_field: str = "max_tokens",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.name = name
        self.provider = name.partition("/")[0]
        self.model = model or name.partition("/")[2]
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.key_env = key_env
        self.headers = dict(headers or {})
        self.timeout = timeout if timeout is not None else timeout_from_env()
        self.retry = retry or RetryPolicy.from_env()
        self.stream = stream
        self.max_tokens_field = max_tokens_field
        self._transport = transport
        self._client: httpx.Client | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<OpenAIModel {self.name} at {self.base_url}>"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None or self._pid != os.getpid():  # a fork gets its own
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                    transport=self._transport,
                )
                self._pid = os.getpid()
            return self._client

    # -- generate ---------------------------------------------------------------------

    def generate(
        self, request: ModelRequest, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        config = dict(request.config or {})
        wanted = config.pop("stream", True)
        streaming = self.stream and on_chunk is not None and wanted is not False
        body = self.body(request, config, streaming)
        wrapped = wrapped_tools(request.tools)
        started = [False]

        def emit(chunk: ModelChunk) -> None:
            started[0] = True
            assert on_chunk is not None
            on_chunk(chunk)

        def attempt() -> ModelResponse:
            if streaming:
                return self._stream(body, emit, wrapped)
            return self._parse(self._post(body), wrapped)

        return call_with_retries(attempt, self.retry, started=lambda: started[0], what=self.name)

    # -- request ----------------------------------------------------------------------

    def body(
        self, request: ModelRequest, config: Mapping[str, Any] | None = None, stream: bool = False
    ) -> dict[str, Any]:
        """The Chat Completions request body for `request`."""
        check_history(request.messages, self.name)
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(request)}
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        for key, value in (config if config is not None else request.config or {}).items():
            if value is None:
                continue
            if key in _COMMON:
                body[_COMMON[key] or self.max_tokens_field] = value
            elif key == "topK":
                continue  # not in Chat Completions
            elif key not in ("model", "messages", "tools", "stream", "stream_options"):
                body[key] = value
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        wrapped = wrapped_tools(request.tools)
        for message in request.messages:
            if message.role == "system":
                out.append({"role": "system", "content": text_of(message.content)})
            elif message.role == "user":
                out.append({"role": "user", "content": _user_content(message.content)})
            elif message.role == "model":
                out.append(_assistant(message, wrapped))
            else:
                for part in message.content:
                    res = part.tool_response
                    if res is not None:
                        out.append(
                            {
                                "role": "tool",
                                "tool_call_id": res.ref or res.name,
                                "content": dump_output(res.output),
                            }
                        )
        return out

    def _headers(self, streaming: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "interlock"}
        headers["Accept"] = "text/event-stream" if streaming else "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(self.headers)
        return headers

    # -- transport --------------------------------------------------------------------

    def _post(self, body: dict[str, Any]) -> Any:
        try:
            response = self._http().post(self.url, json=body, headers=self._headers(False))
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code >= 400:
            raise self._http_error(response.status_code, response.text, response.headers)
        return self._json(response.content)

    def _json(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ModelError(
                Status.INTERNAL,
                f"{self.name}: the reply is not JSON: {raw[:200]!r}",
                provider=self.provider,
            ) from exc

    def _stream(
        self, body: dict[str, Any], emit: ChunkCallback, wrapped: frozenset[str]
    ) -> ModelResponse:
        try:
            with self._http().stream(
                "POST", self.url, json=body, headers=self._headers(True)
            ) as response:
                if response.status_code >= 400:
                    text = response.read().decode("utf-8", "replace")
                    raise self._http_error(response.status_code, text, response.headers)
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    # A server that ignored `stream`: take the whole reply as one chunk.
                    reply = self._parse(self._json(response.read()), wrapped)
                    emit(ModelChunk(role="model", content=list(reply.message.content)))
                    return reply
                state = _StreamState(self.name, wrapped)
                for data in _sse_data(response.iter_lines()):
                    if data.strip() == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue  # a keep-alive or a comment some servers send
                    if isinstance(chunk, list) and chunk:  # Google's errors: an array
                        self._check_stream_error(chunk[0])
                    self._check_stream_error(chunk)
                    if not isinstance(chunk, dict):
                        raise ModelError(
                            Status.INTERNAL,
                            f"{self.name}: a streamed event is not a JSON object: {data[:200]!r}",
                            provider=self.provider,
                        )
                    state.add(chunk, emit)
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        return state.finish(emit)

    def _parse(self, data: Any, wrapped: frozenset[str] = frozenset()) -> ModelResponse:
        if isinstance(data, dict) and "error" in data and not data.get("choices"):
            self._check_stream_error(data)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices:
            raise ModelError(
                Status.INTERNAL,
                f"{self.name}: the reply has no choices: {json.dumps(data)[:300]}",
                provider=self.provider,
            )
        choice = choices[0]
        msg = choice.get("message") or {}
        parts: list[Part] = []
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append(Part(reasoning=reasoning))
        content = msg.get("content")
        if isinstance(content, list):  # some compatible servers answer with parts
            content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
        if content:
            parts.append(Part(text=content))
        refusal = msg.get("refusal")
        if refusal:
            parts.append(Part(text=refusal))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append(
                _tool_request(
                    call.get("id"),
                    fn.get("name", ""),
                    fn.get("arguments"),
                    call,
                    self.name,
                    wrapped,
                )
            )
        return ModelResponse(
            message=Message(role="model", content=parts),
            finish_reason=finish_reason(choice.get("finish_reason"), bool(refusal)),
            usage=_usage(data.get("usage")),
        )

    # -- errors -----------------------------------------------------------------------

    def _http_error(self, code: int, text: str, headers: Mapping[str, str]) -> ModelError:
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        detail = error_text(body) or f"HTTP {code}"
        message = f"{self.name}: {self.provider} answered HTTP {code}: {detail}"
        if code == 401 and not self.api_key and self.key_env:
            message += f" ({self.key_env[0]} is not set)"
        return ModelError(
            status_for_http(code),
            message,
            provider=self.provider,
            http_status=code,
            retryable=is_retryable_http(code, headers),
            retry_after=retry_after_seconds(headers),
        )

    def _transport_error(self, exc: httpx.TransportError) -> ModelError:
        if isinstance(exc, httpx.TimeoutException):
            kind = type(exc).__name__
            return ModelError(
                Status.DEADLINE_EXCEEDED,
                f"{self.name}: no reply from {self.url} within {self.timeout:g}s ({kind})",
                provider=self.provider,
                retryable=True,
            )
        return ModelError(
            Status.UNAVAILABLE,
            f"{self.name}: cannot reach {self.url}: {exc or type(exc).__name__}",
            provider=self.provider,
            retryable=True,
        )

    def _check_stream_error(self, chunk: Any) -> None:
        """An error object in place of a reply (OpenAI sends these mid-stream)."""
        err = chunk.get("error") if isinstance(chunk, dict) else None
        if not err:
            return
        code = err.get("code") if isinstance(err, dict) else None
        kind = err.get("type") if isinstance(err, dict) else None
        if isinstance(code, int) and code >= 400:
            status, retryable = status_for_http(code), is_retryable_http(code)
        else:  # OpenAI's rate limits: type "requests" or "tokens", code "rate_limit_exceeded"
            known = _ERROR_TYPES.get(str(code)) or _ERROR_TYPES.get(str(kind))
            status, retryable = known or (Status.UNKNOWN, False)
        raise ModelError(
            status,
            f"{self.name}: {self.provider} reported an error: {error_text(chunk)}",
            provider=self.provider,
            retryable=retryable,
        )


_COMMON: dict[str, str | None] = {
    "temperature": "temperature",
    "topP": "top_p",
    "stopSequences": "stop",
    "maxOutputTokens": None,  # the preset's max-tokens field
}

_ERROR_TYPES: dict[str, tuple[Status, bool]] = {
    "server_error": (Status.UNAVAILABLE, True),
    "rate_limit_exceeded": (Status.RESOURCE_EXHAUSTED, True),
    "insufficient_quota": (Status.RESOURCE_EXHAUSTED, False),
    "invalid_request_error": (Status.INVALID_ARGUMENT, False),
    "authentication_error": (Status.UNAUTHENTICATED, False),
    "permission_error": (Status.PERMISSION_DENIED, False),
    "not_found_error": (Status.NOT_FOUND, False),
}

_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.STOP,
    "function_call": FinishReason.STOP,
    "content_filter": FinishReason.BLOCKED,
}


def finish_reason(reason: str | None, refused: bool = False) -> FinishReason:
    """Our finish reason for a Chat Completions `finish_reason` (a refusal is blocked)."""
    if refused:
        return FinishReason.BLOCKED
    if reason is None:
        return FinishReason.UNKNOWN
    return _FINISH.get(reason, FinishReason.OTHER)


# -- mapping helpers -------------------------------------------------------------------


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name, "parameters": object_schema(tool.input_schema)}
    if tool.description:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


def _user_content(parts: list[Part]) -> str | list[dict[str, Any]]:
    if all(p.text is not None for p in parts):
        return text_of(parts)
    content: list[dict[str, Any]] = []
    for part in parts:
        if part.text is not None:
            content.append({"type": "text", "text": part.text})
        elif part.data is not None:
            content.append({"type": "text", "text": dump_output(part.data)})
        elif part.media is not None:
            kind = part.media.content_type or ""
            if kind and not kind.startswith("image/"):
                raise StatusError(
                    Status.UNIMPLEMENTED,
                    f"media of type {kind!r} cannot be sent to a Chat Completions model",
                )
            content.append({"type": "image_url", "image_url": {"url": part.media.url}})
    return content


def _assistant(message: Message, wrapped: frozenset[str] = frozenset()) -> dict[str, Any]:
    text = "".join(p.text for p in message.content if p.text is not None)
    calls = []
    for part in message.content:
        req = part.tool_request
        if req is None:
            continue
        call: dict[str, Any] = {
            "id": req.ref or req.name,
            "type": "function",
            "function": {
                "name": req.name,
                "arguments": dump_input(
                    {WRAPPED_INPUT: req.input} if req.name in wrapped else req.input
                ),
            },
        }
        extra = (part.meta(_EXTRA) or {}).get("extra_content")
        if extra is not None:
            call["extra_content"] = extra
        calls.append(call)
    out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_request(
    call_id: str | None,
    name: str,
    arguments: Any,
    call: Mapping[str, Any],
    model: str,
    wrapped: frozenset[str],
) -> Part:
    ref = call_id or new_ref()
    extra = call.get("extra_content")
    value = parse_arguments(arguments, tool=name, ref=ref, model=model)
    return Part(
        tool_request=ToolRequest(name=name, ref=ref, input=unwrap_input(value, name, wrapped)),
        metadata={_EXTRA: {"extra_content": extra}} if extra is not None else None,
    )


def _usage(data: Any) -> Usage | None:
    if not isinstance(data, dict):
        return None
    return Usage(
        input_tokens=data.get("prompt_tokens"),
        output_tokens=data.get("completion_tokens"),
        total_tokens=data.get("total_tokens"),
    )


def _sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data` of each server-sent event."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def whole(self) -> bool:
        """Whether the arguments so far are complete JSON (none yet: not whole)."""
        text = "".join(self.arguments)
        if not text.strip():
            return False
        try:
            json.loads(text)
        except ValueError:
            return False
        return True


@dataclass
class _StreamState:
    """A streamed reply as it is assembled from its deltas."""

    model: str
    wrapped: frozenset[str] = frozenset()
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    reason: str | None = None
    usage: Any = None

    def add(self, chunk: Mapping[str, Any], emit: ChunkCallback) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self.reasoning.append(reasoning)
                emit(ModelChunk(role="model", content=[Part(reasoning=reasoning)]))
            content = delta.get("content")
            if isinstance(content, list):  # some compatible servers stream parts
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            if isinstance(content, str) and content:
                self.text.append(content)
                emit(ModelChunk(role="model", content=[Part(text=content)]))
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                self.refusal.append(refusal)
                emit(ModelChunk(role="model", content=[Part(text=refusal)]))
            for tc in delta.get("tool_calls") or []:
                self._add_call(tc)
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"]

    def _add_call(self, tc: Mapping[str, Any]) -> None:
        index = tc.get("index")
        fn = tc.get("function") or {}
        if not isinstance(index, int):
            # Servers that send calls without an index: a new id starts a new call; so
            # does a name once the call before is whole (its arguments complete JSON),
            # for servers whose ids are empty or repeated ("", or the function's name),
            # while one that repeats the id and name in every fragment goes on joining.
            known = [c.id for c in self.calls.values()]
            fresh = bool(tc.get("id")) and tc["id"] not in known
            last = self.calls[max(self.calls)] if self.calls else None
            named = bool(fn.get("name")) and last is not None and last.whole()
            index = len(self.calls) if not self.calls or fresh or named else max(self.calls)
        call = self.calls.setdefault(index, _Call())
        if tc.get("id"):
            call.id = tc["id"]
        if fn.get("name"):
            call.name = fn["name"]
        arguments = fn.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.arguments.append(arguments)
        elif arguments:  # some servers send the JSON itself, not a string of it
            call.arguments.append(json.dumps(arguments))
        if isinstance(tc.get("extra_content"), dict):
            call.extra.update(tc["extra_content"])

    def finish(self, emit: ChunkCallback) -> ModelResponse:
        parts: list[Part] = []
        if self.reasoning:
            parts.append(Part(reasoning="".join(self.reasoning)))
        if self.text:
            parts.append(Part(text="".join(self.text)))
        if self.refusal:
            parts.append(Part(text="".join(self.refusal)))
        requests = [
            _tool_request(
                call.id,
                call.name,
                "".join(call.arguments),
                {"extra_content": call.extra} if call.extra else {},
                self.model,
                self.wrapped,
            )
            for _, call in sorted(self.calls.items())
        ]
        if requests:
            # Whole, with their refs: a caller may act on them from the stream.
            emit(ModelChunk(role="model", content=requests))
        return ModelResponse(
            message=Message(role="model", content=[*parts, *requests]),
            finish_reason=finish_reason(self.reason, bool(self.refusal)),
            usage=_usage(self.usage),
        )
