"""Which query parameters of a store's or broker's URL hold a secret, for what shows one."""

from __future__ import annotations

__all__ = ["is_secret_parameter"]

_ENDINGS = ("password", "passwd", "secret", "token")


def is_secret_parameter(name: str) -> bool:
    """Whether the URL query parameter `name` holds a secret, as its name ends says:
    libpq's `password` and `sslpassword` (psycopg takes both in the query string),
    redis-py's `password`, a `token`, ..."""
    return name.lower().endswith(_ENDINGS)
