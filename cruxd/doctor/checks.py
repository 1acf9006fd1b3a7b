"""`cruxctl doctor`'s checks: this host against what crux needs, one verdict each.

Each check reads what the kernel and rdma-core expose, under roots a test can move (sysfs,
procfs), and returns a `Check`: ok, warn (crux works, less well), fail (crux cannot do its
job here), or unknown (nothing here says: the driver or a tool does not answer). Every
verdict but ok carries the fix. The DCB checks (trust, PFC) are in dcb.py; the libraries
and the agent socket in the CLI module, which owns those edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cruxd.agent.nic_tc import tc_overrides

OK, WARN, FAIL, UNKNOWN = "ok", "warn", "fail", "unknown"
MAX_READ = 4096  # sysfs and procfs values are short; a longer one is not what we expect


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # OK, WARN, FAIL or UNKNOWN
    detail: str
    fix: str = ""


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ).decode("ascii", "replace").strip()
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class RdmaPort:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", ...
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    roce_v2: tuple[int, ...]  # GID indexes of type RoCE v2 with a GID set
    netdevs: tuple[str, ...]


def rdma_ports(sys_root: Path) -> list[RdmaPort]:
    base = sys_root / "class" / "infiniband"
    out = []
    for port_dir in sorted(base.glob("*/ports/*")) if base.is_dir() else ():
        if not port_dir.name.isdigit():
            continue
        state = (_read(port_dir / "state") or "?").split(":")[-1].strip()
        v2, netdevs = [], set()
        for t in sorted((port_dir / "gid_attrs" / "types").glob("*")):
            gid = _read(port_dir / "gids" / t.name) or ""
            if (_read(t) or "").lower() == "roce v2" and gid.strip("0:") != "":
                v2.append(int(t.name))
                if (ndev := _read(port_dir / "gid_attrs" / "ndevs" / t.name)):
                    netdevs.add(ndev)
        out.append(RdmaPort(port_dir.parents[1].name, int(port_dir.name), state,
                            _read(port_dir / "link_layer") or "?", tuple(v2),
                            tuple(sorted(netdevs))))
    return out


def check_rdma(ports: Sequence[RdmaPort]) -> Check:
    if not ports:
        return Check("rdma", WARN, "no RDMA device (/sys/class/infiniband is empty): only TCP "
                     "jobs (the socket interposer) can be steered here",
                     "load the NIC's RDMA driver (mlx5_ib, ...), or ignore on a TCP-only host")
    roce = [p for p in ports if p.link_layer == "Ethernet"]
    good = [p for p in roce if p.state == "ACTIVE" and p.roce_v2]
    names = ", ".join(f"{p.device}/{p.port}" for p in ports)
    if good:
        return Check("rdma", OK, "; ".join(
            f"{p.device}/{p.port} ACTIVE, RoCE v2 GID index {p.roce_v2[0]}"
            + (f" on {','.join(p.netdevs)}" if p.netdevs else "") for p in good))
    if not roce:
        return Check("rdma", WARN, f"{names}: InfiniBand link layer, not RoCE: crux steers "
                     "RoCEv2 (UDP source ports and DSCP)",
                     "crux's path steering needs RoCE; on InfiniBand it sets levels only")
    down = [p for p in roce if p.state != "ACTIVE"]
    if down and len(down) == len(roce):
        states = ", ".join(f"{p.device}/{p.port} {p.state}" for p in down)
        return Check("rdma", FAIL, f"no RoCE port is ACTIVE ({states})", "bring the link up "
                     "(ip link set DEV up; check the cable and the switch port)")
    return Check("rdma", FAIL, f"{names}: no RoCE v2 GID: the NIC's traffic would be RoCE v1 "
                 "(no UDP, no source port to steer)", "give the netdev an IP address (the RoCE "
                 "v2 GIDs follow it), and make sure RoCE v2 is enabled "
                 "(cma_roce_mode / the NIC's firmware)")


def check_tc_override(sys_root: Path) -> Check:
    found = tc_overrides(sys_root)
    if not found:
        return Check("tc-override", OK, "no RDMA port overrides the QPs' traffic class")
    return Check("tc-override", WARN, "; ".join(
        f"{o.port} sets traffic class {o.traffic_class} on every QP" for o in found)
        + ": crux's DSCP does not reach the wire there", "clear it: echo -1 > "
        "/sys/class/infiniband/DEV/tc/PORT/traffic_class (mlx5)")


def _sysctl(proc_root: Path, name: str) -> str | None:
    return _read(proc_root / "sys" / Path(*name.split(".")))


def _ports(spec: str) -> set[int]:
    """ip_local_reserved_ports: "61000-61100,62000" -> the ports."""
    out: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if "-" in part:
            a, _, b = part.partition("-")
            if a.isdigit() and b.isdigit():
                out.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.add(int(part))
    return out


def check_port_range(proc_root: Path, tcp_sports: tuple[int, int]) -> Check:
    raw = _sysctl(proc_root, "net.ipv4.ip_local_port_range")
    if raw is None or len(raw.split()) != 2 or not all(x.isdigit() for x in raw.split()):
        return Check("port-range", UNKNOWN, "net.ipv4.ip_local_port_range is unreadable")
    lo, hi = (int(x) for x in raw.split())
    first, last = tcp_sports
    overlap = set(range(max(lo, first), min(hi, last) + 1))
    if not overlap:
        return Check("port-range", OK, f"the kernel's ephemeral ports {lo}-{hi} leave crux's "
                     f"TCP source ports {first}-{last} alone")
    reserved = _ports(_sysctl(proc_root, "net.ipv4.ip_local_reserved_ports") or "")
    left = overlap - reserved
    if not left:
        return Check("port-range", OK, f"crux's TCP source ports inside the ephemeral range "
                     f"{lo}-{hi} are reserved (ip_local_reserved_ports)")
    return Check("port-range", WARN, f"{len(left)} of crux's TCP source ports "
                 f"({first}-{last}, [probing] tcp_sports) are in the kernel's ephemeral range "
                 f"{lo}-{hi}: any connection may take one, and a steered connect then falls "
                 "back to a kernel port", f"sysctl -w net.ipv4.ip_local_port_range=\"{lo} "
                 f"{first - 1}\", or net.ipv4.ip_local_reserved_ports={first}-{last}")


def check_rp_filter(proc_root: Path, netdevs: Iterable[str]) -> Check:
    strict = []
    for dev in ("all", *netdevs):
        value = _sysctl(proc_root, f"net.ipv4.conf.{dev}.rp_filter")
        if value == "1":
            strict.append(dev)
    if strict:
        return Check("rp-filter", WARN, f"strict reverse-path filtering on {', '.join(strict)}"
                     ": replies to probes (and traffic) that come back over another of the "
                     "host's interfaces are dropped", "sysctl -w net.ipv4.conf.{all,DEV}."
                     "rp_filter=2 (loose)")
    return Check("rp-filter", OK, "no strict reverse-path filter")


def check_multipath_hash(proc_root: Path) -> Check:
    value = _sysctl(proc_root, "net.ipv4.fib_multipath_hash_policy")
    if value is None:
        return Check("multipath-hash", UNKNOWN, "net.ipv4.fib_multipath_hash_policy is "
                     "unreadable")
    if value in ("1", "3"):  # layer 4, or layer 4 of the inner packet
        return Check("multipath-hash", OK, f"fib_multipath_hash_policy {value}: routes with "
                     "several next hops hash the source port, which crux steers")
    return Check("multipath-hash", WARN, f"fib_multipath_hash_policy {value}: where this "
                 "host's own routes have several next hops, they hash addresses only and "
                 "crux's source ports change nothing (the fabric's switches are unaffected)",
                 "sysctl -w net.ipv4.fib_multipath_hash_policy=1")
