"""A synthetic training job's traffic: compute (quiet) then a UDP burst, every period.

    python -m tests.rig.bursts DST PERIOD_S BURST_S MBIT ITERATIONS

Iteration i starts at t0 + i*PERIOD_S on an absolute schedule (no drift); its burst sends
1400-byte datagrams to DST:4791 paced at MBIT for BURST_S, then it is quiet until the next.
It holds UDP port 4791 itself (never reading it), so a peer running the same job does not
make this host send ICMP errors that would count as its traffic.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import Callable

SIZE = 1400


def paced(send: Callable[[bytes], object], size: int, period_s: float, burst_s: float,
          mbit: float, iterations: int) -> None:
    """`iterations` periods on an absolute schedule (no drift), each a burst of `size`-byte
    pieces paced at `mbit` for `burst_s`, then quiet until the next."""
    gap = size * 8 / (mbit * 1e6)
    payload = bytes(size)
    t0 = time.monotonic() + 0.05
    for i in range(iterations):
        start = t0 + i * period_s
        k = 0
        while (t := start + k * gap) < start + burst_s:
            delay = t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            send(payload)
            k += 1
        rest = start + period_s - time.monotonic()
        if rest > 0:
            time.sleep(rest)


def main(dst: str, period_s: float, burst_s: float, mbit: float, iterations: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        # hold the port the peer's bursts arrive on, or every datagram of theirs draws an
        # ICMP port unreachable from this host; held already (an agent's responder): no ICMP
        with contextlib.suppress(OSError):
            sink.bind(("0.0.0.0", 4791))
        paced(lambda b: s.sendto(b, (dst, 4791)), SIZE, period_s, burst_s, mbit, iterations)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], float(a[1]), float(a[2]), float(a[3]), int(a[4]))
