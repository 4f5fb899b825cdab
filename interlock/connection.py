"""A connection: one session held across turns, with streamed chunks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from schemas import AgentChunk, AgentInput, AgentOutput, Message, Part, Status, ToolResume

from ._ids import new_id
from .errors import StatusError

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Connection"]

_DONE = object()


class Connection:
    """Send a message or a resume, then `receive()` the turn's chunks; `output()` is the
    last turn's output. Each send runs its turn in the background as it streams."""

    def __init__(
        self,
        agent: Agent,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: str | None = None,
    ) -> None:
        self.agent = agent
        if agent.store is not None and session_id is None and snapshot_id is None:
            session_id = new_id()  # one session, even if the first turn fails
        self.session_id = session_id
        self.snapshot_id = snapshot_id
        self.state = state
        self._chunks: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._output: AgentOutput | None = None
        self._error: BaseException | None = None
        self._drained = True
        self._closed = False

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Wait for a running turn to end; no turn can be sent after. What the last turn
        gave stays readable (`receive()`, `output()`)."""
        self._closed = True
        if self._thread is not None:
            self._thread.join()

    # -- sending ----------------------------------------------------------------------

    def send(self, input: AgentInput) -> None:
        if self._closed:
            again = (
                f"go on in its session with agent.connect(session_id={self.session_id!r})"
                if self.session_id is not None
                else "go on from its last turn with agent.connect(state=conn.output().state)"
                if self.state is not None
                else "open another with agent.connect()"
            )
            raise StatusError(Status.FAILED_PRECONDITION, f"this connection is closed: {again}")
        if not self._drained:
            raise StatusError(
                Status.FAILED_PRECONDITION,
                "a turn is still running on this connection: receive() it first",
            )
        self._drained = False
        self._output = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(input,), daemon=True)
        self._thread.start()

    def send_text(self, text: str) -> None:
        self.send(AgentInput(message=Message(role="user", content=[Part(text=text)])))

    def send_message(self, message: Message) -> None:
        self.send(AgentInput(message=message))

    def send_resume(self, resume: ToolResume) -> None:
        self.send(AgentInput(resume=resume))

    def _run(self, input: AgentInput) -> None:
        try:
            out = self.agent.run(
                input,
                session_id=self.session_id if self.state is None else None,
                snapshot_id=self.snapshot_id if self.state is None else None,
                state=self.state,
                on_chunk=self._chunks.put,
            )
        except BaseException as exc:
            self._error = exc
        else:
            self._output = out
            self.session_id = out.session_id if self.agent.store is not None else None
            self.snapshot_id = out.snapshot_id
            self.state = out.state
        finally:
            self._chunks.put(_DONE)

    # -- receiving --------------------------------------------------------------------

    def receive(self) -> Iterator[AgentChunk]:
        """The current turn's chunks, ending after its `turn_end`. Raises the turn's
        error, if it failed."""
        if self._drained:
            return
        while True:
            item = self._chunks.get()
            if item is _DONE:
                self._settle(done=True)
                return
            assert isinstance(item, AgentChunk)
            if item.turn_end is not None:
                # The turn is over: settle it before yielding its last chunk, so that a
                # caller who stops at the turn_end (as Genkit's example does) can send again.
                self._settle(done=False)
                yield item
                return
            yield item

    def _settle(self, *, done: bool) -> None:
        """Wait for the turn's run to end (its end marker read), then raise its error."""
        if not done:
            while self._chunks.get() is not _DONE:
                pass
        self._drained = True
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error

    def output(self) -> AgentOutput:
        """The output of the last turn (waiting for it if needed). Idempotent."""
        for _ in self.receive():
            pass
        if self._error is not None:
            raise self._error
        if self._output is None:
            raise StatusError(Status.FAILED_PRECONDITION, "no turn has been sent yet")
        return self._output
