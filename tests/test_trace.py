"""cruxd.sim.trace: seeded trace jobs with the seed's size mix, packed without
oversubscribing GPUs on the standalone schedule."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from cruxd.model.topology import Topology
from cruxd.sim.profiles import KINDS
from cruxd.sim.run import SimJob
from cruxd.sim.trace import DAY_S, standalone_period, trace_jobs, trace_stats
from cruxd.topo import clos2, double_sided, trace_clos


def _key(jobs: list[SimJob]) -> list[tuple[object, ...]]:
    return [(s.job.id, s.job.hosts, s.job.flows, s.job.compute_s, s.job.overlap, s.arrival_s,
             s.iterations) for s in jobs]


@pytest.fixture(scope="module")
def busy() -> tuple[Topology, list[SimJob]]:
    """A loaded fabric: jobs queue and fragment hosts."""
    topo = double_sided()
    return topo, trace_jobs(topo, jobs=3000, days=7, seed=1)


def test_same_seed_same_trace() -> None:
    topo = clos2(4, 2, 4)
    a = trace_jobs(topo, jobs=200, days=1, seed=3)
    assert _key(a) == _key(trace_jobs(topo, jobs=200, days=1, seed=3))
    assert _key(a) != _key(trace_jobs(topo, jobs=200, days=1, seed=4))


def test_size_mix_follows_the_trace() -> None:
    topo = trace_clos()
    jobs = trace_jobs(topo, jobs=4000, days=14, seed=0)
    st = trace_stats(jobs, topo)
    assert st["jobs"] == len(jobs) == 4000
    assert st["share_ge_128"] > 0.10
    assert st["largest"] == 512
    assert st["peak_jobs"] > 30  # the seed: peak concurrency above 30 jobs
    assert st["peak_gpus"] <= topo.total_gpus()
    assert len({s.job.id for s in jobs}) == len(jobs)


def test_small_fabric_caps_sizes_and_arrivals_cover_the_period() -> None:
    topo = clos2(2, 2, 2)  # 32 GPUs
    jobs = trace_jobs(topo, jobs=300, days=2, seed=0)
    assert max(s.job.gpus for s in jobs) <= 32
    arrivals = np.array([s.arrival_s for s in jobs])
    assert np.all(np.diff(arrivals) >= 0)  # FIFO: jobs start in arrival order
    assert arrivals[0] < 0.1 * 2 * DAY_S and arrivals[-1] > 0.9 * 2 * DAY_S


def test_no_gpu_is_oversubscribed(busy: tuple[Topology, list[SimJob]]) -> None:
    topo, jobs = busy
    events: list[tuple[float, int, str, int]] = []
    for s in jobs:
        end = s.arrival_s + (s.iterations or 0.0) * standalone_period(s.job, topo)
        for host, g in s.job.hosts:
            events.append((s.arrival_s, 1, host, g))
            events.append((end - 1e-6 * max(1.0, end), 0, host, -g))  # ends first on ties
    used: dict[str, int] = defaultdict(int)
    for _, _, host, g in sorted(events):
        used[host] += g
        assert 0 <= used[host] <= topo.nodes[host].gpus, host
    assert all(v == 0 for v in used.values())


def test_fabric_fills_up_and_jobs_still_fit(busy: tuple[Topology, list[SimJob]]) -> None:
    topo, jobs = busy
    st = trace_stats(jobs, topo)
    assert st["peak_gpus"] > 0.8 * topo.total_gpus()
    for s in jobs:
        assert s.job.gpus == sum(g for _, g in s.job.hosts)
        assert len({h for h, _ in s.job.hosts}) == len(s.job.hosts)
        assert all(0 < g <= topo.nodes[h].gpus for h, g in s.job.hosts)
        assert s.iterations is not None and s.iterations >= 1.0


def test_jobs_spanning_hosts_have_flows(busy: tuple[Topology, list[SimJob]]) -> None:
    topo, jobs = busy
    multi = [s.job for s in jobs if len(s.job.hosts) > 1]
    assert 0.5 * len(jobs) < len(multi) < len(jobs)
    for job in (s.job for s in jobs):
        hosts = {h for h, _ in job.hosts}
        if len(hosts) == 1:
            assert job.flows == ()
            continue
        assert job.pattern in KINDS and job.network_bytes > 0
        assert {f.src for f in job.flows} == hosts == {f.dst for f in job.flows}
        if job.pattern not in ("ctr", "multi-interests") and job.gpus < 512:
            # the ring alone (no pipeline below 512 GPUs): one channel per rail per hop
            assert len(job.flows) == len(hosts) * min(topo.nic_ports(h) for h in hosts)


def test_load_sets_the_mean_demand() -> None:
    topo = trace_clos()
    lo = trace_stats(trace_jobs(topo, jobs=2000, days=7, seed=0, load=0.2), topo)
    hi = trace_stats(trace_jobs(topo, jobs=2000, days=7, seed=0, load=0.4), topo)
    assert 0.1 * topo.total_gpus() < lo["mean_gpus"] < 0.3 * topo.total_gpus()
    assert hi["mean_gpus"] > 1.5 * lo["mean_gpus"]


def test_merged_iterations_keep_the_standalone_rate() -> None:
    """min_period_s simulates short iterations k at a time: k x compute and k x bytes,
    the same work per second alone, and every merged period reaches the minimum."""
    topo = clos2(4, 2, 4)
    exact = trace_jobs(topo, jobs=150, days=1, seed=5, placement="none")
    merged = trace_jobs(topo, jobs=150, days=1, seed=5, placement="none", min_period_s=1.0)
    assert [s.job.hosts for s in exact] == [s.job.hosts for s in merged]
    assert any(s.job.compute_s < 1.0 for s in exact)
    for a, b in zip(exact, merged, strict=True):
        pa, pb = standalone_period(a.job, topo), standalone_period(b.job, topo)
        k = round(b.job.compute_s / a.job.compute_s)
        assert k == (1 if pa >= 1.0 else int(np.ceil(1.0 / pa)))
        assert pb >= min(1.0, pa) - 1e-12
        assert b.job.network_bytes == pytest.approx(k * a.job.network_bytes)
        assert pb == pytest.approx(k * pa)
        assert (b.iterations or 0) * pb == pytest.approx((a.iterations or 0) * pa, rel=1e-9) \
            or (a.iterations == 1.0 or b.iterations == 1.0)
