"""A real etcd cluster on loopback for the HA tests and bench/ha.py: Debian's etcd-server,
one process per member, each with its own data directory, ports from the OS."""

from __future__ import annotations

import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

from cruxd.testing.rig import free_port, spawn, stop_processes, wait_for

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def etcd_missing() -> str | None:
    """Why the etcd rig cannot run here, or None."""
    if not Path(ETCD).exists():
        return "etcd is not installed (Debian's etcd-server; .ci/bootstrap installs it)"
    return None


class EtcdCluster:
    def __init__(self, root: Path, members: int = 3) -> None:
        self.root = root / "etcd"
        self.names = [f"m{i}" for i in range(members)]
        self.client = {n: free_port() for n in self.names}
        self.peer = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{self.client[n]}" for n in self.names]

    def start(self, name: str | None = None) -> EtcdCluster:
        initial = ",".join(f"{n}=http://127.0.0.1:{self.peer[n]}" for n in self.names)
        for n in [name] if name else self.names:
            c, p = self.client[n], self.peer[n]
            (self.root / n).mkdir(parents=True, exist_ok=True)
            self.procs[n] = spawn([
                ETCD, "--name", n, "--data-dir", str(self.root / n / "data"),
                "--listen-client-urls", f"http://127.0.0.1:{c}",
                "--advertise-client-urls", f"http://127.0.0.1:{c}",
                "--listen-peer-urls", f"http://127.0.0.1:{p}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
                "--initial-cluster", initial, "--initial-cluster-token", "crux-test",
                "--initial-cluster-state", "new",
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--log-level", "warn"], self.root / n / "etcd.log", die_with_parent=True)
        if name is None:
            wait_for("etcd cluster healthy", self.healthy, 30)
        return self

    def healthy(self) -> bool:
        """Whether a live member says the cluster has a leader (quorum)."""
        for n in self.procs:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.client[n]}/health",
                                            timeout=1) as r:
                    if b'"health":"true"' in r.read():
                        return True
            except OSError:
                continue
        return False

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        stop_processes(list(self.procs.values()), timeout=10)
        self.procs.clear()
