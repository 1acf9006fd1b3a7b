"""Model profiles of the trace (cruxd/sim/profiles.py) and the collectives behind them
(pipeline and all-to-all flows in cruxd/model/jobs.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.hints.arnold import volumes
from cruxd.model.jobs import all_to_all, pipeline_p2p
from cruxd.sim import profiles as pf

PORTS = 4


def _hosts(gpus: list[int]) -> list[tuple[str, int]]:
    return [(f"h{i}", g) for i, g in enumerate(gpus)]


def test_pipeline_sends_each_boundary_its_bytes_both_ways() -> None:
    hosts = _hosts([8] * 8)  # 64 GPUs in 4 stages of 2 hosts
    flows = pipeline_p2p(hosts, 4, 1e9, {h: PORTS for h, _ in hosts})
    stage = {f"h{i}": i // 2 for i in range(8)}
    per_boundary: dict[tuple[int, int], float] = {}
    for f in flows:
        key = (stage[f.src], stage[f.dst])
        assert abs(key[0] - key[1]) == 1  # only neighbouring stages talk
        per_boundary[key] = per_boundary.get(key, 0.0) + f.bytes
    assert per_boundary == pytest.approx({(0, 1): 1e9, (1, 0): 1e9, (1, 2): 1e9, (2, 1): 1e9,
                                          (2, 3): 1e9, (3, 2): 1e9})
    assert {f.src_port for f in flows} == set(range(PORTS))
    assert pipeline_p2p(hosts, 1, 1e9, {}) == ()  # one stage: no pipeline traffic


@settings(max_examples=100, deadline=None)
@given(gpus=st.lists(st.integers(1, 8), min_size=1, max_size=12),
       per_gpu=st.floats(1.0, 1e9))
def test_all_to_all_conserves_what_leaves_the_hosts(gpus: list[int], per_gpu: float) -> None:
    hosts = _hosts(gpus)
    flows = all_to_all(hosts, per_gpu, {h: PORTS for h, _ in hosts})
    total = sum(gpus)
    # every GPU spreads its bytes over all GPUs; what stays on its own host is not sent
    expected = per_gpu / total * (total * total - sum(g * g for g in gpus))
    assert sum(f.bytes for f in flows) == pytest.approx(expected, rel=1e-9)
    assert all(f.src != f.dst and f.src_port == f.dst_port for f in flows)
    assert len(flows) == (len(gpus) * (len(gpus) - 1) if len(gpus) > 1 else 0)


def test_gpt_profiles_follow_megatron_and_arnold() -> None:
    big = pf.profile("gpt", 512)
    assert (big.unit, big.pp_stages) == (8, 2)
    # Arnold's Appendix C: a stage's parameters in bf16, all-reduced by its DP group
    assert big.dp_bytes == volumes(8192, 2048, 51200, 48, 2).dp_bytes
    assert big.pp_bytes == 1536 * 2048 * 8192 * 2  # the batch's activations, bf16
    # Megatron's Eq. 3 at 140 TFLOP/s per GPU: 39.1B on 512 GPUs, batch 1536
    assert big.compute_s == pytest.approx(14.2, abs=0.1)
    assert pf.profile("gpt", 100) is pf.profile("gpt", 64)  # the largest that fits
    assert pf.profile("gpt", 8).unit == 1 and pf.profile("gpt", 8).pp_stages == 1


def test_every_model_of_the_seed_has_a_cited_profile() -> None:
    assert set(pf.KINDS) == {"gpt", "bert", "resnet", "nmt", "multi-interests", "ctr", "nlp"}
    assert sum(pf.SMALL_MIX.values()) == pytest.approx(1.0)
    for kind in pf.KINDS:
        p = pf.profile(kind, 16)
        assert p.source and p.compute_s > 0 and 0 <= p.overlap < 1
        assert p.dp_bytes > 0  # every model all-reduces something
    assert pf.profile("ctr", 16).a2a_bytes > 0 and pf.profile("bert", 16).a2a_bytes == 0
    with pytest.raises(ValueError, match="models: gpt"):
        pf.profile("alexnet", 8)


def test_profile_flows_add_up_the_collectives() -> None:
    hosts = tuple(_hosts([8] * 64))  # a 512-GPU GPT: ring + pipeline
    ports = {h: PORTS for h, _ in hosts}
    flows = pf.profile_flows(pf.profile("gpt", 512), hosts, ports)
    ring = [f for f in flows if f.dst == f"h{(int(f.src[1:]) + 1) % 64}"]
    assert len(flows) == 64 * PORTS + 32 * 2 * PORTS
    assert ring and all(f.bytes > 0 for f in flows)
    doubled = pf.profile_flows(pf.profile("ctr", 16), hosts[:3], ports, bytes_scale=2.0)
    once = pf.profile_flows(pf.profile("ctr", 16), hosts[:3], ports)
    assert sum(f.bytes for f in doubled) == pytest.approx(2 * sum(f.bytes for f in once))
