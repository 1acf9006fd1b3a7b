"""The source-port sweep: probe a peer from many source ports, group the ports by
the path (hop signature) each one takes, stop when the paths are all found.

Pure: the prober that sends a probe and reads the path back is injected (TTL/ICMP
on a real fabric, a hash model in tests and benchmarks), and so are the clock and
sleep that pace it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from probing.budget import quiet_probes


def port_range(text: str) -> range:
    """ "LO-HI" (or one port) as a range; ValueError says what is wrong."""
    lo, sep, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi if sep else lo)
    except ValueError:
        raise ValueError(f'expected "LO-HI", got "{text}"') from None
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"ports must satisfy 1 <= LO <= HI <= 65535, got {text}")
    return range(first, last + 1)


class Prober(Protocol):
    def trace(self, sport: int) -> tuple[str, ...] | None:
        """The hops a probe from `sport` crossed, or None when it got no usable answer."""
        ...


@dataclass
class SweepResult:
    peer: str
    paths: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    probes_sent: int = 0
    unanswered: int = 0
    stopped: str = ""  # "expected" | "quiet" | "budget" | "ports" | "unanswered"

    def to_json(self) -> dict[str, object]:
        return {"peer": self.peer, "probes_sent": self.probes_sent,
                "unanswered": self.unanswered, "stopped": self.stopped,
                "paths": [{"sports": sports, "hops": list(hops)}
                          for hops, sports in sorted(self.paths.items())]}


def sweep(prober: Prober, peer: str, sports: Iterable[int], *, expected: int | None = None,
          max_probes: int = 1024, miss: float = 1e-3, rate_pps: float = 0.0,
          ports_per_path: int = 1, give_up: int = 32,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> SweepResult:
    """Probe `peer` from `sports` in order until `expected` paths each have
    `ports_per_path` ports, or (N unknown) no new path for `quiet_probes(k, miss)`
    probes, or `max_probes` probes were sent, or the first `give_up` probes all went
    unanswered (nothing answers: a full sweep would only wait out every timeout).
    `rate_pps` > 0 paces the probes."""
    result = SweepResult(peer)
    quiet = 0
    interval = 1.0 / rate_pps if rate_pps > 0 else 0.0
    next_at = clock()
    for sport in sports:
        if result.probes_sent >= max_probes:
            result.stopped = "budget"
            return result
        if interval:
            delay = next_at - clock()
            if delay > 0:
                sleep(delay)
            next_at = max(next_at, clock()) + interval
        result.probes_sent += 1
        hops = prober.trace(sport)
        if hops is None:
            result.unanswered += 1
            if not result.paths and result.unanswered >= give_up:
                result.stopped = "unanswered"
                return result
            continue
        ports = result.paths.setdefault(hops, [])
        quiet = 0 if not ports else quiet + 1
        if len(ports) < ports_per_path:
            ports.append(sport)
        full = all(len(p) >= ports_per_path for p in result.paths.values())
        if expected is not None and len(result.paths) >= expected and full:
            result.stopped = "expected"
            return result
        if expected is None and full and quiet >= quiet_probes(len(result.paths), miss):
            result.stopped = "quiet"
            return result
    result.stopped = "ports"
    return result
