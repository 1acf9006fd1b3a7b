"""The [measurement] section: how an agent with agent.measurement = "live" measures jobs."""

from __future__ import annotations

from cruxd.config.fields import Range, Section
from cruxd.config.model import MeasureConfig

# The FFT of a 30-s window costs 0.4 ms at 100 Hz and grows as n log n; past 1 kHz the
# sampler itself costs more than the measurement is worth (bench/measure.py).
MAX_RATE_HZ = 1000.0


def parse_measurement(m: Section, live: bool) -> MeasureConfig:
    """`live`: whether agent.measurement is "live" (then gpu = "replay" needs its file)."""
    gpu = m.choice("gpu", "nvml", ("nvml", "replay", "none"))
    gpu_file = m.path("gpu_file")
    if live and gpu == "replay" and gpu_file is None:
        raise m.error("gpu_file", 'required with gpu = "replay": a recording made with '
                      "`cruxctl measure --record`")
    if gpu != "replay" and gpu_file is not None:
        raise m.error("gpu_file", 'only used with gpu = "replay"')
    rate_hz = m.number("rate_hz", 100.0, Range(1, MAX_RATE_HZ))
    window_s = m.number("window_s", 30.0, Range(1, 600))
    if window_s * rate_hz < 16:
        raise m.error("window_s", f"a window of {window_s:g} s at {rate_hz:g} Hz holds "
                      "fewer than 16 samples; the period cannot be estimated")
    return MeasureConfig(
        rate_hz=rate_hz,
        sampler=m.choice("sampler", "auto", ("auto", "python")),
        window_s=window_s,
        gpu=gpu,
        gpu_file=gpu_file,
        gpu_interval_s=m.number("gpu_interval_s", 1.0, Range(0.05, 60)),
        interfaces=m.strings("interfaces"),
        rdma=m.boolean("rdma", True),
        peak_tflops=m.number("peak_tflops", 0.0, Range(0, 100000)),
        settle_s=m.number("settle_s", 1.0, Range(0, 60)),
        sysfs=m.path("sysfs"),
    )
