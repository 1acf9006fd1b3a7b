"""Records to JSON-ready dicts and back, for the leader's and agent's state files.

Generic over the dataclasses in this package: nested records, tuples, dicts with
string keys, enums and optionals are rebuilt from their type hints, and anything
that does not fit raises ValueError naming the field, so a damaged state file is
refused whole rather than half-loaded.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from typing import Any


@functools.cache
def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.repr)  # repr=False: caches


@functools.cache
def _hints(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((name, hints[name]) for name in _fields(cls))


@functools.cache
def _frozen(cls: type) -> bool:
    return bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]


def to_dict(obj: Any, memo: Memo | None = None) -> Any:
    """`obj` as JSON-ready data. With `memo`, a frozen record met in the memo's previous
    round is not converted again (see Memo)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if memo is not None and _frozen(type(obj)):
            return memo.get(obj)
        return {name: to_dict(getattr(obj, name), memo) for name in _fields(type(obj))}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_dict(v, memo) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v, memo) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)  # "inf": JSON has no infinity
    return obj


class Memo:
    """to_dict of frozen records, kept from one round (one snapshot of the leader's state)
    to the next. A re-plan rebuilds few of its 80,000 routes at 10,000 hosts, and a report
    few of a host's records; converting all of them again took 1.4 s per save.

    Keyed by identity, holding the record itself, so an id is never reused while its entry
    lives. Only frozen records are kept, and the persisted ones hold tuples, never a dict
    or list that could change under the kept conversion (tests/test_codec_memo.py checks
    this). The returned dicts are shared between rounds: callers never change them."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[Any, Any]] = {}
        self._this: dict[int, tuple[Any, Any]] = {}
        self.hits = 0
        self.misses = 0

    def turn(self) -> None:
        """Start a round: what the previous round did not meet is dropped, so the memo
        never holds more than two rounds' records."""
        self._last, self._this = self._this, {}

    def get(self, obj: Any) -> Any:
        key = id(obj)
        hit = self._this.get(key) or self._last.get(key)
        if hit is not None and hit[0] is obj:
            self.hits += 1
            self._this[key] = hit
            return hit[1]
        self.misses += 1
        cls: type = type(obj)
        out = {name: to_dict(getattr(obj, name), self) for name in _fields(cls)}
        self._this[key] = (obj, out)
        return out


def from_dict(cls: Any, data: Any, where: str = "$") -> Any:
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return from_dict(inner[0], data, where)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object for {cls.__name__}")
        kwargs = {}
        for name, hint in _hints(cls):
            if name in data:
                kwargs[name] = from_dict(hint, data[name], f"{where}.{name}")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list")
        item = args[0] if args else Any
        return tuple(from_dict(item, v, f"{where}[{i}]") for i, v in enumerate(data))
    if origin is dict:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object")
        return {k: from_dict(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        try:
            return cls(data)
        except ValueError:
            raise ValueError(f"{where}: {data!r} is not a {cls.__name__}") from None
    if cls is float:
        if isinstance(data, str) and data in ("inf", "-inf", "nan"):
            return float(data)
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise ValueError(f"{where}: expected a number")
    if cls is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise ValueError(f"{where}: expected an integer")
    if cls is str or cls is bool:
        if isinstance(data, cls):
            return data
        raise ValueError(f"{where}: expected a {cls.__name__}")
    if cls is Any:
        return data
    raise ValueError(f"{where}: cannot decode type {cls!r}")
