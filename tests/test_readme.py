"""README.md's commands work as written, in a clean clone (issue 31).

Every command of every fenced block (tests/readme_commands.py says which blocks hold
commands and how each runs) runs, in order, as literally written, in a `git clone` of this
checkout's HEAD: what is committed is tested, edits not yet committed are not. A command
that exits non-zero fails the test. Daemons (`cruxd`) and jobs (`crux-run -- ...`) start in
the background and must answer (`cruxctl status --local`; the agent lists the job) before
the next line runs; the commands after them run while they do; at the end of their block
they get SIGTERM, and `cruxd` must then exit 0.

The clone's venv. A fresh install would need the network, so the clone reuses what this
checkout's `.venv` holds, but not by a symlink to it: `.ci/bootstrap` writes into the venv
(its install stamp; a .pth naming $PWD for pyverbs) and, on a stamp mismatch, reinstalls
crux editable from where it runs, which would point everyone's `.venv` at a temporary
directory. And that shared editable install maps `cruxd` to this checkout, not the clone.
So the clone gets a venv of its own (`python -m venv --without-pip`) that sees the shared
site-packages through a .pth (the dependencies only: .pth files there are not processed,
so not the shared editable finder), and crux is installed editable from the clone,
offline (`pip install -e --no-deps --no-build-isolation --no-index`; the stubs and C
libraries are built in the clone). The clone's code is what runs. The install stamp is
written by `.ci/bootstrap`'s own `want=` line, run in the clone, and $PYTHON names the
interpreter the venv was made from (bootstrap remakes a venv built from another), so
`bash .ci/bootstrap demo` there installs nothing.

Isolation from whatever else runs on this host: the commands get their own state and
runtime directories and agent socket (STATE_DIRECTORY, RUNTIME_DIRECTORY, CRUX_SOCKET, so
`cruxctl` does not ask a host's cruxd at /run/crux), and, as root, a network namespace of
their own, so the fixed ports of examples/cruxd.toml (7470, 9477) meet no other cruxd.
Without root they share the host's network.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.paths import REPO
from tests.readme_commands import SKIPPED, Command, readme_commands

READY_S = 120.0  # a daemon or job that has not answered by then has failed to start
FOREGROUND_S = 900.0  # a foreground command still running by then hangs
STOP_S = 60.0


@dataclass
class Clone:
    root: Path
    env: dict[str, str]
    netns: list[str]  # the prefix that enters the private network namespace, or []
    logs: Path

    def argv(self, shell: str) -> list[str]:
        return [*self.netns, "bash", "-c", shell]

    def run(self, argv: list[str], timeout: float = FOREGROUND_S
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.netns, *argv], cwd=self.root, env=self.env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout,
                              check=False)


@dataclass
class Background:
    cmd: Command
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return _tail(self.log.read_text(errors="replace"))


@dataclass
class Block:
    """The background processes of one README block, stopped when it ends."""

    running: list[Background] = field(default_factory=list)

    def stop(self) -> list[str]:
        problems = []
        for bg in reversed(self.running):
            alive = bg.proc.poll() is None
            if alive:
                bg.proc.send_signal(signal.SIGTERM)
            try:
                rc = bg.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                rc = None
                problems.append(f"README.md:{bg.cmd.line}: `{bg.cmd.text}` ignored SIGTERM")
            _kill_group(bg.proc.pid)
            # a job may die of our signal; a daemon stops cleanly (0); anything that ended
            # on its own must have succeeded
            if rc not in (0, None) and (not alive or bg.cmd.kind == "daemon"):
                problems.append(f"README.md:{bg.cmd.line}: `{bg.cmd.text}` exited {rc}"
                                f"{' on SIGTERM' if alive else ''}\n{bg.tail()}")
        self.running.clear()
        return problems


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # whatever the program left behind
        os.killpg(pid, signal.SIGKILL)


def _install(root: Path) -> None:
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    Path(site.stdout.strip(), "crux-shared-venv.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", "--ignore-installed", "-e", str(root)],
                         cwd=root, capture_output=True, text=True, check=False)
    assert pip.returncode == 0, f"installing the clone: {_tail(pip.stdout + pip.stderr)}"
    script = (root / ".ci" / "bootstrap").read_text()
    stamp = re.search(r"^stamp=(\S+)$", script, re.M)
    want = re.search(r'^want="\$\((.*?)\)"$', script, re.M | re.S)
    assert stamp and want, ".ci/bootstrap has no stamp=/want= lines: update test_readme.py"
    digest = subprocess.run(["bash", "-c", want[1]], cwd=root, check=True,
                            capture_output=True, text=True).stdout.strip()
    (root / stamp[1]).write_text(digest + "\n")


def _venv_python(root: Path) -> str:
    """The interpreter the clone's venv was made from, for bootstrap's $PYTHON: it remakes
    a venv whose `home` is not the directory of the interpreter it would use."""
    cfg = (root / ".venv" / "pyvenv.cfg").read_text()
    home = re.search(r"^home = (.+)$", cfg, re.M)
    assert home, cfg
    return str(Path(home[1].strip(), "python3"))


@pytest.fixture(scope="module")
def clone() -> Iterator[Clone]:
    top = Path(tempfile.mkdtemp(prefix="crux-readme-"))  # short: agent socket paths
    holder = None
    try:
        root = top / "crux"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(root)], check=True,
                       capture_output=True)
        _install(root)
        netns: list[str] = []
        if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("nsenter"):
            holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c",
                                       "ip link set lo up && echo up && exec sleep infinity"],
                                      stdout=subprocess.PIPE, text=True)
            assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
            netns = ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUX_")
               and k not in ("PYTHONPATH", "VIRTUAL_ENV", "STATE_DIRECTORY",
                             "RUNTIME_DIRECTORY")}
        run = top / "run"
        run.mkdir(mode=0o700)
        env.update(STATE_DIRECTORY=str(top / "state"), RUNTIME_DIRECTORY=str(run),
                   CRUX_SOCKET=str(run / "agent.sock"), PYTHON=_venv_python(root),
                   NO_COLOR="1", COLUMNS="120")
        (top / "logs").mkdir()
        yield Clone(root, env, netns, top / "logs")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        shutil.rmtree(top, ignore_errors=True)


def _lists(jobs_json: str, cmd: Command) -> bool:
    """Whether `cruxctl jobs --json` lists the job of `cmd` (any job without --job-id)."""
    ids = {j["job_id"] for j in json.loads(jobs_json)["jobs"]}
    want = cmd.option("--job-id")
    return want in ids if want else bool(ids)


def _start(clone: Clone, cmd: Command) -> Background:
    log = clone.logs / f"line{cmd.line}.log"
    with log.open("wb") as out:
        # exec: the pid is the program's own, so SIGTERM reaches it, not a shell
        proc = subprocess.Popen(clone.argv("exec " + cmd.text), cwd=clone.root, env=clone.env,
                                stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    bg = Background(cmd, proc, log)
    cruxctl = str(clone.root / ".venv" / "bin" / "cruxctl")
    if cmd.kind == "daemon":  # ready when its agent answers
        config = cmd.option("--config")
        probe = [cruxctl, "status", "--local", *(["--config", config] if config else [])]
    else:  # ready when the agent lists the job
        probe = [cruxctl, "jobs", "--json"]
    deadline = time.monotonic() + READY_S
    while True:
        if proc.poll() is not None:
            if cmd.kind == "job" and proc.returncode == 0:
                return bg  # a job that ran to its end before we looked
            pytest.fail(f"README.md:{cmd.line}: `{cmd.text}` exited {proc.returncode} "
                        f"before it was ready\n{bg.tail()}")
        answer = clone.run(probe, timeout=STOP_S)
        if answer.returncode == 0 and (cmd.kind == "daemon" or _lists(answer.stdout, cmd)):
            return bg
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"README.md:{cmd.line}: `{cmd.text}` not ready: `{' '.join(probe)}` "
                        f"says {_tail(answer.stdout + answer.stderr)}\n{bg.tail()}")
        time.sleep(0.2)


@pytest.mark.slow
def test_every_readme_command_runs(clone: Clone) -> None:
    blocks = readme_commands((clone.root / "README.md").read_text())
    ran: list[str] = []
    for commands in blocks:
        block = Block()
        try:
            for cmd in commands:
                if cmd.kind == "skip":
                    continue
                if cmd.kind == "run":
                    r = subprocess.run(clone.argv(cmd.text), cwd=clone.root, env=clone.env,
                                       text=True, capture_output=True, timeout=FOREGROUND_S,
                                       stdin=subprocess.DEVNULL, check=False)
                    assert r.returncode == 0, (f"README.md:{cmd.line}: `{cmd.text}` exited "
                                               f"{r.returncode}\n{_tail(r.stdout + r.stderr)}")
                    assert "installing crux" not in r.stderr, "bootstrap reinstalled crux"
                else:
                    block.running.append(_start(clone, cmd))
                ran.append(cmd.text)
        except BaseException:
            block.stop()  # the first failure is the one to show
            raise
        problems = block.stop()
        assert not problems, "\n".join(problems)
    assert any(c.startswith("bash .ci/bootstrap demo") for c in ran), ran


def test_readme_blocks_are_all_classified() -> None:
    blocks = readme_commands((REPO / "README.md").read_text())
    commands = [c for block in blocks for c in block]
    kinds = {c.key: c.kind for c in commands}
    assert set(SKIPPED) <= set(kinds), f"SKIPPED names commands no longer in README.md: " \
        f"{set(SKIPPED) - set(kinds)}"
    assert "daemon" in kinds.values() and "run" in kinds.values()


SAMPLE = "\n".join([
    "Prose with `inline code`, which is not run.",                    # 1
    "```",                                                            # 2
    ".venv/bin/cruxd --config examples/cruxd.toml   # a comment",     # 3
    "",                                                               # 4
    ".venv/bin/crux-run --job-id j --gpus 8 -- sleep 9",              # 5
    "bash .ci/bootstrap test      # says why",                        # 6
    ".venv/bin/cruxctl simulate \\",                                  # 7
    "    testbed96",                                                  # 8
    "```",                                                            # 9
    "```toml",                                                        # 10
    "[daemon]",                                                       # 11
    "```",                                                            # 12
    "```console",                                                     # 13
    "$ .venv/bin/cruxd --check-config",                               # 14
    "{\"roles\": []}",                                                # 15
    "```",                                                            # 16
])


def test_commands_are_read_and_classified() -> None:
    blocks = readme_commands(SAMPLE)
    assert [[(c.kind, c.line) for c in b] for b in blocks] == [
        [("daemon", 3), ("job", 5), ("skip", 6), ("run", 7)], [("run", 14)]]
    first = blocks[0]
    assert first[3].argv == [".venv/bin/cruxctl", "simulate", "testbed96"]
    assert first[1].option("--job-id") == "j" and first[1].option("--socket") is None
    assert first[0].option("--config") == "examples/cruxd.toml"


def test_a_block_nobody_classified_fails() -> None:
    with pytest.raises(ValueError, match=r"README.md:2: a ```rust block"):
        readme_commands("text\n```rust\nfn main() {}\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        readme_commands("```\nls\n")
