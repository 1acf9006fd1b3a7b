"""The agent's NIC ports as links for its reports: transmit utilisation and congestion.

Utilisation is the mean transmit rate of a port's sampled byte counter over the report
interval, over the port's speed from sysfs: `class/net/<if>/speed` (Mbit/s; -1 or unreadable
while the link is down) or `class/infiniband/<dev>/ports/<p>/rate` ("100 Gb/sec (4X EDR)").
A port of unknown speed reports utilisation 0 rather than a guess.

Congestion events come from an RDMA port's `hw_counters`, read once per report: RoCEv2
packets received ECN-marked (`np_ecn_marked_roce_packets`: congestion on the way in) plus
CNPs handled as a sender (`rp_cnp_handled`: congestion on the way out), the mlx5 names; a
device without them reports 0. Netdevs have no such counters in sysfs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cruxd.control.records import LinkObservation
from cruxd.measure.sampling.nic import Counter, CounterReader

CONGESTION_COUNTERS = ("np_ecn_marked_roce_packets", "rp_cnp_handled")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def _port_dir(root: Path, name: str) -> tuple[str, Path] | None:
    """("net" | "rdma", the port's sysfs directory) for a counter name, else None."""
    kind, _, rest = name.partition(":")
    if kind == "net" and rest and "/" not in rest:
        return kind, root / "class" / "net" / rest
    dev, _, port = rest.partition("/")
    if kind == "rdma" and dev and port.isdigit():
        return kind, root / "class" / "infiniband" / dev / "ports" / port
    return None


def port_speed_bps(root: Path, name: str) -> float | None:
    """The port's line rate in bit/s, or None when sysfs does not say (down, virtual)."""
    where = _port_dir(root, name)
    if where is None:
        return None
    kind, d = where
    try:
        text = (d / ("speed" if kind == "net" else "rate")).read_text()
    except OSError:
        return None
    if kind == "net":
        try:
            mbit = int(text.strip())
        except ValueError:
            return None
        return mbit * 1e6 if mbit > 0 else None
    m = _RATE.match(text)
    return float(m[1]) * 1e9 if m and float(m[1]) > 0 else None


def congestion_counters(root: Path, name: str) -> list[Counter]:
    """The port's hw_counters that count congestion (empty for netdevs)."""
    where = _port_dir(root, name)
    if where is None or where[0] != "rdma":
        return []
    hw = where[1] / "hw_counters"
    return [Counter(f"{name}#{c}", hw / c) for c in CONGESTION_COUNTERS if (hw / c).exists()]


def utilization(rates_bps: npt.NDArray[np.float64], speed_bps: float | None) -> float:
    """Mean of byte rates (NaN intervals left out) as a fraction of the line rate, 0..1."""
    finite = rates_bps[np.isfinite(rates_bps)]
    if speed_bps is None or finite.size == 0:
        return 0.0
    return float(min(1.0, max(0.0, finite.mean() * 8 / speed_bps)))


@dataclass
class PortLinks:
    """Per-port state between reports: the last congestion totals (a reading that goes
    backwards, a reset, counts as 0 events). Runs on the agent's event loop, once per report."""

    root: Path
    names: Sequence[str]
    counters: dict[str, list[Counter]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    reader: CounterReader = field(default_factory=CounterReader)

    def __post_init__(self) -> None:
        for n in self.names:
            self.counters[n] = congestion_counters(self.root, n)

    def congestion(self, name: str) -> int:
        total = 0
        for c in self.counters.get(name, []):
            v = self.reader.read_or_none(c)
            if v is None:
                self.last.pop(c.name, None)
                continue
            prev = self.last.get(c.name)
            self.last[c.name] = v
            if prev is not None and v >= prev:
                total += v - prev
        return total

    def observe(self, name: str, rates_bps: npt.NDArray[np.float64]) -> LinkObservation:
        # the speed is re-read each time: a link renegotiates, or comes up after the agent
        util = utilization(rates_bps, port_speed_bps(self.root, name))
        return LinkObservation(name, util, self.congestion(name))

    def close(self) -> None:
        self.reader.close()
