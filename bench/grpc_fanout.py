"""The floor under the leader's fan-out: gRPC Python (grpc.aio) writing one small message on
each of N open server streams, with nothing else in either process (issue 34).

Protocol
  * One server process (grpc.aio, a generic handler, bytes in and out: no protobuf): every
    stream's handler waits on one asyncio.Event and writes the round's 40-byte message
    when it is set, as the leader's WatchPlan does.
  * C client processes (default 4, as bench/control_plane.py's workers) hold N/C streams,
    each `per_channel` streams to one channel (1: a TCP connection per stream, as separate
    hosts have), and read with `await call.read()`.
  * Each round: set the event; "all" = the last stream's read minus the moment the
    controller told the server to send; CPU = utime+stime of the server and of the
    clients over the round, per stream. Median over --rounds rounds (the first dropped).

    .venv/bin/python bench/grpc_fanout.py [--streams 1000 10000] [--per-channel 1 4]
        [--clients 4] [--rounds 6] [--json]

What it says: on this machine no fan-out through gRPC Python can be cheaper than this; the
leader's own per-stream work comes on top (bench/control_plane.py's "fan-out").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from tables import preamble, table

MSG = 40


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


async def _server(n: int, rounds: int, port_q: Any, go_q: Any, ready_q: Any) -> None:
    import grpc

    state = {"event": asyncio.Event(), "msg": b"", "open": 0}

    async def watch(request: bytes, context: Any) -> None:
        state["open"] += 1
        while True:
            event = state["event"]
            await event.wait()
            await context.write(state["msg"])

    handler = grpc.method_handlers_generic_handler(
        "bench.Fan", {"Watch": grpc.unary_stream_rpc_method_handler(watch)})
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 1 << 20)])
    server.add_generic_rpc_handlers((handler,))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    loop = asyncio.get_running_loop()
    while state["open"] < n:
        await asyncio.sleep(0.1)
    ready_q.put(state["open"])
    for r in range(rounds):
        await loop.run_in_executor(None, go_q.get)
        state["msg"] = b"%06d" % r + b"x" * (MSG - 6)
        old, state["event"] = state["event"], asyncio.Event()
        old.set()
    await asyncio.sleep(3600)


async def _clients(port: int, n: int, per_channel: int, rounds: int, out_q: Any) -> None:
    import grpc

    got: dict[int, list[float]] = {}
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range((n + per_channel - 1) // per_channel)]

    async def one(i: int) -> None:
        ch = channels[i // per_channel]
        while True:  # a stream the server reset before it counted is opened again
            call = ch.unary_stream("/bench.Fan/Watch", request_serializer=None,
                                   response_deserializer=None)(b"")
            try:
                while True:
                    m = await call.read()
                    got.setdefault(int(m[:6]), []).append(time.monotonic())
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    for r in range(rounds):
        while len(got.get(r, ())) < n:
            await asyncio.sleep(0.01)
        out_q.put((r, max(got[r])))
    await asyncio.gather(*tasks)


def _run_server(*a: Any) -> None:
    asyncio.run(_server(*a))


def _run_clients(*a: Any) -> None:
    asyncio.run(_clients(*a))


def measure(n: int, per_channel: int, clients: int, rounds: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    port_q, go_q, ready_q, out_q = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=_run_server, args=(n, rounds, port_q, go_q, ready_q))
    server.start()
    procs = [server]
    try:
        port = port_q.get(timeout=60)
        share = [n // clients + (i < n % clients) for i in range(clients)]
        procs += [ctx.Process(target=_run_clients, args=(port, k, per_channel, rounds, out_q))
                  for k in share]
        for p in procs[1:]:
            p.start()
        ready_q.get(timeout=600)
        time.sleep(2.0)
        rows = []
        for _ in range(rounds):
            s0, c0 = cpu_s(server.pid), sum(cpu_s(p.pid) for p in procs[1:])
            t0 = time.monotonic()
            go_q.put(1)
            last = max(out_q.get(timeout=120)[1] for _ in procs[1:])
            time.sleep(0.3)  # the clients' polling has seen it; their CPU is counted
            rows.append({"all_s": last - t0,
                         "server_us": 1e6 * (cpu_s(server.pid) - s0) / n,
                         "clients_us": 1e6 * (sum(cpu_s(p.pid) for p in procs[1:]) - c0) / n})
            print(f"    ... {n} streams, {per_channel} per channel: all "
                  f"{1e3 * rows[-1]['all_s']:.0f} ms", file=sys.stderr, flush=True)
            time.sleep(0.5)
    finally:
        for p in procs:
            p.kill()
            p.join()
    kept = rows[1:] or rows
    return {"streams": n, "per_channel": per_channel, "clients": clients,
            **{k: statistics.median(r[k] for r in kept) for k in kept[0]},
            "all_max_s": max(r["all_s"] for r in kept)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--per-channel", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 2 or args.clients < 1 or min(args.streams) < args.clients:
        ap.error("--rounds >= 2, --clients >= 1, and at least one stream per client")
    started = time.monotonic()
    out = [measure(n, pc, args.clients, args.rounds)
           for n in args.streams for pc in args.per_channel]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    preamble()
    print(table(["streams", "per channel", "all delivered (median)", "max",
                 "server CPU per stream", "clients' CPU per stream"],
                [[str(r["streams"]), str(r["per_channel"]), f"{1e3 * r['all_s']:.0f} ms",
                  f"{1e3 * r['all_max_s']:.0f} ms", f"{r['server_us']:.0f} us",
                  f"{r['clients_us']:.0f} us"] for r in out]))
    print(f"# one {MSG}-byte message per stream per round, {args.rounds} rounds (first "
          f"dropped), {args.clients} client processes; CPU from /proc (10 ms ticks)")
    print(f"# total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
