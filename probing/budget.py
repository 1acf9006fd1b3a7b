"""How many probes a source-port sweep needs (the coupon collector).

ECMP hashes each source port onto one of N paths, about uniformly, so finding all
N is the coupon-collector problem: N * H_N probes on average. When N is unknown
the sweep stops once it has gone `quiet_probes(k, miss)` probes without a new
path after finding k: were there a (k+1)-th path (hit with probability >= 1/(k+1)
per probe), it would have shown up by then with probability >= 1 - miss.
"""

from __future__ import annotations

import math


def harmonic(n: int) -> float:
    return sum(1.0 / i for i in range(1, n + 1))


def expected_probes(n: int) -> float:
    """Mean probes to see all of n equally likely paths: n * H_n."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return n * harmonic(n)


def quiet_probes(found: int, miss: float = 1e-3) -> int:
    """Probes without a new path after which a (found+1)-th path is ruled out at `miss`."""
    if not 0 < miss < 1:
        raise ValueError("miss must be in (0, 1)")
    p_new = 1.0 / (found + 1)
    if p_new >= 1.0:
        return 1
    return math.ceil(math.log(miss) / math.log(1.0 - p_new))


def probes_for_all(n: int, miss: float = 1e-3) -> int:
    """Probes after which all n paths were seen with probability >= 1 - miss
    (union bound: n (1 - 1/n)^m <= miss)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if n == 1:
        return 1
    return math.ceil(math.log(miss / n) / math.log(1.0 - 1.0 / n))
