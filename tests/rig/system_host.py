"""A host's agent as systemd runs it, for tests that run jobs as other users (root only).

cruxd.service runs cruxd as root with Group=crux and UMask=0027, in RuntimeDirectory=crux
(/run/crux, 0755 root:crux): every job, whatever its uid, finds the agent at
/run/crux/agent.sock. A test must not take the host's own /run/crux, so the daemon and the
jobs run in a private mount namespace with a tmpfs on /run/crux: the paths are the real ones,
and nothing outside the test sees them. The namespace is held by a `sleep` made with
unshare(1); commands join it with nsenter(1), and the test reads its files through
/proc/<holder>/root.

Network namespaces (`ip netns exec`) made before the holder are seen inside it: build a
fabric first, then the host.
"""

from __future__ import annotations

import grp
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cruxd.testing import BIN, spawn

RUN = Path("/run/crux")
GROUP = "crux"
NOBODY = 65534


def crux_gid() -> int:
    """Group crux, created (a system group, as systemd-sysusers would) if the host lacks it."""
    subprocess.run(["groupadd", "-f", "--system", GROUP], check=True, capture_output=True)
    return grp.getgrnam(GROUP).gr_gid


def can_run_as(uid: int) -> str | None:
    """None when `uid` can run this venv's crux-run, else why not (an interpreter under
    /root, a checkout only root can reach)."""
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                        str(BIN / "python"), "-c", "import cruxd.cli.crux_run"],
                       capture_output=True, text=True, cwd="/", env=job_env())
    if r.returncode != 0:
        return (f"uid {uid} cannot run {BIN / 'python'} with crux ({r.stderr.strip()[-200:]}): "
                "build the venv on /usr/bin/python3 in a checkout every user can reach "
                "(bash .ci/bootstrap does the first)")
    return None


def job_env(**extra: str) -> dict[str, str]:
    """A job's environment as a fresh login of another user would have it: nothing of root's
    runtime directory, socket or preloads."""
    drop = ("XDG_RUNTIME_DIR", "CRUX_SOCKET", "CRUX_DECISION_TABLE", "LD_PRELOAD",
            "RUNTIME_DIRECTORY", "STATE_DIRECTORY", "HOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "HOME": "/nonexistent", **extra}


class SystemHost:
    """/run/crux of one host, private to the test. The empty directory it mounts on is made
    on the real host if missing, and left there: removing a directory that is a mount point
    in another namespace would unmount it under a test running beside this one."""

    def __init__(self) -> None:
        RUN.mkdir(mode=0o755, exist_ok=True)
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--",
                                        "sleep", "infinity"])
        mine = os.readlink("/proc/self/ns/mnt")
        end = time.monotonic() + 10
        while os.readlink(f"/proc/{self.holder.pid}/ns/mnt") == mine:
            if time.monotonic() > end:
                raise RuntimeError("unshare made no mount namespace")
            time.sleep(0.01)
        self.gid = crux_gid()
        self.run("mount", "-t", "tmpfs", "-o", f"mode=0755,uid=0,gid={self.gid}", "tmpfs",
                 str(RUN))

    def prefix(self, netns: str | None = None) -> list[str]:
        out = ["nsenter", "-t", str(self.holder.pid), "-m", "--"]
        return out + (["ip", "netns", "exec", netns] if netns else [])

    def run(self, *cmd: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix(netns), *cmd], check=True, capture_output=True,
                              text=True)

    def path(self, inside: Path | str) -> Path:
        """Where the test reads a path of the namespace (/run/crux/... inside it)."""
        return Path(f"/proc/{self.holder.pid}/root") / Path(inside).relative_to("/")

    def cruxd(self, config: Path, log: Path, netns: str | None = None,
              state_dir: Path | None = None) -> subprocess.Popen[bytes]:
        """cruxd as the unit starts it: root, gid crux, umask 0027, the unit's directories
        in RUNTIME_DIRECTORY / STATE_DIRECTORY."""
        env = {"RUNTIME_DIRECTORY": str(RUN)}
        if state_dir is not None:
            env["STATE_DIRECTORY"] = str(state_dir)
        cmd = [*self.prefix(netns), "setpriv", f"--regid={self.gid}", "--clear-groups", "--",
               "sh", "-c", 'umask 0027; exec "$@"', "sh", str(BIN / "cruxd"), "--config",
               str(config)]
        return spawn(cmd, log, env=env)

    def as_user(self, argv: Sequence[str], *, uid: int = NOBODY, in_group: bool,
                netns: str | None = None, env: Mapping[str, str] | None = None,
                ) -> subprocess.Popen[str]:
        """`argv` run as `uid` (its own group, and crux when `in_group`), from /."""
        groups = [f"--groups={self.gid}"] if in_group else ["--clear-groups"]
        cmd = [*self.prefix(netns), "setpriv", f"--reuid={uid}", f"--regid={uid}", *groups,
               "--", *argv]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd="/", env=job_env(**(env or {})))

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()

    def __enter__(self) -> SystemHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
