"""Real crux processes on loopback: free ports, TOML configs, `cruxd` processes that log to a
file, are waited for and stopped, and the `cruxctl` / `crux-run` command lines.

Each daemon is its own process with its own TOML file, runtime and state directories under
one root (a test's tmp_path, a benchmark's scratch directory); gRPC ports are chosen by the
OS. The executables are the ones installed beside the running interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent

# With die_with_parent a child is started through this launcher: it asks the kernel to
# SIGTERM it when its parent dies (PR_SET_PDEATHSIG, kept across exec), then execs the
# command, so a killed benchmark leaves no daemons behind. Not a preexec_fn: that makes Popen
# fork() instead of vfork(), and grpcio >= 1.81 then runs its fork handlers in the child,
# whose poller can abort on the fds close_fds closes before exec (grpc/grpc#43055).
_LAUNCHER = ("import ctypes, os, signal, sys; "
             "ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
             "os.execvp(sys.argv[1], sys.argv[1:])")


def free_port() -> int:
    """A port the OS just handed out (for daemons that must keep theirs across restarts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0,
             every: float = 0.05) -> Any:
    """Poll `check` until it returns something true, and return that."""
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def toml(doc: Mapping[str, Mapping[str, Any]]) -> str:
    """Sections of scalars and lists as TOML (a JSON value is a valid TOML value for these)."""
    lines = []
    for section, keys in doc.items():
        lines.append(f"[{section}]")
        for k, v in keys.items():
            lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def spawn(cmd: Sequence[str], log: Path | None = None, *,
          env: Mapping[str, str] | None = None,
          die_with_parent: bool = False) -> subprocess.Popen[bytes]:
    """Start `cmd` with its output appended to `log`; without a log, stdout is dropped and
    stderr piped for the caller to read. `env` is added to this process's environment."""
    argv = [sys.executable, "-c", _LAUNCHER, *cmd] if die_with_parent else list(cmd)
    full_env = {**os.environ, **env} if env else None
    if log is None:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=full_env)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, env=full_env)


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], sig: int = signal.SIGTERM,
         timeout: float = 20.0) -> list[int]:
    """Signal every process still running first (they shut down together), then wait for
    each; one still there after `timeout` is killed. Returns their exit codes."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


class Daemon:
    """One `cruxd` under `root/name`: its config (`sections` on top of a [daemon] section
    naming the host after the directory, metrics off, debug logs) and its log file."""

    def __init__(self, root: Path, name: str, sections: Mapping[str, Mapping[str, Any]],
                 env: dict[str, str] | None = None, netns: str | None = None,
                 die_with_parent: bool = False) -> None:
        self.root = root / name
        self.root.mkdir(parents=True, exist_ok=True)
        self.name = name
        daemon = {"host_id": name, "state_dir": str(self.root / "state"),
                  "runtime_dir": str(self.root / "run"), "log_level": "debug",
                  **sections.get("daemon", {})}
        rest = {k: v for k, v in sections.items() if k != "daemon"}
        self.config = self.root / "cruxd.toml"
        self.config.write_text(toml({"daemon": daemon, "metrics": {"listen": ""}, **rest}))
        self.log = self.root / "cruxd.log"
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.netns = netns  # run inside this network namespace (a rig host)
        self.die_with_parent = die_with_parent

    @property
    def socket(self) -> Path:
        return self.root / "run" / "agent.sock"

    @property
    def table(self) -> Path:
        return self.root / "run" / "decisions"

    def start(self) -> Daemon:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = spawn([*prefix, str(BIN / "cruxd"), "--config", str(self.config)],
                          self.log, env=self.env, die_with_parent=self.die_with_parent)
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
        rc = stop_processes([self.proc], sig, timeout)[0]
        self.proc = None
        return rc


@contextmanager
def running(daemons: list[Daemon], ready: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start every daemon and wait for `ready` in each log; yields a list for the jobs the
    caller starts. On the way out the jobs are killed first, then the daemons stopped."""
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
    """`cruxctl status --json` of the agent on `socket_path`, which must answer."""
    run = cruxctl("status", "--json", socket_path=socket_path)
    assert run.returncode == 0, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


def crux_run(socket_path: Path, job: str, *extra: str,
             command: tuple[str, ...] = ("sleep", "600"), log: Path | None = None,
             die_with_parent: bool = False,
             env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`crux-run --socket ... --job-id job *extra -- *command`; its stderr is piped unless
    it goes to `log`; `env` added to the environment (CRUX_JOB_KEY, say)."""
    return spawn([str(BIN / "crux-run"), "--socket", str(socket_path), "--job-id", job,
                  *extra, "--", *command], log, env=env, die_with_parent=die_with_parent)
