"""Slurm `topology.conf` for the topology/tree plugin (pure). See docs/hints/volcano-slurm.md.

Leaves list their hosts (`Nodes=`), pods list their leaves, and one top switch
lists the pods when cores or several pods exist. The tree plugin needs a tree, so
a dual-homed host appears under its first leaf only; the header names them.
Switch names are sanitized (Slurm parses them as hostlists); host names must
already be Slurm node names, and one Slurm cannot parse is left out and counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from cruxd.hints.fabric_view import SCHEMA_VERSION, FabricView, natural
from cruxd.hints.volcano import GENERATOR, has_fabric_tier, unique_names

_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")


def slurm_name(raw: str) -> str:
    """Characters a hostlist parses as themselves ('[', ',', '=', spaces do not)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", raw).strip("-_.")


def compress(names: Iterable[str]) -> str:
    """Slurm hostlist: h0,h1,h2,h5 -> h[0-2,5]. Zero-padded numbers (h01) only share a
    bracket with numbers of the same width, because h[01-10] means h01..h10 but
    h[1-10] means h1..h10; names without trailing digits stay as they are."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        m = _TRAILING_DIGITS.match(name)
        if not m:
            plain.append(name)
            continue
        prefix, digits = m.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    parts = sorted(plain, key=natural)
    for (prefix, width), nums in sorted(groups.items(), key=lambda g: (natural(g[0][0]),
                                                                       g[0][1])):
        nums.sort()
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        runs: list[list[int]] = []
        for n in nums:
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        spans = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}"
                 for a, b in runs]
        parts.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(parts)


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"bad brackets in hostlist {expr!r}")
        cur += ch
    out.append(cur)
    return out


def expand(expr: str) -> list[str]:
    """Inverse of `compress` for the single-bracket form Slurm writes: prefix[a-b,c]suffix."""
    out: list[str] = []
    if not expr:
        return out
    for part in _split_top(expr):
        m = re.fullmatch(r"([^\[\]]*)\[([0-9,-]+)\]([^\[\]]*)", part)
        if not m:
            if not part or "[" in part or "]" in part:
                raise ValueError(f"bad hostlist item {part!r} in {expr!r}")
            out.append(part)
            continue
        prefix, body, suffix = m.groups()
        for span in body.split(","):
            lo, _, hi = span.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"bad range {span!r} in {expr!r}")
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            end = int(hi) if hi else int(lo)
            if end < int(lo):
                raise ValueError(f"descending range {span!r} in {expr!r}")
            out.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(lo), end + 1))
    return out


def _stamp(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def topology_conf(view: FabricView) -> str:
    fabric = view.name or "fabric"
    keys = [("leaf", leaf) for leaf in view.leaf_pod] + [("pod", p) for p in view.pods()]
    names = unique_names([*keys, ("fabric", fabric)], slurm_name)
    leaf_hosts = {leaf: [h for h in hosts if _NAME_OK.match(h)]
                  for leaf, hosts in view.leaf_hosts().items()}
    skipped = sum(len(hosts) for hosts in view.leaf_hosts().values()) - sum(
        len(hosts) for hosts in leaf_hosts.values())
    dual = [h for h in sorted(view.hosts, key=natural) if len(view.hosts[h].leaves) > 1]
    head = [
        "# Slurm topology.conf for TopologyPlugin=topology/tree",
        f"# generator: {GENERATOR} (cruxd.hints.slurm), schema version {SCHEMA_VERSION}",
        f"# fabric: {slurm_name(fabric)}",
        f"# generated: {_stamp(view.generated_unix_ms)} (unix ms {view.generated_unix_ms})",
    ]
    if dual:
        head.append(f"# {len(dual)} dual-homed hosts are listed under their first leaf only "
                    "(the tree plugin needs a tree)")
    if skipped:
        head.append(f"# {skipped} hosts left out: their names are not Slurm node names")
    lines: list[str] = []
    populated = []
    for leaf, hosts in leaf_hosts.items():
        if hosts:  # a switch with no nodes and no children is an error to Slurm
            populated.append(leaf)
            lines.append(f"SwitchName={names[('leaf', leaf)]} Nodes={compress(hosts)}")
    empty = [names[("leaf", lf)] for lf, hosts in leaf_hosts.items() if not hosts]
    if empty:
        head.append(f"# leaves with no host of their own, left out: {compress(empty)}")
    pods = []
    for pod, leaves in view.pods().items():
        mine = [names[("leaf", lf)] for lf in leaves if lf in populated]
        if mine:
            pods.append(names[("pod", pod)])
            lines.append(f"SwitchName={names[('pod', pod)]} Switches={compress(mine)}")
    if pods and has_fabric_tier(view):
        lines.append(f"SwitchName={names[('fabric', fabric)]} Switches={compress(pods)}")
    return "\n".join(head + lines) + "\n"
