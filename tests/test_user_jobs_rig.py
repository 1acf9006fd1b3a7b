"""Jobs of ordinary users against the host's agent, started as cruxd.service starts it (root,
group crux, umask 0027, /run/crux): a user in group crux is steered from the job's very first
connection, a user outside it is told why in one line and runs untouched, and
`crux-run --print-env` exports the agent's real table or nothing. Jobs run as `nobody` through
setpriv, in a private mount namespace whose /run/crux is the test's own (tests/rig/
system_host.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, free_port, toml, wait_for
from tests.rig.system_host import NOBODY, RUN, SystemHost, can_run_as
from transport.decision_table import TableReader

WHY = can_run_as(NOBODY)
pytestmark = [pytest.mark.root, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
CRUX_RUN = str(BIN / "crux-run")


def system_config(root: Path, listen: str, extra: dict[str, dict[str, Any]] | None = None
                  ) -> Path:
    """The host's cruxd.toml: no runtime_dir (the unit's RUNTIME_DIRECTORY gives /run/crux)."""
    doc: dict[str, dict[str, Any]] = {
        "daemon": {"host_id": "sys", "log_level": "debug"},
        "agent": {"leader": listen, "gpus": 8},
        "leader": {"listen": listen, "profiling_s": 0},
        "metrics": {"listen": ""},
    }
    for section, keys in (extra or {}).items():
        doc.setdefault(section, {}).update(keys)
    path = root / "cruxd.toml"
    path.write_text(toml(doc))
    return path


def finish(p: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, list[str]]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def host(tmp_path: Path) -> Any:
    with SystemHost() as h:
        listen = f"127.0.0.1:{free_port()}"
        log = tmp_path / "cruxd.log"
        d = h.cruxd(system_config(tmp_path, listen), log, state_dir=tmp_path / "state")
        wait_for("the host's agent", lambda: h.path(RUN / "agent.sock").is_socket() or
                 d.poll() is not None)
        assert d.poll() is None, log.read_text()
        try:
            yield h, d, log
        finally:
            d.terminate()
            d.wait(20)


def test_a_user_outside_group_crux_gets_one_line_and_runs_untouched(host: Any) -> None:
    h, _, _ = host
    rc, out, err = finish(h.as_user([CRUX_RUN, "--job-id", "outsider", "--", "sh", "-c",
                                     'echo "ran ${LD_PRELOAD:-unpreloaded}"'], in_group=False))
    assert rc == 0 and out == "ran unpreloaded\n"
    assert len(err) == 1, err
    assert "not in group crux" in err[0] and "usermod -aG crux" in err[0], err
    assert "running without crux" in err[0]


def test_a_user_in_group_crux_is_registered_and_waits_for_the_first_decision(
        host: Any) -> None:
    h, _, _ = host
    # the job reads the table itself, first thing: its entry is there before it starts
    probe = f"from transport.decision_table import TableReader as T; " \
            f"print(T('{RUN}/decisions').lookup('member') is not None)"
    rc, out, err = finish(h.as_user([CRUX_RUN, "--job-id", "member", "--verbose", "--",
                                     str(BIN / "python"), "-c", probe], in_group=True))
    assert rc == 0, err
    assert out == "True\n", (out, err)
    assert len(err) == 1 and "member's decision" in err[0], err  # --verbose, no warning


def test_print_env_exports_the_agents_real_table_or_nothing(host: Any) -> None:
    h, d, _ = host
    tmp_own = Path(f"/tmp/crux-{NOBODY}")
    had_tmp = tmp_own.exists()
    anchor = h.as_user([CRUX_RUN, "--job-id", "pe", "--", "sleep", "120"], in_group=True)
    try:
        wait_for("pe registered", lambda: (t := h.path(RUN / "decisions")).exists()
                 and TableReader(t).lookup("pe"))
        rc, out, err = finish(h.as_user([CRUX_RUN, "--print-env", "--job-id", "pe"],
                                        in_group=True))
        assert rc == 0 and err == [], err
        assert f"export CRUX_DECISION_TABLE={RUN}/decisions\n" in out
        assert "export LD_PRELOAD=" in out and "export CRUX_JOB_ID=pe\n" in out

        rc, out, err = finish(h.as_user([CRUX_RUN, "--print-env", "--job-id", "pe"],
                                        in_group=False))
        assert rc == 0 and out == "" and len(err) == 1 and "not in group crux" in err[0], err
    finally:
        anchor.kill()
        anchor.wait()
    d.terminate()
    d.wait(20)
    rc, out, err = finish(h.as_user([CRUX_RUN, "--print-env", "--job-id", "pe"],
                                    in_group=True))
    assert rc == 0 and out == "", out
    assert len(err) == 1 and "no crux agent serves this user" in err[0], err
    assert had_tmp or not tmp_own.exists()  # looked for, never created


def test_no_decision_in_time_starts_the_job_anyway_with_one_line(tmp_path: Path) -> None:
    """An agent whose leader never answers: the wait runs out, the job runs."""
    with SystemHost() as h:
        cfg = system_config(tmp_path, f"127.0.0.1:{free_port()}",
                            {"daemon": {"roles": ["agent"]}})
        d = h.cruxd(cfg, tmp_path / "cruxd.log", state_dir=tmp_path / "state")
        try:
            wait_for("the agent", lambda: h.path(RUN / "agent.sock").is_socket())
            rc, out, err = finish(h.as_user([CRUX_RUN, "--job-id", "late", "--wait-s", "0.3",
                                             "--", "echo", "ran"], in_group=True))
        finally:
            d.terminate()
            d.wait(20)
    assert rc == 0 and out == "ran\n"
    assert len(err) == 1 and "no decision for job late" in err[0], err
    assert "after 0.3 s" in err[0] and "starting it anyway" in err[0]
