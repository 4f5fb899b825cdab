"""What a tool call knows about itself."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolContext"]


@dataclass
class ToolContext:
    """The context of one tool call.

    `resumed` is the resume data of a restart (None on a first call). `metadata` is the
    request part's metadata; middleware may record keys in it that persist with the
    part when the call interrupts.
    """

    name: str
    ref: str
    input: Any
    session_id: str = ""
    turn_id: str = ""
    agent: str = ""
    resumed: dict[str, Any] | None = None
    restarted: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        """Stable for this call across retries and redeliveries: pass it to the outside
        system the tool calls so a repeated request has no second effect."""
        raw = f"{self.session_id}\x00{self.ref}\x00{self.name}".encode()
        return hashlib.sha256(raw).hexdigest()[:32]
