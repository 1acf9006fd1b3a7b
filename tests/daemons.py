"""A rig of real cruxd processes on loopback for the control-plane tests.

Each daemon is its own process with its own TOML file, runtime and state
directories under the test's tmp_path; gRPC ports are chosen by the OS.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def free_port() -> int:
    """A port the OS just handed out (for daemons that must keep theirs across restarts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0,
             every: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def toml(doc: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, keys in doc.items():
        lines.append(f"[{section}]")
        for k, v in keys.items():
            lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


class Daemon:
    def __init__(self, root: Path, name: str, sections: dict[str, dict[str, Any]],
                 env: dict[str, str] | None = None, netns: str | None = None) -> None:
        self.root = root / name
        self.root.mkdir(parents=True, exist_ok=True)
        self.name = name
        daemon = {"host_id": name, "state_dir": str(self.root / "state"),
                  "runtime_dir": str(self.root / "run"), "log_level": "debug"}
        daemon.update(sections.pop("daemon", {}))
        sections = {"daemon": daemon, "metrics": {"listen": ""}, **sections}
        self.config = self.root / "cruxd.toml"
        self.config.write_text(toml(sections))
        self.log = self.root / "cruxd.log"
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.netns = netns  # run inside this network namespace (a rig host)

    @property
    def socket(self) -> Path:
        return self.root / "run" / "agent.sock"

    @property
    def table(self) -> Path:
        return self.root / "run" / "decisions"

    def start(self) -> Daemon:
        with open(self.log, "ab") as log:
            prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
            self.proc = subprocess.Popen([*prefix, str(BIN / "cruxd"), "--config",
                                          str(self.config)],
                                         stdout=log, stderr=log,
                                         env={**os.environ, **self.env})
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 20.0) -> str:
        def seen() -> bool:
            self.check_alive(needle)
            return needle in self.log_text()
        wait_for(f"{self.name} to log {needle!r}", seen, timeout)
        return self.log_text()

    def check_alive(self, why: str = "") -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}) while waiting "
                                 f"for {why}:\n{self.log_text()[-3000:]}")

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc


@contextmanager
def running(daemons: list[Daemon], ready: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start every daemon and wait for `ready` in each log; yields a list for the jobs the
    test starts. On the way out the jobs are killed first, then the daemons stopped."""
    jobs: list[subprocess.Popen[bytes]] = []
    try:
        for d in daemons:
            d.start()
        for d in daemons:
            d.wait_log(ready)
        yield jobs
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        for d in daemons:
            d.stop()


def cruxctl(*args: str, socket_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "cruxctl"), *args]
    if socket_path is not None:
        cmd += ["--socket", str(socket_path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def status(socket_path: Path) -> dict[str, Any]:
    run = cruxctl("status", "--json", socket_path=socket_path)
    assert run.returncode == 0, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


def crux_run(socket_path: Path, job: str, *extra: str,
             command: tuple[str, ...] = ("sleep", "600")) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN / "crux-run"), "--socket", str(socket_path), "--job-id",
                             job, *extra, "--", *command], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
