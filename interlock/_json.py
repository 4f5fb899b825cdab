"""JSON helpers: turning values into JSON, and comparing JSON as values."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

__all__ = ["copy_json", "normalize", "same_json", "to_json_value"]


def to_json_value(value: Any) -> Any:
    """A JSON value (dicts, lists, str, numbers, bools, None) for any pydantic-able value."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return to_jsonable_python(value, by_alias=True)


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (dicts and lists are copied; other values are shared,
    which is safe for str, numbers, bools and None). Much cheaper than `copy.deepcopy`."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


def normalize(value: Any) -> Any:
    """A canonical form: key order ignored, 5 == 5.0, but true != 1. Numbers keep their
    exact value (Python compares int and float exactly: 2**53 + 1 != 2.0**53)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, dict):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    return normalize(to_json_value(value))


def same_json(a: Any, b: Any) -> bool:
    """True when `a` and `b` are the same JSON value."""
    return bool(normalize(to_json_value(a)) == normalize(to_json_value(b)))
