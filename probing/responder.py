"""The far end of a probe: echo the INT data a probe collected back to its source,
so the source learns the path without a collector or telemetry reports, and tell
a TTL trace that its last datagram arrived (probing.ttl.TTL_ECHO), since this
socket holding the data's port means the kernel sends no port unreachable.

Safe to leave running on every host: an echo is exactly as long as its probe (only
the trailer's marker changes, see int_md.echo_of), echoes are never answered (two
responders cannot ping-pong), and a token bucket caps answers per second, so the
responder cannot be used as an amplifier or a reflector beyond that rate.

The default port is RoCEv2's 4791, so probes hash onto the data's paths. Where the
RDMA stack owns that port (soft-RoCE's kernel socket, a RoCE NIC's steering) this
socket cannot bind or never sees the probes: configure another port there.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from probing import int_md
from probing.ttl import outside, ttl_echo_of
from transport.roce import ROCE_DPORT


@dataclass
class ResponderCounters:
    received: int = 0
    answered: int = 0
    ignored: int = 0  # malformed, not a probe, outside the fabric, rate-limited, send failed
    reasons: dict[str, int] = field(default_factory=dict)

    def ignore(self, why: str) -> None:
        self.ignored += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; the clock is injectable so
    tests count answers instead of timing them."""

    def __init__(self, rate: float, burst: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = burst
        self.stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class ProbeResponder:
    """Answers INT probes on (addr, port); `port=0` picks a free one (tests).
    Thread use: `serve_forever(stop)`. Event loop use:
    `loop.add_reader(r.fileno(), r.handle_readable)`."""

    def __init__(self, addr: str = "0.0.0.0", port: int = ROCE_DPORT, *,
                 rate_pps: float = 1000.0, burst: float | None = None,
                 allowed: tuple[ipaddress.IPv4Network, ...] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed = allowed
        self.counters = ResponderCounters()
        self.bucket = TokenBucket(rate_pps, burst if burst is not None else max(1.0, rate_pps / 10),
                                  clock)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.bind((addr, port))
            self._sock.setblocking(False)  # an event loop must never block in us
        except OSError:
            self._sock.close()
            raise

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()
        return str(host), int(port)

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> ProbeResponder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def handle_readable(self, limit: int = 64) -> int:
        """Handle what is queued now, up to `limit` datagrams (so one busy socket
        cannot starve the loop); returns how many were read."""
        n = 0
        while n < limit:
            try:
                data, (host, port) = self._sock.recvfrom(int_md.MAX_PAYLOAD + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. a queued ICMP error; the datagram is gone either way
                self.counters.ignore("receive failed")
                break
            n += 1
            self._handle(data, str(host), int(port))
        return n

    def serve_once(self, timeout: float) -> int:
        """Wait up to `timeout` s for datagrams and handle them; returns how many."""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        return self.handle_readable() if ready else 0

    def serve_forever(self, stop: threading.Event, poll_s: float = 0.05) -> None:
        while not stop.is_set():
            self.serve_once(poll_s)

    def _handle(self, data: bytes, host: str, port: int) -> None:
        self.counters.received += 1
        if outside(host, self.allowed):
            self.counters.ignore("outside the fabric")
            return
        ttl_echo = ttl_echo_of(data)
        if ttl_echo is not None:  # the last datagram of a TTL trace: say it arrived
            self._answer(ttl_echo, host, port)
            return
        report = int_md.parse(data)
        if report is None or port == 0:
            self.counters.ignore("malformed")
            return
        if report.echo:
            self.counters.ignore("not a probe")  # never answer an echo: no loops
            return
        self._answer(int_md.echo_of(data), host, port)

    def _answer(self, echo: bytes, host: str, port: int) -> None:
        if port == 0:
            self.counters.ignore("malformed")
            return
        if not self.bucket.take():
            self.counters.ignore("rate-limited")
            return
        try:
            self._sock.sendto(echo, (host, port))
        except OSError:  # a full send buffer drops the echo, as a congested link would
            self.counters.ignore("send failed")
            return
        self.counters.answered += 1
