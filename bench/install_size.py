"""What each kind of host installs: the size of a fresh venv with the crux wheel and a set of
extras, and the largest distributions in it.

Protocol
  * The wheel: --wheel, else `python -m build --wheel` of this checkout into a temporary folder.
  * For each install (agent: the wheel alone; leader: [leader]; leader-ha: [leader,ha];
    all: [all]), a new venv (`python -m venv`, pip's own files counted as the baseline), then
    `pip install WHEEL[extras]`; size = bytes of regular files under the venv minus the
    baseline, in MiB. pip's cache is used, so the time column is install time, not download.
  * The largest distributions: summed from each one's RECORD (size column).

    .venv/bin/python bench/install_size.py [--wheel dist/crux-*.whl] [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

# bench/ is on sys.path when run as a script
from tables import preamble, table

REPO = Path(__file__).resolve().parent.parent
INSTALLS = {"agent": "", "leader": "[leader]", "leader-ha": "[leader,ha]", "all": "[all]"}


def mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and not f.is_symlink()) / 2**20


def distributions(site: Path) -> dict[str, float]:
    """MiB per installed distribution, from the sizes its RECORD lists."""
    out = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0]
        with open(record, newline="") as f:
            out[name] = sum(int(row[2]) for row in csv.reader(f)
                            if len(row) == 3 and row[2].isdigit()) / 2**20
    return out


def measure(wheel: Path, extras: str, where: Path) -> dict[str, object]:
    venv.create(where, with_pip=True)
    base = mib(where)
    started = time.monotonic()
    subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "-q",
                    f"{wheel}{extras}"], check=True, capture_output=True, timeout=1800)
    (site,) = where.glob("lib/python3*/site-packages")
    dists = distributions(site)
    top = sorted(((n, s) for n, s in dists.items() if n not in ("pip", "setuptools")),
                 key=lambda x: -x[1])[:5]
    return {"mib": round(mib(where) - base, 1), "seconds": round(time.monotonic() - started, 1),
            "largest": {n: round(s, 1) for n, s in top}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="a built crux wheel (default: build one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="crux-size-") as tmp:
        wheel = args.wheel
        if wheel is None:
            subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp, str(REPO)],
                           check=True, capture_output=True, timeout=1800)
            (wheel,) = Path(tmp).glob("crux-*.whl")
        results = {name: measure(wheel.resolve(), extras, Path(tmp) / name)
                   for name, extras in INSTALLS.items()}
    if args.json:
        print(json.dumps({"wheel": wheel.name, "installs": results}, indent=2))
        return 0
    preamble(f"wheel {wheel.name}")
    print(table(["install", "extras", "MiB", "install s", "largest distributions (MiB)"],
                [[n, INSTALLS[n] or "-", f"{r['mib']:.1f}", f"{r['seconds']:.1f}",
                  ", ".join(f"{d} {s:.1f}" for d, s in r["largest"].items())]
                 for n, r in results.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
