"""Model profiles of the seed's §6.3 model list at real sizes (pure, no I/O).

The seed evaluates BERT, GPT, ResNet, NMT and Multi-Interests (public) plus two
in-house models, a click-through-rate (CTR) model and a transformer NLP model. Each
profile below gives, per iteration of one job, its compute time per GPU, the bytes
its collectives put on the network and how much of the compute they may overlap.
Sizes are the public models' own; compute times are FLOP counts over an achieved
A100 rate unless a published throughput is named. Where a number is our estimate
rather than a published one, the comment says so. docs/simulator.md has the table.

Traffic per iteration (host level; `profile_flows`):
  * data parallel: a ring all-reduce of the gradients (`ring_allreduce`);
  * tensor parallel (GPT): inside a host over NVLink, never on the fabric (the
    placement keeps a TP group on one host, see `Profile.unit`);
  * pipeline parallel (GPT): the batch's activations forward and their gradients back
    at each stage boundary (`pipeline_p2p`), and each stage's DP all-reduce of its
    share of the parameters (Arnold, seed 001 Appendix C: `cruxd.hints.arnold.volumes`);
  * embedding models (CTR, Multi-Interests): an all-to-all of the looked-up embeddings
    forward and of their gradients back (`all_to_all`), plus a ring all-reduce of the
    small dense part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cruxd.hints.arnold import volumes
from cruxd.model.jobs import FlowSpec, all_to_all, pipeline_p2p, ring_allreduce

# Megatron-LM on A100s sustains 135-142 TFLOP/s per GPU on GPT models of 1.7B-39B
# parameters (Narayanan et al., SC'21, Table 1); we take 140.
GPT_FLOPS = 140e12
# smaller transformers at the batches below reach less; 100 TFLOP/s (32 % of the
# A100's 312 bf16 peak) is our estimate
TRANSFORMER_FLOPS = 100e12
SEQ, VOCAB, BF16, FP32 = 2048, 51200, 2, 4


@dataclass(frozen=True, slots=True)
class Profile:
    kind: str
    compute_s: float  # per iteration on each GPU
    overlap: float  # share of the compute the communication may overlap
    dp_bytes: float = 0.0  # all-reduced per iteration (gradients of one pipeline stage)
    pp_stages: int = 1
    pp_bytes: float = 0.0  # per stage boundary and direction, per iteration
    a2a_bytes: float = 0.0  # sent by each GPU in the embedding all-to-all, per iteration
    unit: int = 1  # GPUs that must share a host (a TP group)
    source: str = ""


def _gpt(gpus: int, h: int, layers: int, tp: int, pp: int, batch: int) -> Profile:
    """A Megatron GPT configuration (Narayanan et al., SC'21, Table 1) at its global
    batch over its GPUs. FLOPs per iteration: their Eq. 3 (activation recomputation),
    96 B s l h^2 (1 + s / 6h + V / 16 l h); each GPU computes its 1/gpus share."""
    flops = 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))
    vol = volumes(h, SEQ, VOCAB, layers, pp)
    return Profile("gpt", flops / gpus / GPT_FLOPS, 0.1, dp_bytes=vol.dp_bytes, pp_stages=pp,
                   pp_bytes=batch * SEQ * h * BF16, unit=tp,
                   source=f"Megatron-LM SC'21 Table 1: h={h}, l={layers}, TP={tp}, PP={pp}, "
                          f"{gpus} GPUs, batch {batch}")


def _dense(kind: str, params: float, tokens: float, overlap: float, source: str,
           grad_bytes_per_param: int = BF16) -> Profile:
    """A data-parallel transformer: 6 N T FLOPs per iteration (Kaplan et al. 2020),
    T tokens per GPU, gradients all-reduced in bf16/fp16."""
    return Profile(kind, 6 * params * tokens / TRANSFORMER_FLOPS, overlap,
                   dp_bytes=params * grad_bytes_per_param, source=source)


# GPT sizes by job size: the largest configuration with at most the job's GPUs. The
# 8-16 GPU jobs run the seed's own GPT variant (§2.2: GPT-3 reduced to 24 layers,
# hidden 1024), at Megatron's 16 sequences per GPU.
GPT: tuple[tuple[int, Profile], ...] = (
    (8, _gpt(8, 1024, 24, 1, 1, 128)),
    (32, _gpt(32, 2304, 24, 1, 1, 512)),
    (64, _gpt(64, 3072, 30, 2, 1, 512)),
    (128, _gpt(128, 4096, 36, 4, 1, 512)),
    (256, _gpt(256, 6144, 40, 8, 1, 1024)),
    (512, _gpt(512, 8192, 48, 8, 2, 1536)),
)

PROFILES: dict[str, Profile] = {
    # BERT-large, 340M parameters (Devlin et al. 2019); pre-training phase 1, sequence
    # 128 at 64 sequences per GPU (NVIDIA DeepLearningExamples' per-GPU batch)
    "bert": _dense("bert", 340e6, 64 * 128, 0.5,
                   "BERT-large 340M (Devlin et al. 2019), 64 x 128 tokens per GPU"),
    # ResNet-50, 25.6M parameters (He et al. 2016), fp32 gradients (DDP all-reduces the
    # parameters' dtype under AMP); 256 images per GPU at ~2,500 images/s per A100
    # with AMP (NVIDIA DeepLearningExamples, ResNet-50 v1.5)
    "resnet": Profile("resnet", 256 / 2500, 0.7, dp_bytes=25.6e6 * FP32,
                      source="ResNet-50 25.6M (He et al. 2016), 256 img/GPU at 2,500 img/s"),
    # Transformer-big NMT, 213M parameters (Vaswani et al. 2017, Table 3), fairseq's
    # 3,584 tokens per GPU (Ott et al. 2018, WMT'16 En-De recipe)
    "nmt": _dense("nmt", 213e6, 3584, 0.5,
                  "Transformer-big 213M (Vaswani et al. 2017), 3,584 tokens per GPU "
                  "(Ott et al. 2018)"),
    # the in-house transformer NLP model, stood in for by BERT-base (110M, Devlin et al.
    # 2019) fine-tuning at 32 x 128 tokens per GPU (our estimate of such a job)
    "nlp": _dense("nlp", 110e6, 32 * 128, 0.5,
                  "in-house NLP: BERT-base 110M (Devlin et al. 2019), 32 x 128 tokens/GPU"),
    # Multi-Interests (MIND, Li et al. CIKM'19): 64-dim embeddings of a user's 50 most
    # recent items and the target, 2,048 users per GPU, fp32, forward and back; the
    # dense part (capsule and MLP layers, ~2M parameters) all-reduced; 30 ms of
    # memory-bound compute per step is our estimate
    "multi-interests": Profile("multi-interests", 0.030, 0.1, dp_bytes=2e6 * FP32,
                               a2a_bytes=2048 * 51 * 64 * FP32 * 2,
                               source="MIND (Li et al. 2019): dim 64, 51 items, "
                                      "2,048 users/GPU; compute estimated"),
    # the in-house CTR model, stood in for by DLRM (Naumov et al. 2019) in its MLPerf
    # configuration: 26 embedding tables of dim 128, fp16 exchange, 2,048 samples per
    # GPU, ~2.7M dense MLP parameters; 20 ms per step is our estimate
    "ctr": Profile("ctr", 0.020, 0.1, dp_bytes=2.7e6 * FP32,
                   a2a_bytes=2048 * 26 * 128 * BF16 * 2,
                   source="DLRM MLPerf config (Naumov et al. 2019): 26 x dim 128, "
                          "2,048 samples/GPU; compute estimated"),
}

LARGE_JOB_GPUS = 128  # from this size on, jobs are GPT variants (trace, §2.2)
SMALL_MIX: dict[str, float] = {"gpt": 0.2, "bert": 0.2, "resnet": 0.15, "nmt": 0.15,
                               "nlp": 0.1, "multi-interests": 0.1, "ctr": 0.1}
KINDS = ("gpt", *PROFILES)


def profile(kind: str, gpus: int) -> Profile:
    """The profile of a `kind` job of `gpus` GPUs."""
    if kind == "gpt":
        return [p for size, p in GPT if size <= gpus][-1] if gpus >= GPT[0][0] else GPT[0][1]
    try:
        return PROFILES[kind]
    except KeyError:
        raise ValueError(f"unknown model {kind!r}; models: {', '.join(KINDS)}") from None


def profile_flows(p: Profile, hosts: tuple[tuple[str, int], ...], nic_ports: Mapping[str, int],
                  bytes_scale: float = 1.0) -> tuple[FlowSpec, ...]:
    """A job's network flows per iteration under profile `p` on `hosts` (ring order)."""
    s = bytes_scale
    flows = ring_allreduce(hosts, s * p.dp_bytes, nic_ports) if p.dp_bytes > 0 else ()
    if p.pp_stages > 1:
        flows += pipeline_p2p(hosts, p.pp_stages, s * p.pp_bytes, nic_ports)
    if p.a2a_bytes > 0:
        flows += all_to_all(hosts, s * p.a2a_bytes, nic_ports)
    return flows
