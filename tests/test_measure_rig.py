"""t_j from real kernel counters: a synthetic job on the namespace fabric alternates quiet
compute and UDP bursts of known length and period; the agent's NIC sampler reads its host's
netdev counters (in the host's namespace, as the agent would) and the estimator must recover
the period within 2 % and the burst time per iteration (t_j) within 10 %."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cruxd.measure.comm import estimate_comm
from tests.rig.fabric import Fabric, can_build

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

REPO = Path(__file__).resolve().parent.parent
SAMPLER = """
import json, sys
from pathlib import Path
from cruxd.measure.sampling.nic import Sampler, net_counters
s = Sampler(net_counters(Path("/sys"), ["eth0"]), rate_hz=float(sys.argv[1]))
out = s.run(float(sys.argv[2]))["net:eth0"]
print(json.dumps({"rates": out.rates, "failed": s.failed_reads}))
"""


@pytest.mark.parametrize(("period_s", "burst_s"), [(0.5, 0.15), (1.2, 0.5)])
def test_period_and_comm_time_from_kernel_counters(period_s: float, burst_s: float) -> None:
    rate_hz, window_s = 200.0, max(8.0, 8 * period_s)
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        job = subprocess.Popen(["ip", "netns", "exec", f.ns("h0"), sys.executable, "-m",
                                "tests.rig.bursts", f.address("h1"), str(period_s),
                                str(burst_s), "40", str(int(window_s / period_s) + 3)],
                               cwd=REPO)
        try:
            r = f.exec("h0", sys.executable, "-c", SAMPLER, str(rate_hz), str(window_s),
                       timeout=window_s + 30)
        finally:
            job.kill()
            job.wait()
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    est = estimate_comm(doc["rates"], rate_hz)
    assert est is not None, "no period found in the kernel counters"
    print(f"period {est.period_s:.4f} s (true {period_s}), t_j {est.comm_s:.4f} s "
          f"(true {burst_s}), {est.iterations:.1f} iterations, confidence "
          f"{est.confidence:.2f}, failed reads {doc['failed']}")
    assert abs(est.period_s - period_s) <= 0.02 * period_s
    assert abs(est.comm_s - burst_s) <= 0.10 * burst_s


def test_cruxctl_measure_on_a_rig_host() -> None:
    """The operator's view of the same thing: `cruxctl measure` inside the host's namespace."""
    period_s, burst_s = 0.4, 0.1
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        job = subprocess.Popen(["ip", "netns", "exec", f.ns("h0"), sys.executable, "-m",
                                "tests.rig.bursts", f.address("h1"), str(period_s),
                                str(burst_s), "40", "40"], cwd=REPO)
        try:
            r = f.exec("h0", str(Path(sys.executable).parent / "cruxctl"), "measure",
                       "--interface", "eth0", "--no-rdma", "--gpu", "none", "--window", "6",
                       "--json", timeout=40)
        finally:
            job.kill()
            job.wait()
    assert r.returncode == 0, r.stderr
    est = json.loads(r.stdout)["estimate"]
    assert est is not None, r.stdout
    assert abs(est["period_s"] - period_s) <= 0.02 * period_s
    assert abs(est["comm_s"] - burst_s) <= 0.10 * burst_s
    assert est["flops_per_iter"] == 0 and est["note"] == "no GPUs mapped to the job"
