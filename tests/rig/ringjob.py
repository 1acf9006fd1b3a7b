"""One rank (host) of an emulated data-parallel training job on the namespace fabric.

Each iteration: the job's "GPUs" compute for `--compute-s` (busy, emulated by waiting);
once (1 - overlap) of that is done the rank joins a ring all-reduce of `--hop-bytes` per
iteration with its ring neighbours over TCP; the next iteration starts when both are
done (docs/scenario.md's iteration model, which the simulator runs too). The all-reduce
is the real algorithm between hosts: 2(n-1) steps, each sending one chunk to the next rank
while receiving one from the previous, a step's data waiting for the last step's, done
slice by slice as NCCL does it (`Ring.allreduce`).

Data goes over plain `socket.connect`, so under `crux-run` the socket interposer gives
the connection its decided source port and DSCP, as it would NCCL's socket transport.

The fabric is scaled down (Gbit/s to Mbit/s), so the ring's socket buffers are too
(`--sockbuf`): at the kernel's autotuned megabytes, one rank's data could sit seconds'
worth ahead of its neighbour in socket buffers (NCCL's slack is its 4 MiB staging buffer,
a fraction of a millisecond at 200 Gbit/s), the ranks drifted out of phase, and a GPT
alone alternated 1.2 s and 1.47 s iterations where its profile gives 1.23 s. `--tcp-cc`
picks the congestion control per socket (the rig's kernel defaults to bbr here, which
does not back off on loss in the fabric's 32-packet queues).
Each iteration is one JSON line in `--log`: start, collective start and end, end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONNECT_TIMEOUT_S = 60.0
PIECE = 64 << 10  # bytes forwarded at a time: the ring's pipelining grain


@dataclass(frozen=True)
class SockOpts:
    """What every ring socket gets before it connects or listens (0 / "": the kernel's)."""

    buf: int = 0  # SO_SNDBUF and SO_RCVBUF, bytes (the kernel doubles it)
    cc: str = ""  # TCP_CONGESTION

    def apply(self, s: socket.socket) -> socket.socket:
        if self.buf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buf)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buf)
        if self.cc:
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, self.cc.encode())
            except OSError as exc:  # not built into this kernel: say so, run on
                print(f"ringjob: --tcp-cc {self.cc}: {exc.strerror}; using the kernel's "
                      f"default", file=sys.stderr, flush=True)
        return s


def _listen(port: int, opts: SockOpts) -> socket.socket:
    s = opts.apply(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.listen(4)
    return s


def _connect(addr: str, port: int, opts: SockOpts) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        s = opts.apply(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        s.settimeout(5)
        try:
            s.connect((addr, port))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Decisions:
    """This rank's decision toward its next rank, as crux-run's table holds it
    (CRUX_DECISION_TABLE, CRUX_JOB_ID), to notice when the plan changed it. Without a
    table (no crux) it never changes. The decision's source ports count only when it was
    made toward `port`, the ring's: the shim binds them toward that port alone, so a
    change of ports toward another one (the testbed's levels-only mode probes elsewhere)
    changes nothing this ring's connections would take."""

    def __init__(self, peer: str, port: int) -> None:
        self.peer, self.port = peer, port
        self.reader = None
        table, self.job = os.environ.get("CRUX_DECISION_TABLE"), os.environ.get("CRUX_JOB_ID")
        if table and self.job:
            from transport.decision_table import TableReader
            with contextlib.suppress(Exception):  # fail open, as the shim does
                self.reader = TableReader(table)
        self.at_connect = self.now()

    def now(self) -> tuple[int, tuple[int, ...], int] | None:
        if self.reader is None or self.job is None:
            return None
        try:
            d = self.reader.lookup(self.job, self.peer)
        except Exception:  # a damaged table: keep what we have
            return self.at_connect
        if d is None:
            return None
        return (d.dscp, tuple(d.tcp_sports) if d.tcp_dport == self.port else (), d.tcp_dport)

    def changed(self, sock: socket.socket | None) -> bool:
        """Whether the ring must be rebuilt to take the decision: it differs from the one
        read at the last connect, and the connection does not carry it already (its class,
        and a source port among the decided ones). A re-plan that hands out the same path
        and class changes nothing here; a decision whose ports were all busy at connect
        is not chased again until it changes."""
        now = self.now()
        if now == self.at_connect or now is None:
            return False  # nothing new, or no decision any more: keep what we have
        if sock is None:
            return True
        dscp, sports, _ = now
        try:
            tos = sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)
            sport = sock.getsockname()[1]
        except OSError:
            return True
        return tos >> 2 != dscp or (bool(sports) and sport not in sports)


class Ring:
    """This rank's two ring connections: to the next rank and from the previous one.

    Every slice's message starts with one byte: whether any rank seen so far wants to
    reconnect because the plan changed its decision. After n-1 slices every rank knows
    every vote, so all of them rebuild the ring after the same iteration, and the
    new connections take the new decisions (TCP decisions apply at connect)."""

    def __init__(self, rank: int, peers: list[tuple[str, int]],
                 opts: SockOpts = SockOpts()) -> None:
        self.n = len(peers)
        self.opts = opts
        self.listener = _listen(peers[rank][1], opts)
        self.listener.settimeout(CONNECT_TIMEOUT_S)
        self.nxt = peers[(rank + 1) % self.n]
        self.decisions = Decisions(*self.nxt)
        self.reconnects = 0
        # the decision the last rebuild took: [dscp, its source ports, their port]
        self.rebuilt_to: list[Any] = []
        self._connect()

    def _connect(self) -> None:
        # Read before connecting: the shim reads the table at connect(), and a plan that
        # lands between the two must look like a change (one spare rebuild), never like
        # what the connection already has. Read after accept(), it once did: the ring
        # kept a kernel port from before the TCP sweep for the whole run, on the wrong
        # spine (CI, test_testbed_rig).
        self.decisions.at_connect = self.decisions.now()
        box: dict[str, socket.socket] = {}
        addr, port = self.nxt
        t = threading.Thread(target=lambda: box.setdefault("out",
                                                           _connect(addr, port, self.opts)))
        t.start()
        self.prev, _ = self.listener.accept()
        t.join()
        if "out" not in box:
            raise ConnectionError(f"could not reach the next rank at {self.nxt[0]}:"
                                  f"{self.nxt[1]}")
        self.next = box["out"]
        self.prev.settimeout(None)
        self.next.settimeout(None)

    def allreduce(self, hop_bytes: int) -> None:
        """`hop_bytes` in 2(n-1) steps, done as NCCL's ring does it: the data is cut into
        chunks of at most 2(n-1) slices of PIECE bytes, and each chunk goes through all
        the steps, slice by slice, before the next chunk starts; a byte of a slice goes
        to the next rank once the same byte of the slice before it has come in from the
        previous one. So a rank runs at most one slice ahead of its neighbour (NCCL: its
        few buffer slots), the ring streams at its slowest hop's rate, and a rank that
        starts late holds everyone up only by as much. (Steps of the whole message had
        let early ranks run a whole step ahead: a GPT alone on the 4-leaf rig settled
        into a 60 ms skew between its ranks, and 1.31 s iterations for 1.24 s.)
        On the wire each slice is a flag byte (the reconnect vote) and its data."""
        steps = 2 * (self.n - 1)
        chunks = max(1, -(-hop_bytes // (steps * PIECE)))
        seg = max(1, hop_bytes // (steps * chunks)) + 1  # a slice, with its flag byte
        total = chunks * steps * seg
        st: dict[str, Any] = {"received": 0, "vote": self.decisions.changed(self.next),
                              "broken": False}
        cond = threading.Condition()
        sender = threading.Thread(target=self._send, args=(total, seg, st, cond), daemon=True)
        sender.start()
        buf = bytearray(PIECE)
        view = memoryview(buf)
        got = 0
        try:
            while got < total:
                flag = got % seg == 0
                want = 1 if flag else min(PIECE, seg - got % seg)
                k = self.prev.recv_into(view[:want], want)
                if not k:
                    raise ConnectionError("the previous rank closed the ring")
                with cond:
                    st["vote"] = st["vote"] or (flag and bool(buf[0]))
                    got += k
                    st["received"] = got
                    cond.notify()
        except BaseException:
            with cond:
                st["broken"] = True
                cond.notify()
            raise
        sender.join()
        if st["broken"]:
            raise ConnectionError("the next rank closed the ring")
        if st["vote"]:
            self._rebuild()

    def _send(self, total: int, seg: int, st: dict[str, Any],
              cond: threading.Condition) -> None:
        payload = bytes(PIECE)
        sent = 0
        try:
            while sent < total:
                with cond:  # step k's bytes wait for step k-1's (step 0's are ours)
                    while st["received"] + seg <= sent and not st["broken"]:
                        cond.wait()
                    if st["broken"]:
                        return
                    limit = min(total, st["received"] + seg)
                    vote = st["vote"]  # every flag received so far: step k-1's included
                while sent < limit:
                    if sent % seg == 0:
                        self.next.sendall(b"\x01" if vote else b"\x00")
                        sent += 1
                        continue
                    k = min(PIECE, limit - sent, seg - sent % seg)
                    self.next.sendall(payload[:k])
                    sent += k
        except OSError:
            with cond:
                st["broken"] = True
                cond.notify()

    def _rebuild(self) -> None:
        # The incoming side closes first (every byte of this all-reduce has arrived), and
        # the outgoing side waits for the next rank to do the same: TIME_WAIT then stays
        # with the listener's end. Were it on ours, each rebuild would hold one of the few
        # decided source ports for a minute, and once all were held the shim would fall
        # back to a kernel port on whatever spine it hashes to.
        with contextlib.suppress(OSError):
            self.prev.close()
        with contextlib.suppress(OSError):
            self.next.settimeout(CONNECT_TIMEOUT_S)
            while self.next.recv(4096):
                pass
        with contextlib.suppress(OSError):
            self.next.close()
        self.reconnects += 1
        now = self.decisions.now()
        self.rebuilt_to = [] if now is None else [now[0], sorted(now[1]), now[2]]
        self._connect()


def _collective(ring: Ring, hop_bytes: int, done: list[float]) -> None:
    ring.allreduce(hop_bytes)
    done.append(time.time())


def run(args: argparse.Namespace) -> None:
    peers = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in args.peers.split(",")]
    ring = Ring(args.rank, peers, SockOpts(args.sockbuf, args.tcp_cc))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    end_at = time.time() + args.duration_s
    with Path(args.log).open("a", buffering=1) as log:
        i = 0
        while not stop.is_set() and time.time() < end_at:
            t0 = time.time()
            time.sleep(args.compute_s * (1 - args.overlap))
            c0 = time.time()
            done: list[float] = []
            comm = threading.Thread(target=_collective, args=(ring, args.hop_bytes, done),
                                    daemon=True)
            comm.start()
            time.sleep(max(0.0, t0 + args.compute_s - time.time()))
            comm.join()
            if not done:
                break  # the ring broke (a neighbour left): the job ends
            log.write(json.dumps({"i": i, "t0": t0, "comm_start": c0, "comm_end": done[0],
                                  "end": time.time(), "compute_s": args.compute_s,
                                  "reconnects": ring.reconnects,
                                  "rebuilt_to": ring.rebuilt_to}) + "\n")
            i += 1
    os._exit(0)  # the neighbours may still be mid-step; closing here ends theirs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--peers", required=True, help="ADDR:PORT of every rank, ring order")
    p.add_argument("--hop-bytes", type=int, required=True,
                   help="bytes each ring hop carries per iteration (2(K-1)/K x model bytes)")
    p.add_argument("--compute-s", type=float, required=True)
    p.add_argument("--overlap", type=float, default=0.0)
    p.add_argument("--duration-s", type=float, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--sockbuf", type=int, default=0,
                   help="SO_SNDBUF/SO_RCVBUF of the ring's sockets, bytes (0: the kernel's)")
    p.add_argument("--tcp-cc", default="",
                   help="TCP congestion control of the ring's sockets (default: the kernel's)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
