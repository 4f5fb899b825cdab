"""The error tree: every error Interlock raises is an `InterlockError`. Errors of the
database driver under a SQL store (a lost connection) pass through unwrapped."""

from __future__ import annotations

from typing import Any, Self, TypeVar

from schemas import ErrorInfo, Status

__all__ = [
    "InterlockError",
    "ResumeSnapshotNotFoundError",
    "ResumeValidationError",
    "SnapshotNotFoundError",
    "StatusError",
    "ToolFailedError",
    "ToolNotFoundError",
    "error_from_info",
    "status_of",
]


class InterlockError(Exception):
    """Root of every error Interlock raises."""


class StatusError(InterlockError):
    """An error with a canonical status. Crosses queues as `{"status", "message"}`.

    Built as `StatusError(status, message)`; a subclass also from its message alone
    (`ResumeValidationError("...")`: its default status), and so is `StatusError("...")`
    (UNKNOWN) when the text names no status."""

    default_status = Status.UNKNOWN
    snapshot_id: str | None = None
    """The failed snapshot kept for inspection, when the turn got far enough to keep one."""

    def __init__(self, status: Status | str | None = None, message: str = "") -> None:
        named = isinstance(status, Status) or status in Status.__members__
        if isinstance(status, str) and not named and not message:  # the message alone
            message, status = status, self.default_status
        self.status = Status(status) if status is not None else self.default_status
        self.message = message
        super().__init__(f"{self.status.value}: {message}" if message else self.status.value)

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt in another process with its status, message and attributes, and with
        the status its cause chain gives (`status_of`): a tool's `StatusError` is kept as
        the cause of its `ToolFailedError`; a cause with no status is left behind."""
        extra = dict(self.__dict__)
        return (_rebuild, (type(self), self.status.value, self.message, extra, _portable(self)))

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, message=self.message)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        info = ErrorInfo.model_validate(data)
        return _rebuild(cls, info.status.value, info.message, {})


_E = TypeVar("_E", bound="StatusError")


def _rebuild(
    cls: type[_E],
    status: str,
    message: str,
    extra: dict[str, Any],
    cause: StatusError | None = None,
) -> _E:
    err = cls.__new__(cls)
    StatusError.__init__(err, status, message)
    err.__dict__.update(extra)
    err.__cause__ = cause
    return err


def _portable(err: StatusError) -> StatusError | None:
    """What of `err`'s cause can travel: a `StatusError` as it is; any other exception
    as a `StatusError` with the status its own chain gives, if it gives one."""
    cause = err.__cause__
    if cause is None or isinstance(cause, StatusError):
        return cause
    inner = status_of(cause)
    if inner is Status.UNKNOWN:
        return None
    return StatusError(inner, f"{type(cause).__name__}: {cause}")


class ToolFailedError(StatusError):
    """A tool raised: the turn fails. The tool's exception is the `__cause__`."""

    default_status = Status.INTERNAL
    tool_name: str = ""  # unknown when rebuilt from {"status", "message"}

    def __init__(
        self, tool_name: str | Status, message: str = "", status: Status | None = None
    ) -> None:
        if isinstance(tool_name, Status):  # StatusError's form: (status, message)
            status, name = tool_name, ""
        else:
            name = tool_name
        self.tool_name = name
        fallback = f"tool {name!r} failed" if name else "a tool failed"
        super().__init__(status or Status.INTERNAL, message or fallback)


class ResumeValidationError(StatusError):
    """A resume that does not match the paused turn, or a new message the session
    cannot take now (it is paused, being resumed, or its snapshot cannot be continued).
    Nothing ran, nothing was written."""

    default_status = Status.INVALID_ARGUMENT


class _NotFound(StatusError):
    """NOT_FOUND errors, built from a message (`SnapshotNotFoundError("...")`) or in
    StatusError's form (`SnapshotNotFoundError(Status.NOT_FOUND, "...")`)."""

    default_status = Status.NOT_FOUND
    default_message = "not found"

    def __init__(self, message: Status | str | None = None, detail: str | None = None) -> None:
        if detail is not None or isinstance(message, Status):
            super().__init__(message, detail or self.default_message)
        else:
            super().__init__(Status.NOT_FOUND, message or self.default_message)


class SnapshotNotFoundError(_NotFound):
    """No snapshot has this id."""

    default_message = "snapshot not found"


class ResumeSnapshotNotFoundError(SnapshotNotFoundError, ResumeValidationError):
    """A resume addressed to a snapshot that does not exist: NOT_FOUND, and, like every
    resume refused before it ran, a `ResumeValidationError`."""


class ToolNotFoundError(_NotFound):
    """No tool of this name is registered."""

    default_message = "tool not found"


def status_of(exc: BaseException | None) -> Status:
    """The status of the innermost `StatusError` on the `__cause__` chain, else UNKNOWN."""
    found = Status.UNKNOWN
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StatusError):
            found = exc.status
        exc = exc.__cause__
    return found


def error_from_info(info: ErrorInfo | dict[str, Any]) -> StatusError:
    """Rebuild an error that crossed a queue as `{"status", "message"}`."""
    info = info if isinstance(info, ErrorInfo) else ErrorInfo.model_validate(info)
    return StatusError(info.status, info.message)
