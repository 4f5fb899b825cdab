"""What every HTTP model plugin shares: status mapping, retries, keys from the environment.

Retries are safe only before the caller has seen anything: a request is retried on
429, 5xx, a connection error or a timeout, and only while no chunk of the reply has
reached `on_chunk`. Other 4xx are never retried. `Retry-After` (seconds or an HTTP
date, and `retry-after-ms`) is honoured up to `RetryPolicy.max_retry_after`.
"""

from __future__ import annotations

import email.utils
import logging
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from schemas import Status

from ..errors import StatusError

__all__ = [
    "ModelError",
    "RetryPolicy",
    "call_with_retries",
    "env_first",
    "missing_key",
    "retry_after_seconds",
    "status_for_http",
]

log = logging.getLogger("interlock.models")

T = TypeVar("T")

ENV_ATTEMPTS = "INTERLOCK_MODEL_MAX_ATTEMPTS"
ENV_TIMEOUT = "INTERLOCK_MODEL_TIMEOUT"
DEFAULT_TIMEOUT = 120.0


class ModelError(StatusError):
    """A model provider's call failed. `http_status` is the provider's HTTP status (None
    for a connection error or a timeout); `retryable` says whether sending the same
    request again may succeed."""

    default_status = Status.UNAVAILABLE
    provider: str = ""
    http_status: int | None = None
    retryable: bool = False
    retry_after: float | None = None

    def __init__(
        self,
        status: Status,
        message: str,
        *,
        provider: str = "",
        http_status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, message)
        self.provider = provider
        self.http_status = http_status
        self.retryable = retryable
        self.retry_after = retry_after


_BY_HTTP = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    408: Status.DEADLINE_EXCEEDED,
    409: Status.ABORTED,
    413: Status.INVALID_ARGUMENT,
    422: Status.INVALID_ARGUMENT,
    429: Status.RESOURCE_EXHAUSTED,
}


def status_for_http(code: int) -> Status:
    """The canonical status of an HTTP error status."""
    if code in _BY_HTTP:
        return _BY_HTTP[code]
    if code >= 500:
        return Status.UNAVAILABLE
    return Status.INVALID_ARGUMENT if 400 <= code < 500 else Status.UNKNOWN


def is_retryable_http(code: int, headers: Mapping[str, str] | None = None) -> bool:
    """Whether an HTTP error is worth another try: 408 (the request timed out), 409 (a
    lock conflict), 429 and 5xx, as the providers' own SDKs decide, unless the server
    says otherwise with `x-should-retry: true` or `false` (OpenAI and Anthropic send it)."""
    told = {k.lower(): v for k, v in (headers or {}).items()}.get("x-should-retry")
    if told is not None and told.strip().lower() in ("true", "false"):
        return told.strip().lower() == "true"
    return code in (408, 409, 429) or code >= 500


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """`retry-after-ms`, else `Retry-After` (seconds or an HTTP date), in seconds."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: `attempts` tries in all (1 = no retry), waiting
    about `initial_delay * 2**n` (at most `max_delay`) between them, or what the server's
    `Retry-After` asks when it asks at most `max_retry_after` seconds."""

    attempts: int = 3
    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, with `attempts` from INTERLOCK_MODEL_MAX_ATTEMPTS when it
        is set: a whole number, at least 1 (1 = no retry)."""
        raw = os.environ.get(ENV_ATTEMPTS)
        if not raw:
            return cls()
        try:
            attempts = int(raw)
        except ValueError:
            attempts = 0
        if attempts < 1:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"{ENV_ATTEMPTS} must be a whole number of at least 1, got {raw!r}",
            )
        return cls(attempts=attempts)

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before try `attempt + 1`; None when the server asks for more
        than `max_retry_after`."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        backoff = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
        return backoff * (0.5 + random.random() / 2)


def timeout_from_env() -> float:
    """Seconds from INTERLOCK_MODEL_TIMEOUT (DEFAULT_TIMEOUT when unset): a finite number
    greater than 0."""
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not (math.isfinite(timeout) and timeout > 0):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"{ENV_TIMEOUT} must be a number of seconds greater than 0, got {raw!r}",
        )
    return timeout


def call_with_retries(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    started: Callable[[], bool],
    what: str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`attempt()`, tried again on a retryable `ModelError` while `started()` is false
    (nothing of the reply has reached the caller yet). Each retry is logged, led by
    `what` (the model's name) once."""
    for n in range(1, max(1, policy.attempts) + 1):
        try:
            return attempt()
        except ModelError as err:
            if not err.retryable:
                raise
            if started():
                _note(err, "not retried: part of the reply had already been streamed")
                raise
            if n >= policy.attempts:
                if n > 1:
                    _note(err, f"gave up after {n} attempts")
                raise
            wait = policy.delay(n, err.retry_after)
            if wait is None:
                _note(err, f"not retried: the server asks to wait {err.retry_after:.0f}s")
                raise
            log.warning(
                "%s; retrying in %.2fs (attempt %d of %d)",
                _named(what, err.message),
                wait,
                n + 1,
                policy.attempts,
            )
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _named(what: str, message: str) -> str:
    """`message` led by `what`, unless it already is: the plugins' errors name their model."""
    return message if not what or message.startswith(f"{what}: ") else f"{what}: {message}"


def _note(err: StatusError, note: str) -> None:
    err.message = f"{err.message} ({note})"
    err.args = (f"{err.status.value}: {err.message}",)


def env_first(names: Sequence[str]) -> str | None:
    """The value of the first of `names` set to a non-empty value."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def missing_key(names: Sequence[str], model: str) -> StatusError:
    """UNAUTHENTICATED, naming the variable to set (and the ones also accepted)."""
    also = f" ({', '.join(names[1:])} is also accepted)" if len(names) > 1 else ""
    return StatusError(
        Status.UNAUTHENTICATED,
        f"{names[0]} is not set{also}; export it to use {model}",
    )


def error_text(body: Any) -> str:
    """The provider's error message from an error body (OpenAI, Anthropic and Google
    shapes: `{"error": {"message": ...}}`, `[{"error": ...}]`, `{"message": ...}`)."""
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail")
            if message:
                kind = err.get("type") or err.get("code") or err.get("status")
                return f"{message} ({kind})" if isinstance(kind, str) and kind else str(message)
        elif isinstance(err, str):
            return err
    return str(body)[:500] if body not in (None, "") else ""
