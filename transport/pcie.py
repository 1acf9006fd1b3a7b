"""PCIe semaphores: a priority-aware lock per shared PCIe link, in shared memory.

The lock itself is C (shim/crux_pcie.h documents the grant rule, liveness and limitations);
this module is its ctypes binding for the agent (create, stats, revoke) and Python jobs
(acquire, release), plus `shared_links`, which finds the PCIe links worth a semaphore on this
host. `LAYOUT` mirrors the file's fixed layout (crux_pcie.h), for tools and tests that read it.

The library is the installed libcrux_pcie.so (transport/native.py), or $CRUX_PCIE_LIB.

Callers fail open: `held()` proceeds without the semaphore when it cannot be had; `acquire`
raises PcieLockError (an OSError with the errno) for the caller to decide. Every member of the
agent's group can write the file, so a hold is a priority hint, not mutual exclusion for data:
a holder past the lease (20 ms) loses the link to an equal or higher waiter, a stopped holder
to any waiter, and the agent can revoke a hold (crux_pcie.h, "Trust").
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from transport import native

__all__ = [
    "DEFAULT_PATH", "LAYOUT", "LEASE_ENV", "LEVELS", "QUEUE_LEN", "Layout", "LinkStats",
    "PcieLockError", "PcieLocks", "PcieSwitch", "library_path", "load_library", "shared_links",
]

log = logging.getLogger(__name__)

DEFAULT_PATH = "/run/crux/pcie"
LEVELS = 8  # CRUX_PCIE_LEVELS
QUEUE_LEN = 64  # CRUX_PCIE_QUEUE
LIB_ENV = "CRUX_PCIE_LIB"
LEASE_ENV = "CRUX_PCIE_LEASE_MS"  # read at open: this process's waits' lease, 0: none


@dataclass(frozen=True)
class Layout:
    """The semaphore file's layout (crux_pcie.h, version 2; asserted there at compile time)."""

    version: int = 2
    header_size: int = 64
    link_size: int = 256 + 32 * QUEUE_LEN  # a 64-byte mutex slot, fields, counters, the queue
    # offsets inside a link record
    wake: int = 64
    holder_pid: int = 68  # i32
    holder_level: int = 72  # u32
    nwaiters: int = 76  # u32
    holder_start: int = 80  # u64: /proc/<pid>/stat field 22, + 1
    held_since_ns: int = 88  # i64, CLOCK_MONOTONIC when first found held by another; 0: not yet
    checked_ns: int = 104  # i64
    queue: int = 256  # QUEUE_LEN slots of 32 bytes: pid i32, level u32, seq u64, start u64,
    waiter_size: int = 32  # polled_ns i64

    def link(self, index: int) -> int:
        """The file offset of link record `index`."""
        return self.header_size + index * self.link_size


LAYOUT = Layout()


class PcieLockError(OSError):
    """A failed create/open/acquire/release; .errno holds the C side's error."""


class _Stats(ctypes.Structure):
    _fields_ = [
        ("holder_pid", ctypes.c_int32),
        ("holder_level", ctypes.c_uint32),
        ("waiters", ctypes.c_uint32 * LEVELS),
        ("grants", ctypes.c_uint64),
        ("contended", ctypes.c_uint64),
        ("recovered", ctypes.c_uint64),
        ("repairs", ctypes.c_uint64),
        ("expired", ctypes.c_uint64),
        ("stopped", ctypes.c_uint64),
        ("foreign", ctypes.c_uint64),
        ("stale", ctypes.c_uint64),
        ("revoked", ctypes.c_uint64),
        ("held_ns", ctypes.c_int64),
    ]


@dataclass(frozen=True)
class LinkStats:
    holder_pid: int  # 0 = free
    holder_level: int
    waiters: tuple[int, ...]  # queued waiters per level, index = level
    grants: int
    contended: int  # grants that had to queue
    recovered: int  # dead holders/waiters purged
    repairs: int  # internal mutexes recovered after their owner died
    expired: int = 0  # holders past the lease, ended by an equal or higher waiter
    stopped: int = 0  # stopped holders/waiters purged
    foreign: int = 0  # holders/waiters whose pid is another process (start time differs)
    stale: int = 0  # queue slots not refreshed (abandoned, forged) dropped
    revoked: int = 0  # holds the agent revoked
    held_ns: int = 0  # how long the current hold has been seen by others (stats, waiters)


def library_path() -> Path:
    env = os.environ.get(LIB_ENV)
    return Path(env) if env else native.lib_dir() / native.PCIE


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def load_library() -> ctypes.CDLL:
    """The installed C library (PcieLockError ENOENT when it is missing)."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        lib_path = library_path()
        if not lib_path.exists():
            if os.environ.get(LIB_ENV):
                raise PcieLockError(errno.ENOENT, f"${LIB_ENV}={lib_path} does not exist")
            try:
                native.library(native.PCIE)
            except native.NativeLibraryMissing as exc:
                raise PcieLockError(errno.ENOENT, str(exc)) from None
        lib = ctypes.CDLL(str(lib_path), use_errno=True)
        u, i = ctypes.c_uint, ctypes.c_int
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        for name, res, args in [
            ("crux_pcie_create", i, [cp, u]),
            ("crux_pcie_open", vp, [cp]),
            ("crux_pcie_close", None, [vp]),
            ("crux_pcie_links", u, [vp]),
            ("crux_pcie_acquire", i, [vp, u, u]),
            ("crux_pcie_acquire_timed", i, [vp, u, u, ctypes.c_int64]),
            ("crux_pcie_release", i, [vp, u]),
            ("crux_pcie_stats", i, [vp, u, ctypes.POINTER(_Stats)]),
            ("crux_pcie_revoke", i, [vp, u, ctypes.c_int32]),
            ("crux_pcie__test_lock_internal", i, [vp, u]),
        ]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _lib = lib
        return lib


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise PcieLockError(-rc, f"{what}: {os.strerror(-rc)}")


class PcieLocks:
    """One mapping of a PCIe semaphore file. Not for use across fork: open it in the child."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lib = load_library()
        self.path = Path(path)
        ctypes.set_errno(0)
        handle = self._lib.crux_pcie_open(os.fsencode(self.path))
        if not handle:
            err = ctypes.get_errno() or errno.EINVAL
            raise PcieLockError(err, f"{self.path}: {os.strerror(err)}")
        self._handle: int | None = int(handle)
        self.links = int(self._lib.crux_pcie_links(self._handle))

    @classmethod
    def create(cls, path: str | os.PathLike[str], links: int) -> PcieLocks:
        """Agent side: create (or atomically replace) the file with `links` free links."""
        lib = load_library()
        if not 0 < links <= 1024:
            raise PcieLockError(errno.EINVAL, f"links must be 1..1024, not {links}")
        _check(int(lib.crux_pcie_create(os.fsencode(path), links)), f"create {path}")
        return cls(path)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> PcieLocks:
        return cls(path)

    @classmethod
    def try_open(cls, path: str | os.PathLike[str]) -> PcieLocks | None:
        """Fail open: None (logged) when the file is missing or not a valid semaphore file."""
        try:
            return cls(path)
        except PcieLockError as e:
            log.warning("PCIe semaphores unavailable, proceeding without: %s", e)
            return None

    def _h(self) -> int:
        if self._handle is None:
            raise PcieLockError(errno.EBADF, f"{self.path}: closed")
        return self._handle

    @staticmethod
    def _args(link: int, level: int) -> None:
        # ctypes would wrap negative ints into huge unsigned ones: the C side then says EINVAL
        # anyway, but only for values that fit; reject the rest here.
        if not (0 <= link < 2**32 and 0 <= level < 2**32):
            raise PcieLockError(errno.EINVAL, f"bad link {link} or level {level}")

    def acquire(self, link: int, level: int, timeout: float | None = None) -> None:
        """Block until `link` is granted at `level` (0..7, 7 highest), or `timeout` s pass."""
        self._args(link, level)
        if timeout is None:
            rc = int(self._lib.crux_pcie_acquire(self._h(), link, level))
        else:
            rc = int(self._lib.crux_pcie_acquire_timed(self._h(), link, level,
                                                        max(0, int(timeout * 1e9))))
        _check(rc, f"acquire link {link} level {level}")

    def release(self, link: int) -> None:
        self._args(link, 0)
        _check(int(self._lib.crux_pcie_release(self._h(), link)), f"release link {link}")

    @contextmanager
    def held(self, link: int, level: int, timeout: float | None = None) -> Iterator[bool]:
        """Hold `link` for the block; yields False (and proceeds, fail open) if it cannot."""
        try:
            self.acquire(link, level, timeout)
        except PcieLockError as e:
            log.warning("proceeding without PCIe semaphore: %s", e)
            yield False
            return
        try:
            yield True
        finally:
            self.release(link)

    def stats(self, link: int) -> LinkStats:
        self._args(link, 0)
        s = _Stats()
        _check(int(self._lib.crux_pcie_stats(self._h(), link, ctypes.byref(s))), f"stats {link}")
        return LinkStats(holder_pid=s.holder_pid, holder_level=s.holder_level,
                         waiters=tuple(int(w) for w in s.waiters), grants=s.grants,
                         contended=s.contended, recovered=s.recovered, repairs=s.repairs,
                         expired=s.expired, stopped=s.stopped, foreign=s.foreign,
                         stale=s.stale, revoked=s.revoked, held_ns=s.held_ns)

    def revoke(self, link: int, pid: int = 0) -> bool:
        """Agent side: take `link` from its holder, when that is `pid` (0: whoever holds it).

        True when a hold was revoked. The waiters are woken; the old holder's release then fails
        with EPERM and changes nothing, and the wrapper's gate notices at its next post."""
        self._args(link, 0)
        if not 0 <= pid < 2**31:
            raise PcieLockError(errno.EINVAL, f"bad pid {pid}")
        rc = int(self._lib.crux_pcie_revoke(self._h(), link, pid))
        _check(rc, f"revoke link {link}")
        return rc == 1

    def revoke_pid(self, pid: int) -> list[int]:
        """Agent side: revoke every link `pid` holds (a job deregistered or stuck); the links
        revoked. A link whose internal mutex is stuck (EBUSY) is still tried lock-free."""
        if pid <= 0:
            raise PcieLockError(errno.EINVAL, f"bad pid {pid}")
        return [link for link in range(self.links) if self.revoke(link, pid)]

    def revoke_stuck(self, max_hold_s: float) -> list[tuple[int, int]]:
        """Agent side: revoke every hold seen (by a waiter, or an earlier call of this or of
        stats) at least `max_hold_s` ago; (link, pid) of each. Call it periodically: the first
        call only starts the clock of a hold nobody waited for."""
        done = []
        for link in range(self.links):
            st = self.stats(link)
            if st.holder_pid and st.held_ns >= max_hold_s * 1e9 and \
                    self.revoke(link, st.holder_pid):
                done.append((link, st.holder_pid))
        return done

    def _test_lock_internal(self, link: int) -> None:
        """Test hook: take the link's internal mutex and keep it (see crux_pcie.h)."""
        _check(int(self._lib.crux_pcie__test_lock_internal(self._h(), link)), "lock internal")

    def close(self) -> None:
        if self._handle is not None:
            self._lib.crux_pcie_close(self._handle)
            self._handle = None

    def __enter__(self) -> PcieLocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- topology ---------------------------------------------------------------------------

_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA controller, 3D controller (class >> 8)
NIC_CLASSES = (0x0200, 0x0207)  # Ethernet, InfiniBand


@dataclass(frozen=True)
class PcieSwitch:
    """A PCIe link shared by GPUs and NICs: the upstream link of `bridge` (a BDF)."""

    bridge: str
    gpus: tuple[str, ...]
    nics: tuple[str, ...]


def _read_hex(p: Path) -> int | None:
    try:
        return int(p.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def shared_links(sysfs_root: str | os.PathLike[str] = "/sys") -> list[PcieSwitch]:
    """The PCIe links shared by at least one NVIDIA GPU and one NIC, sorted by bridge.

    Reads <root>/bus/pci/devices/* (symlinks into <root>/devices/pci*/...). A device's group is
    its upstream switch: in the resolved path .../<root port>/<switch up>/<switch down>/<dev>,
    the grandparent <switch up> when the parent is a switch downstream port (its own parent is
    a PCI device too), else the parent bridge (<root port>: devices right under one root port).
    Devices under different downstream ports of one switch share the switch's upstream link,
    which is what the semaphore protects. The list index is the semaphore link number the agent
    uses. Unreadable entries are skipped; no devices, no links."""
    devices = Path(sysfs_root) / "bus" / "pci" / "devices"
    groups: dict[str, tuple[list[str], list[str]]] = {}
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return []
    for dev in entries:
        cls, vendor = _read_hex(dev / "class"), _read_hex(dev / "vendor")
        if cls is None or vendor is None:
            continue
        is_gpu = vendor == NVIDIA and cls >> 8 in GPU_CLASSES
        is_nic = cls >> 8 in NIC_CLASSES
        if not (is_gpu or is_nic):
            continue
        try:
            real = dev.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        parent = real.parent
        if not _BDF.match(parent.name):
            continue  # directly on the root complex: no bridge to share
        key = parent.parent.name if _BDF.match(parent.parent.name) else parent.name
        gpus, nics = groups.setdefault(key, ([], []))
        (gpus if is_gpu else nics).append(dev.name)
    return [PcieSwitch(bridge=k, gpus=tuple(g), nics=tuple(n))
            for k, (g, n) in sorted(groups.items()) if g and n]
