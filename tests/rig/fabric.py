"""A 2-tier Clos fabric of network namespaces joined by veth pairs.

Hosts hang off leaves, every leaf connects to every spine, and the kernel does the
switching: leaves forward with L4 ECMP (`fib_multipath_hash_policy=3` over the
5-tuple, one nexthop per spine), decrement TTL and answer with ICMP time-exceeded, so
probing, path steering and priority queues are tested against the real thing. Routers answer
from the interface the probe arrived on (`icmp_errors_use_inbound_ifaddr`), so each
hop address names the link a probe came over: a cross-leaf trace reads
10.2.k.1 (its leaf), 10.3.(l*32+s).2 (spine s), 10.3.(m*32+s).1 (leaf m, from spine s).

ECMP modes (`ecmp=`):
    "kernel"  the kernel's multipath hash (siphash of the flow keys, keyed randomly at
              boot unless fib_multipath_hash_seed is set): unknown to the prober, as
              a real fabric's hash usually is.
    "jhash"   a known hash: each leaf's nftables prerouting chain marks UDP with
              `jhash <hash_fields> mod <spines> seed <hash_seed> offset 1`, and
              `ip rule fwmark s+1 table 100+s` sends mark s+1 over spine s (per-spine
              tables hold the remote host prefixes only). `hash_model()` is the
              probing.hashmodel model of that rule. Non-UDP traffic (ICMP) keeps the
              kernel's multipath route.
`link_mbit` rate-limits every switch egress port (HTB, via `priority_queues`). HTB counts
frames; with `goodput=True` a port's rate is raised by a full TCP segment's frame/payload
ratio (1514/1448), so a bulk TCP transfer moves its payload at the nominal rate, as the
simulator's links carry the jobs' bytes.

Addressing (k: global host index, l: leaf, s: spine):
    host k  <-> its leaf   10.2.k.0/24   leaf .1, host .2 (the host's fabric address)
    leaf l  <-> spine s    10.3.(l*32+s).0/24   leaf .1, spine .2

Names are unique per fabric (a random prefix), so tests run in parallel; `close()`
deletes every namespace and is safe to call twice; use the fabric as a context
manager so a failing test still tears it down.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from probing.hashmodel import HashModel

MAX_SPINES = 32
MAX_HOSTS = 250


class RigError(RuntimeError):
    pass


def can_build() -> str | None:
    """None when a fabric can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    return None


def can_build_jhash() -> str | None:
    """None when a fabric with ecmp="jhash" can be built here, else the reason."""
    if (why := can_build()) is not None:
        return why
    if shutil.which("nft") is None:
        return "ecmp='jhash' needs nftables (nft); apt-get install nftables"
    return None


# the nft expression loading each 5-tuple field (each into its own 32-bit register,
# which is the key layout probing.hashmodel's "jhash" assumes)
NFT_FIELDS = {"src": "ip saddr", "dst": "ip daddr", "proto": "meta l4proto",
              "sport": "udp sport", "dport": "udp dport"}
MARK_TABLE = 100  # mark s+1 -> routing table MARK_TABLE+s -> spine s
# a full-size TCP segment on a 1500-byte MTU: Ethernet + IP + TCP with timestamps
# around 1448 payload bytes (measured: 66,903 packets of 1,513.5 bytes for 200 Mbit/s
# of HTB rate gave iperf3 191 Mbit/s of goodput)
FRAME_PER_PAYLOAD = 1514 / 1448


def _run(*cmd: str, stdin: str | None = None) -> str:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RigError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Fabric:
    hosts_per_leaf: int = 2
    leaves: int = 2
    spines: int = 2
    ecmp: str = "kernel"  # | "jhash" (see the module docstring)
    hash_seed: int = 0
    hash_fields: tuple[str, ...] = ("src", "dst", "sport", "dport")
    link_mbit: float | None = None
    # per kind of port, overriding link_mbit: leaf->host, and leaf<->spine (a blocking
    # fabric has less uplink than host bandwidth under a leaf)
    host_mbit: float | None = None
    uplink_mbit: float | None = None
    dscp_by_level: tuple[int, ...] = (0,)  # strict-priority classes on every shaped port
    queue_packets: int = 64
    goodput: bool = False  # port rates are TCP payload rates (see the module docstring)
    prefix: str = field(default_factory=lambda: f"crx{secrets.token_hex(3)}")
    created: list[str] = field(default_factory=list)
    down_links: set[tuple[int, int]] = field(default_factory=set)  # (leaf, spine), set_link

    def __post_init__(self) -> None:
        if not 1 <= self.spines <= MAX_SPINES:
            raise ValueError(f"spines must be 1..{MAX_SPINES}")
        if not 1 <= self.leaves * self.hosts_per_leaf <= MAX_HOSTS:
            raise ValueError(f"at most {MAX_HOSTS} hosts")
        if self.ecmp not in ("kernel", "jhash"):
            raise ValueError("ecmp must be 'kernel' or 'jhash'")
        if self.ecmp == "jhash":
            if self.spines < 2:
                raise ValueError("ecmp='jhash' needs >= 2 spines (nft: mod >= 2)")
            self.hash_model()  # validates seed and fields

    # --- names and addresses -------------------------------------------------
    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    @property
    def host_names(self) -> list[str]:
        return [f"h{k}" for k in range(self.leaves * self.hosts_per_leaf)]

    def leaf_of(self, host: str) -> int:
        return int(host[1:]) // self.hosts_per_leaf

    def address(self, host: str) -> str:
        return f"10.2.{int(host[1:])}.2"

    def uplink(self, leaf: int, spine: int) -> str:
        """The leaf's interface toward `spine` (counters: `tx_packets`)."""
        return f"s{spine}"

    def hash_model(self) -> HashModel:
        """The model of the leaves' nft rule (ecmp="jhash"): path index = spine."""
        return HashModel("jhash", self.hash_seed, self.hash_fields, "reciprocal")

    def nft_rules(self) -> str:
        """The nft script each leaf loads in ecmp="jhash" mode."""
        key = " . ".join(NFT_FIELDS[f] for f in self.hash_fields)
        return (f"table ip crux_ecmp {{\n"
                f"  chain pre {{\n"
                f"    type filter hook prerouting priority mangle; policy accept;\n"
                f"    meta l4proto udp meta mark set jhash {key} mod {self.spines} "
                f"seed {self.hash_seed:#x} offset 1\n"
                f"  }}\n"
                f"}}\n")

    # --- build -----------------------------------------------------------------
    def __enter__(self) -> Fabric:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, node: str, forward: bool) -> None:
        name = self.ns(node)
        _run("ip", "netns", "add", name)
        self.created.append(name)
        cmds = ["link set lo up"]
        _run("ip", "-n", name, "-batch", "-", stdin="\n".join(cmds) + "\n")
        # no ICMP rate limit anywhere: probes are paced by the prober, not the kernel.
        # icmp_ratelimit is the per-destination limit; the ratemask also exempts every
        # type from the global icmp_msgs_per_sec/burst one, which otherwise dropped ~1 %
        # of time-exceeded replies in fast sweeps
        settings = [("net.ipv4.icmp_ratelimit", "0"), ("net.ipv4.icmp_ratemask", "0")]
        if forward:
            settings += [("net.ipv4.ip_forward", "1"),
                         # L4 ECMP over the 5-tuple in the headers, as a switch hashes.
                         # Not policy 1: it reuses a hash the skb already carries, and a
                         # TCP socket's skb carries the socket's random txhash across the
                         # veth, so TCP paths would follow no 5-tuple at all (on the rig
                         # 10 of 16 connections missed the spine their port was probed on)
                         ("net.ipv4.fib_multipath_hash_policy", "3"),
                         ("net.ipv4.fib_multipath_hash_fields", "0x0037"),
                         # time-exceeded from the address the probe arrived on, not
                         # from the reply's way out: a hop then names its link
                         ("net.ipv4.icmp_errors_use_inbound_ifaddr", "1"),
                         # a nexthop whose link is down leaves the ECMP set (set_link)
                         ("net.ipv4.conf.all.ignore_routes_with_linkdown", "1")]
        for key, val in settings:
            _run("ip", "netns", "exec", name, "sysctl", "-qw", f"{key}={val}")

    def _veth(self, a: str, a_if: str, a_ip: str, b: str, b_if: str, b_ip: str) -> None:
        _run("ip", "link", "add", "name", a_if, "netns", self.ns(a), "type", "veth", "peer",
             "name", b_if, "netns", self.ns(b))
        for node, ifname, ip in ((a, a_if, a_ip), (b, b_if, b_ip)):
            _run("ip", "-n", self.ns(node), "-batch", "-",
                 stdin=f"address add {ip}/24 dev {ifname}\nlink set {ifname} up\n")

    def build(self) -> None:
        for h in self.host_names:
            self._add_ns(h, forward=False)
        for leaf in range(self.leaves):
            self._add_ns(f"l{leaf}", forward=True)
        for s in range(self.spines):
            self._add_ns(f"s{s}", forward=True)
        for h in self.host_names:
            k, leaf = int(h[1:]), self.leaf_of(h)
            self._veth(h, "eth0", f"10.2.{k}.2", f"l{leaf}", h, f"10.2.{k}.1")
            _run("ip", "-n", self.ns(h), "route", "add", "default", "via", f"10.2.{k}.1")
        for leaf in range(self.leaves):
            for s in range(self.spines):
                net = f"10.3.{leaf * MAX_SPINES + s}"
                self._veth(f"l{leaf}", f"s{s}", f"{net}.1", f"s{s}", f"l{leaf}", f"{net}.2")
        routes: dict[str, list[str]] = {}
        for h in self.host_names:
            k, home = int(h[1:]), self.leaf_of(h)
            for s in range(self.spines):
                routes.setdefault(f"s{s}", []).append(
                    f"route add 10.2.{k}.0/24 via 10.3.{home * MAX_SPINES + s}.1")
            for leaf in range(self.leaves):
                if leaf == home:
                    continue
                hops = " ".join(f"nexthop via 10.3.{leaf * MAX_SPINES + s}.2"
                                for s in range(self.spines))
                routes.setdefault(f"l{leaf}", []).append(f"route add 10.2.{k}.0/24 {hops}")
                if self.ecmp == "jhash":
                    routes[f"l{leaf}"] += [
                        f"route add 10.2.{k}.0/24 via 10.3.{leaf * MAX_SPINES + s}.2 "
                        f"table {MARK_TABLE + s}" for s in range(self.spines)]
        if self.ecmp == "jhash":
            for leaf in range(self.leaves):
                # a marked packet whose destination is not in its spine's table (a local
                # host) falls through to the main table
                routes.setdefault(f"l{leaf}", []).extend(
                    f"rule add fwmark {s + 1} table {MARK_TABLE + s} pref {1000 + s}"
                    for s in range(self.spines))
                _run("ip", "netns", "exec", self.ns(f"l{leaf}"), "nft", "-f", "-",
                     stdin=self.nft_rules())
        for node, cmds in routes.items():
            _run("ip", "-n", self.ns(node), "-batch", "-", stdin="\n".join(cmds) + "\n")
        for node, ifnames in self._switch_ports().items():
            for ifname in ifnames:
                rate = self.port_mbit(node, ifname)
                if rate is not None:
                    self.priority_queues(node, ifname, rate, list(self.dscp_by_level),
                                         self.queue_packets)

    def port_mbit(self, node: str, ifname: str) -> float | None:
        """The egress rate of a switch port (None: not shaped)."""
        to_host = node.startswith("l") and ifname.startswith("h")
        rate = self.host_mbit if to_host else self.uplink_mbit
        rate = rate if rate is not None else self.link_mbit
        return rate * FRAME_PER_PAYLOAD if rate is not None and self.goodput else rate

    def set_link(self, leaf: int, spine: int, up: bool) -> None:
        """Take the cable between a leaf and a spine down (or back up), both ends, as a
        failed link would, and converge routing the way a fabric's BGP would: every other
        leaf stops (or resumes) sending this leaf's hosts' traffic over that spine, and the
        spine's route back to them returns with the link. Main-table ECMP only."""
        if self.ecmp != "kernel":
            raise RigError("set_link re-routes the kernel's ECMP only (ecmp='kernel')")
        state = "up" if up else "down"
        _run("ip", "-n", self.ns(f"l{leaf}"), "link", "set", self.uplink(leaf, spine), state)
        _run("ip", "-n", self.ns(f"s{spine}"), "link", "set", f"l{leaf}", state)
        (self.down_links.discard if up else self.down_links.add)((leaf, spine))
        hosts = [h for h in self.host_names if self.leaf_of(h) == leaf]
        if up:
            _run("ip", "-n", self.ns(f"s{spine}"), "-batch", "-", stdin="".join(
                f"route replace 10.2.{int(h[1:])}.0/24 via 10.3.{leaf * MAX_SPINES + spine}.1\n"
                for h in hosts))
        for other in range(self.leaves):
            if other == leaf:
                continue
            alive = [s for s in range(self.spines)
                     if (leaf, s) not in self.down_links and (other, s) not in self.down_links]
            if not alive:
                cmds = [f"route del 10.2.{int(h[1:])}.0/24" for h in hosts]
            else:
                hops = " ".join(f"nexthop via 10.3.{other * MAX_SPINES + s}.2" for s in alive)
                cmds = [f"route replace 10.2.{int(h[1:])}.0/24 {hops}" for h in hosts]
            subprocess.run(["ip", "-n", self.ns(f"l{other}"), "-force", "-batch", "-"],
                           input="\n".join(cmds) + "\n", capture_output=True, text=True,
                           timeout=60)

    def _switch_ports(self) -> dict[str, list[str]]:
        """Every switch's egress interfaces: leaves' host and spine ports, spines' leaf ports."""
        ports = {f"l{leaf}": [f"s{s}" for s in range(self.spines)]
                 for leaf in range(self.leaves)}
        for h in self.host_names:
            ports[f"l{self.leaf_of(h)}"].append(h)
        for s in range(self.spines):
            ports[f"s{s}"] = [f"l{leaf}" for leaf in range(self.leaves)]
        return ports

    def close(self) -> None:
        while self.created:
            name = self.created.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=60)

    # --- use -------------------------------------------------------------------
    def exec(self, node: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.ns(node), *cmd],
                              capture_output=True, text=True, timeout=timeout)

    def counters(self, node: str) -> dict[str, dict[str, int]]:
        """Per-interface statistics of a node (`ip -s -j link`)."""
        out = json.loads(_run("ip", "-n", self.ns(node), "-s", "-j", "link", "show"))
        return {link["ifname"]: {"tx_packets": link["stats64"]["tx"]["packets"],
                                 "rx_packets": link["stats64"]["rx"]["packets"]}
                for link in out}

    def spine_tx(self, leaf: int) -> list[int]:
        """Packets the leaf has sent toward each spine."""
        c = self.counters(f"l{leaf}")
        return [c[self.uplink(leaf, s)]["tx_packets"] for s in range(self.spines)]

    def spine_tx_delta(self, src: str, dst: str, sports: list[int], count: int = 1) -> list[int]:
        """Send from `sports` and return how many of those packets `src`'s leaf sent to
        each spine. With nft, a forward-chain counter per uplink matches only this flow's
        5-tuples, so other traffic on the fabric (agents probing, IPv6 chatter) cannot
        blur the result; without nft, the uplinks' interface counters are used."""
        if shutil.which("nft") is None:
            leaf = self.leaf_of(src)
            before = self.spine_tx(leaf)
            self.send_udp(src, dst, sports, count=count)
            return [a - b for a, b in zip(self.spine_tx(leaf), before, strict=True)]
        with self.uplink_counts(src, dst, sports) as read:
            self.send_udp(src, dst, sports, count=count)
            return read()

    @contextmanager
    def uplink_counts(self, src: str, dst: str, sports: list[int] | None, proto: str = "udp",
                      dport: int = 4791, what: str = "packets",
                      ) -> Iterator[Callable[[], list[int]]]:
        """While open, count per uplink of `src`'s leaf the packets (or `what="bytes"`)
        from `src` to `dst` with protocol `proto` ("udp" or "tcp"), a source port in
        `sports` (None: any) and destination port `dport` (nft forward-chain counters:
        only that flow's packets); yields a function returning the counts so far, one
        per spine. Needs nft."""
        if proto not in ("udp", "tcp"):
            raise ValueError("proto must be 'udp' or 'tcp'")
        leaf = self.leaf_of(src)
        ns = self.ns(f"l{leaf}")
        ports = f"{proto} sport {{ {', '.join(map(str, sports))} }} " if sports else ""
        match = (f"ip saddr {self.address(src)} ip daddr {self.address(dst)} "
                 f"meta l4proto {proto} {ports}{proto} dport {dport}")
        rules = "\n".join(f'        oifname "{self.uplink(leaf, s)}" {match} counter'
                           for s in range(self.spines))
        table = f"crux_count_{secrets.token_hex(3)}"  # several may be open at once
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=(
            f"table ip {table} {{\n    chain count {{\n"
            "        type filter hook forward priority 0; policy accept;\n"
            f"{rules}\n    }}\n}}\n"))

        def read() -> list[int]:
            listing = json.loads(_run("ip", "netns", "exec", ns, "nft", "-j", "list",
                                      "table", "ip", table))
            counts = [next(e["counter"][what] for e in item["rule"]["expr"]
                           if "counter" in e)
                      for item in listing["nftables"] if "rule" in item]
            if len(counts) != self.spines:
                raise RigError(f"nft counters on {ns}: {len(counts)} rules, "
                               f"{self.spines} spines")
            return counts
        try:
            yield read
        finally:
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", table)

    def send_udp(self, src: str, dst: str, sports: list[int], dport: int = 4791,
                 count: int = 1, payload: int = 64) -> None:
        """Send `count` UDP datagrams from each source port, from host `src` to `dst`."""
        script = (
            "import socket, sys\n"
            "dst, dport, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "
            "int(sys.argv[4])\n"
            "for sp in map(int, sys.argv[5:]):\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "    s.bind(('', sp))\n"
            "    for _ in range(count):\n"
            "        s.sendto(bytes(size), (dst, dport))\n"
            "    s.close()\n")
        proc = self.exec(src, sys.executable, "-c", script, self.address(dst), str(dport),
                         str(count), str(payload), *map(str, sports))
        if proc.returncode != 0:
            raise RigError(f"send_udp from {src}: {proc.stderr.strip()}")

    def priority_queues(self, node: str, ifname: str, rate_mbit: float,
                        dscp_by_level: list[int], queue_packets: int = 64) -> None:
        """Emulate a switch port: egress limited to `rate_mbit`, one HTB class per level
        (the highest level gets spare bandwidth first, as strict priority does), and
        u32 filters that sort packets into levels by DSCP. As a switch trusting DSCP
        does with the priorities cruxd.scheduler.dscp reserves, CS6 and CS7 (control,
        probing, the routers' own ICMP errors) go above every level (class 1:9), and any
        other unmatched DSCP, best effort, below them all (class 1:8)."""
        ns = self.ns(node)
        levels = len(dscp_by_level)
        if not 1 <= levels <= 6:
            raise ValueError("1..6 levels fit HTB's 8 priorities beside control and "
                             "best effort")
        cmds = [f"qdisc replace dev {ifname} root handle 1: htb default 8",
                f"class add dev {ifname} parent 1: classid 1:1 htb rate {rate_mbit}mbit "
                f"ceil {rate_mbit}mbit"]
        floor = f"rate {max(rate_mbit / 1000, 0.008)}mbit ceil {rate_mbit}mbit"
        # (class, HTB prio: a lower number is served first)
        classes = [(9, 0), *((10 + level, levels - level) for level in range(levels)),
                   (8, levels + 1)]
        for cls, prio in classes:
            cmds.append(f"class add dev {ifname} parent 1:1 classid 1:{cls} htb {floor} "
                        f"prio {prio}")
            # a short queue per class, like a switch buffer (veth's default is 1000)
            cmds.append(f"qdisc add dev {ifname} parent 1:{cls} handle {cls}: "
                        f"pfifo limit {queue_packets}")
        for level, dscp in enumerate(dscp_by_level):  # a level's own DSCP first
            cmds.append(f"filter add dev {ifname} parent 1: protocol ip prio 1 u32 match ip "
                        f"dsfield {dscp << 2:#x} 0xfc flowid 1:{10 + level}")
        cmds.append(f"filter add dev {ifname} parent 1: protocol ip prio 2 u32 match ip "
                    f"dsfield 0xc0 0xc0 flowid 1:9")
        _run("tc", "-n", ns, "-batch", "-", stdin="\n".join(cmds) + "\n")

    def one_class(self) -> None:
        """From now on every level's DSCP goes to the lowest level's class (1:10) on
        every shaped switch port: the fabric stops telling the levels apart, as one
        with a single queue would, while control and probes keep theirs (1:9). What
        the testbed's paths-only mode measures crux's paths on."""
        for node, ifnames in self._switch_ports().items():
            cmds = []
            for ifname in ifnames:
                if self.port_mbit(node, ifname) is None:
                    continue  # not shaped: no classes
                # the levels' filters are priority_queues' prio 1; prio 2 (CS6/CS7) stays
                cmds.append(f"filter del dev {ifname} parent 1: protocol ip prio 1")
                cmds += [f"filter add dev {ifname} parent 1: protocol ip prio 1 u32 match ip "
                         f"dsfield {dscp << 2:#x} 0xfc flowid 1:10"
                         for dscp in self.dscp_by_level]
            if cmds:
                _run("tc", "-n", self.ns(node), "-batch", "-", stdin="\n".join(cmds) + "\n")

    def class_bytes(self, node: str, ifname: str) -> dict[str, int]:
        """Bytes each HTB class of a port (see priority_queues) has sent, by class id."""
        # this iproute2 prints classes as text even with -j
        out = _run("tc", "-n", self.ns(node), "-s", "class", "show", "dev", ifname)
        return {m[1]: int(m[2]) for m in re.finditer(r"class \S+ (\S+) .*\n Sent (\d+) bytes",
                                                     out)}
