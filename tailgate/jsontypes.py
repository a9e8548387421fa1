"""JSON as the suite's files and messages carry it, typed at the edge where it is read or written.

A typed object (a dataclass, a contract, a ``TypedDict``) is what the code holds; :data:`JsonObject` is only
its form on the way to a file or the wire, and the ``json_*`` readers are how a decoded object becomes a typed
one again: each checks the value it takes and, when the file does not fit, raises one :class:`JsonShapeError`
line naming the key, where a plain ``float(data["x"])`` would fail later with a traceback. Writing
``JsonObject`` rather than ``dict[str, Any]`` lets the type checker refuse a value no JSON encoder takes.

Standard library only: the load path (gevent) and the analysis (pandas) both import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, cast

JsonValue: TypeAlias = bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
"""Any value a JSON encoder writes; read-only containers, so a ``list[float]`` or a typed mapping is one."""
JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object being built for a file or a message."""
JsonMapping: TypeAlias = Mapping[str, object]
"""A decoded JSON object not yet checked: every value is read through a ``json_*`` reader."""

_ABSENT = object()


class JsonShapeError(ValueError):
    """A decoded object whose key is missing or of the wrong type; ``str()`` is one line naming the key."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _wrong(key: str, want: str, value: object, where: str) -> JsonShapeError:
    prefix = f"{where}: " if where else ""
    return JsonShapeError(f"{prefix}key {key!r} should be {want}, got {_show(value)} ({type(value).__name__})")


def _take(data: JsonMapping, key: str, default: object, where: str) -> object:
    if key in data:
        return data[key]
    if default is _ABSENT:
        prefix = f"{where}: " if where else ""
        raise JsonShapeError(f"{prefix}key {key!r} is missing")
    return default


def json_float(data: JsonMapping, key: str, default: float | object = _ABSENT, *, where: str = "") -> float:
    """A number (an integer is one too; a boolean is not)."""
    value = _take(data, key, default, where)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _wrong(key, "a number", value, where)


def json_opt_float(data: JsonMapping, key: str, *, where: str = "") -> float | None:
    """A number, or None when the key is absent or null."""
    value = data.get(key)
    return None if value is None else json_float(data, key, where=where)


def json_number(data: JsonMapping, key: str, *, where: str = "") -> float:
    """A number as the file wrote it (``4`` stays an integer; see :func:`json_opt_number`)."""
    value = data.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return json_float(data, key, where=where)  # absent or not a number: the one line naming the key


def json_opt_number(data: JsonMapping, key: str, *, where: str = "") -> float | None:
    """A number as the file wrote it (``4`` stays an integer), or None when absent or null: a figure read back
    and written again keeps its form, so a resumed search leaves the rows it did not touch as they were."""
    value = data.get(key)
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    return json_opt_float(data, key, where=where)  # not a number: the one line naming the key


def json_int(data: JsonMapping, key: str, default: int | object = _ABSENT, *, where: str = "") -> int:
    """A whole number (``3.0`` counts: some writers round through a float)."""
    value = _take(data, key, default, where)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _wrong(key, "an integer", value, where)


def json_opt_int(data: JsonMapping, key: str, *, where: str = "") -> int | None:
    """A whole number, or None when the key is absent or null."""
    value = data.get(key)
    return None if value is None else json_int(data, key, where=where)


def json_str(data: JsonMapping, key: str, default: str | object = _ABSENT, *, where: str = "") -> str:
    """A string."""
    value = _take(data, key, default, where)
    if isinstance(value, str):
        return value
    raise _wrong(key, "a string", value, where)


def json_opt_str(data: JsonMapping, key: str, *, where: str = "") -> str | None:
    """A string, or None when the key is absent or null."""
    value = data.get(key)
    return None if value is None else json_str(data, key, where=where)


def json_bool(data: JsonMapping, key: str, default: bool | object = _ABSENT, *, where: str = "") -> bool:
    """``true`` or ``false``."""
    value = _take(data, key, default, where)
    if isinstance(value, bool):
        return value
    raise _wrong(key, "true or false", value, where)


def json_object(
    data: JsonMapping, key: str, default: JsonMapping | object = _ABSENT, *, where: str = ""
) -> JsonMapping:
    """A nested object, itself read through these readers."""
    value = _take(data, key, default, where)
    if isinstance(value, Mapping):
        return value
    raise _wrong(key, "an object", value, where)


def json_opt_object(data: JsonMapping, key: str, *, where: str = "") -> JsonMapping | None:
    """A nested object, or None when the key is absent or null."""
    value = data.get(key)
    return None if value is None else json_object(data, key, where=where)


def json_list(
    data: JsonMapping, key: str, default: Sequence[object] | object = _ABSENT, *, where: str = ""
) -> Sequence[object]:
    """An array (its items still to be read)."""
    value = _take(data, key, default, where)
    if isinstance(value, (list, tuple)):
        return value
    raise _wrong(key, "an array", value, where)


def as_object(value: object, *, where: str = "") -> JsonMapping:
    """A decoded value that must be an object (a file's top level, an array's item)."""
    if isinstance(value, Mapping):
        return value
    prefix = f"{where}: " if where else ""
    raise JsonShapeError(f"{prefix}should be a JSON object, got {_show(value)} ({type(value).__name__})")


def json_objects(data: JsonMapping, key: str, *, where: str = "") -> list[JsonMapping]:
    """An array of objects, or an empty list when the key is absent."""
    return [
        as_object(item, where=f"{where} {key}[{i}]".strip())
        for i, item in enumerate(json_list(data, key, (), where=where))
    ]


def json_floats(data: JsonMapping, key: str, *, where: str = "") -> list[float]:
    """An array of numbers, or an empty list when the key is absent."""
    out: list[float] = []
    for i, item in enumerate(json_list(data, key, (), where=where)):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise _wrong(f"{key}[{i}]", "a number", item, where)
        out.append(float(item))
    return out


def json_strs(data: JsonMapping, key: str, *, where: str = "") -> list[str]:
    """An array of strings, or an empty list when the key is absent."""
    out: list[str] = []
    for i, item in enumerate(json_list(data, key, (), where=where)):
        if not isinstance(item, str):
            raise _wrong(f"{key}[{i}]", "a string", item, where)
        out.append(item)
    return out


def json_extra(data: JsonMapping, known: frozenset[str] | set[str]) -> JsonObject:
    """The keys a reader does not declare, kept (unchecked, in order) to be written back as they were read."""
    return {k: cast(JsonValue, v) for k, v in data.items() if k not in known}
