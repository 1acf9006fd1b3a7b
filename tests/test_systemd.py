"""systemd integration: the sd_notify protocol, the unit file, journald-aware logging."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from cruxd.daemon.logs import setup_logging
from cruxd.daemon.notify import Notifier, watchdog_loop
from tests.paths import REPO

SYSTEMD = REPO / "systemd"
UNIT = SYSTEMD / "cruxd.service"
CAPS = {"CAP_NET_RAW", "CAP_NET_ADMIN", "CAP_IPC_LOCK"}


# --- sd_notify ------------------------------------------------------------------------

@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd, and its NOTIFY_SOCKET value."""
    path = tmp_path / "notify.sock"
    if len(os.fsencode(path)) >= 100:  # sun_path is 108 bytes; a deep basetemp can exceed it
        path = Path(tempfile.mkdtemp(prefix="crux-")) / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield sock, str(path)
    path.unlink(missing_ok=True)
    if path.parent != tmp_path:
        path.parent.rmdir()


def fields(sock: socket.socket) -> dict[str, str]:
    lines = sock.recv(4096).decode().split("\n")
    return dict(line.split("=", 1) for line in lines)


def drain(sock: socket.socket) -> list[bytes]:
    out: list[bytes] = []
    sock.setblocking(False)
    with suppress(BlockingIOError):
        while True:
            out.append(sock.recv(4096))
    return out


def test_states(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.enabled
    # Datagrams queue in order: send them all, then read them back one by one.
    sent = [n.ready("4 jobs"), n.ready(), n.status("probing"), n.watchdog(), n.stopping()]
    assert all(sent) and [fields(sock) for _ in sent] == [
        {"READY": "1", "STATUS": "4 jobs"}, {"READY": "1"}, {"STATUS": "probing"},
        {"WATCHDOG": "1"}, {"STOPPING": "1"}]
    assert n.send("READY=1\nSTATUS=a b", ERRNO=0)
    assert sock.recv(4096) == b"READY=1\nSTATUS=a b\nERRNO=0"


def test_reloading_sends_monotonic_usec(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert Notifier.from_env({"NOTIFY_SOCKET": path}).reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    got = fields(sock)
    assert got.pop("RELOADING") == "1" and got.keys() == {"MONOTONIC_USEC"}
    assert before <= int(got["MONOTONIC_USEC"]) <= after


def test_abstract_socket() -> None:
    name = f"crux-test-{os.getpid()}-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        assert Notifier.from_env({"NOTIFY_SOCKET": "@" + name}).ready("up")
        assert fields(sock) == {"READY": "1", "STATUS": "up"}


def test_noop_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_socket(*args: object) -> None:
        raise AssertionError("no socket may be opened without NOTIFY_SOCKET")

    monkeypatch.setattr(socket, "socket", no_socket)
    n = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not n.enabled and n.watchdog_interval_s is None
    assert not n.ready("x") and not n.watchdog() and not n.stopping() and not n.reloading()
    monkeypatch.undo()  # the event loop needs socket.socket for its self-pipe
    asyncio.run(asyncio.wait_for(watchdog_loop(n, asyncio.Event()), 5))


def test_watchdog_pid_and_interval() -> None:
    assert Notifier.from_env({"NOTIFY_SOCKET": "/run/n"}).watchdog_interval_s is None
    usec = {"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "30000000"}
    assert Notifier.from_env(usec).watchdog_interval_s == 15.0
    for pid, interval in ((os.getpid(), 15.0), (os.getpid() + 1, None)):
        assert Notifier.from_env({**usec, "WATCHDOG_PID": str(pid)}).watchdog_interval_s == interval


@pytest.mark.parametrize("env", [{"NOTIFY_SOCKET": "relative/path"}, {"NOTIFY_SOCKET": "@"},
                                 {"WATCHDOG_USEC": "30s"}, {"WATCHDOG_USEC": "0"},
                                 {"WATCHDOG_USEC": "100", "WATCHDOG_PID": "me"}])
def test_malformed_environment(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        Notifier.from_env(env)


@pytest.mark.parametrize("args, kwargs", [((), {"STATUS": "two\nlines"}), (("ready=1",), {}),
                                          (("READY=1\nnonsense",), {}), ((), {"status": "x"}),
                                          ((), {})])
def test_bad_input_raises_even_when_disabled(args: tuple[str, ...],
                                             kwargs: dict[str, object]) -> None:
    for n in (Notifier(None), Notifier("/nonexistent/notify")):
        with pytest.raises(ValueError):
            n.send(*args, **kwargs)


def test_vanished_socket_is_logged_once_not_raised(
        listener: tuple[socket.socket, str], caplog: pytest.LogCaptureFixture) -> None:
    sock, path = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    sock.close()
    os.unlink(path)
    with caplog.at_level(logging.DEBUG, logger="cruxd.daemon.notify"):
        assert not n.ready() and not n.watchdog()
    levels = [r.levelno for r in caplog.records if r.name == "cruxd.daemon.notify"]
    assert levels == [logging.WARNING, logging.DEBUG]
    assert path in caplog.records[0].getMessage()


def test_watchdog_loop_pings_until_stopped(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})
    assert n.watchdog_interval_s == 0.05

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(watchdog_loop(n, stop))
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(run())
    pings = drain(sock)
    assert len(pings) >= 2 and set(pings) == {b"WATCHDOG=1"}


# --- the unit file --------------------------------------------------------------------

def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Section -> (key, value) in order. Own parser: systemd allows repeated keys."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"continuation lines are not used here: {raw!r}"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"stray line {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


SERVICE_DIRECTIVES = {
    "Type": "notify", "NotifyAccess": "main",
    "ExecStart": "/usr/local/bin/cruxd --config /etc/crux/cruxd.toml $CRUXD_ARGS",
    "ExecReload": "/bin/kill -HUP $MAINPID", "WatchdogSec": "30s", "Restart": "on-failure",
    "RestartSec": "2s", "TimeoutStopSec": "20s", "RuntimeDirectory": "crux",
    "RuntimeDirectoryMode": "0755", "RuntimeDirectoryPreserve": "yes",
    "StateDirectory": "crux", "StateDirectoryMode": "0750", "ConfigurationDirectory": "crux",
    "EnvironmentFile": "-/etc/default/cruxd", "ProtectSystem": "strict",
    "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
    "ProtectKernelModules": "yes", "ProtectControlGroups": "yes", "PrivateMounts": "yes",
    "ProtectClock": "yes", "ProtectKernelLogs": "yes", "ProtectHostname": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes", "UMask": "0027",
    "LockPersonality": "yes", "RestrictRealtime": "yes", "SystemCallArchitectures": "native",
    "SystemCallFilter": "@system-service", "SystemCallErrorNumber": "EPERM",
    "LimitNOFILE": "65536", "MemoryMax": "2G",
    "LimitMEMLOCK": "infinity", "StandardOutput": "journal", "StandardError": "journal",
    "SyslogIdentifier": "cruxd", "Group": "crux",
}


def test_unit_directives_once_each() -> None:
    sections = unit_sections(UNIT.read_text())
    for name, pairs in sections.items():
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"[{name}] repeats {keys}"
    service = dict(sections["Service"])
    for key, value in SERVICE_DIRECTIVES.items():
        assert service.get(key) == value, key
    assert "User" not in service  # runs as root, held to the capabilities below
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        caps = service[key].split()
        assert len(caps) == len(set(caps)) and set(caps) == CAPS, key
    assert dict(sections["Install"]) == {"WantedBy": "multi-user.target"}
    assert "CRUXD_ARGS=" in (SYSTEMD / "cruxd.env.example").read_text()


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package: systemd)")
    venv = REPO / ".venv" / "bin" / "cruxd"
    cruxd = str(venv) if venv.exists() else shutil.which("cruxd")
    if cruxd is None:
        pytest.skip("no cruxd console script (pip install -e .)")
    # verify fails when ExecStart's binary is missing, so point it at the venv's.
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace("ExecStart=/usr/local/bin/cruxd ",
                                             f"ExecStart={cruxd} "))
    run = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    # Unknown keys and unparsable values are only warnings: exit 0, a line on stderr.
    assert UNIT.name not in run.stderr, run.stderr


MAX_EXPOSURE = 3.5  # issue 17: "OK" or better in systemd-analyze security


def test_systemd_analyze_security_score() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package: systemd)")
    helps = subprocess.run([analyze, "security", "--help"], capture_output=True, text=True,
                           timeout=60, check=False)
    if "--offline" not in helps.stdout:
        pytest.skip("systemd-analyze security has no --offline (systemd < 250)")
    run = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(UNIT)],
                         capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Overall exposure level for cruxd\.service: (\d+\.\d+)", run.stdout)
    assert found, run.stdout + run.stderr
    assert float(found[1]) <= MAX_EXPOSURE, run.stdout


@pytest.mark.root
def test_sysusers_and_tmpfiles(tmp_path: Path) -> None:
    sysusers, tmpfiles = shutil.which("systemd-sysusers"), shutil.which("systemd-tmpfiles")
    if sysusers is None or tmpfiles is None:
        pytest.skip("systemd-sysusers/systemd-tmpfiles not installed (Debian package: systemd)")
    (tmp_path / "etc").mkdir()
    for tool, conf in ((sysusers, "crux.sysusers"), (tmpfiles, "crux.tmpfiles")):
        extra = ["--create"] if tool == tmpfiles else []
        run = subprocess.run([tool, f"--root={tmp_path}", *extra, str(SYSTEMD / conf)],
                             capture_output=True, text=True, timeout=60, check=False)
        # Warnings name the file; sysusers also reports what it created.
        assert run.returncode == 0 and conf not in run.stderr, run.stderr
    group = (tmp_path / "etc" / "group").read_text()
    entry = re.search(r"^crux:x:(\d+):", group, re.M)
    st = (tmp_path / "run" / "crux").stat()
    assert entry and (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o755, 0, int(entry[1]))


# --- logging --------------------------------------------------------------------------

@contextmanager
def root_logger_restored() -> Iterator[None]:
    """setup_logging replaces the root handlers; put pytest's back within the same phase."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def emit(level: str, env: dict[str, str], log_format: str = "auto",
         journal: Path = Path("/nonexistent/journal/socket")) -> list[str]:
    buf = io.StringIO()
    with root_logger_restored():
        setup_logging(level, env=env, stream=buf, log_format=log_format, journal=journal)
        log = logging.getLogger("crux.test")
        for level_no, message in ((logging.DEBUG, "quiet"), (logging.INFO, "hello"),
                                  (logging.ERROR, "bad")):
            log.log(level_no, message, extra={"crux_job": "gpt", "generation": 7})
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.critical("crashed", exc_info=True)
    return buf.getvalue().splitlines()


def test_journal_prefixes() -> None:
    lines = emit("INFO", {"JOURNAL_STREAM": "8:12345"})
    assert lines[:3] == ["<6>crux.test: hello", "<3>crux.test: bad", "<2>crux.test: crashed"]
    # The traceback's lines keep the priority, one journal entry each.
    assert len(lines) > 3 and all(line.startswith("<2>") for line in lines[3:])
    assert lines[-1] == "<2>RuntimeError: boom"
    assert emit("debug", {"JOURNAL_STREAM": "8:1"})[0] == "<7>crux.test: quiet"


def test_plain_lines_are_timestamped() -> None:
    lines = emit("Warning", {})
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.fullmatch(stamp + r" ERROR crux\.test: bad", lines[0]), lines
    assert re.fullmatch(stamp + r" CRITICAL crux\.test: crashed", lines[1]), lines
    assert not any("hello" in line for line in lines)


def test_json_lines_carry_the_structured_fields() -> None:
    lines = emit("info", {"JOURNAL_STREAM": "8:1"}, log_format="json")
    docs = [json.loads(line) for line in lines]  # one object a line, traceback included
    assert [(d["level"], d["message"]) for d in docs] == [
        ("info", "hello"), ("error", "bad"), ("critical", "crashed")]
    assert docs[0]["crux_job"] == "gpt" and docs[0]["generation"] == "7"
    assert docs[0]["logger"] == "crux.test" and docs[0]["time"].endswith("Z")
    assert "RuntimeError: boom" in docs[2]["exc"] and "crux_job" not in docs[2]


def test_journal_format_without_a_journal_falls_back_to_stderr() -> None:
    lines = emit("info", {}, log_format="journal")
    assert lines[:2] == ["<6>crux.test: hello", "<3>crux.test: bad"]


JOURNALD = Path("/lib/systemd/systemd-journald")


@pytest.mark.root
def test_native_journal_entries_in_a_real_journald() -> None:
    """A real systemd-journald, in a mount namespace of its own (a tmpfs /run), receives the
    entries with their fields: `journalctl CRUX_JOB=gpt` finds them."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not JOURNALD.exists():
        pytest.skip("needs root, unshare and systemd-journald")
    code = ("import logging\n"
            "from cruxd.daemon.logs import setup_logging\n"
            "setup_logging('info', env={'JOURNAL_STREAM': '8:1'})\n"
            "log = logging.getLogger('cruxd.test')\n"
            "log.info('plan %d applied', 7, extra={'generation': 7, 'crux_job': 'gpt'})\n"
            "try:\n    raise RuntimeError('boom')\n"
            "except RuntimeError:\n    log.error('two\\nlines', exc_info=True,"
            " extra={'host': 'h9'})\n")
    script = (f"mount -t tmpfs none /run && mkdir -p /run/systemd/journal /run/log/journal && "
              f"({JOURNALD} >/dev/null 2>&1 &) && "
              f"for i in $(seq 50); do [ -S /run/systemd/journal/socket ] && break; "
              f"sleep 0.1; done && {sys.executable} -c \"$CODE\" && sleep 0.5 && "
              f"journalctl -D /run/log/journal -o json --no-pager SYSLOG_IDENTIFIER=cruxd; "
              f"pkill -f {JOURNALD}")
    run = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "CODE": code})
    entries = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(entries) == 2, (run.stdout, run.stderr)
    plan, err = entries
    assert (plan["MESSAGE"], plan["PRIORITY"], plan["CRUX_JOB"], plan["CRUX_GENERATION"]) == (
        "cruxd.test: plan 7 applied", "6", "gpt", "7")
    assert plan["LOGGER"] == "cruxd.test" and plan["CODE_FUNC"] == "<module>"
    # a message with newlines and its traceback: one entry, binary-safe
    assert err["PRIORITY"] == "3" and err["CRUX_HOST"] == "h9"
    assert "two\nlines" in err["MESSAGE"] and "RuntimeError: boom" in err["MESSAGE"]


def test_unknown_level() -> None:
    with pytest.raises(ValueError, match="debug, info, warning, error"):
        setup_logging("verbose", env={}, stream=io.StringIO())
