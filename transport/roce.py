"""RoCEv2 on the wire: its UDP ports, and DSCP in the IP TOS byte / GRH traffic class.

The one home of these numbers for transport (steering a QP or socket), probing (probes
must carry the data's 5-tuple so switches hash them alike) and cruxd (planning, the
simulator's ECMP hash, configuration defaults). Pure: no I/O.
"""

from __future__ import annotations

ROCE_DPORT = 4791  # IANA's RoCEv2 UDP destination port
# The source ports a GRH flow label can reach (the kernel's rdma_flow_label_to_udp_sport
# sets the top two bits), so the ones worth probing and deciding.
ROCE_SPORT_MIN = 0xC000
ROCE_SPORT_MAX = 0xFFFF
ROCE_SPORTS = range(ROCE_SPORT_MIN, ROCE_SPORT_MAX + 1)
ROCE_SPORT_TEXT = f"{ROCE_SPORT_MIN}-{ROCE_SPORT_MAX}"  # as configuration and help spell it


def tos(dscp: int) -> int:
    """The IP TOS byte (IPv6 traffic class, RoCE GRH traffic class) carrying `dscp`: DSCP is
    its upper six bits; the two ECN bits are left 0 for the NIC or kernel to set."""
    return dscp << 2
