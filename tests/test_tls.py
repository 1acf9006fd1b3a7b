"""Agent <-> leader over mutual TLS, with certificates made by the test: an agent
with a certificate from the cluster's CA gets plans; one without a certificate, or
with one from another CA, is refused and never sees a plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from cruxd.testing import Daemon, free_port, status
from tests.tls_certs import CA

pytestmark = pytest.mark.slow


def _tls(ca: Path, cert: Path, key: Path) -> dict[str, str]:
    return {"ca": str(ca), "cert": str(cert), "key": str(key)}


def test_mutual_tls_admits_only_agents_with_the_clusters_certificates(tmp_path: Path) -> None:
    ca = CA(tmp_path / "pki")
    rogue = CA(tmp_path / "rogue", name="rogue-ca")
    port = free_port()
    leader = Daemon(tmp_path, "leader", {
        "daemon": {"roles": ["leader"]}, "leader": {"listen": f"127.0.0.1:{port}"},
        "tls": _tls(ca.path, *ca.issue("leader", server=True))})

    def agent(name: str, tls: dict[str, str] | None) -> Daemon:
        sections = {"daemon": {"roles": ["agent"]},
                    "agent": {"leader": f"127.0.0.1:{port}", "addresses": ["10.2.0.1"],
                              "gpus": 0, "report_interval_s": 0.3, "reconnect_max_s": 0.5}}
        if tls is not None:
            sections["tls"] = tls
        return Daemon(tmp_path, name, sections)

    good = agent("good", _tls(ca.path, *ca.issue("good", server=False)))
    plain = agent("plain", None)
    # trusts the real CA (so it would accept the leader) but its own cert is rogue
    stranger = agent("stranger", _tls(ca.path, *rogue.issue("stranger", server=False)))
    daemons = [leader, good, plain, stranger]
    try:
        leader.start().wait_log("(mTLS)")
        for d in daemons[1:]:
            d.start()
        good.wait_log(" applied: ")
        for d in (plain, stranger):
            d.wait_log("UNAVAILABLE")
        cluster = status(good.socket)["cluster"]
        assert [a["host_id"] for a in cluster["agents"]] == ["good"]
        for d in (plain, stranger):
            local = status(d.socket)
            assert local["agent"]["leader_reachable"] is False
            assert local["agent"]["applied_generation"] == 0
            assert " applied: " not in d.log_text()
    finally:
        codes = [d.stop() for d in daemons]
    assert codes == [0, 0, 0, 0]


def test_a_leader_whose_certificate_names_another_host_gets_nothing(tmp_path: Path) -> None:
    """The address is a configured leader's, the certificate is the cluster CA's, but it
    names another host: the agent ends the handshake before it sends a report or a token,
    and applies nothing (issue 37, item 1: a leader proves who it is)."""
    ca = CA(tmp_path / "pki")
    port = free_port()
    impostor = Daemon(tmp_path, "impostor", {
        "daemon": {"roles": ["leader"]}, "leader": {"listen": f"127.0.0.1:{port}"},
        "tls": _tls(ca.path, *ca.issue("impostor", server=True, san=("h5.cluster",)))})
    agent = Daemon(tmp_path, "a1", {
        "daemon": {"roles": ["agent"]},
        "agent": {"leader": f"127.0.0.1:{port}", "addresses": ["10.2.0.1"], "gpus": 0,
                  "report_interval_s": 0.3, "reconnect_max_s": 0.5},
        "tls": _tls(ca.path, *ca.issue("a1", server=False))})
    try:
        impostor.start().wait_log("(mTLS)")
        agent.start().wait_log("Hostname Verification Check failed")
        local = status(agent.socket)["agent"]
        assert local["leader_reachable"] is False and local["applied_generation"] == 0
        assert " applied: " not in agent.log_text()
        assert "agent joined" not in impostor.log_text()  # no report reached it
    finally:
        codes = [d.stop() for d in (agent, impostor)]
    assert codes == [0, 0]
