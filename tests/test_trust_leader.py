"""Who may speak for a host at the leader (issue 17): the plaintext leader's token, mTLS
identities bound to host ids, the admission list, per-host job quotas, and fake hosts
that come and go leaving nothing behind. Real leaders (`cruxd`), real gRPC calls."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cruxd.leader.auth import ensure_token
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.testing import BIN, Daemon, crux_run, cruxctl, free_port, status, toml, wait_for
from tests.nobody import SETPRIV
from tests.tls_certs import CA

pytestmark = pytest.mark.slow

READS = {"Status": lpb.StatusRequest(), "GetPlan": lpb.PlanRequest(),
         "GetHints": cpb.HintsRequest(format="spiderflow")}


def _port(d: Daemon, what: str) -> int:
    m = re.search(re.escape(what) + r"[^\n]*?127\.0\.0\.1:(\d+)", d.wait_log(what))
    assert m
    return int(m.group(1))


def _auth(d: Daemon) -> tuple[tuple[str, str], ...]:
    return (("authorization", "Bearer " + (d.root / "state" / "leader.token").read_text()
             .strip()),)


def _report(host: str, *jobs: str, gpus: int = 1) -> lpb.AgentReport:
    return lpb.AgentReport(schema=cpb.SCHEMA_REVISION_CURRENT,
                           host=lpb.HostInventory(host_id=host, gpus=8), jobs=[
        cpb.LocalJob(job_id=j, gpus=gpus, nnodes=1,
                     measurement=cpb.JobMeasurement(flops_per_iter=1e12, comm_s=0.1,
                                                    period_s=1.0, compute_s=0.5))
        for j in jobs])


def _rejected(url: str) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for ln in text.splitlines():
        m = re.match(r'crux_rpc_rejected_total\{(.*)\} (\S+)', ln)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["rpc"], labels["field"])] = float(m.group(2))
    return out


def _code(fn: Any, *args: Any, **kwargs: Any) -> grpc.StatusCode:
    """The status code `fn(*args, **kwargs)` fails with."""
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kwargs)
    code: grpc.StatusCode = err.value.code()
    return code


def _watch(stub: Any, host: str, **kwargs: Any) -> list[Any]:
    return list(stub.WatchPlan(lpb.WatchRequest(host_id=host), timeout=5, **kwargs))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Daemon, str, str]]:
    """One host running agent + leader (one job scheduled), metrics on."""
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10,
                   "max_jobs_per_host": 4, "levels": 4},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.3},
        "metrics": {"listen": "127.0.0.1:0"}})
    d.start()
    job = None
    try:
        address = f"127.0.0.1:{_port(d, 'leader listening on')}"
        url = f"http://127.0.0.1:{_port(d, 'metrics on http://')}/metrics"
        d.wait_log(" applied: ")  # the agent is up and has the leader's token
        job = crux_run(d.socket, "real", "--gpus", "8", "--flops-per-iter", "1e15")
        wait_for("the real job scheduled", lambda: [
            j["state"] for j in status(d.socket)["cluster"]["jobs"]] == ["scheduled"])
        yield d, address, url
    finally:
        if job is not None:
            job.kill()
            job.wait()
        assert d.stop() == 0, d.log_text()[-2000:]


def test_plaintext_leader_refuses_every_rpc_without_its_token(
        pair: tuple[Daemon, str, str]) -> None:
    d, address, url = pair
    token = d.root / "state" / "leader.token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o640 and stat.S_ISREG(token.lstat().st_mode)
    before = status(d.socket)["cluster"]
    with grpc.insecure_channel(address) as ch:
        stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
        for auth in ((), (("authorization", "Bearer " + "0" * 64),),
                     (("authorization", "token-without-scheme"),)):
            # a fake h0 that would drop the real job, a fake host adding one, a plan read
            assert _code(stub.Report, _report("h0"), timeout=5, metadata=auth) \
                == grpc.StatusCode.UNAUTHENTICATED
            assert _code(stub.Report, _report("evil", "evil"), timeout=5, metadata=auth) \
                == grpc.StatusCode.UNAUTHENTICATED
            assert _code(_watch, stub, "h0", metadata=auth) == grpc.StatusCode.UNAUTHENTICATED
            for rpc, req in READS.items():
                assert _code(getattr(stub, rpc), req, timeout=5, metadata=auth) \
                    == grpc.StatusCode.UNAUTHENTICATED, rpc
        # the real token works
        assert stub.Status(lpb.StatusRequest(), timeout=5, metadata=_auth(d)).agents
    counted = _rejected(url)
    assert counted[("Report", "unauthenticated")] == 6
    for rpc in ("WatchPlan", *READS):
        assert counted[(rpc, "unauthenticated")] == 3, rpc
    after = status(d.socket)["cluster"]
    assert [a["host_id"] for a in after["agents"]] == ["h0"], "no fake host got in"
    assert [(j["job_id"], j["level"]) for j in after["jobs"]] == \
        [(j["job_id"], j["level"]) for j in before["jobs"]]
    # cruxctl --leader reads the token named by the configuration
    run = cruxctl("status", "--json", "--leader", address, "--config", str(d.config))
    assert run.returncode == 0, run.stderr
    assert [a["host_id"] for a in json.loads(run.stdout)["cluster"]["agents"]] == ["h0"]


@pytest.mark.root
def test_a_user_who_cannot_read_the_token_is_refused(pair: tuple[Daemon, str, str]) -> None:
    _, address, url = pair
    # nobody's own runtime dir, so the run leaves no /tmp/crux-65534 behind for
    # test_trust_agent's check of that path
    runtime = Path(tempfile.mkdtemp(prefix="crux-nobody-", dir="/tmp"))
    os.chown(runtime, 65534, 65534)
    try:
        run = subprocess.run([*SETPRIV, str(BIN / "cruxctl"), "status", "--json", "--leader",
                              address], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "HOME": "/nonexistent",
                                  "XDG_RUNTIME_DIR": str(runtime)})
    finally:
        shutil.rmtree(runtime)
    assert run.returncode == 3, run.stderr
    assert "UNAUTHENTICATED" in run.stderr
    assert _rejected(url)[("Status", "unauthenticated")] == 1


def test_token_file_is_replaced_unless_it_is_a_private_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "leader.token"
    first = ensure_token(path)
    assert ensure_token(path) == first, "a good token is reused across restarts"
    path.chmod(0o644)  # world-readable: anyone could have copied it
    second = ensure_token(path)
    assert second != first and stat.S_IMODE(path.stat().st_mode) == 0o640
    target = tmp_path / "elsewhere"
    target.write_text("a" * 64 + "\n")
    target.chmod(0o600)
    path.unlink()
    path.symlink_to(target)  # planted: never followed, never trusted
    third = ensure_token(path)
    assert third != "a" * 64 and not path.is_symlink()
    assert target.read_text() == "a" * 64 + "\n", "the symlink's target is untouched"
    path.unlink()
    path.mkdir()
    with pytest.raises(Exception, match="leader token"):
        ensure_token(path)  # a directory cannot be replaced by a file: a clear error


def test_plaintext_leader_on_a_non_loopback_address_refuses_to_start(tmp_path: Path) -> None:
    cfg = tmp_path / "cruxd.toml"
    sections: dict[str, dict[str, Any]] = {
        "daemon": {"roles": ["leader"], "state_dir": str(tmp_path / "state"),
                   "runtime_dir": str(tmp_path / "run")},
        "leader": {"listen": f"0.0.0.0:{free_port()}"}, "metrics": {"listen": ""}}
    cfg.write_text(toml(sections))
    run = subprocess.run([str(BIN / "cruxd"), "--config", str(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert "leader.listen" in lines[-1] and "insecure_remote" in lines[-1]
    assert "Traceback" not in run.stderr
    sections["leader"]["insecure_remote"] = True  # a lab, said explicitly: starts
    d = Daemon(tmp_path, "lab", sections)
    d.start().wait_log("leader listening on")
    assert d.stop() == 0


def test_allow_list_admits_only_the_named_hosts(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "h1", {"daemon": {"roles": ["leader"]},
                                "leader": {"listen": "127.0.0.1:0", "hosts": ["h1"]},
                                "metrics": {"listen": "127.0.0.1:0"}})
    d.start()
    try:
        address = f"127.0.0.1:{_port(d, 'leader listening on')}"
        url = f"http://127.0.0.1:{_port(d, 'metrics on http://')}/metrics"
        with grpc.insecure_channel(address) as ch:
            stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
            assert _code(stub.Report, _report("h2", "j2"), timeout=5, metadata=_auth(d)) \
                == grpc.StatusCode.PERMISSION_DENIED
            assert _code(_watch, stub, "h2", metadata=_auth(d)) \
                == grpc.StatusCode.PERMISSION_DENIED
            stub.Report(_report("h1", "j1"), timeout=5, metadata=_auth(d))
            st = stub.Status(lpb.StatusRequest(), timeout=5, metadata=_auth(d))
            assert [a.host_id for a in st.agents] == ["h1"]
            assert [j.job_id for j in st.jobs] == ["j1"]
        counted = _rejected(url)
        assert counted[("Report", "permission_denied")] == 1
        assert counted[("WatchPlan", "permission_denied")] == 1
    finally:
        assert d.stop() == 0


def test_one_host_over_its_job_quota_does_not_disturb_the_others(
        pair: tuple[Daemon, str, str]) -> None:
    d, address, url = pair
    before = {j["job_id"]: j["level"] for j in status(d.socket)["cluster"]["jobs"]}
    with grpc.insecure_channel(address) as ch:
        stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
        for n in range(3):  # three authenticated hosts, each over the quota of 4 jobs
            with pytest.raises(grpc.RpcError) as err:
                stub.Report(_report(f"fake{n}", *(f"f{n}-{k}" for k in range(5)), gpus=8),
                            timeout=5, metadata=_auth(d))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "leader.max_jobs_per_host is 4" in (err.value.details() or "")
        stub.Report(_report("fake9"), timeout=5, metadata=_auth(d))  # within: accepted
    assert _rejected(url)[("Report", "jobs")] == 3
    cluster = status(d.socket)["cluster"]
    assert sorted(a["host_id"] for a in cluster["agents"]) == ["fake9", "h0"]
    assert {j["job_id"]: j["level"] for j in cluster["jobs"]} == before, "no fake job got in"
    assert status(d.socket)["agent"]["leader_reachable"] is True


def test_mtls_certificate_must_name_the_host_it_speaks_for(tmp_path: Path) -> None:
    ca = CA(tmp_path / "pki")
    leader = Daemon(tmp_path, "leader", {
        "daemon": {"roles": ["leader"]}, "leader": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "tls": dict(zip(("ca", "cert", "key"), map(str, (
            ca.path, *ca.issue("leader", server=True))), strict=True))})
    leader.start()
    try:
        address = f"127.0.0.1:{_port(leader, 'leader listening on')}"
        url = f"http://127.0.0.1:{_port(leader, 'metrics on http://')}/metrics"

        def stub(cn: str, san: tuple[str, ...] | None = None) -> Any:
            cert, key = ca.issue(cn, server=False, san=san)
            creds = grpc.ssl_channel_credentials(ca.path.read_bytes(), key.read_bytes(),
                                                 cert.read_bytes())
            return lgrpc.LeaderStub(grpc.secure_channel(  # type: ignore[no-untyped-call]
                address, creds, options=[("grpc.ssl_target_name_override", "localhost")]))

        t1 = stub("t1")  # SAN DNS:t1
        assert _code(t1.Report, _report("some-other-host", "x"), timeout=5) \
            == grpc.StatusCode.PERMISSION_DENIED
        assert _code(_watch, t1, "some-other-host") == grpc.StatusCode.PERMISSION_DENIED
        t1.Report(_report("t1", "j1"), timeout=5)  # itself: accepted
        # a SAN wins over the CN; a certificate without SAN falls back to its CN
        alias = stub("t2", san=("t2.example",))
        assert _code(alias.Report, _report("t2", "j2"), timeout=5) \
            == grpc.StatusCode.PERMISSION_DENIED
        alias.Report(_report("t2.example"), timeout=5)
        stub("t3", san=()).Report(_report("t3"), timeout=5)
        st = t1.Status(lpb.StatusRequest(), timeout=5)  # any verified certificate reads
        assert sorted(a.host_id for a in st.agents) == ["t1", "t2.example", "t3"]
        assert [j.job_id for j in st.jobs] == ["j1"]
        counted = _rejected(url)
        assert counted[("Report", "permission_denied")] == 2
        assert counted[("WatchPlan", "permission_denied")] == 1
    finally:
        assert leader.stop() == 0


# --- fake hosts coming and going ----------------------------------------------------------

def _rss_kib(pid: int) -> int:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    raise AssertionError("no VmRSS")


async def _admit(address: str, auth: tuple[tuple[str, str], ...], hosts: list[str]) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
        for i in range(0, len(hosts), 200):
            await asyncio.gather(*(stub.Report(_report(h, f"{h}-job"), timeout=60,
                                               metadata=auth) for h in hosts[i:i + 200]))


def test_purged_fake_hosts_leave_nothing_behind(tmp_path: Path) -> None:
    n = int(os.environ.get("CRUX_PURGE_HOSTS", "2000"))  # the audit's 20,000: a longer run
    d = Daemon(tmp_path, "leader", {
        "daemon": {"roles": ["leader"], "log_level": "info"},
        "leader": {"listen": "127.0.0.1:0", "agent_timeout_s": 0.5, "profiling_s": 0,
                   "debounce_ms": 200}})
    d.start()
    try:
        address = f"127.0.0.1:{_port(d, 'leader listening on')}"
        assert d.proc is not None
        rss = []
        for rnd in range(3):
            hosts = [f"r{rnd}-h{i}" for i in range(n)]
            asyncio.run(_admit(address, _auth(d), hosts))

            def counts() -> tuple[int, int]:
                run = cruxctl("status", "--json", "--leader", address, "--config", str(d.config))
                assert run.returncode == 0, run.stderr
                doc = json.loads(run.stdout)["cluster"]
                return len(doc.get("agents", [])), len(doc.get("jobs", []))
            assert counts()[0] > 0, "the hosts were admitted"
            wait_for(f"round {rnd}: every fake host and job purged (hosts, jobs)",
                     lambda: counts() if counts() == (0, 0) else False, timeout=120)
            rss.append(_rss_kib(d.proc.pid))
        print(f"leader VmRSS after each round of {n} hosts (KiB): {rss}")
        # no growth per round (allocator high-water marks aside): within 10 %
        assert rss[1] <= rss[0] * 1.10 and rss[2] <= rss[1] * 1.10, rss
    finally:
        assert d.stop() == 0, d.log_text()[-2000:]

