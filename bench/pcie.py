"""PCIe semaphore benchmark (shim/crux_pcie.c): uncontended and contended acquire+release.

Protocol
  * `make -C shim pcie`, then shim/build/bench_pcie on a fresh file in a temp dir, link 0:
  (a) Uncontended, in C: one process, ITERS acquire+release pairs (level 3) after ITERS/10
      warm-up pairs; ns per pair = elapsed / ITERS (CLOCK_MONOTONIC around the loop).
  (b) Contended, in C: P forked processes (2, 4) hammer link 0, ITERS pairs each, levels
      rank % 2, a shared non-atomic counter incremented inside (checked exact: count_ok);
      throughput = P*ITERS / (start barrier -> last exit); acquire latency = CLOCK_MONOTONIC
      around each crux_pcie_acquire call, percentiles over all P*ITERS calls. The lease is off
      here (CRUX_PCIE_LEASE_MS=0): the exact count needs mutual exclusion, which the lease
      gives up for a holder descheduled for 20 ms while an equal or higher level waits.
  (c) For reference, uncontended from Python (transport/pcie.py, ctypes): ns per pair.
  Each C row is the median (by ns/op) of --repeat runs. With more processes than cores the
  contended rows measure the scheduler as much as the lock: the core count is printed.
  (d) The wrapper's gate on the data path (shim/crux_gate.c), in C without a NIC
      (shim/build/bench_gate DIR ITERS): fake device contexts whose ops tables accept every WR
      and return queued completions, one context gated (its ops swapped for the trampolines,
      real semaphore and map files), one not (the baseline). ns per ibv_post_send (or per
      post + poll pair) through the trampoline minus the same call through the ungated
      context; median of --repeat runs of --gate-iters calls each. Target: < 100 ns added per
      post on the uncontended path. The gated QPs also count their traffic into QP records, as
      every connected QP of a job with an id does; the "counted" rows are a context that is
      counted but not gated (crux_gate.h "Counting"): what per-QP attribution costs alone.
  (e) Attacks (issue 37, item 2): what one member of the agent's group can add to another
      job's post. A post is what the gate does for a signaled post that must take the link:
      acquire_timed(link, level, 100 ms, the gate's default wait) and, when granted, release;
      timed from Python (transport/pcie.py) in a process of its own at level 7 (level 0 in
      the last row). --attack-posts posts per attack, each against a fresh attack:
        none                       the link free;
        stopped in internal mutex  a member took the link's internal mutex and SIGSTOPped
                                   itself (once, for all posts);
        low holder never releases  a member takes the link at level 0 just before each post
                                   and never releases it;
        holder_pid = 1             a member writes holder_pid = 1 (level 7, held_since now)
                                   into the file just before each post;
        ... with pid 1's start     the same with pid 1's real start time forged as well;
        stopped holder             a member takes the link at level 7 and is SIGSTOPped just
                                   before each post;
        level-7 holder, level-0    a member holds at level 7 and never releases; the post is
                                   at level 0, which by the grant rule waits for it: the
                                   gate's fail-open bound.
      "added" = a post's time minus the median post with no attack; the median and the worst
      over the posts, and how many were granted the link (the others failed open).

    .venv/bin/python bench/pcie.py [--iters N] [--repeat R] [--procs 2,4] [--gate-iters N]
                                   [--attack-posts N] [--parts abcde]
"""

from __future__ import annotations

import argparse
import errno
import mmap
import multiprocessing as mp
import os
import signal
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from _make import BUILD, ensure_built

# bench/ is on sys.path when run as a script
from tables import preamble, table

from transport.pcie import LAYOUT, LEASE_ENV, PcieLockError, PcieLocks

BENCH = BUILD / "bench_pcie"
GATE = BUILD / "bench_gate"
# (row, gated key, baseline key): what the gate adds to each kind of call
GATE_ROWS = [
    ("post, counted, not gated (per-QP traffic counters)", "counted_post", "base_post"),
    ("post + poll, counted, not gated", "counted_pair", "base_pair"),
    ("poll, empty CQ, counted, not gated", "counted_poll_empty", "base_poll_empty"),
    ("post, link held, nobody waiting (the fast path)", "gated_post", "base_post"),
    ("post, unsignaled WR", "unsignaled_post", "base_post"),
    ("post, link held, a lower level waiting", "waiter_post", "base_post"),
    ("post + poll, link kept held by another QP", "held_pair", "base_pair"),
    ("post + poll, link taken and given back each time", "pingpong_pair", "base_pair"),
    ("poll, empty CQ", "gated_poll_empty", "base_poll_empty"),
]


def run_c(path: Path, procs: int, iters: int) -> dict[str, float]:
    out = subprocess.run([str(BENCH), str(path), str(procs), str(iters)], capture_output=True,
                         text=True, check=True, env={**os.environ, LEASE_ENV: "0"}).stdout
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


def median_run(path: Path, procs: int, iters: int, repeat: int) -> dict[str, float]:
    runs = sorted((run_c(path, procs, iters) for _ in range(repeat)),
                  key=lambda r: r["ns_per_op"])
    return runs[len(runs) // 2]


def python_ns(path: Path, iters: int) -> float:
    with PcieLocks.create(path, 1) as lk:
        acq, rel = lk.acquire, lk.release
        for _ in range(iters // 10):
            acq(0, 3)
            rel(0)
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            acq(0, 3)
            rel(0)
        return (time.perf_counter_ns() - t0) / iters


def gate_rows(iters: int, repeat: int) -> list[list[object]]:
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([str(GATE), d, str(iters)], capture_output=True, text=True,
                                 check=True).stdout
        runs.append({k: float(v) for k, v in (kv.split("=") for kv in out.split())})
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return [[name, f"{med[base]:.1f}", f"{med[gated]:.1f}", f"{med[gated] - med[base]:.1f}"]
            for name, gated, base in GATE_ROWS]


# ---- (e) attacks ---------------------------------------------------------------------------

CTX = mp.get_context("fork")
GATE_WAIT_S = 0.1  # CRUX_GATE_MAX_WAIT_NS


def _member(path: Path, conn: Connection) -> None:
    """An attacking member, on command: 'take LEVEL' (acquire, never release), 'lock'
    (take the internal mutex and stop), 'exit'."""
    lk = PcieLocks.open(path)
    while True:
        cmd = conn.recv().split()
        if cmd[0] == "take":
            try:
                lk.acquire(0, int(cmd[1]), timeout=30)
                conn.send(0)
            except PcieLockError as e:
                conn.send(e.errno)
        elif cmd[0] == "lock":
            lk._test_lock_internal(0)
            conn.send(0)
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            return


def _prober(path: Path, level: int, conn: Connection) -> None:
    """The victim job: one post per 'post' command, answering (ns, granted)."""
    lk = PcieLocks.open(path)
    while conn.recv() == "post":
        t0 = time.perf_counter_ns()
        try:
            lk.acquire(0, level, timeout=GATE_WAIT_S)
            lk.release(0)
            ok = True
        except PcieLockError:
            ok = False
        conn.send((time.perf_counter_ns() - t0, ok))


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def _poke(path: Path, offset: int, fmt: str, *values: object) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0) as m:
            struct.pack_into(fmt, m, LAYOUT.link(0) + offset, *values)
    finally:
        os.close(fd)


def _start_of_pid1() -> int:
    stat = Path("/proc/1/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19]) + 1


class _Attack:
    """A fresh semaphore file, one attacking member and one prober process."""

    def __init__(self, d: Path, level: int) -> None:
        self.path = d / f"pcie-{time.monotonic_ns()}"
        PcieLocks.create(self.path, 1).close()
        self.member, theirs = CTX.Pipe()
        self.mp = CTX.Process(target=_member, args=(self.path, theirs), daemon=True)
        self.mp.start()
        self.probe, theirs = CTX.Pipe()
        self.pp = CTX.Process(target=_prober, args=(self.path, level, theirs), daemon=True)
        self.pp.start()

    def ask(self, cmd: str) -> None:
        self.member.send(cmd)
        rc = self.member.recv()
        assert rc in (0, errno.EPERM), f"{cmd}: errno {rc}"

    def post(self) -> tuple[int, bool]:
        self.probe.send("post")
        result: tuple[int, bool] = self.probe.recv()
        return result

    def stop_member(self) -> None:
        assert self.mp.pid is not None
        os.kill(self.mp.pid, signal.SIGSTOP)
        while not _stopped(self.mp.pid):
            time.sleep(0.0005)

    def cont_member(self) -> None:
        assert self.mp.pid is not None
        os.kill(self.mp.pid, signal.SIGCONT)

    def close(self) -> None:
        self.probe.send("exit")
        for p in (self.mp, self.pp):
            if p.pid is not None and p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)
            p.join(10)
        self.path.unlink(missing_ok=True)


def _run_attack(d: Path, posts: int, level: int, arm_once: Callable[[_Attack], None] | None,
                arm: Callable[[_Attack], None] | None,
                disarm: Callable[[_Attack], None] | None) -> list[tuple[int, bool]]:
    a = _Attack(d, level)
    try:
        if arm_once:
            arm_once(a)
        out = []
        for _ in range(posts):
            if arm:
                arm(a)
            out.append(a.post())
            if disarm:
                disarm(a)
        return out
    finally:
        a.close()


def _lock_and_stop(a: _Attack) -> None:
    a.member.send("lock")
    assert a.member.recv() == 0
    assert a.mp.pid is not None
    while not _stopped(a.mp.pid):
        time.sleep(0.0005)


def _pid1(a: _Attack) -> None:
    _poke(a.path, LAYOUT.holder_pid, "<iI", 1, 7)
    _poke(a.path, LAYOUT.held_since_ns, "<q", time.monotonic_ns())


def _pid1_forged(a: _Attack) -> None:
    _poke(a.path, LAYOUT.holder_pid, "<iI", 1, 7)
    _poke(a.path, LAYOUT.holder_start, "<Qq", _start_of_pid1(), time.monotonic_ns())


def _take_and_stop(a: _Attack) -> None:
    a.ask("take 7")
    a.stop_member()


ATTACKS: list[tuple[str, int, Callable[[_Attack], None] | None, Callable[[_Attack], None] | None,
                    Callable[[_Attack], None] | None]] = [
    # (row, post level, arm once, arm before each post, disarm after each post)
    ("none", 7, None, None, None),
    ("stopped in internal mutex", 7, _lock_and_stop, None, None),
    ("low holder never releases", 7, None, lambda a: a.ask("take 0"), None),
    ("holder_pid = 1", 7, None, _pid1, None),
    ("holder_pid = 1 with pid 1's start", 7, None, _pid1_forged, None),
    ("stopped holder", 7, None, _take_and_stop, lambda a: a.cont_member()),
    ("level-7 holder never releases, level-0 post", 0, lambda a: a.ask("take 7"), None, None),
]


def attack_rows(posts: int) -> tuple[list[list[object]], float]:
    """The rows of (e), and the median post with no attack (ns)."""
    os.environ.pop(LEASE_ENV, None)  # the default lease, as jobs have it
    rows = []
    base = 0.0
    with tempfile.TemporaryDirectory() as d:
        for name, level, arm_once, arm, disarm in ATTACKS:
            res = _run_attack(Path(d), posts, level, arm_once, arm, disarm)
            ns = [t for t, _ in res]
            if name == "none":
                base = statistics.median(ns)
            added = [(t - base) / 1e6 for t in ns]
            rows.append([name, level, len(res), sum(ok for _, ok in res),
                         f"{statistics.median(added):.3f}", f"{max(added):.3f}"])
    return rows, base


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200_000, help="pairs per process")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--procs", default="2,4", help="contended process counts")
    ap.add_argument("--gate-iters", type=int, default=2_000_000, help="calls per gate case")
    ap.add_argument("--attack-posts", type=int, default=50, help="posts per attack, part (e)")
    ap.add_argument("--parts", default="abcde", help="which parts to run (letters)")
    args = ap.parse_args(argv)
    preamble()
    if set(args.parts) & set("abc"):
        ensure_built(BENCH, "pcie")
        rows = []
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "pcie"
            if "a" in args.parts:
                r = median_run(path, 1, args.iters, args.repeat)
                rows.append(["uncontended (C)", 1, f"{r['ns_per_op']:.1f}",
                             f"{1e9 / r['ns_per_op']:,.0f}", "-", "-", "-", "-"])
            for p in (int(x) for x in args.procs.split(",") if x and "b" in args.parts):
                r = median_run(path, p, args.iters, args.repeat)
                rows.append([f"contended (C), {p} procs", p, f"{r['ns_per_op']:.1f}",
                             f"{r['ops_per_s']:,.0f}", f"{r['p50_acquire_ns']:,.0f}",
                             f"{r['p99_acquire_ns']:,.0f}", f"{r['max_acquire_ns']:,.0f}",
                             "yes" if r["count_ok"] else "NO"])
            if "c" in args.parts:
                py = python_ns(path, min(args.iters, 100_000))
                rows.append(["uncontended (Python ctypes)", 1, f"{py:.1f}", f"{1e9 / py:,.0f}",
                             "-", "-", "-", "-"])
        print()
        print(table(["case", "procs", "ns/pair", "pairs/s", "acq p50 ns", "acq p99 ns",
                     "acq max ns", "count exact"], rows))
        print(f"\n# {args.iters:,} pairs per process, median of {args.repeat} runs; "
              "ns/pair contended = wall time / all pairs (the link is serial)")
    if "d" in args.parts:
        ensure_built(GATE, "gate")
        print("\n(d) the wrapper's PCIe gate on ibv_post_send/ibv_poll_cq, native, no NIC (ns per "
              "call)")
        print(table(["call", "ungated", "gated", "added"],
                    gate_rows(args.gate_iters, args.repeat)))
        print(f"\n# {args.gate_iters:,} calls per case, median of {args.repeat} runs")
    if "e" in args.parts and args.attack_posts > 0:
        rows, base = attack_rows(args.attack_posts)
        print("\n(e) attacks by one member: ms added to another job's post (acquire_timed "
              f"{GATE_WAIT_S * 1e3:.0f} ms + release)")
        print(table(["attack", "post level", "posts", "granted", "median added ms",
                     "worst added ms"], rows))
        print(f"\n# {args.attack_posts} posts per attack, each against a fresh attack; a post "
              f"with no attack takes {base / 1e3:.1f} us (median, from Python)")


if __name__ == "__main__":
    main()
