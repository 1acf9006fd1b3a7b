"""The Alibaba Lingjun 2023 production topology (CSV: ip, DSW, PSW, ASW).

The data gives only adjacency: each host under one ToR (ASW, unique as the pair
PSW/ASW), each ToR under one pod switch (PSW), pods under a core (DSW). Link speeds
and multiplicity are ours, documented in docs/topologies.md:

* host -> ToR: `nics_per_host` links of `nic_gbps` (default 4 x 200 Gbps);
* ToR -> PSW: `tor_uplinks` parallel links (default 8), together as fast as the
  ToR's host ports / oversubscription;
* PSW -> DSW: `psw_uplinks` parallel links (default 16), together as fast as the
  PSW's ToR uplinks / oversubscription.

Parallel links are how the data's single logical adjacency gets the ECMP fan-out a
real Clos has.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path

from cruxd.errors import TopologyError
from cruxd.model.topology import Topology, TopologyBuilder

COLUMNS = ("ip", "DSW", "PSW", "ASW")


def read_rows(path: str | Path | None = None) -> list[dict[str, str]]:
    """Rows of the CSV at `path`, or of the copy bundled with crux."""
    if path is None:
        text = resources.files("cruxd.data").joinpath("lingjun-2023-topo.csv").read_text()
        where = "bundled lingjun-2023-topo.csv"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TopologyError(f"{path}: cannot read: {exc.strerror}") from exc
        where = str(path)
    reader = csv.DictReader(text.splitlines())
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise TopologyError(f"{where}: expected columns {','.join(COLUMNS)}, "
                            f"got {','.join(reader.fieldnames or [])}")
    rows = []
    for n, row in enumerate(reader, start=2):
        if any(not (row.get(c) or "").strip() for c in COLUMNS):
            raise TopologyError(f"{where}: line {n}: empty field")
        rows.append({c: row[c].strip() for c in COLUMNS})
    if not rows:
        raise TopologyError(f"{where}: no hosts")
    return rows


def lingjun(rows: Iterable[Mapping[str, str]] | None = None, *, gpus_per_host: int = 8,
            nics_per_host: int = 4, nic_gbps: float = 200.0, tor_uplinks: int = 8,
            psw_uplinks: int = 16, oversubscription: float = 1.0) -> Topology:
    rows = list(rows) if rows is not None else read_rows()
    for name, v in (("nics_per_host", nics_per_host), ("nic_gbps", nic_gbps),
                    ("tor_uplinks", tor_uplinks), ("psw_uplinks", psw_uplinks),
                    ("oversubscription", oversubscription), ("gpus_per_host", gpus_per_host)):
        if not v > 0:
            raise TopologyError(f"{name} must be > 0, got {v!r}")
    hosts_by_tor: dict[tuple[str, str], list[str]] = {}
    psw_core: dict[str, str] = {}
    seen: set[str] = set()
    for row in rows:
        if row["ip"] in seen:
            raise TopologyError(f"host {row['ip'][:16]} listed twice")
        seen.add(row["ip"])
        if psw_core.setdefault(row["PSW"], row["DSW"]) != row["DSW"]:
            raise TopologyError(f"PSW {row['PSW']} under two DSWs")
        hosts_by_tor.setdefault((row["PSW"], row["ASW"]), []).append(row["ip"])
    short = _short_ids(seen)

    b = TopologyBuilder("lingjun-2023")
    for dsw in sorted(set(psw_core.values())):
        b.switch(dsw, tier=3)
    psw_up_gbps: dict[str, float] = {}
    for psw in sorted(psw_core):
        b.switch(psw, tier=2)
    for (psw, asw), hosts in sorted(hosts_by_tor.items()):
        tor = b.switch(f"{psw}/{asw}", tier=1)
        up = len(hosts) * nics_per_host * nic_gbps / oversubscription
        b.link(tor, psw, up / tor_uplinks, count=tor_uplinks)
        psw_up_gbps[psw] = psw_up_gbps.get(psw, 0.0) + up
        for ip in sorted(hosts):
            b.host(short[ip], gpus_per_host)
            b.link(short[ip], tor, nic_gbps, count=nics_per_host)
    for psw, total in sorted(psw_up_gbps.items()):
        b.link(psw, psw_core[psw], total / oversubscription / psw_uplinks, count=psw_uplinks)
    return b.build()


def _short_ids(ips: set[str]) -> dict[str, str]:
    """Hashed host ids shortened to the fewest hex digits (>= 8) that stay unique."""
    for width in range(8, 65):
        short = {ip: "h" + ip[:width] for ip in ips}
        if len(set(short.values())) == len(ips):
            return short
    return {ip: "h" + ip for ip in ips}
