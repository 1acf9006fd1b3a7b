"""Arnold's placement MIP (seed §5.2, Eq. 4-10) over a crux.arnold document.

The reference consumer of the export: it reads only the document, so it shows the
export is enough to answer "where should this job go". Groups of the scheduling
unit (PP groups by default, as in the seed) are spread over minipods:

  MIN  alpha * sum_j y_j + beta * T                                   (4)
  s.t. sum_j s_ij <= T                 every group i                  (5)
       sum_i n_ij <= C_j * y_j         every minipod j                (6)
       sum_j n_ij  = u                 every group i                  (7)
       n_ij <= u * s_ij                                               (8)
       y_j, s_ij in {0, 1}, n_ij in {0..u}                            (9, 10)

with u the unit's size in nodes and C_j the minipod's free nodes (the document's
`c`). This is the seed's model scaled by u: p_ij = n_ij / u, c_j = C_j / u. We make
n_ij integer where the seed lets p_ij be any fraction, so the answer is a node
count. alpha weights the minipods used (the spread of the other group kind, DP
for a PP unit), beta the unit's worst spread T, as in the seed's text; its Eq. 2
pairs them the other way round, Eq. 4 and the text agree with us. A tie-break
of TIE_BREAK per unit of T and of hp_load per minipod picks, among equal
placements, the least spread and the least loaded minipods.

Ranks (seed: "continuous rank indices to nodes belonging to the same minipod"):
every group takes its minipods in one shared order and fills them with contiguous
members, groups with the same split sit next to each other, and each minipod's
nodes get its free hosts in name order, lowest rank first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from cruxd.errors import UsageError
from cruxd.hints.arnold import FORMAT, VERSION, CommMatrix, comm_matrix
from cruxd.hints.fabric_view import natural

TIE_BREAK = 1e-3
UNITS = ("pp", "dp")


class ArnoldFitError(UsageError):
    """The job cannot be placed on the document's free nodes."""


@dataclass(frozen=True, slots=True)
class Placement:
    matrix: CommMatrix
    unit: str  # "pp" or "dp": the scheduling unit
    hosts: tuple[str, ...]  # host per node rank (see CommMatrix.node)
    minipod: tuple[str, ...]  # minipod per node rank
    minipods_used: tuple[str, ...]
    max_unit_spread: int  # T: most minipods one unit group touches
    max_pp_spread: int
    max_dp_spread: int
    optimal: bool  # HiGHS proved optimality within the time limit

    def to_dict(self) -> dict[str, Any]:
        m = self.matrix
        return {"dp": m.dp, "tp": m.tp, "pp": m.pp, "unit": self.unit,
                "nodes": [{"rank": r, "host": h, "minipod": p, "stage": r // m.rows}
                          for r, (h, p) in enumerate(zip(self.hosts, self.minipod, strict=True))],
                "minipods_used": list(self.minipods_used),
                "max_pp_spread": self.max_pp_spread, "max_dp_spread": self.max_dp_spread,
                "optimal": self.optimal}


def _free_hosts(doc: dict[str, Any], gpus_per_node: int) -> dict[str, list[str]]:
    """minipod -> its free hosts that hold a whole job node, natural order, capped at `c`."""
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise UsageError(f"not a {FORMAT} v{VERSION} document: "
                         f"{doc.get('format')!r} v{doc.get('version')!r}")
    out: dict[str, list[str]] = {mp["id"]: [] for mp in doc["minipods"]}
    for host in sorted(doc["nodes"], key=natural):
        node = doc["nodes"][host]
        if node["free"] and node["gpus_free"] >= gpus_per_node and node["minipod"] in out:
            out[node["minipod"]].append(host)
    return {mp["id"]: out[mp["id"]][:int(mp["c"])] for mp in doc["minipods"]}


def _solve(caps: list[int], load: list[float], groups: int, u: int, alpha: float,
           beta: float, time_limit_s: float) -> tuple[np.ndarray, bool]:
    """n[i, j]: nodes of group i in minipod j, from Eq. 4-10."""
    k = len(caps)
    gk = groups * k
    nv = 2 * gk + k + 1  # n_ij, s_ij, y_j, T
    ni = np.arange(gk).reshape(groups, k)
    si = gk + ni
    yi = 2 * gk + np.arange(k)
    ti = nv - 1
    c = np.zeros(nv)
    c[yi] = alpha + TIE_BREAK * (1.0 + np.asarray(load))
    c[ti] = beta + TIE_BREAK
    rows: list[tuple[dict[int, float], float, float]] = []
    for i in range(groups):
        rows.append(({**{int(v): 1.0 for v in si[i]}, ti: -1.0}, -np.inf, 0.0))  # (5)
        rows.append(({int(v): 1.0 for v in ni[i]}, u, u))  # (7)
        rows.extend(({int(ni[i, j]): 1.0, int(si[i, j]): -u}, -np.inf, 0.0)  # (8)
                    for j in range(k))
    for j in range(k):
        rows.append(({**{int(v): 1.0 for v in ni[:, j]}, int(yi[j]): -caps[j]},
                     -np.inf, 0.0))  # (6)
    # symmetry breaking, which HiGHS needs on uniform fabrics (seconds -> ms): groups
    # are interchangeable, so order them by their share of minipod 0; equal minipods
    # (same capacity and load) are interchangeable, so use them in list order
    rows.extend(({int(ni[i, 0]): 1.0, int(ni[i + 1, 0]): -1.0}, 0.0, np.inf)
                for i in range(groups - 1))
    last: dict[tuple[int, float], int] = {}
    for j in range(k):
        key = (caps[j], load[j])
        if key in last:
            rows.append(({int(yi[last[key]]): 1.0, int(yi[j]): -1.0}, 0.0, np.inf))
        last[key] = j
    a = np.zeros((len(rows), nv))
    for r, (coefs, _, _) in enumerate(rows):
        for col, val in coefs.items():
            a[r, col] = val
    upper = np.concatenate([np.full(gk, u), np.ones(gk + k), [k]])
    integrality = np.concatenate([np.ones(2 * gk + k), [0]])
    res = milp(c=c, integrality=integrality, bounds=Bounds(np.zeros(nv), upper),
               constraints=LinearConstraint(a, [lo for _, lo, _ in rows],
                                            [hi for _, _, hi in rows]),
               options={"time_limit": time_limit_s})
    if res.x is None:
        raise ArnoldFitError(f"HiGHS found no placement: {res.message}")
    return np.rint(res.x[:gk]).reshape(groups, k).astype(int), bool(res.status == 0)


def place(doc: dict[str, Any], dp: int, tp: int, pp: int, *, alpha: float = 0.0,
          beta: float = 1.0, unit: str = "pp", gpus_per_node: int = 8,
          time_limit_s: float = 30.0) -> Placement:
    """Where the job (dp, tp, pp) should go on the document's free nodes."""
    if unit not in UNITS:
        raise UsageError(f"unit must be one of {UNITS}, got {unit!r}")
    if alpha < 0 or beta < 0 or alpha + beta <= 0:
        raise UsageError(f"alpha and beta must be >= 0 and not both 0, got {alpha}, {beta}")
    m = comm_matrix(dp, tp, pp, gpus_per_node)
    free = _free_hosts(doc, gpus_per_node)
    ids = [mid for mid in free if free[mid]]
    have = sum(len(free[mid]) for mid in ids)
    if have < m.nodes:
        raise ArnoldFitError(f"job dp={dp} tp={tp} pp={pp} needs {m.nodes} free "
                             f"{gpus_per_node}-GPU nodes, the fabric has {have}")
    groups = m.pp_groups if unit == "pp" else m.dp_groups
    u = len(groups[0])
    load = {mp["id"]: float(mp["hp_load"]) for mp in doc["minipods"]}
    counts, optimal = _solve([len(free[mid]) for mid in ids], [load[mid] for mid in ids],
                             len(groups), u, alpha, beta, time_limit_s)
    # groups are interchangeable: sort by split so equal splits get adjacent groups
    splits = sorted((tuple(int(x) for x in row) for row in counts), reverse=True)
    where: list[str] = [""] * m.nodes
    for members, split in zip(groups, splits, strict=True):
        pos = 0
        for j, n in enumerate(split):
            for node in members[pos:pos + n]:
                where[node] = ids[j]
            pos += n
    hosts: list[str] = [""] * m.nodes
    for mid in ids:
        mine = [r for r in range(m.nodes) if where[r] == mid]
        for r, host in zip(mine, free[mid], strict=False):
            hosts[r] = host

    def spread(gs: tuple[tuple[int, ...], ...]) -> int:
        return max(len({where[r] for r in g}) for g in gs)

    return Placement(m, unit, tuple(hosts), tuple(where),
                     tuple(mid for mid in ids if mid in set(where)),
                     spread(groups), spread(m.pp_groups), spread(m.dp_groups), optimal)


def weighted_spread(p: Placement, alpha: float, beta: float) -> float:
    """The seed's evaluation metric (Eq. 2-3): alpha * worst DP-group distance +
    beta * worst PP-group distance, D = minipods touched when more than one, else 0."""
    def d(span: int) -> int:
        return span if span > 1 else 0
    return alpha * d(p.max_dp_spread) + beta * d(p.max_pp_spread)
