"""The `anthropic` provider: Claude through the Messages API, with tool use and streaming.

    anthropic/claude-haiku-4-5   ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL (the SDK's default)

It uses the official `anthropic` SDK, an optional extra (`pip install
'interlock[anthropic]'`), imported only when an `anthropic/...` model is looked up. The
SDK's own retries are off (`max_retries=0`): retries follow Interlock's rule (only
before the first chunk reached the caller; see `_http`).

Mapping, ours → Messages API: system messages → `system`; user text, images and PDFs →
`user` blocks; a model message → an `assistant` message of `text`, `thinking` (when
it carries the signature it came with) and `tool_use` blocks (id = the part's ref); a
tool message → `tool_result` blocks (same ids) in a `user` message. Consecutive messages
of one role are merged, as the API wants alternating roles. Tools → `tools: [{"name",
"description", "input_schema"}]` (an input that is not an object travels as the one
field `input` of one: `_wire.object_schema`); the output schema has no place and is
left out.
Config: Genkit's `maxOutputTokens` (default 4096), `temperature`, `topP`, `topK`,
`stopSequences` are translated; other keys (`thinking`, `tool_choice`, ...) go into the
request as they are; `stream: false` turns streaming off.

Reply → ours: text, thinking (as reasoning parts, keeping the signature in
`metadata.anthropic`), tool_use blocks as tool requests (ref = the block's id). Stop
reasons: end_turn, stop_sequence, tool_use → stop; max_tokens → length; refusal →
blocked; others → other.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from schemas import (
    FinishReason,
    Message,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    Part,
    Status,
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
    dump_output,
    new_ref,
    object_schema,
    parse_arguments,
    parse_data_url,
    text_of,
    unwrap_input,
    wrapped_tools,
)
from .base import ChunkCallback

__all__ = ["KEY_ENV", "AnthropicModel", "model", "sdk"]

KEY_ENV = ("ANTHROPIC_API_KEY",)
BASE_URL_ENV = "ANTHROPIC_BASE_URL"
DEFAULT_MAX_TOKENS = 4096
_META = "anthropic"  # part metadata key for provider data that must round-trip
_INSTALL = "the anthropic provider needs the anthropic package: pip install 'interlock[anthropic]'"


def sdk() -> ModuleType:
    """The `anthropic` package, or FAILED_PRECONDITION saying how to install it."""
    try:
        return importlib.import_module("anthropic")
    except ImportError as exc:
        raise StatusError(Status.FAILED_PRECONDITION, _INSTALL) from exc


def model(name: str) -> AnthropicModel:
    """The model `anthropic/name`, configured from the environment."""
    full = f"anthropic/{name}"
    sdk()
    key = env_first(KEY_ENV)
    if key is None:
        raise missing_key(KEY_ENV, full)
    return AnthropicModel(full, api_key=key, base_url=os.environ.get(BASE_URL_ENV) or None)


class AnthropicModel:
    """A Claude model. Streams when the caller takes chunks."""

    def __init__(
        self,
        name: str,
        *,
        api_key: str,
        base_url: str | None = None,
        model: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        stream: bool = True,
    ) -> None:
        self.name = name
        self.model = model or name.partition("/")[2]
        self.api_key = api_key
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.timeout = timeout if timeout is not None else timeout_from_env()
        self.retry = retry or RetryPolicy.from_env()
        self.stream = stream
        self._client: Any = None
        self._pid = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<AnthropicModel {self.name}>"

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _sdk_client(self) -> Any:
        with self._lock:
            if self._client is None or self._pid != os.getpid():  # a fork gets its own
                self._client = sdk().Anthropic(
                    api_key=self.api_key,
                    base_url=self.base_url,
                    max_retries=0,
                    timeout=self.timeout,
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
        params = self.params(request, config)
        wrapped = wrapped_tools(request.tools)
        started = [False]

        def emit(chunk: ModelChunk) -> None:
            started[0] = True
            assert on_chunk is not None
            on_chunk(chunk)

        def attempt() -> ModelResponse:
            try:
                if streaming:
                    return self._stream(params, emit, wrapped)
                reply = self._create(params, stream=False).model_dump(mode="json")
                return self._parse(reply, wrapped)
            except StatusError:
                raise
            except Exception as exc:
                error = self._error(exc)
                if error is None:
                    raise
                raise error from exc

        return call_with_retries(attempt, self.retry, started=lambda: started[0], what=self.name)

    def params(
        self, request: ModelRequest, config: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The Messages API request (the SDK's keyword arguments) for `request`."""
        check_history(request.messages, self.name)
        system, messages = _messages(request.messages, wrapped_tools(request.tools))
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": messages,
        }
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": object_schema(t.input_schema),
                }
                for t in request.tools
            ]
        for key, value in (config if config is not None else request.config or {}).items():
            if value is None:
                continue
            if key in _COMMON:
                params[_COMMON[key]] = value
            elif key not in ("model", "messages", "tools", "system", "stream"):
                params[key] = value
        return params

    # -- replies ----------------------------------------------------------------------

    def _create(self, params: dict[str, Any], *, stream: bool) -> Any:
        """`messages.create`: what this SDK release takes as arguments, the rest of the
        request (a newer or older API field, a config key) in `extra_body`."""
        create = self._sdk_client().messages.create
        accepted = _parameters(create)
        kwargs = {k: v for k, v in params.items() if k in accepted}
        extra = {k: v for k, v in params.items() if k not in accepted}
        if extra:
            kwargs["extra_body"] = extra
        if stream:
            kwargs["stream"] = True
        return create(**kwargs)

    def _stream(
        self, params: dict[str, Any], emit: ChunkCallback, wrapped: frozenset[str]
    ) -> ModelResponse:
        stream = self._create(params, stream=True)
        state = _StreamState(self.name, wrapped)
        try:
            for event in stream:
                state.add(event.model_dump(mode="json"), emit)
        finally:
            stream.close()
        return state.finish()

    def _parse(
        self, data: Mapping[str, Any], wrapped: frozenset[str] = frozenset()
    ) -> ModelResponse:
        parts = [p for block in data.get("content") or [] if (p := _part(block, wrapped))]
        return ModelResponse(
            message=Message(role="model", content=parts),
            finish_reason=finish_reason(data.get("stop_reason")),
            usage=_usage(data.get("usage"), None),
        )

    # -- errors -----------------------------------------------------------------------

    def _error(self, exc: Exception) -> ModelError | None:
        anthropic = sdk()
        if isinstance(exc, anthropic.APITimeoutError) or _is_transport(exc, "TimeoutException"):
            return ModelError(
                Status.DEADLINE_EXCEEDED,
                f"{self.name}: no reply within {self.timeout:g}s ({type(exc).__name__})",
                provider="anthropic",
                retryable=True,
            )
        if isinstance(exc, anthropic.APIConnectionError) or _is_transport(exc, "TransportError"):
            return ModelError(
                Status.UNAVAILABLE,
                f"{self.name}: cannot reach the Anthropic API: {exc or type(exc).__name__}",
                provider="anthropic",
                retryable=True,
            )
        if isinstance(exc, anthropic.APIStatusError):
            code = int(exc.status_code)
            body = exc.body
            kind = _error_type(body)
            if code >= 400:
                retryable = is_retryable_http(code, exc.response.headers)
                status = status_for_http(code)
                where = f"anthropic answered HTTP {code}"
            else:  # an error event in the middle of a stream
                status, retryable = _ERROR_TYPES.get(kind, (Status.UNKNOWN, False))
                where = "anthropic reported an error"
            return ModelError(
                status,
                f"{self.name}: {where}: {error_text(body) or exc.message}",
                provider="anthropic",
                http_status=code if code >= 400 else None,
                retryable=retryable,
                retry_after=retry_after_seconds(exc.response.headers),
            )
        if isinstance(exc, anthropic.APIError):
            return ModelError(
                Status.INTERNAL, f"{self.name}: {exc}", provider="anthropic", retryable=False
            )
        if isinstance(exc, json.JSONDecodeError):  # a reply, or a stream event, not JSON
            return ModelError(
                Status.INTERNAL,
                f"{self.name}: the reply is not JSON ({exc}): {exc.doc[:200]!r}",
                provider="anthropic",
            )
        return None


def _parameters(fn: Any) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover - a signature we cannot read
        return frozenset({"model", "max_tokens", "messages", "system", "tools", "stream"})


def _is_transport(exc: BaseException, base: str) -> bool:
    """An httpx (or httpx2) transport error the SDK let through while streaming."""
    module = type(exc).__module__
    return module.startswith(("httpx", "httpcore")) and any(
        cls.__name__ == base for cls in type(exc).__mro__
    )


def _error_type(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("type") or "")
    return ""


_COMMON = {
    "maxOutputTokens": "max_tokens",
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "stopSequences": "stop_sequences",
}

_ERROR_TYPES: dict[str, tuple[Status, bool]] = {
    "overloaded_error": (Status.UNAVAILABLE, True),
    "api_error": (Status.UNAVAILABLE, True),
    "rate_limit_error": (Status.RESOURCE_EXHAUSTED, True),
    "invalid_request_error": (Status.INVALID_ARGUMENT, False),
    "request_too_large": (Status.INVALID_ARGUMENT, False),
    "authentication_error": (Status.UNAUTHENTICATED, False),
    "permission_error": (Status.PERMISSION_DENIED, False),
    "not_found_error": (Status.NOT_FOUND, False),
}

_FINISH = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "tool_use": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "refusal": FinishReason.BLOCKED,
}


def finish_reason(reason: str | None) -> FinishReason:
    """Our finish reason for a Messages API `stop_reason`."""
    if reason is None:
        return FinishReason.UNKNOWN
    return _FINISH.get(reason, FinishReason.OTHER)


# -- ours → the Messages API ----------------------------------------------------------------


def _messages(
    history: list[Message], wrapped: frozenset[str] = frozenset()
) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in history:
        if message.role == "system":
            system.append(text_of(message.content))
        elif message.role == "user":
            add("user", [b for p in message.content if (b := _user_block(p))])
        elif message.role == "model":
            add(
                "assistant",
                [b for p in message.content if (b := _assistant_block(p, wrapped))],
            )
        else:
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": p.tool_response.ref or p.tool_response.name,
                        "content": dump_output(p.tool_response.output),
                    }
                    for p in message.content
                    if p.tool_response is not None
                ],
            )
    return "\n\n".join(s for s in system if s), out


def _user_block(part: Part) -> dict[str, Any] | None:
    if part.text is not None:
        return {"type": "text", "text": part.text} if part.text else None
    if part.data is not None:
        return {"type": "text", "text": dump_output(part.data)}
    if part.media is not None:
        inline = parse_data_url(part.media.url)
        kind = part.media.content_type or (inline[0] if inline else "")
        block = "document" if kind == "application/pdf" else "image"
        if kind and block == "image" and not kind.startswith("image/"):
            raise StatusError(
                Status.UNIMPLEMENTED, f"media of type {kind!r} cannot be sent to a Claude model"
            )
        source: dict[str, Any] = (
            {"type": "base64", "media_type": kind or inline[0], "data": inline[1]}
            if inline
            else {"type": "url", "url": part.media.url}
        )
        return {"type": block, "source": source}
    return None


def _assistant_block(part: Part, wrapped: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    if part.text is not None:
        return {"type": "text", "text": part.text} if part.text else None
    req = part.tool_request
    if req is not None:
        if req.name in wrapped:  # its schema was wrapped: so are its calls
            value: Any = {WRAPPED_INPUT: req.input}
        elif req.input is None:
            value = {}
        elif isinstance(req.input, dict):
            value = req.input
        else:  # the API takes objects only; keep what the model sent
            value = {WRAPPED_INPUT: req.input}
        return {"type": "tool_use", "id": req.ref or req.name, "name": req.name, "input": value}
    meta = part.meta(_META) or {}
    if part.reasoning is not None and meta.get("signature"):
        return {"type": "thinking", "thinking": part.reasoning, "signature": meta["signature"]}
    if part.custom is not None and meta.get("redacted_thinking"):
        return {"type": "redacted_thinking", "data": part.custom.get("data", "")}
    return None


# -- the Messages API → ours ----------------------------------------------------------------


def _part(block: Mapping[str, Any], wrapped: frozenset[str] = frozenset()) -> Part | None:
    kind = block.get("type")
    if kind == "text":
        return Part(text=block.get("text") or "") if block.get("text") else None
    if kind == "tool_use":
        ref = block.get("id") or new_ref()
        name = block["name"]
        value = unwrap_input(block.get("input"), name, wrapped)
        return Part(tool_request=ToolRequest(name=name, ref=ref, input=value))
    if kind == "thinking":
        return Part(
            reasoning=block.get("thinking") or "",
            metadata={_META: {"signature": block.get("signature")}},
        )
    if kind == "redacted_thinking":
        return Part(
            custom={"data": block.get("data", "")}, metadata={_META: {"redacted_thinking": True}}
        )
    return None


def _usage(data: Any, output: int | None) -> Usage | None:
    if not isinstance(data, dict):
        return None
    inputs = sum(
        data.get(k) or 0
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    outputs = output if output is not None else data.get("output_tokens")
    return Usage(
        input_tokens=inputs,
        output_tokens=outputs,
        total_tokens=inputs + (outputs or 0),
    )


@dataclass
class _Block:
    type: str
    text: list[str] = field(default_factory=list)
    json: list[str] = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)
    signature: str | None = None


@dataclass
class _StreamState:
    """A streamed reply as it is assembled from its events."""

    model: str
    wrapped: frozenset[str] = frozenset()
    blocks: dict[int, _Block] = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)
    reason: str | None = None
    usage: Any = None
    output_tokens: int | None = None

    def add(self, event: Mapping[str, Any], emit: ChunkCallback) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.usage = (event.get("message") or {}).get("usage")
        elif kind == "content_block_start":
            start = dict(event.get("content_block") or {})
            self.blocks[event["index"]] = _Block(type=start.get("type", ""), start=start)
        elif kind == "content_block_delta":
            block = self.blocks.get(event["index"])
            delta = event.get("delta") or {}
            if block is None:
                return
            dtype = delta.get("type")
            if dtype == "text_delta" and delta.get("text"):
                block.text.append(delta["text"])
                emit(ModelChunk(role="model", content=[Part(text=delta["text"])]))
            elif dtype == "thinking_delta" and delta.get("thinking"):
                block.text.append(delta["thinking"])
                emit(ModelChunk(role="model", content=[Part(reasoning=delta["thinking"])]))
            elif dtype == "signature_delta":
                block.signature = delta.get("signature")
            elif dtype == "input_json_delta":
                block.json.append(delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            block = self.blocks.pop(event["index"], None)
            part = self._close(block) if block is not None else None
            if part is not None:
                self.parts.append(part)
                if part.tool_request is not None:
                    emit(ModelChunk(role="model", content=[part]))
        elif kind == "message_delta":
            self.reason = (event.get("delta") or {}).get("stop_reason") or self.reason
            usage = event.get("usage") or {}
            if usage.get("output_tokens") is not None:
                self.output_tokens = usage["output_tokens"]

    def _close(self, block: _Block) -> Part | None:
        if block.type == "tool_use":
            ref = block.start.get("id") or new_ref()
            name = block.start.get("name", "")
            raw = "".join(block.json)
            value = (
                parse_arguments(raw, tool=name, ref=ref, model=self.model)
                if raw.strip()
                else block.start.get("input") or {}
            )
            value = unwrap_input(value, name, self.wrapped)
            return Part(tool_request=ToolRequest(name=name, ref=ref, input=value))
        if block.type == "text":
            text = block.start.get("text", "") + "".join(block.text)
            return Part(text=text) if text else None
        if block.type == "thinking":
            return _part(
                {
                    "type": "thinking",
                    "thinking": block.start.get("thinking", "") + "".join(block.text),
                    "signature": block.signature or block.start.get("signature"),
                }
            )
        return _part(block.start)

    def finish(self) -> ModelResponse:
        return ModelResponse(
            message=Message(role="model", content=self.parts),
            finish_reason=finish_reason(self.reason),
            usage=_usage(self.usage, self.output_tokens),
        )
