"""Where the files beside the code lie: the systemd unit, the example configurations and
scenarios, the placement hints' JSON schemas.

A wheel carries them as package data under cruxd/share/ (setup.py copies them there at
build); a checkout (an editable install, tests) has them at the top level of the tree.
"""

from __future__ import annotations

from pathlib import Path

# kind -> (its folder in the wheel, under cruxd/share/; its folder in a checkout)
KINDS = {"systemd": ("systemd", "systemd"), "examples": ("examples", "examples"),
         "hints": ("hints", "docs/hints")}


def path(kind: str) -> Path:
    """The folder of `kind` (a key of KINDS) in this install; FileNotFoundError if absent."""
    packaged, checkout = KINDS[kind]
    here = Path(__file__).resolve().parent
    for candidate in (here / "share" / packaged, here.parent / checkout):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"crux's {kind} files are not installed (looked in "
                            f"{here / 'share' / packaged} and {here.parent / checkout})")
