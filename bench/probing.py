"""Probing benchmark: what finding a peer's N ECMP paths costs, blind and hash-guided.

(a) Blind sweep vs the coupon collector. A hash-model prober (its trace(sport) returns
    the path index a model gives the port: no network) stands for an N-path fabric; a
    fresh random seed per trial. sweep() runs over the RoCE ports from 0xC000 in order:
    with expected=N (it stops when all N are found: the probes "to find all N") and
    with N unknown (the quiet rule, miss 1e-3: the probes until it stops, and how often
    it stopped short of N). Two hashes: nft's jhash (reciprocal_scale) and a
    switch-style CRC-32 (modulo) over src, dst, sport, dport.
(b) Guided sweep (probing/guided.py) with the right model: probes used (target exactly
    N); with a wrong seed: the probes its fallback to the blind sweep used (expected=N).
(c) On the namespace rig (root only; else the section is skipped, saying why): 2-leaf
    Clos fabrics with 2, 4, 8 spines, h0 -> h1. Kernel ECMP: blind sweeps from a few
    starting ports; ecmp="jhash" (nft, random seed): the guided sweep, and blind sweeps
    for comparison. A probed port is a TTL trace: up to hops+1 datagrams (here 3 hops:
    leaf, spine, leaf, then the peer), so both ports and datagrams are counted.
(d) Probe bandwidth at cruxctl probe's default rate (its parser's --rate default), each
    port traced with hops+1 datagrams of TtlProber's real payload (captured from its
    sendto), on-wire size = preamble+SFD+IFG 20 + max(64, Ethernet 14 + IPv4 20 +
    UDP 8 + payload + FCS 4); the routers' ICMP replies (IPv4 + ICMP 8 + the quoted
    probe) on the way back, the same way.

(e) A peer's whole sweep as an agent runs it (issue 33): one UDP sweep, then one TCP sweep
    per destination port ([probing] tcp_dport, and each job's listening port at the peer,
    at most tcp_dports_per_peer), each collecting tcp_ports_per_path = 8 ports per path;
    all with N unknown (the quiet rule, the agent's default). Hash-model probers, a fresh
    model per port (switches hash both ports); probes per peer sweep and its seconds at
    the agent's default rate_pps, against the number of destination ports.

    .venv/bin/python bench/probing.py [--quick] [--trials T] [--seed S] [--no-rig]
                                      [--json PATH]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from tables import preamble, table  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.rig

from probing.budget import expected_probes  # noqa: E402
from probing.guided import guided_sweep  # noqa: E402
from probing.hashmodel import HashModel  # noqa: E402
from probing.sweep import sweep  # noqa: E402
from transport.roce import ROCE_SPORTS  # noqa: E402

NS = (2, 4, 8, 16, 32, 64)
RIG_SPINES = (2, 4, 8)
SRC, DST = "10.2.0.2", "10.2.1.2"  # the rig's h0 and h1
HASHES = {"jhash (nft)": ("jhash", "reciprocal"), "crc32 % N (switch)": ("crc32", "modulo")}
TARGET_RATIO = 1.5
TARGET_BW_PCT = 0.01


class ModelProber:
    """An N-path fabric whose ECMP is `model`: a port's signature is its path index."""

    def __init__(self, model: HashModel, n: int) -> None:
        self.model, self.n = model, n
        self.src, self.dst = (int(ipaddress.IPv4Address(a)) for a in (SRC, DST))
        self.memo: dict[int, tuple[str, ...]] = {}

    def trace(self, sport: int) -> tuple[str, ...] | None:
        if sport not in self.memo:
            self.memo[sport] = (str(self.model.path_of(self.src, self.dst, sport, n=self.n)),)
        return self.memo[sport]


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# --- (a) and (b): hash-model probers ---------------------------------------------------

def blind(trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for name, (function, select) in HASHES.items():
        for n in NS:
            rng = random.Random(f"{seed}/{name}/{n}")
            found, quiet, short = [], [], 0
            for _ in range(trials):
                prober = ModelProber(HashModel(function, rng.getrandbits(32), select=select), n)
                r = sweep(prober, "peer", ROCE_SPORTS, expected=n, max_probes=len(ROCE_SPORTS))
                found.append(r.probes_sent if len(r.paths) == n else math.inf)
                q = sweep(prober, "peer", ROCE_SPORTS, max_probes=len(ROCE_SPORTS))
                quiet.append(q.probes_sent)
                short += len(q.paths) < n
            rows.append({"hash": name, "n": n, "trials": trials,
                         "found_median": statistics.median(found), "found_p90": pct(found, 90),
                         "found_max": max(found), "nhn": expected_probes(n),
                         "ratio": statistics.median(found) / expected_probes(n),
                         "mean_ratio": statistics.fmean(found) / expected_probes(n),
                         "quiet_median": statistics.median(quiet), "quiet_p90": pct(quiet, 90),
                         "quiet_max": max(quiet), "quiet_short": short})
    return rows


def guided(trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for name, (function, select) in HASHES.items():
        for n in NS:
            rng = random.Random(f"{seed}/guided/{name}/{n}")
            used, wrong, exact, mism, cpu = [], [], 0, 0, 0.0
            for _ in range(trials):
                s = rng.getrandbits(32)
                truth = HashModel(function, s, select=select)
                t0 = time.perf_counter()
                r = guided_sweep(ModelProber(truth, n), truth, DST, SRC, n)
                cpu += time.perf_counter() - t0
                used.append(r.probes_sent)
                exact += r.stopped == "model" and r.probes_sent == n and len(r.paths) == n
                w = guided_sweep(ModelProber(truth, n), HashModel(function, s ^ 1, select=select),
                                 DST, SRC, n, expected=n, max_probes=len(ROCE_SPORTS))
                wrong.append(w.probes_sent if len(w.paths) == n else math.inf)
                mism += w.stopped.startswith("model-mismatch")
            rows.append({"hash": name, "n": n, "trials": trials, "min": min(used),
                         "max": max(used), "exact": exact, "ms_per_sweep": 1e3 * cpu / trials,
                         "wrong_median": statistics.median(wrong), "wrong_mismatch": mism})
    return rows


# --- (e) a peer's sweep with TCP destination ports ---------------------------------------

TCP_NS = (2, 4, 8)
DPORTS = (0, 1, 2, 4, 8, 16, 33)  # 33: tcp_dport and the most jobs' ports (32) per peer


def tcp_cost(trials: int, seed: int) -> list[dict[str, Any]]:
    from cruxd.config.probing_section import MAX_TCP_PORTS, TCP_SPORTS
    from probing.sweep import port_range

    tcp_ports = port_range(TCP_SPORTS)
    rows = []
    for n in TCP_NS:
        rng = random.Random(f"{seed}/tcp/{n}")
        udp, tcp = [], []
        for _ in range(trials):
            model = HashModel("jhash", rng.getrandbits(32), select="reciprocal")
            udp.append(sweep(ModelProber(model, n), "peer", ROCE_SPORTS,
                             max_probes=1024).probes_sent)
            model = HashModel("jhash", rng.getrandbits(32), select="reciprocal")
            tcp.append(sweep(ModelProber(model, n), "peer", tcp_ports, max_probes=1024,
                             ports_per_path=MAX_TCP_PORTS).probes_sent)
        u, t = statistics.median(udp), statistics.median(tcp)
        rows.append({"n": n, "udp_median": u, "tcp_median": t, "tcp_p90": pct(tcp, 90),
                     "per_dports": {k: u + k * t for k in DPORTS}})
    return rows


# --- (c) the rig ------------------------------------------------------------------------

def rig(trials: int, seed: int) -> dict[str, Any]:
    from tests.rig.fabric import Fabric, can_build_jhash
    from tests.rig.probe import guided_from, sweep_from

    if (why := can_build_jhash()) is not None:
        return {"skipped": why}
    rng = random.Random(f"{seed}/rig")
    starts = [0xC000 + 997 * k for k in range(trials)]
    rows = []
    for n in RIG_SPINES:
        for ecmp in ("kernel", "jhash"):
            hash_seed = rng.getrandbits(32)
            with Fabric(hosts_per_leaf=1, leaves=2, spines=n, ecmp=ecmp,
                        hash_seed=hash_seed) as f:
                for start in starts:
                    d = sweep_from(f, "h0", "h1", expected=n, start=start, max_probes=2000)
                    q = sweep_from(f, "h0", "h1", start=start, max_probes=2000)
                    rows.append({"spines": n, "ecmp": ecmp, "mode": "blind", "start": start,
                                 "paths": len(d["paths"]), "ports": d["probes_sent"],
                                 "datagrams": d["datagrams"], "quiet_paths": len(q["paths"]),
                                 "quiet_ports": q["probes_sent"],
                                 "quiet_datagrams": q["datagrams"],
                                 "unanswered": d["unanswered"] + q["unanswered"]})
                if ecmp == "jhash":
                    g = guided_from(f, "h0", "h1", f.hash_model(), n)
                    rows.append({"spines": n, "ecmp": ecmp, "mode": "guided",
                                 "seed": hash_seed, "paths": len(g["paths"]),
                                 "ports": g["probes_sent"], "datagrams": g["datagrams"],
                                 "stopped": g["stopped"], "unanswered": g["unanswered"]})
            print(f"    ... rig: {n} spines, ecmp={ecmp} done", file=sys.stderr, flush=True)
    return {"rows": rows, "starts": starts}


# --- (d) bandwidth ------------------------------------------------------------------------

def probe_payload() -> int:
    """The UDP payload TtlProber.trace really sends, captured with its sockets stubbed."""
    import probing.ttl as ttl

    sent: list[bytes] = []

    class Sock:
        def __init__(self, *a: object) -> None:
            pass

        def __enter__(self) -> Sock:
            return self

        def __exit__(self, *a: object) -> None:
            pass

        def setsockopt(self, *a: object) -> None:
            pass

        def bind(self, *a: object) -> None:
            pass

        def close(self) -> None:
            pass

        def sendto(self, data: bytes, addr: object) -> int:
            sent.append(data)
            return len(data)

    with mock.patch.object(ttl.socket, "socket", Sock), \
            mock.patch.object(ttl.select, "select", lambda *a: ([], [], [])):
        ttl.TtlProber("192.0.2.1", timeout_s=0.0).trace(0xC000)
    assert len({len(d) for d in sent}) == 1, sent
    return len(sent[0])


def default_rate() -> float:
    from cruxd.cli import probe_cmd

    ap = argparse.ArgumentParser()
    probe_cmd.add_parser(ap.add_subparsers())
    return float(ap.parse_args(["probe", "peer"]).rate)


def wire_bytes(l3: int) -> int:
    """An IPv4 packet of l3 bytes on Ethernet: header 14 + FCS 4, padded to the 64-byte
    minimum frame, plus preamble+SFD 8 and the inter-frame gap 12."""
    return max(64, 14 + l3 + 4) + 20


def bandwidth() -> dict[str, Any]:
    payload, rate = probe_payload(), default_rate()
    probe_l3 = 20 + 8 + payload
    reply_l3 = 20 + 8 + probe_l3  # ICMP: header 8, quoting the whole (short) probe
    rows = []
    for what, datagrams in (("2-tier, across leaves (3 hops + peer)", 4),
                            ("3-tier, across pods (5 hops + peer)", 6),
                            ("TTL limit (--max-hops 8, no answer from the peer)", 8)):
        bps = rate * datagrams * wire_bytes(probe_l3) * 8
        rows.append({"path": what, "datagrams": datagrams, "bps": bps,
                     "reply_bps": rate * datagrams * wire_bytes(reply_l3) * 8,
                     "pct": {g: 100 * bps / (g * 1e9) for g in (25, 100, 400)}})
    return {"payload": payload, "rate": rate, "probe_l3": probe_l3,
            "probe_wire": wire_bytes(probe_l3), "reply_l3": reply_l3,
            "reply_wire": wire_bytes(reply_l3), "rows": rows}


# --- report ---------------------------------------------------------------------------------

def fmt(x: float) -> str:
    if not math.isfinite(x):
        return "never"
    return f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    t = args.trials
    print(f"\n(a) Blind sweep vs the coupon collector: {t} trials per N, a random seed each; "
          "ports from 0xC000 in order")
    print(table(["hash", "N", "to find all: median", "p90", "max", "N*H_N", "median/N*H_N",
                 "mean/N*H_N", "stop quiet: median", "p90", "max", "stopped < N",
                 "stop expected=N"],
                [[r["hash"], r["n"], fmt(r["found_median"]), fmt(r["found_p90"]),
                  fmt(r["found_max"]), f"{r['nhn']:.1f}", f"{r['ratio']:.2f}",
                  f"{r['mean_ratio']:.2f}",
                  fmt(r["quiet_median"]), fmt(r["quiet_p90"]), fmt(r["quiet_max"]),
                  f"{r['quiet_short']}/{r['trials']}", fmt(r["found_median"])]
                 for r in res["blind"]]))
    worst = max(r["ratio"] for r in res["blind"] if r["hash"].startswith("jhash"))
    print(f"    target: median/N*H_N <= {TARGET_RATIO} (jhash worst: {worst:.2f}). "
          "stop expected=N = to find all (the sweep stops at the N-th path).\n"
          "    stop quiet: N unknown, quiet_probes(k, 1e-3) probes without a new path after "
          "k found;\n    stopped < N: trials that stopped with a path missing (the rule "
          "allows ~1e-3 per stop).")
    print(f"\n(b) Guided sweep (probing.guided): the right model, then a wrong seed (seed ^ 1); "
          f"{t} trials per N")
    print(table(["hash", "N", "probes: min", "max", "exactly N, all found",
                 "model CPU ms/sweep", "wrong seed: median probes", "mismatch noticed"],
                [[r["hash"], r["n"], r["min"], r["max"], f"{r['exact']}/{r['trials']}",
                  f"{r['ms_per_sweep']:.2f}", fmt(r["wrong_median"]),
                  f"{r['wrong_mismatch']}/{r['trials']}"] for r in res["guided"]]))
    print("    target: exactly N probes. model CPU: ports_per_path + the sweep, pure Python. "
          "wrong seed: the blind\n    fallback with expected=N; 'mismatch noticed' < all "
          "when the wrong model's N ports happen to hit N paths.")
    rg = res["rig"]
    print("\n(c) On the rig: 2-leaf Clos, h0 -> h1, one host per leaf (TTL traces from inside "
          "h0's namespace)")
    if "skipped" in rg:
        print(f"    skipped: {rg['skipped']}")
    else:
        out = []
        for n in RIG_SPINES:
            for ecmp in ("kernel", "jhash"):
                b = [r for r in rg["rows"] if (r["spines"], r["ecmp"], r["mode"]) ==
                     (n, ecmp, "blind")]
                ports = [r["ports"] for r in b]
                out.append([n, ecmp, f"blind x{len(b)}", f"{min(r['paths'] for r in b)}",
                            f"{statistics.median(ports):.0f} ({min(ports)}-{max(ports)})",
                            f"{expected_probes(n):.1f}",
                            f"{statistics.median(r['datagrams'] for r in b):.0f}",
                            f"{statistics.median(r['quiet_ports'] for r in b):.0f} "
                            f"({min(r['quiet_paths'] for r in b)} paths)",
                            f"{statistics.median(r['quiet_datagrams'] for r in b):.0f}", ""])
                for g in (r for r in rg["rows"] if (r["spines"], r["ecmp"], r["mode"]) ==
                          (n, ecmp, "guided")):
                    out.append([n, ecmp, "guided", g["paths"], g["ports"], "", g["datagrams"],
                                "", "", g["stopped"]])
        print(table(["spines", "ECMP", "sweep", "paths found (min)",
                     "ports to find all: median (range)", "N*H_N", "datagrams",
                     "stop quiet: ports", "datagrams", "stopped"], out))
        print(f"    blind: starting ports {', '.join(hex(s) for s in rg['starts'])}; "
              "'ports to find all' = sweep(expected=N); a port = one trace of up to 4 "
              "datagrams\n    (TTL 1-3 expire at leaf, spine, leaf; TTL 4 reaches h1). "
              "Unanswered probes: "
              f"{sum(r['unanswered'] for r in rg['rows'])}. jhash: nft on each leaf, a random "
              "seed per fabric.")
    bw = res["bandwidth"]
    print(f"\n(d) Probe bandwidth at cruxctl probe's default --rate {bw['rate']:g} ports/s, "
          f"payload {bw['payload']} B (TtlProber)")
    print(table(["trace", "datagrams/port", "probe bit/s", "% of 25G", "% of 100G",
                 "% of 400G", "ICMP replies bit/s"],
                [[r["path"], r["datagrams"], f"{r['bps']:,.0f}", f"{r['pct'][25]:.5f}",
                  f"{r['pct'][100]:.5f}", f"{r['pct'][400]:.6f}", f"{r['reply_bps']:,.0f}"]
                 for r in bw["rows"]]))
    print(f"    probe: IPv4 {bw['probe_l3']} B -> {bw['probe_wire']} B on the wire (padded "
          f"to the 64 B minimum frame, + preamble/IFG 20);\n    reply: IPv4 {bw['reply_l3']} B "
          f"(ICMP 8 + the quoted probe) -> {bw['reply_wire']} B. target < {TARGET_BW_PCT} % "
          "of a link. One sweep at a time per agent.")


def report_tcp(rows: list[dict[str, Any]], trials: int) -> None:
    from cruxd.config.model import ProbingConfig
    from cruxd.config.parse import parse_config

    cfg: ProbingConfig = parse_config("", "<defaults>").probing
    rate = cfg.rate_pps
    print(f"\n(e) A peer's sweep: UDP, then one TCP sweep per destination port ({trials} "
          f"trials per N, quiet rule, {cfg.tcp_ports_per_path} TCP ports per path); at "
          f"the agent's rate_pps {rate:g}")
    print(table(["N paths", "UDP sweep: probes", "TCP sweep per port: median", "p90",
                 *(f"{k} port(s): probes (s)" for k in DPORTS)],
                [[r["n"], fmt(r["udp_median"]), fmt(r["tcp_median"]), fmt(r["tcp_p90"]),
                  *(f"{fmt(v)} ({v / rate:.1f})" for v in r["per_dports"].values())]
                 for r in rows]))
    print(f"    each port is one more TCP sweep: a peer's sweep grows linearly with the "
          f"destination ports probed toward it, bounded by 1 + tcp_dports_per_peer "
          f"(default {cfg.tcp_dports_per_peer}, at most 32). One sweep at a time per agent, "
          "every interval_s per peer, so rate_pps still bounds the probe traffic.")


def finite(x: Any) -> Any:
    """JSON has no infinity: a sweep that never found all paths is null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="50 trials, 2 rig starts (< 30 s); the full run: 200 and 8")
    ap.add_argument("--trials", type=int, default=None, help="trials per N for (a), (b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-rig", action="store_true", help="skip (c)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.trials is None:
        args.trials = 50 if args.quick else 200
    rig_trials = 2 if args.quick else 8
    started = time.monotonic()
    preamble(f"kernel {platform.release()}")
    res: dict[str, Any] = {"trials": args.trials, "seed": args.seed}
    res["blind"] = blind(args.trials, args.seed)
    print(f"    ... (a) done at {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    res["guided"] = guided(args.trials, args.seed)
    print(f"    ... (b) done at {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    res["rig"] = {"skipped": "--no-rig"} if args.no_rig else rig(rig_trials, args.seed)
    res["bandwidth"] = bandwidth()
    res["tcp"] = tcp_cost(args.trials, args.seed)
    report(res, args)
    report_tcp(res["tcp"], args.trials)
    res["wall_s"] = time.monotonic() - started
    print(f"\n# total {res['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(finite(res), indent=1) + "\n")


if __name__ == "__main__":
    main()
