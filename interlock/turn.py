"""The turn loop: model, tools, interrupts, resumes. Knows nothing of stores or queues."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas import (
    AgentChunk,
    FinishReason,
    Message,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    Part,
    Role,
    Status,
    ToolResponse,
)

from ._ids import new_id
from ._json import to_json_value
from .context import ToolContext
from .errors import InterlockError, StatusError, ToolFailedError, ToolNotFoundError
from .interrupts import ToolInterrupt, misuses_watched
from .journal import TurnJournal
from .middleware import Middleware
from .models.base import Model
from .resume import Answer
from .tools import Tool

__all__ = ["Turn", "TurnResult"]

Emit = Callable[[AgentChunk], None]

_TOOL_FAILURES = (ToolFailedError, ToolNotFoundError)
"""What a tool call fails with. Every call of a model message runs even when one fails
(§3: all tool calls of one model message are executed); the first failure then fails
the turn. Anything else (a store or journal error) stops the turn at once."""


@dataclass
class TurnResult:
    finish_reason: FinishReason
    message: Message | None
    messages: list[Message]
    inherited: int


@dataclass
class _Outcome:
    output: Any = None
    interrupt: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class Turn:
    """One turn of one agent. `messages` holds the history as it grows, so a failed turn
    can still be recorded as it stood."""

    def __init__(
        self,
        *,
        agent: str,
        model: Model,
        system: str | None,
        tools: Mapping[str, Tool[Any, Any]],
        middleware: Sequence[Middleware],
        max_turns: int,
        history: Sequence[Message],
        session_id: str,
        turn_id: str,
        emit: Emit | None = None,
        config: dict[str, Any] | None = None,
        journal: TurnJournal | None = None,
    ) -> None:
        self.agent = agent
        self.model = model
        self.system = system
        self.tools = tools
        self.middleware = middleware
        self.max_turns = max_turns
        self.messages: list[Message] = list(history)
        self.inherited = len(self.messages)
        self.session_id = session_id
        self.turn_id = turn_id
        self._emit = emit
        self.config = config
        self.journal = journal
        self._journaled = journal.load(session_id, turn_id) if journal is not None else {}
        self._step = 0
        self._unrecorded: tuple[str, ModelResponse] | None = None
        self._refs: set[str] = set()
        self._refs_counted = 0
        self.expires_in: float | None = None
        """The earliest deadline (seconds from the pause) a tool gave its interrupt."""

    # -- entry points -----------------------------------------------------------------

    def start(self, message: Message) -> TurnResult:
        self.messages.append(message)
        return self._loop()

    def resume(self, answers: Mapping[str, Answer]) -> TurnResult:
        """Resolve the pending interrupts of the latest model message with `answers`."""
        self.inherited = len(self.messages) - 1
        paused = self.messages[-1]
        parts: list[Part] = []
        responses: list[Part] = []
        executed: list[Part] = []  # restarted tools that ran to an output in this turn
        repaused = False
        failed: StatusError | None = None
        for part in paused.content:
            req = part.tool_request
            if req is None:
                parts.append(part)
                continue
            meta = dict(part.metadata or {})
            response: Part | None = None
            if "pendingOutput" in meta:
                response = _response(req.name, req.ref, meta["pendingOutput"], "pending")
                if "pendingMetadata" in meta:  # an answer kept across a re-pause: its
                    # marks (`interruptResponse`) stay beside §3's `source: "pending"`
                    marks = {**meta["pendingMetadata"], "source": "pending"}
                    response = response.model_copy(update={"metadata": marks})
            elif "interrupt" in meta and req.ref is not None and req.ref in answers:
                answer = answers[req.ref]
                meta["resolvedInterrupt"] = meta.pop("interrupt")
                if answer.kind == "respond":
                    response = answer.part
                else:
                    try:
                        outcome = self._call(part, meta, resumed=answer.resumed, restarted=True)
                    except _TOOL_FAILURES as exc:  # the other restarts still run
                        self._failed(req.ref, exc)
                        failed = failed or exc
                        continue
                    meta = outcome.metadata
                    if outcome.interrupt is not None:
                        meta["interrupt"] = outcome.interrupt
                        repaused = True
                    else:
                        response = _response(req.name, req.ref, outcome.output, "restart")
                        executed.append(response)
            if response is not None and response.tool_response is not None:
                responses.append(response)
                # Kept if we re-pause; an answer also keeps its marks (`interruptResponse`,
                # `source: "restart"`), so the tool message says how the output came.
                meta["pendingOutput"] = response.tool_response.output
                if response.metadata and "pendingOutput" not in (part.metadata or {}):
                    meta["pendingMetadata"] = response.metadata
            parts.append(part.model_copy(update={"metadata": meta or None}))

        if failed is not None:
            raise failed
        if repaused:
            return self._pause(parts, executed)
        resolved = [_without_pending(p) for p in parts]
        self.messages[-1] = paused.model_copy(update={"content": resolved})
        self._append_tool_message(responses)
        return self._loop()

    # -- the loop ---------------------------------------------------------------------

    def _loop(self) -> TurnResult:
        for _ in range(self.max_turns):
            response = self._generate()
            message = response.message
            self.messages.append(message)
            requests = [p for p in message.content if p.tool_request is not None]
            if not requests:
                return self._finish(response.finish_reason, message)
            parts: list[Part] = []
            responses: list[Part] = []
            paused = False
            failed: StatusError | None = None
            for part in message.content:
                req = part.tool_request
                if req is None:
                    parts.append(part)
                    continue
                try:
                    outcome = self._call(part, dict(part.metadata or {}))
                except _TOOL_FAILURES as exc:  # the other calls still run, as in Genkit
                    self._failed(req.ref, exc)
                    failed = failed or exc
                    continue
                meta = outcome.metadata
                if outcome.interrupt is not None:
                    meta["interrupt"] = outcome.interrupt
                    paused = True
                else:
                    meta["pendingOutput"] = outcome.output
                    responses.append(_response(req.name, req.ref, outcome.output))
                parts.append(part.model_copy(update={"metadata": meta}))
            if failed is not None:  # the first failure, in the message's order, fails the turn
                raise failed
            if paused:
                return self._pause(parts, responses)
            self._append_tool_message(responses)
        raise StatusError(
            Status.ABORTED,
            f"agent {self.agent!r} reached max_turns={self.max_turns} model round-trips "
            "in one turn",
        )

    def _pause(self, parts: list[Part], executed: list[Part]) -> TurnResult:
        """End the turn `interrupted`. The calls of `parts` that ran to an output in this
        turn (`executed`) are streamed as a tool-role chunk, as executed calls always
        are, before the chunk holding the interrupts; their outputs wait in the message
        as `pendingOutput` and come back as the resumed turn's tool message."""
        message = self.messages[-1].model_copy(update={"content": parts})
        self.messages[-1] = message
        interrupts = [p for p in parts if p.is_interrupt()]
        if executed:
            self._stream("tool", executed)
        self._stream("tool", interrupts)
        return self._finish(FinishReason.INTERRUPTED, message)

    def _finish(self, reason: FinishReason, message: Message) -> TurnResult:
        return TurnResult(reason, message, self.messages, self.inherited)

    def _append_tool_message(self, responses: list[Part]) -> None:
        if not responses:
            return
        self.messages.append(Message(role="tool", content=responses))
        self._stream("tool", responses)

    def emit(self, chunk: AgentChunk) -> None:
        if self._emit is not None:
            self._emit(chunk)

    def _stream(self, role: Role, content: list[Part]) -> None:
        """Stream `content` as a chunk of `role`, when the caller streams (a chunk no one
        reads is not built)."""
        if self._emit is not None:
            self._emit(AgentChunk(model_chunk=ModelChunk(role=role, content=list(content))))

    # -- model ------------------------------------------------------------------------

    def _generate(self) -> ModelResponse:
        key = f"model:{self._step}"
        self._step += 1
        if key in self._journaled:  # a redelivered turn: the model already answered
            replayed = ModelResponse.model_validate(self._journaled[key])
            self._stream("model", replayed.message.content)
            return replayed
        response = self._ask_model()
        # Kept once a tool is about to act on it (`_call`): a response no tool acts on
        # is superseded by the turn's snapshot, and a crash before then has no effect
        # that asking the model again could contradict.
        self._unrecorded = (key, response)
        return response

    def _record_model(self) -> None:
        if self._unrecorded is not None:
            key, response = self._unrecorded
            self._unrecorded = None
            if self.journal is not None:  # no JSON made for a turn that keeps no journal
                self._record(key, response.to_json())

    def _record(self, key: str, value: Any) -> None:
        if self.journal is not None:
            self.journal.record(self.session_id, self.turn_id, key, value)

    def _failed(self, ref: str | None, exc: StatusError) -> None:
        """A call of the message failed; the next one runs only once the failure is
        journaled (`failed:REF`, never replayed: a run again calls the tool again). The
        journal keeps a run that stalled past its lease, and that another run took over,
        from writing anything: so it keeps it from running the message's next call too,
        as a completed call's journal entry does."""
        if self.journal is not None:
            self._record(f"failed:{ref}", exc.to_json())

    def _ask_model(self) -> ModelResponse:
        history = self.messages
        if self.system:
            history = [Message(role="system", content=[Part(text=self.system)]), *history]
        request = ModelRequest(
            messages=history,
            tools=[t.definition() for t in self.tools.values()],
            config=self.config,
        )
        streamed = False

        def on_chunk(chunk: ModelChunk) -> None:
            nonlocal streamed
            streamed = True
            self.emit(AgentChunk(model_chunk=chunk))

        try:
            response = self.model.generate(request, on_chunk)
        except InterlockError:
            raise
        except Exception as exc:
            raise StatusError(Status.UNKNOWN, f"model {self.model.name!r} failed: {exc}") from exc
        # Refs first, so the tool requests a caller sees in the stream are answerable.
        try:
            message = _with_refs(response.message, self._refs_in_history())
        except ValueError as exc:  # pydantic's serialization error: an input with no JSON form
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"model {self.model.name!r} gave a tool call an input with no JSON form: {exc}",
            ) from exc
        response = response.model_copy(update={"message": message})
        if not streamed:
            self._stream("model", response.message.content)
        return response

    def _refs_in_history(self) -> set[str]:
        """The refs of every tool request of the turn's history so far (a new call must
        not take one: answers, journal entries and idempotency keys go by ref). Kept up
        to date as messages are added, not read again from the start."""
        for message in self.messages[self._refs_counted :]:
            if message.role == "model":
                self._refs.update(
                    p.tool_request.ref
                    for p in message.content
                    if p.tool_request is not None and p.tool_request.ref
                )
        self._refs_counted = len(self.messages)
        return self._refs

    # -- tools ------------------------------------------------------------------------

    def _call(
        self,
        part: Part,
        metadata: dict[str, Any],
        *,
        resumed: dict[str, Any] | None = None,
        restarted: bool = False,
    ) -> _Outcome:
        req = part.tool_request
        assert req is not None and req.ref is not None
        key = f"tool:{req.ref}"
        if key in self._journaled:  # completed before a crash: not run again
            entry = self._journaled[key]
            return _Outcome(output=entry["output"], metadata=dict(entry.get("metadata") or {}))
        tool = self.tools.get(req.name)
        if tool is None:
            raise ToolNotFoundError(
                f"the model called tool {req.name!r}, which agent {self.agent!r} does not have"
            )
        ctx = ToolContext(
            name=req.name,
            ref=req.ref,
            input=req.input,
            session_id=self.session_id,
            turn_id=self.turn_id,
            agent=self.agent,
            resumed=resumed,
            restarted=restarted,
            metadata=metadata,
        )

        def innermost(c: ToolContext) -> Any:
            return tool.invoke(c)

        call = innermost
        for mw in reversed(self.middleware):
            call = _wrap(mw, tool, call)
        self._record_model()
        with misuses_watched() as misused:
            try:
                output = call(ctx)
            except ToolInterrupt as pause:
                if not misused:
                    if pause.expires_in is not None:
                        self.expires_in = min(self.expires_in or pause.expires_in, pause.expires_in)
                    return _Outcome(interrupt=pause.data, metadata=ctx.metadata)
            except Exception as exc:
                if not misused:  # any exception of a tool is INTERNAL (status_of finds its own)
                    raise ToolFailedError(req.name, f"tool {req.name!r} failed: {exc}") from exc
        if misused:  # interrupt() misused: the tool fails with that, even if it caught it
            error = misused[0]
            raise ToolFailedError(
                req.name, f"tool {req.name!r} failed: {error}", error.status
            ) from error
        self._record(key, {"output": output, "metadata": ctx.metadata})
        return _Outcome(output=output, metadata=ctx.metadata)


def _wrap(mw: Middleware, tool: Tool[Any, Any], call_next: Callable[[ToolContext], Any]) -> Any:
    return lambda ctx: mw.wrap_tool(ctx, tool, call_next)


def _response(name: str, ref: str | None, output: Any, source: str | None = None) -> Part:
    return Part(
        tool_response=ToolResponse(name=name, ref=ref, output=output),
        metadata={"source": source} if source else None,
    )


def _with_refs(message: Message, taken: set[str]) -> Message:
    """Every tool request gets a ref of its own: a new one where the model gave none, or
    gave one already `taken` (by a call earlier in the history) or used by an earlier
    call of the same message. An answer is matched to its call by ref, and the journal
    and `ctx.idempotency_key` go by ref, so one ref must never name two calls. Inputs
    become JSON values (a model function may hand over pydantic objects)."""
    seen = set(taken)
    content: list[Part] = []
    changed = False
    for part in message.content:
        req = part.tool_request
        if req is not None:
            ref = req.ref if req.ref and req.ref not in seen else new_id()
            seen.add(ref)
            given = req.input
            value = given if _is_plain_json(given) else to_json_value(given)
            if ref != req.ref or value is not given:
                update = {"tool_request": req.model_copy(update={"ref": ref, "input": value})}
                part = part.model_copy(update=update)
                changed = True
        content.append(part)
    return message.model_copy(update={"content": content}) if changed else message


def _is_plain_json(value: Any) -> bool:
    """True for a value made only of dicts with str keys, lists, str, numbers, bools
    and None (what a model's parsed arguments are)."""
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int or kind is float:
        return True
    if kind is dict:
        return all(isinstance(k, str) and _is_plain_json(v) for k, v in value.items())
    if kind is list:
        return all(_is_plain_json(v) for v in value)
    return False


_PENDING_KEYS = frozenset({"pendingOutput", "pendingMetadata"})


def _without_pending(part: Part) -> Part:
    if not part.metadata or "pendingOutput" not in part.metadata:
        return part
    meta = {k: v for k, v in part.metadata.items() if k not in _PENDING_KEYS}
    return part.model_copy(update={"metadata": meta or None})
