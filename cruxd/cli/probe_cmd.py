"""`cruxctl probe HOST`: one source-port sweep toward HOST, like traceroute, with no
daemon needed: which UDP source ports lead onto which fabric paths."""

from __future__ import annotations

import argparse
import json
import socket
import sys

from cruxd.errors import CruxError, UsageError
from transport.roce import ROCE_DPORT, ROCE_SPORT_TEXT


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "probe", help="sweep UDP source ports toward a host and group them by path",
        description="Send TTL-limited UDP probes with the data's 5-tuple (dst port "
                    f"{ROCE_DPORT}, source ports in RoCEv2's range) toward HOST, identify each "
                    "port's path by the routers' ICMP time-exceeded replies, and group ports by "
                    "path. Stops when --expected paths are found, when no new path appeared "
                    "for long enough (coupon collector, docs in probing/budget.py), or at "
                    "--max-probes. Needs CAP_NET_RAW (root).",
        epilog="Exit status: 0 ok, 1 cannot probe (permission, network), 2 bad input.")
    p.add_argument("host", metavar="HOST", help="peer host name or IPv4 address")
    p.add_argument("--dport", type=int, default=ROCE_DPORT,
                   help=f"destination port (default {ROCE_DPORT})")
    p.add_argument("--sports", default=ROCE_SPORT_TEXT, metavar="LO-HI",
                   help=f"source ports to try, in order (default {ROCE_SPORT_TEXT})")
    p.add_argument("--max-probes", type=int, default=1024, metavar="N",
                   help="ports to try at most (default 1024)")
    p.add_argument("--expected", type=int, metavar="N", help="stop once N paths are found")
    p.add_argument("--rate", type=float, default=200.0, metavar="PPS",
                   help="ports probed per second (default 200)")
    p.add_argument("--max-hops", type=int, default=8, help="TTL limit (default 8)")
    p.add_argument("--dscp", type=int, default=56,
                   help="DSCP of the probes (default 56, CS7: the class reserved for "
                        "probing, above the jobs' levels)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _range(text: str) -> range:
    from probing.sweep import port_range

    try:
        return port_range(text)
    except ValueError as exc:
        raise UsageError(f"--sports {text!r}: {exc}") from None


def cmd_probe(args: argparse.Namespace) -> int:
    from probing.sweep import sweep
    from probing.ttl import TtlProber

    sports = _range(args.sports)
    for name in ("max_probes", "max_hops"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if not 1 <= args.dport <= 65535:
        raise UsageError("--dport must be 1..65535")
    if not 0 <= args.dscp <= 63:
        raise UsageError("--dscp must be 0..63")
    try:
        peer = socket.gethostbyname(args.host)
    except OSError:
        raise UsageError(f"{args.host}: cannot resolve") from None
    try:
        prober = TtlProber(peer, dport=args.dport, max_hops=args.max_hops, dscp=args.dscp)
    except PermissionError:
        raise CruxError("probing needs CAP_NET_RAW (run as root)") from None
    with prober:
        result = sweep(prober, args.host, sports, expected=args.expected,
                       max_probes=args.max_probes, rate_pps=args.rate)
    doc = result.to_json()
    doc["ignored_replies"] = prober.counters.ignored
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.host} ({peer}): {len(result.paths)} path(s) after {result.probes_sent} "
          f"probe(s), stopped: {result.stopped}; {result.unanswered} unanswered, "
          f"{prober.counters.ignored} replies ignored")
    for hops, ports in sorted(result.paths.items()):
        print(f"  {' > '.join(hops) or '(direct)'}: sports {', '.join(map(str, ports))}")
    return 0
