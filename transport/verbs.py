"""The RoCEv2 verbs backend (pyverbs, from rdma-core): RC QPs with a decided path and priority.

A RoCEv2 NIC derives a QP's UDP source port from the GRH flow label,
sport = 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)), and puts the GRH traffic class in
the IP TOS byte. So the decided source port (which picks the ECMP path) becomes the flow label
`sport & 0x3FFF`, and the decided level's traffic class goes in as it is. Used by tests and
probing; training jobs get the same through the C shim (shim/crux_ibverbs.c), which NCCL loads.

pyverbs ships with rdma-core (Debian: python3-pyverbs).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport.roce import ROCE_SPORT_MAX, ROCE_SPORT_MIN, ROCE_SPORT_TEXT
from transport.steering import Steering
from transport.table_format import gid_text, peer_bytes

FLOW_LABEL_MASK = 0x3FFF
SYSFS = Path("/sys/class/infiniband")


def flow_label_for(sport: int) -> int:
    """The flow label that makes a RoCEv2 NIC send from `sport` (0xC000-0xFFFF). Label 0 means
    "none" (the NIC derives a port from the QP numbers), so 0xC000 takes 0x4001: its two halves
    cancel in the XOR."""
    if not ROCE_SPORT_MIN <= sport <= ROCE_SPORT_MAX:
        raise ValueError(f"RoCEv2 source ports are {ROCE_SPORT_TEXT}, got {sport}")
    return (sport & FLOW_LABEL_MASK) or 0x4001


def sport_of(flow_label: int) -> int:
    """The UDP source port a RoCEv2 NIC derives from a non-zero flow label."""
    fl = flow_label & 0xFFFFF
    if fl == 0:
        raise ValueError("flow label 0: the NIC derives the port from the QP numbers")
    return ROCE_SPORT_MIN | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))


def roce_v2_gid(device: str, port: int = 1, sysfs: Path = SYSFS) -> tuple[int, str]:
    """(index, address) of the port's first RoCEv2 GID that is an IPv4 address, else the
    first RoCEv2 GID; LookupError when the port has none."""
    base = sysfs / device / "ports" / str(port)
    found: list[tuple[int, str]] = []
    for typ in sorted((base / "gid_attrs" / "types").iterdir(), key=lambda p: int(p.name)):
        try:
            kind = typ.read_text().strip()
            raw = (base / "gids" / typ.name).read_text().strip()
        except OSError:
            continue  # unpopulated entries cannot be read
        addr = ipaddress.IPv6Address(raw)
        if kind != "RoCE v2" or addr == ipaddress.IPv6Address(0):
            continue
        found.append((int(typ.name), gid_text(addr)))
    if not found:
        raise LookupError(f"{device} port {port} has no RoCEv2 GID")
    return next((f for f in found if "." in f[1]), found[0])


@dataclass(frozen=True)
class Endpoint:
    """What a peer needs to connect to a QP (exchanged out of band)."""
    gid: str  # IPv4 or IPv6 text
    qpn: int
    addr: int  # buffer address and key for RDMA WRITE
    rkey: int


@dataclass(frozen=True)
class AddressVector:
    """A connected QP's GRH fields, read back from the device with ibv_query_qp."""
    flow_label: int
    traffic_class: int
    dgid: str


class RcQp:
    """One RC QP with its own PD, CQ and a registered buffer, on one device port."""

    def __init__(self, device: str, *, port: int = 1, gid_index: int | None = None,
                 size: int = 4096) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_QPT_RC
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPCap, QPInitAttr

        if gid_index is None:
            gid_index, _ = roce_v2_gid(device, port)
        self.device, self.port, self.gid_index, self.size = device, port, gid_index, size
        self.ctx = Context(name=device)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 256)
        self.mr = MR(self.pd, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
        cap = QPCap(max_send_wr=128, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.gid = self.ctx.query_gid(port, gid_index)
        self.mtu = self.ctx.query_port(port).active_mtu

    def endpoint(self) -> Endpoint:
        return Endpoint(gid_text(str(self.gid)), self.qp.qp_num, self.mr.buf, self.mr.rkey)

    def connect(self, peer: Endpoint, steering: Steering | None = None) -> None:
        """RESET -> RTS toward `peer`, leaving from the steering's source port with its
        traffic class. No steering (or sport 0) keeps the NIC's own port: flow label 0."""
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.enums import IBV_ACCESS_REMOTE_WRITE
        from pyverbs.qp import QPAttr

        s = steering or Steering()
        fl = flow_label_for(s.sport) if s.sport else 0
        dgid = ipaddress.IPv6Address(peer_bytes(peer.gid)).exploded  # pyverbs: full form only
        gr = GlobalRoute(dgid=GID(dgid), flow_label=fl, sgid_index=self.gid_index,
                         hop_limit=64, traffic_class=s.tclass)
        attr = QPAttr()
        attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE
        attr.port_num = self.port
        attr.path_mtu = self.mtu
        attr.dest_qp_num = peer.qpn
        attr.rq_psn = attr.sq_psn = 0
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=self.port)
        self.qp.to_rts(attr)  # RESET -> INIT -> RTR -> RTS, each with its own attribute mask

    def address_vector(self) -> AddressVector:
        from pyverbs.enums import IBV_QP_AV

        attr, _ = self.qp.query(IBV_QP_AV)
        ah = attr.ah_attr
        return AddressVector(ah.flow_label, ah.traffic_class, str(ah.dgid))

    def write(self, peer: Endpoint, count: int = 1, timeout_s: float = 30.0) -> None:
        """`count` signalled RDMA WRITEs of the whole buffer into the peer's; raises
        RuntimeError on a failed completion or when they do not all complete in time."""
        import time

        from pyverbs.enums import IBV_SEND_SIGNALED, IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE
        from pyverbs.wr import SGE, SendWR

        for i in range(count):
            wr = SendWR(wr_id=i, opcode=IBV_WR_RDMA_WRITE, num_sge=1,
                        sg=[SGE(self.mr.buf, self.size, self.mr.lkey)],
                        send_flags=IBV_SEND_SIGNALED)
            wr.set_wr_rdma(peer.rkey, peer.addr)
            self.qp.post_send(wr)
        done, deadline = 0, time.monotonic() + timeout_s
        while done < count:
            n, wcs = self.cq.poll(num_entries=count - done)
            for wc in wcs[:n]:
                if wc.status != IBV_WC_SUCCESS:
                    raise RuntimeError(f"{self.device} qpn {self.qp.qp_num}: write failed, "
                                       f"status {wc.status}")
            done += n
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.device}: {done} of {count} writes completed")

    def close(self) -> None:
        for res in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            res.close()

    def __enter__(self) -> RcQp:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
