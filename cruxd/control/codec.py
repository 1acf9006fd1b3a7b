"""Records to JSON-ready dicts and back, for the leader's and agent's state files.

Generic over the dataclasses in this package: nested records, tuples, dicts with
string keys, enums and optionals are rebuilt from their type hints, and anything
that does not fit raises ValueError naming the field, so a damaged state file is
refused whole rather than half-loaded.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from typing import Any


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.repr}  # repr=False fields are caches
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
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if not f.repr or f.name not in data:
                continue
            kwargs[f.name] = from_dict(hints[f.name], data[f.name], f"{where}.{f.name}")
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
