"""Loading the registry named by `--app MODULE:OBJ`."""

from __future__ import annotations

import importlib

from interlock import Interlock, Status, StatusError

__all__ = ["load_registry"]


def load_registry(spec: str | None) -> Interlock:
    """The `Interlock` registry at `module:attribute` (attribute defaults to `ai`)."""
    if not spec:
        raise StatusError(
            Status.INVALID_ARGUMENT,
            "no app given: pass --app MODULE:OBJ (e.g. examples.banking:ai) or set INTERLOCK_APP",
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StatusError(
            Status.NOT_FOUND, f"cannot import app module {module_name!r}: {exc}"
        ) from exc
    registry = getattr(module, attr or "ai", None)
    if not isinstance(registry, Interlock):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"{spec!r} is not an Interlock registry (got {type(registry).__name__})",
        )
    return registry
