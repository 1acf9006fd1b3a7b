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
from collections.abc import Callable
from typing import Any


@functools.cache
def persisted_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.repr)  # repr=False: caches


@functools.cache
def _hints(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((name, hints[name]) for name in persisted_fields(cls))


@functools.cache
def frozen_record_type(cls: type) -> bool:
    return bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]


def to_dict(obj: Any) -> Any:
    """`obj` as JSON-ready data (codec_json.to_json writes the same as text)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: to_dict(getattr(obj, name)) for name in persisted_fields(type(obj))}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)  # "inf": JSON has no infinity
    return obj


def from_dict(cls: Any, data: Any, where: str = "$") -> Any:
    """`data` as a `cls`; ValueError naming the field (from `where`) for data that is not
    one. Each type's decoder is built once (_decoder): decoding a 10,000-host state file
    by dispatching on the type hints at every value took a newly elected leader 12-18 s
    of a contended box (bench/ha.py --simulated 10000)."""
    try:
        return _decoder(cls)(data)
    except _Bad as bad:
        raise ValueError(f"{where}{''.join(reversed(bad.path))}: {bad.why}") from None


class _Bad(Exception):
    """A decoding error on its way out, gathering the path (innermost first)."""

    def __init__(self, why: str) -> None:
        self.why = why
        self.path: list[str] = []


Decoder = Callable[[Any], Any]


@functools.cache
def _decoder(cls: Any) -> Decoder:
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        return _optional(_decoder(next(a for a in args if a is not type(None))),
                         type(None) in args)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return _record(cls)
    if origin is tuple:
        return _sequence(_decoder(args[0] if args else Any))
    if origin is dict:
        return _mapping(_decoder(args[1]))
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return _enum(cls)
    return _SCALARS.get(cls) or _unknown(cls)


def _optional(inner: Decoder, nullable: bool) -> Decoder:
    def decode(data: Any) -> Any:
        return None if data is None and nullable else inner(data)
    return decode


def _record(cls: type) -> Decoder:
    fields = [(name, _decoder(hint)) for name, hint in _hints(cls)]

    def decode(data: Any) -> Any:
        if not isinstance(data, dict):
            raise _Bad(f"expected an object for {cls.__name__}")
        kwargs = {}
        for name, dec in fields:
            if name in data:
                try:
                    kwargs[name] = dec(data[name])
                except _Bad as bad:
                    bad.path.append(f".{name}")
                    raise
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise _Bad(str(exc)) from None
    return decode


def _sequence(item: Decoder) -> Decoder:
    def decode(data: Any) -> Any:
        if not isinstance(data, list):
            raise _Bad("expected a list")
        out = []
        for i, v in enumerate(data):
            try:
                out.append(item(v))
            except _Bad as bad:
                bad.path.append(f"[{i}]")
                raise
        return tuple(out)
    return decode


def _mapping(value: Decoder) -> Decoder:
    def decode(data: Any) -> Any:
        if not isinstance(data, dict):
            raise _Bad("expected an object")
        out = {}
        for k, v in data.items():
            try:
                out[k] = value(v)
            except _Bad as bad:
                bad.path.append(f".{k}")
                raise
        return out
    return decode


def _enum(cls: type[enum.Enum]) -> Decoder:
    def decode(data: Any) -> Any:
        try:
            return cls(data)
        except ValueError:
            raise _Bad(f"{data!r} is not a {cls.__name__}") from None
    return decode


def _float(data: Any) -> float:
    if isinstance(data, str) and data in ("inf", "-inf", "nan"):
        return float(data)
    if isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    raise _Bad("expected a number")


def _int(data: Any) -> int:
    if isinstance(data, int) and not isinstance(data, bool):
        return data
    raise _Bad("expected an integer")


def _exactly(kind: type) -> Decoder:
    def decode(data: Any) -> Any:
        if isinstance(data, kind):
            return data
        raise _Bad(f"expected a {kind.__name__}")
    return decode


def _unknown(cls: Any) -> Decoder:
    def decode(data: Any) -> Any:
        raise _Bad(f"cannot decode type {cls!r}")
    return decode


_SCALARS: dict[Any, Decoder] = {float: _float, int: _int, str: _exactly(str),
                                bool: _exactly(bool), Any: lambda data: data}
