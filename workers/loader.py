"""Loading the registry named by `--app MODULE:OBJ`."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from interlock import Interlock, Status, StatusError

__all__ = ["load_registry"]


def load_registry(spec: str | None) -> Interlock:
    """The `Interlock` registry at `module:attribute` (attribute defaults to `ai`),
    imported from the path or from the current directory."""
    if not spec:
        raise StatusError(
            Status.INVALID_ARGUMENT,
            "no app given: pass --app MODULE:OBJ (e.g. examples.banking:ai) or set INTERLOCK_APP",
        )
    module_name, _, attr = spec.partition(":")
    if not module_name.strip():
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"--app {spec!r} names no module: pass MODULE:OBJ (e.g. examples.banking:ai)",
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        # As `celery -A` does: a module in the directory the command runs in is found
        # (a console script's path starts at its own directory, not this one).
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if not _is_the_app(exc, module_name):  # found, but an import inside it failed
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"app module {module_name!r} failed to import: {_where(exc)}",
            ) from exc
        raise StatusError(
            Status.NOT_FOUND, f"cannot import app module {module_name!r}: {exc}"
        ) from exc
    except Exception as exc:  # the module itself is broken: say where, in one line
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"app module {module_name!r} failed to import: {_where(exc)}",
        ) from exc
    name = attr or "ai"
    if not hasattr(module, name):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"app module {module_name!r} has no attribute {name!r}: "
            "--app names MODULE:OBJ, the module's Interlock registry",
        )
    registry = getattr(module, name)
    if not isinstance(registry, Interlock):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"{spec!r} is not an Interlock registry (got {type(registry).__name__})",
        )
    return registry


def _is_the_app(exc: ImportError, module_name: str) -> bool:
    """Whether the module not found is the app module (or a package on its way), not
    one that the app module imports."""
    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or missing is None:
        return False
    return module_name == missing or module_name.startswith(f"{missing}.")


def _where(exc: Exception) -> str:
    """`exc` as one line with the file and line it was raised at (for a SyntaxError,
    the line it points at)."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
