"""Run a shell script inside a qemu VM that has two soft-RoCE (rxe) devices.

This host's kernel has no RDMA and cannot load modules, so the VM boots Debian 12's
own 6.1 kernel under TCG (KVM does not boot a guest here). The guest sees the host's
/ read-only through virtio-9p under a tmpfs overlay, so the repo and every installed
tool are there at their usual paths; results come back through a second, writable 9p
mount of a per-call temp dir. Guest side: rxe_vm/init (initramfs) and
rxe_vm/stage2.sh (rxe0 on veth0 10.77.0.1, rxe1 on veth1 10.77.0.2; RoCEv2 GID 1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREPARE = HERE / "rxe_vm_prepare.sh"
STAGE2 = HERE / "rxe_vm" / "stage2.sh"
QEMU = "qemu-system-x86_64"
# The guest runs the host's own binaries (it boots into the host's /), so these must
# be installed here; the prepare script additionally needs PREPARE_TOOLS.
GUEST_TOOLS = ("bash", "busybox", "modprobe", "ip", "rdma", "sysctl")
PREPARE_TOOLS = ("apt-get", "apt-cache", "dpkg", "depmod", "xz", "gzip")


class VmError(RuntimeError):
    """The VM did not produce a result (boot failure, crash or timeout)."""


class VmTimeout(VmError):
    pass


@dataclass
class VmResult:
    rc: int
    output: str  # the script's combined stdout/stderr
    console: str  # the VM's serial console, for debugging
    boot_s: float  # wall time from qemu start to power-off


def cache_dir() -> Path:
    # Absolute and symlink-free: the guest finds it under the 9p mount of /.
    return Path(os.environ.get("CRUX_RIG_CACHE", "/var/cache/crux/rxe-vm")).resolve()


def vm_available() -> str | None:
    """None if run_in_vm can work here, else why not (a pytest skip reason)."""
    if os.geteuid() != 0:
        return "rxe VM needs root"
    if shutil.which(QEMU) is None:
        return f"{QEMU} not found (apt-get install qemu-system-x86)"
    need = list(GUEST_TOOLS)
    if not (cache_dir() / "stamp").is_file():
        need += PREPARE_TOOLS  # not prepared yet: fine as long as it can be
    missing = [t for t in need if shutil.which(t) is None]
    if missing:
        return f"rxe VM needs these host tools: {' '.join(missing)}"
    return None


def prepare() -> Path:
    """Run the (idempotent, stamp-checked) prepare script; return the cache dir."""
    env = dict(os.environ, CRUX_RIG_CACHE=str(cache_dir()))
    proc = subprocess.run(
        ["bash", str(PREPARE)], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise VmError(f"rxe_vm_prepare.sh failed:\n{proc.stderr.strip()}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_in_vm(script: str, *, repo: Path, timeout_s: float = 600) -> VmResult:
    """Boot the VM, set up rxe0/rxe1, run `script` with bash in `repo`, power off.

    The script runs with CRUX_RXE_VM=1; writes under `repo` land in the guest's
    tmpfs overlay and are lost. rc 125 with a message in `output` means the rig's
    own setup failed.
    """
    cache = prepare()
    repo = repo.resolve()
    with tempfile.TemporaryDirectory(prefix="crux-rxe-vm-") as tmp:
        work = Path(tmp)
        (work / "script.sh").write_text(script)
        (work / "repo").write_text(str(repo))
        console_path = work / "console.log"
        kver = (cache / "kver").read_text().strip()
        append = " ".join(
            [
                "console=ttyS0",
                "panic=-1",
                "loglevel=4",
                f"crux.modules={cache / 'tree/lib/modules' / kver}",  # bound to /lib/modules
                f"crux.stage2={STAGE2}",
            ]
        )
        cmd = [
            QEMU,
            "-accel", "tcg",
            # qemu64 lacks SSE4.2/POPCNT, which numpy's x86-64 baseline needs (SIGILL)
            "-cpu", "max",
            "-m", "2048",
            "-smp", "2",
            "-nographic",
            "-no-reboot",
            "-nic", "none",
            "-kernel", str(cache / "vmlinuz"),
            "-initrd", str(cache / "initrd.img"),
            "-append", append,
            # multidevs=remap: the host's / spans several filesystems (inode clashes).
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={work},mount_tag=work,security_model=none",
        ]  # fmt: skip
        start = time.monotonic()
        with open(console_path, "wb") as console_f:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=console_f, stderr=subprocess.STDOUT
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                console = console_path.read_text(errors="replace")
                raise VmTimeout(
                    f"rxe VM timed out after {timeout_s:.0f}s; console tail:\n{_tail(console)}"
                ) from None
        boot_s = time.monotonic() - start
        console = console_path.read_text(errors="replace")
        rc_file = work / "rc"
        if not rc_file.is_file():
            raise VmError(
                f"rxe VM exited (qemu rc {proc.returncode}) without a result; "
                f"console tail:\n{_tail(console)}"
            )
        output_file = work / "output"
        output = output_file.read_text(errors="replace") if output_file.is_file() else ""
        return VmResult(int(rc_file.read_text().strip()), output, console, boot_s)
