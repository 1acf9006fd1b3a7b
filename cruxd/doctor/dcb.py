"""The DCB checks of `cruxctl doctor`: DSCP trust, PFC behind crux's levels, ECN.

Read with iproute2's `dcb` (dcb-app(8), dcb-pfc(8)); a NIC or driver without DCB (a veth, a
VM's NIC) answers "Operation not supported" and the verdict is unknown, with the command an
operator can run on the real host. Where Mellanox's `mlnx_qos` is installed it answers the
trust mode too. ECN/CNP is mlx5's sysfs (`/sys/class/net/DEV/ecn/roce_{rp,np}/enable/P`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from cruxd.doctor.checks import FAIL, OK, UNKNOWN, WARN, Check

Run = Callable[[list[str]], tuple[int, str]]  # (exit status, stdout + stderr)


def run(cmd: list[str]) -> tuple[int, str]:
    """A tool's answer, bounded in time; 127 when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return 127, f"{cmd[0]}: not installed"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return r.returncode, (r.stdout + r.stderr)[:65536]


def dscp_map(text: str) -> dict[int, int]:
    """`dcb app show dev DEV dscp-prio`: "dscp-prio 0:0 24:3 26:3" -> {dscp: priority}."""
    return {int(d): int(p) for d, p in re.findall(r"\b(\d+):(\d+)\b", text)
            if int(d) < 64 and int(p) < 8}


def pfc_on(text: str) -> set[int]:
    """`dcb pfc show dev DEV prio-pfc`: "prio-pfc 0:off 1:off 2:off 3:on ..." -> {3}."""
    return {int(p) for p, on in re.findall(r"\b([0-7]):(on|off)\b", text) if on == "on"}


def priorities(dscp: Sequence[int], mapping: dict[int, int]) -> dict[int, int]:
    """Each DSCP's priority: the host's map, else the usual default (DSCP / 8)."""
    return {d: mapping.get(d, d >> 3) for d in dscp}


def check_trust(dev: str, runner: Run = run) -> Check:
    rc, out = runner(["mlnx_qos", "-i", dev])
    if rc == 0 and (m := re.search(r"trust state:\s*(\w+)", out, re.I)):
        state = m.group(1).lower()
        if state == "dscp":
            return Check(f"dscp-trust {dev}", OK, "mlnx_qos: the NIC trusts DSCP")
        return Check(f"dscp-trust {dev}", FAIL, f"mlnx_qos: the NIC trusts {state}, not DSCP: "
                     "crux's levels (DSCP) do not pick its queues", f"mlnx_qos -i {dev} "
                     "--trust dscp")
    rc, out = runner(["dcb", "apptrust", "show", "dev", dev])
    if rc == 0 and "order" in out:
        order = out.split("order", 1)[1].split()
        if order[:1] == ["dscp"]:
            return Check(f"dscp-trust {dev}", OK, f"dcb apptrust: {' '.join(order)}")
        if "dscp" in order:
            return Check(f"dscp-trust {dev}", WARN, f"dcb apptrust order {' '.join(order)}: "
                         "DSCP is trusted after another selector", f"dcb apptrust set dev "
                         f"{dev} order dscp")
        return Check(f"dscp-trust {dev}", FAIL, f"dcb apptrust order {' '.join(order)}: DSCP "
                     "is not trusted", f"dcb apptrust set dev {dev} order dscp")
    return Check(f"dscp-trust {dev}", UNKNOWN, f"neither mlnx_qos nor dcb apptrust answers "
                 f"for {dev} ({out.strip().splitlines()[-1] if out.strip() else 'no output'})",
                 f"on the real NIC: mlnx_qos -i {dev}, or dcb apptrust show dev {dev}")


def check_pfc(dev: str, dscp: Sequence[int], runner: Run = run, *,
              lossless: Sequence[int] | None = None) -> Check:
    """PFC on the priorities crux's levels map to: lossless RoCE. `lossless`: the
    configured `[leader] lossless_priorities` (None: not declared; (): lossy RoCE)."""
    rc, out = runner(["dcb", "pfc", "show", "dev", dev, "prio-pfc"])
    if rc != 0 or "prio-pfc" not in out:
        return Check(f"pfc {dev}", UNKNOWN, f"dcb pfc does not answer for {dev} "
                     f"({out.strip().splitlines()[-1] if out.strip() else 'no output'})",
                     f"on the real NIC: dcb pfc show dev {dev}")
    on = pfc_on(out)
    rc, app = runner(["dcb", "app", "show", "dev", dev, "dscp-prio"])
    prio = priorities(dscp, dscp_map(app) if rc == 0 else {})
    lossy = sorted({p for p in prio.values() if p not in on})
    where = ", ".join(f"DSCP {d}->{p}" for d, p in sorted(prio.items()))
    unpaused = sorted(set(lossless or ()) - on)
    if unpaused:  # the configuration says lossless, this NIC does not pause them
        return Check(f"pfc {dev}", FAIL, f"[leader] lossless_priorities = "
                     f"{sorted(lossless or ())}, but PFC is off here on {unpaused} (PFC on "
                     f"{sorted(on)}; {where})", f"dcb pfc set dev {dev} prio-pfc "
                     + " ".join(f"{p}:on" for p in unpaused)
                     + ", and the same on the switch ports (docs/operations.md)")
    if lossless == () and lossy:
        return Check(f"pfc {dev}", OK, f"lossy RoCE, as configured (lossless_priorities = "
                     f"[]; {where})")
    if not lossy:
        return Check(f"pfc {dev}", OK, f"PFC on every priority crux's levels use ({where})")
    if not on:
        return Check(f"pfc {dev}", WARN, f"PFC is off on every priority: RoCE here is lossy "
                     f"({where})", "docs/operations.md: one lossless class (crux decides paths "
                     "only), two or three, or lossy RoCE with 8 classes")
    return Check(f"pfc {dev}", FAIL, f"crux's levels map to priorities {lossy} where PFC is "
                 f"off (PFC on {sorted(on)}; {where}): those jobs' RoCE is lossy",
                 "map [leader] dscp onto the lossless priorities, or enable PFC on these "
                 "(docs/operations.md)")


def check_ecn(sys_root: Path, dev: str, dscp: Sequence[int]) -> Check:
    base = sys_root / "class" / "net" / dev / "ecn"
    if not base.is_dir():
        return Check(f"ecn {dev}", UNKNOWN, f"no ECN settings in sysfs for {dev} (mlx5 has "
                     "/sys/class/net/DEV/ecn)", "check DCQCN with the NIC vendor's tool")
    prios = sorted({d >> 3 for d in dscp})
    off = []
    for side in ("roce_rp", "roce_np"):  # reaction point (sender), notification (receiver)
        for p in prios:
            try:
                value = (base / side / "enable" / str(p)).read_text().strip()
            except OSError:
                value = "?"
            if value != "1":
                off.append(f"{side}/{p}")
    if not off:
        return Check(f"ecn {dev}", OK, f"DCQCN (ECN/CNP) on for priorities {prios}")
    return Check(f"ecn {dev}", WARN, f"ECN/CNP off for {', '.join(off)}: congestion is "
                 "left to PFC alone", f"echo 1 > /sys/class/net/{dev}/ecn/roce_rp/enable/P "
                 "and .../roce_np/enable/P for each priority")


__all__ = ["FAIL", "Run", "check_ecn", "check_pfc", "check_trust", "dscp_map", "pfc_on",
           "priorities", "run"]
