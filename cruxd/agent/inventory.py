"""What this host offers: its RoCE NICs (or IP interfaces) and GPU count.

Sysfs is read under an injectable root so tests can point at a fixture tree.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import subprocess
import warnings
from pathlib import Path
from typing import Any

from cruxd.control.records import Nic

LOG = logging.getLogger(__name__)


def rdma_nics(sys_root: Path = Path("/sys")) -> tuple[Nic, ...]:
    """One Nic per RDMA port with a RoCE v2 GID carrying an IP address."""
    base = sys_root / "class" / "infiniband"
    out: list[Nic] = []
    for dev in sorted(base.iterdir()) if base.is_dir() else ():
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else ():
            addr = _roce_v2_address(port)
            if addr is None:
                continue
            out.append(Nic(f"{dev.name}/{port.name}", addr, len(out), _rate_gbps(port)))
    return tuple(out)


def _roce_v2_address(port: Path) -> str | None:
    gids = port / "gids"
    types = port / "gid_attrs" / "types"
    if not gids.is_dir():
        return None
    for gid_file in sorted(gids.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        try:
            kind = (types / gid_file.name).read_text().strip()
            gid = gid_file.read_text().strip()
        except OSError:
            continue  # unpopulated GID slots cannot be read
        if kind != "RoCE v2":
            continue
        ip = ipaddress.IPv6Address(gid)
        if ip.is_unspecified or ip.is_link_local:
            continue
        return str(ip.ipv4_mapped or ip)
    return None


def _rate_gbps(port: Path) -> float:
    try:
        return float((port / "rate").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _ip_links() -> list[dict[str, Any]]:
    try:
        text = subprocess.run(["ip", "-j", "address", "show", "up"], capture_output=True,
                              text=True, timeout=5, check=True).stdout
        links: list[dict[str, Any]] = json.loads(text)
        return links
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        LOG.warning("cannot list IP addresses (%s)", exc)
        return []


def ip_nics() -> tuple[Nic, ...]:
    """Fallback without RDMA devices: global addresses of the interfaces that are up."""
    out: list[Nic] = []
    for link in _ip_links():
        if "LOOPBACK" in link.get("flags", ()):
            continue
        for a in link.get("addr_info", ()):
            if a.get("scope") == "global" and a.get("family") == "inet":
                out.append(Nic(link.get("ifname", ""), a["local"], len(out)))
                break
    return (out and tuple(out)) or ()


def netdevs_for(addresses: tuple[str, ...]) -> tuple[str, ...]:
    """The interfaces that hold these addresses (whose byte counters carry their traffic)."""
    want = set(addresses)
    return tuple(sorted({link.get("ifname", "") for link in _ip_links()
                         for a in link.get("addr_info", ()) if a.get("local") in want} - {""}))


def configured_nics(addresses: tuple[str, ...]) -> tuple[Nic, ...]:
    return tuple(Nic(f"nic{i}", a, i) for i, a in enumerate(addresses))


def discover_nics(addresses: tuple[str, ...], sys_root: Path = Path("/sys")) -> tuple[Nic, ...]:
    return configured_nics(addresses) or rdma_nics(sys_root) or ip_nics()


def gpu_count(configured: int | None) -> int:
    """Configured count, else NVML's, else 0 (a host without GPUs or driver)."""
    if configured is not None:
        return configured
    try:
        with warnings.catch_warnings():  # pynvml's own deprecation notice, not ours
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml  # type: ignore[import-untyped]  # GPU-less hosts never load it

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError subclasses, missing library
        LOG.info("no GPUs from NVML (%s); reporting 0", exc)
        return 0
