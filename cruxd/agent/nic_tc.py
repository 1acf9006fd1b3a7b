"""NICs that override the traffic class a QP asks for, and which class wins on a QP.

mlx5 (MLNX_OFED and recent upstream) has a per-port global override,
/sys/class/infiniband/<dev>/tc/<port>/traffic_class: once written (`tclass=106`), every RoCE
QP on that port sends that class whatever its address vector says, so a decided DSCP never
reaches the wire. The agent reports such ports instead of claiming the decision applied.
Reading shows "Global tclass=<n>" when set, and nothing (or a negative value) when not; the
parser takes the last integer on the line and treats a negative one as unset. That format is
from the driver's documentation and has not been seen on a real NIC here.

Which class wins on a QP, in order: the NIC's override; else the decided class, where the
shim applied a decision; else what the program asked for (NCCL_IB_TC, or the
ncclConfig_t trafficClass of NCCL >= 2.26).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

LOG = logging.getLogger(__name__)

MAX_READ = 256  # a sysfs attribute is a line; never read more than that
_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class TcOverride:
    port: str  # "<dev>/<port>", as the agent's NIC names read
    traffic_class: int


def parse_traffic_class(text: str) -> int | None:
    """The override in a traffic_class attribute's text; None when unset or unreadable."""
    found = _INT.findall(text)
    if not found:
        return None
    value = int(found[-1])
    return value if 0 <= value <= 255 else None


def tc_overrides(sys_root: Path = Path("/sys")) -> list[TcOverride]:
    """Every RDMA port whose driver overrides the traffic class, sorted by port."""
    base = sys_root / "class" / "infiniband"
    out: list[TcOverride] = []
    for attr in sorted(base.glob("*/tc/*/traffic_class")) if base.is_dir() else ():
        try:
            with open(attr, "rb") as f:
                raw = f.read(MAX_READ)
        except OSError as exc:  # mlx5 refuses reads on some ports (no RoCE): nothing to say
            LOG.debug("%s: %s", attr, exc)
            continue
        tc = parse_traffic_class(raw.decode("ascii", "replace"))
        if tc is not None:
            out.append(TcOverride(f"{attr.parents[2].name}/{attr.parent.name}", tc))
    return out


def winning_class(override: int | None, applied: bool, decided: int, asked: int) -> tuple[int,
                                                                                        str]:
    """(the class a QP's packets carry, which setting it comes from)."""
    if override is not None:
        return override, "nic-override"
    if applied:
        return decided, "crux"
    return asked, "program"
