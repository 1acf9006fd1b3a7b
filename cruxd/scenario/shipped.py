"""The scenarios shipped with crux (`cruxd/data/scenarios/NAME.json`), by name: light, so the
CLI can list them without importing the scenario parser and the scheduler behind it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled(name: str) -> Path | None:
    """A scenario shipped with crux, if there is one of that name."""
    res = resources.files("cruxd.data").joinpath("scenarios", f"{name}.json")
    return Path(str(res)) if res.is_file() else None


def bundled_names() -> list[str]:
    folder = resources.files("cruxd.data").joinpath("scenarios")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))
