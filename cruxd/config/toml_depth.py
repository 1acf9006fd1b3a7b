"""How deep a TOML text nests its arrays and inline tables, found before tomllib parses it.

tomllib recurses once per level: a file nested 5,000 deep ends in a RecursionError thousands
of frames long. No cruxd key needs more than two levels, so a scan that bounds the depth
first turns such a file into one line naming where it went too deep.
"""

from __future__ import annotations

import re

MAX_DEPTH = 32

# what changes the depth or hides brackets: strings (multi-line first), comments, brackets
_TOKEN = re.compile(r'"""(?:\\.|[^\\])*?"""|\'\'\'.*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\''
                    r"|#[^\n]*|[\[\]{}]", re.DOTALL)
_KEY = re.compile(r"\s*([^=\[\]{}#\s][^=\n]*?)\s*=")


def too_deep(text: str, limit: int = MAX_DEPTH) -> tuple[int, str] | None:
    """(line, key written on that line or "") where nesting first passes `limit`, else None.

    Unterminated strings and unbalanced brackets are left for tomllib to report.
    """
    depth = 0
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, m.start()) + 1
                start = text.rfind("\n", 0, m.start()) + 1
                key = _KEY.match(text, start)
                return line, key.group(1) if key else ""
        elif tok in ("]", "}"):
            depth = max(depth - 1, 0)
    return None
