"""Arnold export: minipods, free nodes and load, plus the job's communication matrix (pure).

Arnold (seed §2, §5) schedules a large pre-training job over *minipods*: the nodes
under one spine (s1) layer. Our pods are exactly that (see view.py), so the export
is per pod. What Arnold's MIP needs from the fabric is c_j, the capacity of each
minipod in free nodes; the job side (Eq. 1, Appendix C) is computed here too so a
consumer needs nothing but this module and the document.

Definitions (docs/hints/arnold.md):
  free node:   every GPU free (Arnold places whole 8-GPU nodes);
  c:           free nodes of the minipod, i.e. c_j for a one-node scheduling unit;
               a unit of u nodes uses c_j = c / u (Eq. 6 counts units, not nodes);
  hp_load:     planned demand at the top half of the priority levels
               (level >= levels // 2; with one level, level 0) summed over every
               directed link with an end on the minipod's leaves or aggregation
               switches, divided by those links' nominal capacity. Those are the
               flows a new job's traffic would contend with or be shaped under.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cruxd.hints.fabric_view import FabricView, natural

FORMAT = "crux.arnold"
VERSION = 1
BYTES_BF16 = 2


def hp_min_level(levels: int) -> int:
    """The lowest level counted as high priority: the top half of `levels`."""
    return max(0, levels) // 2


def _minipod_load(view: FabricView, pod: str, leaves: tuple[str, ...]) -> tuple[float, float]:
    """(high-priority planned Gbps, nominal Gbps) over the links touching the minipod."""
    switches = set(leaves) | set(view.pod_aggs.get(pod, ()))
    lo = hp_min_level(view.levels)
    load = nominal = 0.0
    for lk in view.links:
        if lk.src in switches or lk.dst in switches:
            nominal += lk.nominal_gbps
            load += sum(lk.load_gbps[lo:])
    return load, nominal


def export(view: FabricView) -> dict[str, Any]:
    """The versioned Arnold document (schema: docs/hints/arnold.schema.json)."""
    pods = view.pods()
    minipods = []
    for pod, leaves in pods.items():
        hosts = [h for h in sorted(view.hosts, key=natural) if view.hosts[h].pod == pod]
        free = [h for h in hosts if view.hosts[h].gpus > 0 and view.hosts[h].gpus_used == 0]
        load, nominal = _minipod_load(view, pod, leaves)
        minipods.append({
            "id": pod,
            "leaves": list(leaves),
            "aggs": list(view.pod_aggs.get(pod, ())),
            "nodes": len(hosts),
            "nodes_free": len(free),
            "gpus": sum(view.hosts[h].gpus for h in hosts),
            "gpus_free": sum(view.hosts[h].gpus_free for h in hosts),
            "c": len(free),
            "hp_load_gbps": round(load, 3),
            "hp_load": round(load / nominal, 6) if nominal > 0 else 0.0,
        })
    nodes = {h: {"minipod": hh.pod, "gpus": hh.gpus, "gpus_free": hh.gpus_free,
                 "free": hh.gpus > 0 and hh.gpus_used == 0}
             for h, hh in sorted(view.hosts.items(), key=lambda kv: natural(kv[0]))
             if hh.pod}
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": view.name,
        "generated_unix_ms": view.generated_unix_ms,
        "levels": view.levels,
        "hp_min_level": hp_min_level(view.levels),
        "minipods": minipods,
        "nodes": nodes,
    }


@dataclass(frozen=True, slots=True)
class CommMatrix:
    """Arnold's communication matrix (Eq. 1): a row is a PP group, a column a DP group.

    Node v_ij (row i, stage j) gets node index j * rows + i: Megatron orders ranks
    TP fastest, then DP, then PP, so a node holds 8/TP consecutive DP ranks of one
    stage and the nodes of one stage are consecutive.
    """

    dp: int
    tp: int
    pp: int
    gpus_per_node: int
    rows: int  # DP / (gpus_per_node / TP): nodes per stage
    cols: int  # PP

    @property
    def nodes(self) -> int:
        return self.rows * self.cols

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def node(self, row: int, col: int) -> int:
        return col * self.rows + row

    @property
    def pp_groups(self) -> tuple[tuple[int, ...], ...]:
        """Rows: one node per stage, stage order."""
        return tuple(tuple(self.node(i, j) for j in range(self.cols)) for i in range(self.rows))

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]:
        """Columns: the nodes of one stage."""
        return tuple(tuple(self.node(i, j) for i in range(self.rows)) for j in range(self.cols))


def comm_matrix(dp: int, tp: int, pp: int, gpus_per_node: int = 8) -> CommMatrix:
    """Eq. 1. TP must fit inside a node and the DP ranks must fill whole nodes,
    as in every configuration of the seed; anything else is rejected."""
    if min(dp, tp, pp, gpus_per_node) < 1:
        raise ValueError(f"dp, tp, pp, gpus_per_node must be >= 1, got {dp}, {tp}, {pp}, "
                         f"{gpus_per_node}")
    if gpus_per_node % tp:
        raise ValueError(f"TP={tp} must divide the {gpus_per_node} GPUs of a node")
    per_node = gpus_per_node // tp  # DP ranks of one stage on a node
    if dp % per_node:
        raise ValueError(f"DP={dp} must be a multiple of {per_node} (= {gpus_per_node}/TP) "
                         "so each node holds one stage")
    return CommMatrix(dp, tp, pp, gpus_per_node, dp // per_node, pp)


def microbatches(gb: int, mb: int, dp: int) -> float:
    """Eq. 11: m = gb / (mb * dp)."""
    return gb / (mb * dp)


@dataclass(frozen=True, slots=True)
class Volumes:
    """Appendix C, in elements (parameters or activations) and bytes."""

    dp_elems: float  # Eq. 12: parameters of one PP stage, exchanged per step by a DP group
    pp_elems: float  # Eq. 13: activations one stage sends its neighbour per microbatch
    bytes_per_elem: int

    @property
    def dp_bytes(self) -> float:
        return self.dp_elems * self.bytes_per_elem

    @property
    def pp_bytes(self) -> float:
        return self.pp_elems * self.bytes_per_elem


def volumes(h: int, s: int, vocab: int, layers: int, pp: int, mb: int = 1,
            bytes_per_elem: int = BYTES_BF16) -> Volumes:
    """Appendix C for a GPT-style dense model: hidden size h, sequence length s,
    vocabulary V, l layers, PP size pp, micro-batch size mb.

    Eq. 12: DP = h (V + s) + l/pp (4h^2 + 2h + 8h^2 + 7h), the embedding plus a
            stage's share of the layers (attention 4h^2 + 2h, dense 8h^2 + 7h);
    Eq. 13: PP = 2 mb s h (activation forward, its gradient back).
    The seed counts elements; bytes_per_elem (bf16 by default) turns them into bytes.
    """
    if min(h, s, vocab, layers, pp, mb, bytes_per_elem) < 1:
        raise ValueError("model dimensions must be >= 1")
    dp_elems = h * (vocab + s) + layers / pp * (4 * h * h + 2 * h + 8 * h * h + 7 * h)
    return Volumes(float(dp_elems), float(2 * mb * s * h), bytes_per_elem)
