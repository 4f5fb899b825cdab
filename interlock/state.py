"""Client-managed state: the paused session as a signed, opaque string."""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib

from pydantic import ValidationError

from schemas import Snapshot, Status

from .errors import StatusError

__all__ = ["RandomSecretWarning", "StateCodec"]

_VERSION = "v1"


class RandomSecretWarning(UserWarning):
    """A registry signs states with the process's random secret (no `secret=`, no
    `INTERLOCK_SECRET`): its states will not survive a restart."""


class StateCodec:
    """Signs states with HMAC-SHA256. A state edited by a client, or signed with another
    secret, is refused with PERMISSION_DENIED. It does not stop a state being replayed."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._secret, f"{_VERSION}.{body}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()

    def encode(self, snapshot: Snapshot) -> str:
        raw = snapshot.model_dump_json(exclude={"inherited", "resumed_by", "resume_token_hash"})
        body = base64.urlsafe_b64encode(zlib.compress(raw.encode(), 6)).rstrip(b"=").decode()
        return f"{_VERSION}.{body}.{self._sign(body)}"

    def decode(self, state: str) -> Snapshot:
        pieces = state.split(".") if isinstance(state, str) else []
        if len(pieces) != 3 or pieces[0] != _VERSION:
            raise StatusError(Status.PERMISSION_DENIED, "state is not one this service issued")
        _, body, signature = pieces
        if not hmac.compare_digest(signature, self._sign(body)):
            raise StatusError(
                Status.PERMISSION_DENIED,
                "state signature does not match: it was modified, or signed with another secret",
            )
        try:
            raw = zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            return Snapshot.model_validate_json(raw)
        except (ValueError, zlib.error, ValidationError) as exc:  # signed but unreadable
            raise StatusError(Status.DATA_LOSS, f"state could not be read: {exc}") from exc
