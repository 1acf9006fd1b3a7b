"""INT probes over real UDP sockets on 127.0.0.1: IntProber -> emulated INT transit
relays (what switch silicon would do: push_hop with the relay's node id) ->
ProbeResponder, and the echo back. Timeouts are short; nothing sleeps to assert timing."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from probing import int_prober
from probing.int_md import build_probe, echo_of, parse, push_hop
from probing.int_prober import IntProber
from probing.responder import ProbeResponder
from probing.sweep import sweep

HOST = "127.0.0.1"
Addr = tuple[str, int]


class Relay:
    """An INT transit hop as a UDP forwarder. Like a NAT, it sends each upstream
    flow on from a socket of its own so the responder's echo finds its way back;
    `next_hop(upstream source port)` picks the next hop, as ECMP hashing would."""

    def __init__(self, node_id: int, next_hop: Callable[[int], Addr]) -> None:
        self.node_id, self.next_hop = node_id, next_hop
        self.main = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.main.bind((HOST, 0))
        self.port = self.main.getsockname()[1]
        self.flows: dict[Addr, socket.socket] = {}
        self.back: dict[socket.socket, Addr] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.main, *self.back], [], [], 0.02)
            for sock in ready:
                data, src = sock.recvfrom(4096)
                if sock is self.main:
                    with contextlib.suppress(ValueError):  # not INT: forwarded untouched
                        data = push_hop(data, self.node_id)
                    if src not in self.flows:
                        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        out.bind((HOST, 0))
                        self.flows[src], self.back[out] = out, src
                    self.flows[src].sendto(data, self.next_hop(src[1]))
                else:
                    self.main.sendto(data, self.back[sock])

    def __enter__(self) -> Relay:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for sock in (self.main, *self.back):
            sock.close()


@contextlib.contextmanager
def serving(responder: ProbeResponder) -> Iterator[ProbeResponder]:
    stop = threading.Event()
    thread = threading.Thread(target=responder.serve_forever, args=(stop, 0.02), daemon=True)
    thread.start()
    try:
        yield responder
    finally:
        stop.set()
        thread.join()
        responder.close()


def fixed(to: Addr) -> Callable[[int], Addr]:
    return lambda _sport: to


@contextlib.contextmanager
def chain(nodes: list[int], end: Addr) -> Iterator[Relay]:
    """Relays in a line, the first one is the entry; yields the entry."""
    with contextlib.ExitStack() as stack:
        nxt = end
        for node in reversed(nodes):
            relay = stack.enter_context(Relay(node, fixed(nxt)))
            nxt = (HOST, relay.port)
        yield relay


def free_ports(even: int, odd: int) -> list[int]:
    """Ports nobody holds right now, `even` even ones and `odd` odd ones."""
    got: dict[int, list[int]] = {0: [], 1: []}
    while len(got[0]) < even or len(got[1]) < odd:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in got[port % 2]:
            got[port % 2].append(port)
    return sorted(got[0][:even] + got[1][:odd])


def udp(bind: str = HOST) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((bind, 0))
    return s


def test_prober_gets_the_transit_node_ids_in_path_order() -> None:
    with serving(ProbeResponder(HOST, 0)) as resp, chain([1, 2, 3], resp.address) as entry:
        prober = IntProber(HOST, dport=entry.port, timeout_s=2.0)
        assert prober.trace(free_ports(1, 0)[0]) == ("node:1", "node:2", "node:3")
        assert prober.counters.replies == 1 and prober.counters.ignored == 0
    assert resp.counters.answered == 1


def test_sweep_groups_source_ports_by_the_relay_path() -> None:
    with contextlib.ExitStack() as stack:
        resp = stack.enter_context(serving(ProbeResponder(HOST, 0)))
        exit_leaf = stack.enter_context(Relay(2, lambda _s: resp.address))
        spines = [stack.enter_context(Relay(n, lambda _s: (HOST, exit_leaf.port)))
                  for n in (10, 11)]
        entry = stack.enter_context(Relay(1, lambda sport: (HOST, spines[sport % 2].port)))
        prober = IntProber(HOST, dport=entry.port, timeout_s=2.0)
        ports = free_ports(3, 3)
        r = sweep(prober, HOST, ports, expected=2, ports_per_path=2)
    # the prober's counters say why a port went unanswered (a source port taken meanwhile by
    # another test's socket is "source port busy"; CI once saw 1 of 5 unanswered)
    assert r.stopped == "expected" and r.unanswered == 0, (r, prober.counters)
    assert set(r.paths) == {("node:1", "node:10", "node:2"), ("node:1", "node:11", "node:2")}
    for hops, sports in r.paths.items():
        assert len(sports) == 2
        assert {p % 2 for p in sports} == {0 if hops[1] == "node:10" else 1}


def test_malformed_and_echoes_are_counted_not_answered() -> None:
    with ProbeResponder(HOST, 0) as resp, udp() as client:
        probe = push_hop(build_probe(max_hops=4, nonce=42), 9)
        junk = [b"", b"junk", probe[:-1], probe + b"\0", echo_of(probe)]
        for d in [*junk, probe]:
            client.sendto(d, resp.address)
        assert resp.handle_readable() == 6  # loopback: all queued once sendto returns
        client.setblocking(False)
        data, src = client.recvfrom(4096)
        assert data == echo_of(probe) and src == resp.address  # the only answer
        with pytest.raises(BlockingIOError):
            client.recvfrom(4096)
    assert resp.counters.received == 6 and resp.counters.answered == 1
    assert resp.counters.reasons == {"malformed": 4, "not a probe": 1}


def test_outside_the_fabric_is_not_answered() -> None:
    import ipaddress
    fabric = (ipaddress.IPv4Network("10.0.0.0/8"),)
    with ProbeResponder(HOST, 0, allowed=fabric) as resp, udp() as client:
        client.sendto(build_probe(max_hops=4, nonce=1), resp.address)
        assert resp.handle_readable() == 1
    assert resp.counters.answered == 0 and resp.counters.reasons == {"outside the fabric": 1}


def test_rate_limit_counts_answers() -> None:
    now = [0.0]
    with ProbeResponder(HOST, 0, rate_pps=10.0, burst=3, clock=lambda: now[0]) as resp, \
            udp() as client:
        probes = [build_probe(max_hops=4, nonce=n) for n in range(10)]
        for p in probes:
            client.sendto(p, resp.address)
        assert resp.handle_readable() == 10
        assert resp.counters.answered == 3 and resp.counters.reasons == {"rate-limited": 7}
        now[0] += 0.1  # one token's worth
        for p in probes[:2]:
            client.sendto(p, resp.address)
        resp.handle_readable()
        assert resp.counters.answered == 4 and resp.counters.reasons == {"rate-limited": 8}
        client.setblocking(False)
        echoes = [client.recvfrom(4096)[0] for _ in range(4)]
        with pytest.raises(BlockingIOError):
            client.recvfrom(4096)
    assert [parse(e).nonce for e in echoes] == [0, 1, 2, 0]  # type: ignore[union-attr]
    assert all(len(e) == len(probes[0]) for e in echoes)  # never larger than the probe


def test_no_echo_returns_none_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float | None] = []  # every select() timeout the prober asks for

    def spy(r: list[socket.socket], w: list[object], x: list[object], timeout: float | None
            ) -> tuple[list[socket.socket], list[object], list[object]]:
        waits.append(timeout)
        return select.select(r, w, x, timeout)

    monkeypatch.setattr(int_prober, "select", SimpleNamespace(select=spy))
    with udp() as silent:
        prober = IntProber(HOST, dport=silent.getsockname()[1], timeout_s=0.2)
        assert prober.trace(0) is None
        # it returns after one bounded wait, never blocking without a timeout
        assert len(waits) == 1 and waits[0] is not None and 0 < waits[0] <= 0.2
        assert silent.recvfrom(4096)[0][-16:-8] == b"crux-prb"
    assert (prober.counters.sent, prober.counters.timeouts) == (1, 1)


def test_wrong_nonce_and_strays_are_ignored_and_counted() -> None:
    with udp() as peer, udp("127.0.0.2") as stranger:
        def answer() -> None:
            probe, src = peer.recvfrom(4096)
            good = echo_of(push_hop(probe, 7))
            forged = good[:-8] + bytes(b ^ 0xFF for b in good[-8:])
            stranger.sendto(good, src)  # right nonce, wrong address
            peer.sendto(forged, src)
            peer.sendto(probe, src)  # a probe reflected back is not an echo
            peer.sendto(b"garbage", src)
            peer.sendto(good, src)

        t = threading.Thread(target=answer)
        t.start()
        prober = IntProber(HOST, dport=peer.getsockname()[1], timeout_s=2.0)
        assert prober.trace(0) == ("node:7",)
        t.join()
    assert prober.counters.replies == 1
    assert prober.counters.reasons == {"not ours": 1, "wrong nonce": 1, "not an echo": 1,
                                       "malformed": 1}


def test_no_int_hops_or_missing_hops_mean_fall_back() -> None:
    with serving(ProbeResponder(HOST, 0)) as resp:
        direct = IntProber(HOST, dport=resp.address[1], timeout_s=2.0)
        assert direct.trace(0) is None
        assert direct.counters.replies == 1 and direct.counters.reasons == {"no INT hops": 1}
        with chain([1, 2, 3], resp.address) as entry:
            short = IntProber(HOST, dport=entry.port, max_hops=2, timeout_s=2.0)
            assert short.trace(0) is None  # E set: only a prefix of the path
            assert short.counters.reasons == {"hops missing": 1}


def test_a_busy_source_port_is_an_unanswered_probe() -> None:
    with udp() as holder:
        prober = IntProber(HOST, dport=9, timeout_s=0.2)
        assert prober.trace(holder.getsockname()[1]) is None
    assert prober.counters.sent == 0 and prober.counters.reasons == {"source port busy": 1}


def test_responder_runs_on_an_event_loop() -> None:
    async def main() -> tuple[str, ...] | None:
        with ProbeResponder(HOST, 0) as resp, chain([5, 6], resp.address) as entry:
            loop = asyncio.get_running_loop()
            loop.add_reader(resp.fileno(), resp.handle_readable)
            try:
                prober = IntProber(HOST, dport=entry.port, timeout_s=2.0)
                return await asyncio.to_thread(prober.trace, 0)
            finally:
                loop.remove_reader(resp.fileno())

    assert asyncio.run(main()) == ("node:5", "node:6")
