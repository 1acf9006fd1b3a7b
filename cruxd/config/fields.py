"""Typed reads of one TOML section, and the default directories.

Kept apart from config.py so the checks (types, ranges, paths) read the same for
every key. Failures raise FieldError with the dotted key; config.py adds the file
name, so this module never needs to know where the text came from.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from cruxd.config.hostport import parse_hostport
from cruxd.errors import UsageError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class FieldError(UsageError):
    """A bad value at `key` (dotted); becomes a ConfigError once the file is known."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason, where=key)
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Range:
    """A closed interval, optionally open at the bottom: `(0, 3600]`."""

    lo: float
    hi: float
    lo_open: bool = False

    def holds(self, v: float) -> bool:
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}]"


def quote_key(key: str) -> str:
    """A key as TOML would need it written: bare when it can be, quoted otherwise."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def did_you_mean(word: str, choices: Collection[str], prefix: str = "", suffix: str = "") -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}{suffix}?" if close else ""


def describe(v: object) -> str:
    """A TOML value for an error message, in TOML's own terms."""
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, int):
        return f"the integer {v}"
    if isinstance(v, float):
        return f"the float {v!r}"
    if isinstance(v, str):
        return f"the string {json.dumps(v)}" if len(v) < 40 else "a long string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    return f"a {type(v).__name__}"  # TOML dates and times


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(v)


class Section:
    """The keys of one [section]; unknown keys are refused as soon as it is built."""

    def __init__(self, name: str, data: Mapping[str, object], keys: Collection[str],
                 base: Path | None, home: str) -> None:
        self.name = name
        self._data = data
        self._base = base
        self._home = home
        for key in data:
            if key not in keys:
                raise self.error(key, "unknown key" + did_you_mean(key, keys, f"{name}."))

    def error(self, key: str, reason: str) -> FieldError:
        return FieldError(f"{self.name}.{quote_key(key)}", reason)

    def _typed(self, key: str, default: object, want: tuple[type, ...], expected: str) -> object:
        v = self._data.get(key, default)
        # bool is an int subclass in Python, but `true` is no count in a config file.
        if isinstance(v, bool) != (bool in want) or not isinstance(v, want):
            raise self.error(key, f"expected {expected}, got {describe(v)}")
        return v

    def string(self, key: str, default: str) -> str:
        v = self._typed(key, default, (str,), "a string")
        assert isinstance(v, str)
        if "\0" in v:
            raise self.error(key, "contains a NUL character")
        return v

    def boolean(self, key: str, default: bool) -> bool:
        return bool(self._typed(key, default, (bool,), "a boolean (true or false)"))

    def integer(self, key: str, default: int, bounds: Range) -> int:
        v = self._typed(key, default, (int,), "an integer")
        assert isinstance(v, int)
        if not bounds.holds(v):
            raise self.error(key, f"must be in {bounds}, got {v}")
        return v

    def integer_or(self, key: str, default: int | str, bounds: Range, word: str) -> int | None:
        """An integer in `bounds`, or the string `word` (None)."""
        v = self._typed(key, default, (int, str), f'an integer in {bounds} or "{word}"')
        if isinstance(v, str):
            if v != word:
                raise self.error(key, f'expected an integer in {bounds} or "{word}", got '
                                 f"{describe(v)}")
            return None
        assert isinstance(v, int)
        if not bounds.holds(v):
            raise self.error(key, f'must be in {bounds} (or "{word}"), got {v}')
        return v

    def number(self, key: str, default: float, bounds: Range) -> float:
        v = self._typed(key, default, (int, float), "a number")
        assert isinstance(v, int | float)
        if not math.isfinite(v):
            raise self.error(key, f"expected a finite number, got {v}")
        if not bounds.holds(v):
            raise self.error(key, f"must be in {bounds}, got {_num(v)}")
        return float(v)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.string(key, default)
        if v not in choices:
            quoted = [json.dumps(c) for c in choices]
            options = " or ".join(quoted) if len(quoted) == 2 else "one of " + ", ".join(quoted)
            raise self.error(key, f"must be {options}, got {json.dumps(v)}"
                             + did_you_mean(v, choices, '"', '"'))
        return v

    def _array(self, key: str, item: type, expected: str) -> list[object]:
        v = self._typed(key, [], (list,), f"an array of {expected}")
        assert isinstance(v, list)
        for i, x in enumerate(v):
            if isinstance(x, bool) != (item is bool) or not isinstance(x, item):
                raise self.error(key, f"expected an array of {expected}, "
                                 f"got {describe(x)} at index {i}")
        return v

    def strings(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        if key not in self._data:
            return default
        return tuple(x for x in self._array(key, str, "strings") if isinstance(x, str))

    def integers(self, key: str) -> tuple[int, ...]:
        return tuple(x for x in self._array(key, int, "integers") if isinstance(x, int))

    def path(self, key: str) -> Path | None:
        """"" -> None; `~` is the home directory; relative paths are beside the file."""
        v = self.string(key, "")
        if not v:
            return None
        if v == "~" or v.startswith("~/"):
            v = self._home + v[1:]
        elif v.startswith("~"):
            raise self.error(key, f"only ~/ (this user's home) is expanded, got {json.dumps(v)}")
        # Text that is not a file (base None) has only the working directory to go by.
        return (self._base or Path.cwd()) / v

    def hostport(self, key: str, default: str, *, min_port: int, optional: bool = False) -> str:
        """A checked `host:port` text; "" passes through when optional (the caller's None)."""
        v = self.string(key, default)
        if v == "" and optional:
            return v
        try:
            _, port = parse_hostport(v)
        except ValueError as exc:
            raise self.error(key, str(exc)) from None
        if port < min_port:
            raise self.error(key, f"port must be in [{min_port}, 65535], got {port}")
        return v

    def hostports(self, key: str, *, min_port: int = 1) -> tuple[str, ...]:
        """An array of checked `host:port` texts, none twice."""
        out: list[str] = []
        for i, v in enumerate(self.strings(key)):
            try:
                _, port = parse_hostport(v)
            except ValueError as exc:
                raise self.error(key, f"[{i}]: {exc}") from None
            if port < min_port:
                raise self.error(key, f"[{i}]: port must be in [{min_port}, 65535], got {port}")
            if v in out:
                raise self.error(key, f"{v} is listed twice")
            out.append(v)
        return tuple(out)

    def has(self, key: str) -> bool:
        return key in self._data

    def addresses(self, key: str) -> tuple[str, ...]:
        """IP address texts, normalised (`fe80:0::1` -> `fe80::1`) so equal means equal."""
        out: list[str] = []
        for text in self.strings(key):
            try:
                addr = str(ipaddress.ip_address(text))
            except ValueError:
                raise self.error(key, f"{json.dumps(text)} is not an IPv4 or IPv6 address") \
                    from None
            if addr in out:
                raise self.error(key, f"{addr} is listed twice")
            out.append(addr)
        return tuple(out)


    def networks(self, key: str) -> tuple[str, ...]:
        """CIDR prefixes, normalised (`10.2.0.0/16`); host bits set are refused."""
        out: list[str] = []
        for text in self.strings(key):
            try:
                net = str(ipaddress.ip_network(text))
            except ValueError as exc:
                raise self.error(key, f"{json.dumps(text)} is not an IP prefix ({exc})") \
                    from None
            if net in out:
                raise self.error(key, f"{net} is listed twice")
            out.append(net)
        return tuple(out)


def home_dir(env: Mapping[str, str]) -> str:
    return env.get("HOME") or os.path.expanduser("~")


def _first(listing: str | None) -> str:
    # systemd joins several StateDirectory= entries with ':'; ours is the first.
    return (listing or "").split(":", 1)[0]


def default_state_dir(env: Mapping[str, str], euid: int) -> Path:
    if first := _first(env.get("STATE_DIRECTORY")):
        return Path(first)
    if euid == 0:
        return Path("/var/lib/crux")
    xdg = env.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says to ignore relative values
        return Path(xdg) / "crux"
    return Path(home_dir(env)) / ".local" / "state" / "crux"


def default_runtime_dir(env: Mapping[str, str], euid: int) -> Path:
    if first := _first(env.get("RUNTIME_DIRECTORY")):
        return Path(first)
    if euid == 0:
        return Path("/run/crux")
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "crux"
    return shared_tmp_runtime_dir(euid)


def shared_tmp_runtime_dir(euid: int) -> Path:
    """The last resort: a name in /tmp, which any user could have created first."""
    return Path(f"/tmp/crux-{euid}")


def private_dir_problem(path: Path, euid: int) -> str | None:
    """Create `path` 0700 if missing; why it cannot be trusted (another user's, a link,
    group- or world-writable: whoever can write there can swap the decision table), or
    None. For a directory in a place every user can write to, such as /tmp."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} exists and is not a directory; remove it or set daemon.runtime_dir"
    if st.st_uid != euid:
        return (f"{path} belongs to uid {st.st_uid}, not to this user ({euid}); another user "
                "may have created it: remove it or set daemon.runtime_dir")
    if st.st_mode & 0o022:
        return (f"{path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}); "
                "chmod 700 it or set daemon.runtime_dir")
    return None
