"""A synthetic training job's traffic over TCP: compute (quiet) then a burst, every period.

    python -m tests.rig.tcpbursts PEER PORT PERIOD_S BURST_S MBIT ITERATIONS

Both ranks run it with each other's address: each listens on PORT, connects to PEER:PORT, and
drains what the peer sends. Iteration i starts at t0 + i*PERIOD_S on an absolute schedule;
its burst sends 4200-byte pieces with socket.sendall (send(2), as NCCL's socket transport
does) paced at MBIT for BURST_S, then it is quiet until the next. Under crux-run the socket
interposer counts those bytes per process (sock-<pid>), which is what lets two such jobs on
one host pair be measured apart (tests/test_measure_two_jobs.py).
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from tests.rig.bursts import paced

SIZE = 4200  # 3 MTU-sized segments per send: a third of the wakeups of 1400-byte pieces
CONNECT_S = 30.0


def drain(conn: socket.socket) -> None:
    with conn:
        while conn.recv(1 << 16):
            pass


def main(peer: str, port: int, period_s: float, burst_s: float, mbit: float,
         iterations: int) -> None:
    srv = socket.create_server(("0.0.0.0", port), backlog=4)
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            out = socket.create_connection((peer, port), timeout=1.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out.settimeout(None)
    conn, _ = srv.accept()
    threading.Thread(target=drain, args=(conn,), daemon=True).start()
    paced(out.sendall, SIZE, period_s, burst_s, mbit, iterations)
    out.close()
    srv.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), float(a[2]), float(a[3]), float(a[4]), int(a[5]))
