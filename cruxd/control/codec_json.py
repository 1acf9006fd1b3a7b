"""Records straight to compact JSON text, with the text of unchanged records kept between
saves: `to_json(obj)` is `json.dumps(to_dict(obj), separators=(",", ":"),
allow_nan=False)`, character for character.

Why text and not dicts: the leader saves its whole view after each plan. At 10,000 hosts
that is a 27 MB document; keeping the records' dicts (codec.Memo before) still left
json.dumps encoding all of it again, 0.5 s holding the GIL per save, while the plan's
fan-out waited for it. The text of a frozen record cannot change, so it is kept by
identity and a save joins kept strings, encoding only what changed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

from cruxd.control.codec import frozen_record_type, persisted_fields

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def to_json(obj: Any, memo: Memo | None = None) -> str:
    """`obj` as compact JSON text; with `memo`, the text of a frozen record (or of a tuple
    of them) met in the memo's previous round is not built again."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if memo is not None and frozen_record_type(type(obj)):
            return memo.text(obj)
        return _record(obj, memo)
    if isinstance(obj, enum.Enum):
        return _encode(obj.value)
    if isinstance(obj, dict):
        return "{" + ",".join(_encode(str(k)) + ":" + to_json(v, memo)
                              for k, v in obj.items()) + "}"
    if isinstance(obj, tuple) and memo is not None and obj and _is_frozen(obj[0]):
        return memo.text(obj)  # a record's tuple of records: the plan's routes
    if isinstance(obj, list | tuple):
        return "[" + ",".join(to_json(v, memo) for v in obj) + "]"
    if isinstance(obj, float) and not math.isfinite(obj):
        return _encode(repr(obj))  # "inf", as to_dict writes it: JSON has no infinity
    return _encode(obj)


def _record(obj: Any, memo: Memo | None) -> str:
    cls: type = type(obj)
    return "{" + ",".join(_encode(name) + ":" + to_json(getattr(obj, name), memo)
                          for name in persisted_fields(cls)) + "}"


def _is_frozen(v: Any) -> bool:
    cls: type = type(v)
    return dataclasses.is_dataclass(v) and not isinstance(v, type) and frozen_record_type(cls)


class Memo:
    """to_json of frozen records and of tuples of them, kept from one round (one save of
    the leader's state) to the next. A re-plan rebuilds few of its 80,000 routes at 10,000
    hosts, and a report few of a host's records.

    Keyed by identity, holding the object itself, so an id is never reused while its entry
    lives. A frozen record's text is final only if all it holds is: the persisted ones hold
    tuples, never a dict or list (tests/test_codec_memo.py checks this), and a tuple is
    kept only when it holds frozen records (its first item is one; the records' tuples
    are of one type)."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[Any, str]] = {}
        self._this: dict[int, tuple[Any, str]] = {}
        self.hits = 0
        self.misses = 0

    def turn(self) -> None:
        """Start a round: what the previous round did not meet is dropped, so the memo
        never holds more than two rounds' objects."""
        self._last, self._this = self._this, {}

    def text(self, obj: Any) -> str:
        key = id(obj)
        hit = self._this.get(key) or self._last.get(key)
        if hit is not None and hit[0] is obj:
            self.hits += 1
            self._this[key] = hit
            return hit[1]
        self.misses += 1
        if isinstance(obj, tuple):
            out = "[" + ",".join(to_json(v, self) for v in obj) + "]"
        else:
            out = _record(obj, self)
        self._this[key] = (obj, out)
        return out
