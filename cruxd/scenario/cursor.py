"""A validating cursor over parsed JSON/YAML that knows its JSON path.

Every accessor either returns a checked value or raises `ScenarioError` naming
the path (``$.jobs[2].hosts[0]``) and the reason, so a bad file gets one clear
line instead of a traceback.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from cruxd.config.statefile import read_bounded
from cruxd.errors import ScenarioError

# what a message may quote of the file: a word that could be a field, an id or a name
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/+=-]{0,39}")


class Cursor:
    def __init__(self, value: Any, path: str = "$") -> None:
        self.value = value
        self.path = path

    def fail(self, reason: str) -> ScenarioError:
        return ScenarioError(reason, path=self.path)

    # --- structure ------------------------------------------------------------
    def fields(self, required: set[str],
               optional: set[str] | frozenset[str] = frozenset()) -> Cursor:
        """Check this is an object with exactly the allowed keys."""
        if not isinstance(self.value, dict):
            raise self.fail(f"expected an object, got {_kind(self.value)}")
        for key in self.value:
            if not isinstance(key, str) or key not in required | optional:
                allowed = ", ".join(sorted(required | optional))
                if isinstance(key, str) and _NAME.fullmatch(key):  # a typo: name it
                    raise ScenarioError(f"unknown field {key!r} (allowed: {allowed})",
                                        path=self._child_path(key))
                # not a field name: this is not a scenario, and its text stays out of the
                # message (a password file's line parsed as a YAML key: issue 37)
                raise self.fail(f"a field that is not a field name (allowed: {allowed})")
        for key in sorted(required):
            if key not in self.value:
                raise self.fail(f"missing field {key!r}")
        return self

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def __getitem__(self, key: str) -> Cursor:
        return Cursor(self.value[key], self._child_path(key))

    def get(self, key: str) -> Cursor | None:
        return self[key] if self.has(key) and self.value[key] is not None else None

    def _child_path(self, key: object) -> str:
        k = str(key)
        return f"{self.path}.{k}" if k.isidentifier() else f"{self.path}[{json.dumps(k)}]"

    def items(self) -> Iterator[Cursor]:
        if not isinstance(self.value, list):
            raise self.fail(f"expected a list, got {_kind(self.value)}")
        for i, v in enumerate(self.value):
            yield Cursor(v, f"{self.path}[{i}]")

    def entries(self) -> Iterator[tuple[str, Cursor]]:
        if not isinstance(self.value, dict):
            raise self.fail(f"expected an object, got {_kind(self.value)}")
        for k, v in self.value.items():
            yield str(k), Cursor(v, self._child_path(k))

    # --- scalars --------------------------------------------------------------
    def string(self) -> str:
        if not isinstance(self.value, str) or not self.value:
            raise self.fail(f"expected a non-empty string, got {_kind(self.value)}")
        return self.value

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.fail(f"expected true or false, got {_kind(self.value)}")
        return self.value

    def integer(self, lo: int | None = None, hi: int | None = None) -> int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"expected an integer, got {_kind(v)}")
        self._range(v, lo, hi)
        return v

    def number(self, lo: float | None = None, hi: float | None = None, *,
            positive: bool = False) -> float:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(f"expected a number, got {_kind(v)}")
        if not math.isfinite(v):
            raise self.fail(f"expected a finite number, got {v}")
        if positive and v <= 0:
            raise self.fail(f"must be > 0, got {v}")
        self._range(v, lo, hi)
        return float(v)

    def _range(self, v: float, lo: float | None, hi: float | None) -> None:
        if lo is not None and v < lo:
            raise self.fail(f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise self.fail(f"must be <= {hi}, got {v}")


def _kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return f"the string {v!r}" if _NAME.fullmatch(v) else "a string"
    return {dict: "an object", list: "a list", int: f"the integer {v}",
            float: f"the number {v}"}.get(type(v), type(v).__name__)


class _Constant(ValueError):
    """NaN or Infinity in a JSON file (json.loads takes them): the message is ours."""


def _no_constants(name: str) -> Any:
    raise _Constant(f"{name} is not valid JSON")


MAX_DOCUMENT = 64 << 20  # the largest bundled scenario is a few hundred KB


def load_document(path: Path) -> Any:
    """Parse a JSON or YAML file (by suffix); ScenarioError naming the file on failure. A
    regular file of at most MAX_DOCUMENT bytes: /dev/zero read until MemoryError, and a
    FIFO hung `cruxctl plan` (issue 37)."""
    try:
        raw = read_bounded(path, MAX_DOCUMENT)
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror}", where=str(path)) from exc
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ScenarioError("not UTF-8 text", where=str(path)) from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            return yaml.safe_load(text)
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                            where=str(path)) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ScenarioError(f"invalid YAML{at}: {exc.problem or exc.context}",
                            where=str(path)) from exc
    except _Constant as exc:
        raise ScenarioError(f"cannot parse: {exc}", where=str(path)) from exc
    except (yaml.YAMLError, ValueError) as exc:  # the kind only: a message may quote the file
        kind = "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"
        raise ScenarioError(f"cannot parse it as {kind} ({type(exc).__name__})",
                            where=str(path)) from exc
    except RecursionError:
        raise ScenarioError("nested too deeply", where=str(path)) from None
