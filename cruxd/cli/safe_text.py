"""Text that other users, their jobs or remote hosts wrote, made safe for a terminal and for
rich before a person's view prints it (issue 37: a job id `[/red]` crashed `cruxctl status`
with a MarkupError; job ids and command lines carrying ESC, OSC or `[link=...]` reached
root's terminal raw). `--json` prints the messages as they are: JSON escapes control
characters, and a program reads it, not a terminal."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich.markup import escape

# C0 controls (ESC, BEL ends an OSC), DEL, C1 controls (CSI as one byte), and the Unicode
# line and paragraph separators and bidirectional overrides that reorder what is shown
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
M = TypeVar("M", bound=Message)


def plain(text: str) -> str:
    """`text` with every control character shown as `?`."""
    return _UNSAFE.sub("?", text)


def safe(text: str) -> str:
    """`text` for rich: control characters shown as `?`, markup escaped."""
    return escape(plain(text))


def scrub(msg: M) -> M:
    """A copy of `msg` with every string in it (nested messages, repeated fields and map
    keys included) made `safe`, for the views that print it with rich."""
    out = _copy(msg)
    _scrub(out)
    return out


def _scrub(msg: Message) -> None:
    for fd, value in msg.ListFields():
        if fd.type == FieldDescriptor.TYPE_STRING:
            if fd.is_repeated:
                value[:] = [safe(v) for v in value]
            else:
                setattr(msg, fd.name, safe(value))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            kind = fd.message_type
            assert kind is not None
            if kind.GetOptions().map_entry:
                _scrub_map(kind.fields_by_name["key"], kind.fields_by_name["value"], value)
            elif fd.is_repeated:
                for m in value:
                    _scrub(m)
            else:
                _scrub(value)


def _scrub_map(key: FieldDescriptor, val: FieldDescriptor, value: Any) -> None:
    items = list(value.items())
    if val.type == FieldDescriptor.TYPE_MESSAGE:
        for _, v in items:
            _scrub(v)
        if key.type == FieldDescriptor.TYPE_STRING:  # renamed keys: rebuild the map
            copies = [(safe(k), _copy(v)) for k, v in items]
            value.clear()
            for k, c in copies:
                value[k].CopyFrom(c)
        return
    value.clear()
    for k, v in items:
        value[safe(k) if key.type == FieldDescriptor.TYPE_STRING else k] = (
            safe(v) if val.type == FieldDescriptor.TYPE_STRING else v)


def _copy(msg: M) -> M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out
