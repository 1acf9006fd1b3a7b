"""The [probing] section: how an agent sweeps paths toward its jobs' peers."""

from __future__ import annotations

from cruxd.config.fields import Range, Section
from cruxd.config.model import ProbingConfig
from probing.sweep import port_range
from transport.roce import ROCE_DPORT, ROCE_SPORT_TEXT

# One sweep at a time over all peers: this caps probe traffic per host whatever
# the configuration says (a 3-hop TTL trace is 3-4 datagrams of 80 bytes per port).
MAX_RATE_PPS = 1000.0
# A decision-table entry holds at most this many TCP source ports per peer.
MAX_TCP_PORTS = 8
# Above Linux's default ephemeral range (net.ipv4.ip_local_port_range = 32768 60999):
# the kernel never picks these ports for other programs' connections, so the probed
# ports stay free for the shim to bind, and a probe never finds them taken.
TCP_SPORTS = "61000-65535"
# Jobs' listening ports one peer's sweep probes toward, at most (a TCP sweep per port):
# cruxd.control.validate.MAX_TCP_DPORTS bounds a report's sets per path by this plus one.
MAX_TCP_DPORTS_PER_PEER = 32
# CS7: the priority cruxd.scheduler.dscp reserves for probing, above every job level, so
# a loaded fabric does not starve the re-verification of its own paths.
PROBE_DSCP = 56


def parse_probing(p: Section, sweep: bool) -> ProbingConfig:
    """`sweep`: whether agent.probing is "sweep" (then fabric_prefixes is required)."""
    prefixes = p.networks("fabric_prefixes")
    if sweep and not prefixes:
        raise p.error("fabric_prefixes", 'required with agent.probing = "sweep": the '
                      "prefixes of the fabric's host and switch addresses, e.g. "
                      '["10.0.0.0/8"]; probes go nowhere else and replies from elsewhere '
                      "are ignored")
    try:
        ports = port_range(p.string("sports", ROCE_SPORT_TEXT))
    except ValueError as exc:
        raise p.error("sports", str(exc)) from None
    try:
        tcp_ports = port_range(p.string("tcp_sports", TCP_SPORTS))
    except ValueError as exc:
        raise p.error("tcp_sports", str(exc)) from None
    per_path = p.integer("tcp_ports_per_path", MAX_TCP_PORTS, Range(1, MAX_TCP_PORTS))
    if len(tcp_ports) < per_path:
        raise p.error("tcp_sports", f"{len(tcp_ports)} port(s), fewer than "
                      f"tcp_ports_per_path = {per_path}")
    return ProbingConfig(
        method=p.choice("method", "ttl", ("ttl", "int")),
        fabric_prefixes=prefixes,
        rate_pps=p.number("rate_pps", 200.0, Range(0, MAX_RATE_PPS, lo_open=True)),
        interval_s=p.number("interval_s", 300.0, Range(1, 86400)),
        sports=(ports.start, ports.stop - 1),
        dport=p.integer("dport", ROCE_DPORT, Range(1, 65535)),
        max_probes=p.integer("max_probes", 1024, Range(1, 65536)),
        expected_paths=p.integer("expected_paths", 0, Range(0, 256)),
        miss=p.number("miss", 1e-3, Range(0, 0.5, lo_open=True)),
        max_hops=p.integer("max_hops", 8, Range(1, 32)),
        timeout_s=p.number("timeout_s", 0.5, Range(0.01, 10)),
        responder=p.boolean("responder", True),
        responder_port=p.integer("responder_port", ROCE_DPORT, Range(1, 65535)),
        responder_rate_pps=p.number("responder_rate_pps", 1000.0,
                                    Range(0, 100000, lo_open=True)),
        tcp_dport=p.integer("tcp_dport", 0, Range(0, 65535)),
        tcp_sports=(tcp_ports.start, tcp_ports.stop - 1),
        tcp_ports_per_path=per_path,
        dscp=p.integer("dscp", PROBE_DSCP, Range(0, 63)),
        tcp_dports_per_peer=p.integer("tcp_dports_per_peer", 8,
                                      Range(0, MAX_TCP_DPORTS_PER_PEER)),
    )
