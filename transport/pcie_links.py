"""The device -> PCIe link map beside the semaphore file: /run/crux/pcie-links.

The agent writes it at start (cruxd/agent/dataplane.py) from sysfs; the wrapper libibverbs in
every job reads it (shim/crux_links.c) to learn which semaphore link (transport/pcie.py) each
RDMA device's traffic crosses. The job's level comes from its job-wide decision-table entry.

Format (shim/crux_gate.h is the source of truth; `parse_map` applies the same rules, and a test
feeds both the same hostile files). Text, at most MAX_BYTES, every line ending in a newline:

    # comment lines and empty lines are ignored
    crux-pcie-links 1 <links>                  the semaphore file's link count, 1..1024
    <device> <link> <pci address or ->         one per RDMA device on a shared link

Device names are 1..63 of [A-Za-z0-9_.-], links 0..links-1, numbers decimal without leading
zeros, fields separated by single spaces, each device at most once, at most MAX_DEVICES. Any
flaw rejects the whole file: a job reading a bad map runs ungated (fail open).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transport.pcie import PcieSwitch

__all__ = ["MAX_BYTES", "MAX_DEVICES", "DeviceLink", "LinkMap", "LinkMapError",
           "device_links", "format_map", "level_for", "parse_map", "read_map", "write_map"]

HEADER = b"crux-pcie-links 1 "
MAX_BYTES = 65536  # CRUX_LINKS_MAX_BYTES
MAX_DEVICES = 256  # CRUX_LINKS_MAX_DEVICES
MAX_LINKS = 1024  # CRUX_PCIE_MAX_LINKS
TOP_LEVEL = 7  # CRUX_PCIE_LEVELS - 1
_NAME = re.compile(rb"[A-Za-z0-9_.-]{1,63}")
_PCI = re.compile(rb"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


class LinkMapError(ValueError):
    """A map file that breaks the format; the message says where."""


@dataclass(frozen=True)
class DeviceLink:
    device: str  # RDMA device name (ibv_get_device_name)
    link: int  # semaphore link index
    pci: str | None  # the PCI function the device sits on, for people; None when unknown


@dataclass(frozen=True)
class LinkMap:
    links: int  # the semaphore file's link count
    devices: tuple[DeviceLink, ...]

    def link_of(self, device: str) -> int | None:
        return next((d.link for d in self.devices if d.device == device), None)


def level_for(plan_level: int) -> int:
    """The semaphore level (0..7, 7 highest) for a plan level (0 lowest): the same order,
    capped. The scheduler never makes more than 8 levels (DSCP classes), so the cap is a
    guard, and what the shim does too (crux_gate_level)."""
    return max(0, min(TOP_LEVEL, plan_level))


# ---- the agent side: sysfs -> map --------------------------------------------------------

def _pci_of(path: Path) -> str | None:
    """The PCI address a sysfs `device` link resolves to, if it is one."""
    try:
        name = path.resolve(strict=True).name
    except (OSError, RuntimeError):
        return None
    return name if _BDF.fullmatch(name) else None


def device_links(sysfs_root: str | os.PathLike[str],
                 switches: list[PcieSwitch]) -> list[DeviceLink]:
    """The RDMA devices (<root>/class/infiniband/*) whose PCI function is a NIC of one of
    `switches` (shared_links' list, whose index is the semaphore link), sorted by name.

    A device's PCI function is where its `device` link points; a software device (rxe, siw)
    has none and names its netdev in `parent`, whose `device` link is then used. Devices on no
    shared link are left out: their traffic contends with no GPU, so nothing gates them."""
    link_of = {nic: i for i, sw in enumerate(switches) for nic in sw.nics}
    root = Path(sysfs_root)
    try:
        names = sorted(p.name for p in (root / "class" / "infiniband").iterdir())
    except OSError:
        return []
    out = []
    for name in names:
        if not _NAME.fullmatch(name.encode(errors="replace")):
            continue  # the shim could not look it up anyway
        dev = root / "class" / "infiniband" / name
        pci = _pci_of(dev / "device")
        if pci is None:
            try:
                parent = (dev / "parent").read_text().strip()
            except (OSError, UnicodeDecodeError):
                parent = ""
            if parent and "/" not in parent and parent not in (".", ".."):
                pci = _pci_of(root / "class" / "net" / parent / "device")
        if pci is not None and pci in link_of:
            out.append(DeviceLink(name, link_of[pci], pci))
    return out


def format_map(m: LinkMap) -> str:
    lines = ["# crux: RDMA device -> PCIe link (index into the semaphore file beside this one)",
             f"crux-pcie-links 1 {m.links}"]
    lines += [f"{d.device} {d.link} {d.pci or '-'}" for d in m.devices]
    text = "\n".join(lines) + "\n"
    parse_map(text.encode())  # never write what the readers would refuse
    return text


def write_map(path: str | os.PathLike[str], m: LinkMap) -> None:
    """Replace the map atomically (temp file in the same directory, fsync, rename), mode 0644:
    a job reads the old file or the new one, never half of one. LinkMapError for a map that
    breaks the format (nothing is written), OSError for the file system."""
    data = format_map(m).encode()
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- the readers' rules --------------------------------------------------------------------

def _number(b: bytes, top: int) -> int | None:
    if not (1 <= len(b) <= 7) or not b.isdigit() or (len(b) > 1 and b[:1] == b"0"):
        return None
    v = int(b)
    return v if v <= top else None


def parse_map(data: bytes) -> LinkMap:
    """The map in `data`, or LinkMapError: the shim's rules (crux_links_parse), byte for byte."""
    if not data:
        raise LinkMapError("empty")
    if len(data) > MAX_BYTES:
        raise LinkMapError(f"larger than {MAX_BYTES} bytes")
    if not data.endswith(b"\n"):
        raise LinkMapError("does not end with a newline")
    if b"\0" in data:
        raise LinkMapError("holds a NUL byte")
    links: int | None = None
    devices: list[DeviceLink] = []
    for no, line in enumerate(data[:-1].split(b"\n"), 1):
        if not line or line.startswith(b"#"):
            continue
        if links is None:
            n = _number(line[len(HEADER):], MAX_LINKS) if line.startswith(HEADER) else None
            if not n:
                raise LinkMapError(f"line {no}: expected 'crux-pcie-links 1 <links 1..1024>'")
            links = n
            continue
        fields = line.split(b" ")
        if len(fields) != 3:
            raise LinkMapError(f"line {no}: expected '<device> <link> <pci address or ->'")
        name, link_b, pci = fields
        if not _NAME.fullmatch(name):
            raise LinkMapError(f"line {no}: device name must be 1..63 of [A-Za-z0-9_.-]")
        link = _number(link_b, links - 1)
        if link is None:
            raise LinkMapError(f"line {no}: link must be 0..{links - 1}")
        if pci != b"-" and not _PCI.fullmatch(pci):
            raise LinkMapError(f"line {no}: bad PCI address (want dddd:bb:ss.f or -)")
        device = name.decode()
        if any(d.device == device for d in devices):
            raise LinkMapError(f"line {no}: device listed twice")
        if len(devices) >= MAX_DEVICES:
            raise LinkMapError(f"line {no}: more than {MAX_DEVICES} devices")
        devices.append(DeviceLink(device, link, None if pci == b"-" else pci.decode()))
    if links is None:
        raise LinkMapError("no 'crux-pcie-links 1 <links>' line")
    return LinkMap(links, tuple(devices))


def read_map(path: str | os.PathLike[str]) -> LinkMap:
    """Read and parse a map file as the shim does: never through a symlink, only a regular
    file, at most MAX_BYTES. FileNotFoundError when there is none, LinkMapError when it is bad."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise LinkMapError(f"{path}: is a symlink") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LinkMapError(f"{path}: not a regular file")
        data = f.read(MAX_BYTES + 1)  # one past the limit: it may have grown since fstat
    try:
        return parse_map(data)
    except LinkMapError as exc:
        raise LinkMapError(f"{path}: {exc}") from None
