"""Resume tokens: a secret per interrupt, stored only as a hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["hash_token", "new_token", "token_matches"]


def new_token() -> str:
    return secrets.token_urlsafe(24)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str | None, token_hash: str | None) -> bool:
    """True when `token` is the one whose hash is stored (constant-time)."""
    if not token or not token_hash:
        return False
    return hmac.compare_digest(hash_token(token), token_hash)
