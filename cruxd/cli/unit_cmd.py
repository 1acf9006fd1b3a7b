"""`cruxctl install-unit`: put the systemd files this install ships where systemd reads them.

The unit's ExecStart names this install's own `cruxd` (a venv under /opt, say), so a wheel
user needs no link into /usr/local/bin. Local files (an administrator's install, not a
distribution package's) go under /etc: the unit in /etc/systemd/system, the group in
/etc/sysusers.d, the runtime directory in /etc/tmpfiles.d. /etc/default/cruxd is written
only when absent: it is the operator's. A unit that differs from the shipped one is kept
unless --force (changes belong in a drop-in: `systemctl edit cruxd`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cruxd import share
from cruxd.errors import CruxError, UsageError

SHIPPED_EXEC = "/usr/local/bin/cruxd"  # what systemd/cruxd.service names
HIDDEN = ("/home/", "/root/", "/run/user/")


@dataclass(frozen=True)
class Target:
    source: str  # the shipped file's name in share/systemd
    dest: str  # where it goes, relative to --root
    keep_existing: bool = False  # the operator's file once it exists


TARGETS = (Target("cruxd.service", "etc/systemd/system/cruxd.service"),
           Target("crux.sysusers", "etc/sysusers.d/crux.conf"),
           Target("crux.tmpfiles", "etc/tmpfiles.d/crux.conf"),
           Target("cruxd.env.example", "etc/default/cruxd", keep_existing=True))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "install-unit", help="install the systemd unit, sysusers and tmpfiles files",
        description="Install the systemd files this crux install ships: cruxd.service (its "
                    "ExecStart pointed at this install's cruxd), the group crux (sysusers.d) "
                    "and /run/crux (tmpfiles.d), and /etc/default/cruxd if absent. Then "
                    "create the group and reload systemd. Does not enable or start cruxd.",
        epilog="Exit status: 0 ok, 1 cannot write or run systemd's tools, 2 bad input (a "
               "changed unit without --force).")
    p.add_argument("--root", type=Path, default=Path("/"), metavar="DIR",
                   help="install under DIR instead of / (an image being built); systemd's "
                        "tools are then not run")
    p.add_argument("--cruxd", metavar="PATH",
                   help="the cruxd the unit runs (default: this install's)")
    p.add_argument("--force", action="store_true",
                   help="replace an installed unit that differs from the shipped one")
    p.add_argument("--dry-run", action="store_true", help="say what would be done; do nothing")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")


def unit_text(shipped: str, cruxd: str) -> str:
    """The shipped unit with its ExecStart's program replaced by `cruxd`."""
    if any(c.isspace() for c in cruxd) or not cruxd.startswith("/"):
        raise UsageError(f"{cruxd!r}: needs an absolute path without spaces (systemd splits "
                         "ExecStart on whitespace)", where="--cruxd")
    if cruxd.startswith(HIDDEN):  # the unit's ProtectHome=yes: systemd could not exec it
        raise UsageError(f"{cruxd}: the unit runs with ProtectHome=yes, which hides /home, "
                         "/root and /run/user; install crux elsewhere (/opt/crux, say)",
                         where="--cruxd")
    text, n = re.subn(rf"^ExecStart={re.escape(SHIPPED_EXEC)} ", f"ExecStart={cruxd} ",
                      shipped, flags=re.MULTILINE)
    if n != 1:
        raise CruxError(f"the shipped cruxd.service has no 'ExecStart={SHIPPED_EXEC} ' line")
    return text


def plan(root: Path, files: dict[str, str], force: bool) -> list[dict[str, str]]:
    """(dest, action) for each target: write, unchanged, kept (the operator's), or refused.
    `files` maps each source name to the text to install."""
    out = []
    for t in TARGETS:
        dest = root / t.dest
        want = files[t.source]
        if not dest.exists():
            action = "write"
        elif dest.read_text(errors="replace") == want:
            action = "unchanged"
        elif t.keep_existing:
            action = "kept"
        else:
            action = "write" if force else "refused"
        out.append({"path": str(dest), "source": t.source, "action": action})
    return out


def _this_cruxd() -> str:
    beside = Path(sys.argv[0]).resolve().parent / "cruxd"  # the venv's bin/, with cruxctl
    found = str(beside) if beside.is_file() else shutil.which("cruxd")
    if found is None:
        raise UsageError("cannot find this install's cruxd; name it", where="--cruxd")
    return str(Path(found).absolute())


def cmd_install_unit(args: argparse.Namespace) -> int:
    src = share.path("systemd")
    files = {t.source: (src / t.source).read_text() for t in TARGETS}
    cruxd = args.cruxd or _this_cruxd()
    files["cruxd.service"] = unit_text(files["cruxd.service"], cruxd)
    steps = plan(args.root, files, args.force)
    refused = [s["path"] for s in steps if s["action"] == "refused"]
    live = args.root.resolve() == Path("/") and not args.dry_run
    if not args.dry_run and not refused:
        for s in steps:
            if s["action"] == "write":
                _write(Path(s["path"]), files[s["source"]])
    ran = _systemd_tools(args.root) if live and not refused else []
    if args.json:
        print(json.dumps({"cruxd": cruxd, "files": steps, "ran": ran, "dry_run": args.dry_run,
                          "refused": refused}, indent=2))
    else:
        for s in steps:
            verb = {"write": "would write" if args.dry_run else "wrote"}.get(s["action"],
                                                                          s["action"])
            print(f"{verb:<12} {s['path']}")
        for cmd in ran:
            print(f"ran          {cmd}")
    if refused:
        raise UsageError(f"{refused[0]} differs from the shipped unit; put local changes in a "
                         "drop-in (systemctl edit cruxd), or --force to replace it",
                         where="install-unit")
    if not args.json and not args.dry_run:
        print(f"next: put the configuration in {args.root / 'etc/crux/cruxd.toml'}, then "
              "systemctl enable --now cruxd")
    return 0


def _write(dest: Path, text: str) -> None:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.crux-tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError as exc:
        raise CruxError(f"cannot write {dest}: {exc.strerror or exc}") from None


def _systemd_tools(root: Path) -> list[str]:
    """Create the group now (the unit runs with Group=crux) and reload systemd, where this
    host runs systemd; each command as run."""
    if not Path("/run/systemd/system").is_dir():
        return []
    cmds = [["systemd-sysusers", str(root / "etc/sysusers.d/crux.conf")],
            ["systemctl", "daemon-reload"]]
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise CruxError(f"{' '.join(cmd)}: {(r.stderr.strip() or 'failed')[:300]}")
    return [" ".join(c) for c in cmds]
