"""`cruxctl measure`: what the agent's live measurement would see on this host, no daemon
needed: sample the NIC counters (and the GPUs) for one window and print the iteration
period, t_j and W_j; `--record` saves the GPU samples for replay (`[measurement] gpu =
"replay"`)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cruxd.errors import CruxError, UsageError

if TYPE_CHECKING:
    from cruxd.measure.sampling.gpu import GpuBackend


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "measure", help="sample this host's NIC counters and GPUs for one window: period, "
                        "t_j, W_j",
        description="Sample the byte counters of this host's NICs (RDMA ports' "
                    "port_xmit_data, netdevs' tx_bytes) and the GPUs' utilisation for one "
                    "window, then estimate the iteration period (FFT + autocorrelation), t_j "
                    "(time on the wire per iteration) and W_j (busy x peak FLOPS per "
                    "iteration), as the agent does for a job. docs/measurement.md explains "
                    "the method.",
        epilog="Exit status: 0 ok (even when no period is found: see 'period'), 1 cannot "
               "sample, 2 bad input.")
    p.add_argument("--interface", action="append", default=[], metavar="IF",
                   help="a netdev to sample (repeatable; default: every netdev but lo)")
    p.add_argument("--no-rdma", action="store_true", help="do not sample RDMA ports")
    p.add_argument("--window", type=float, default=30.0, metavar="S",
                   help="seconds to sample (default 30)")
    p.add_argument("--rate", type=float, default=100.0, metavar="HZ",
                   help="counter samples per second (default 100)")
    p.add_argument("--gpu", choices=("nvml", "replay", "none"), default="nvml",
                   help="GPU source (default nvml; without NVML W_j is reported unknown)")
    p.add_argument("--gpu-file", type=Path, metavar="FILE", help="recording for --gpu replay")
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="save the GPU samples as a replayable recording")
    p.add_argument("--sysfs", type=Path, default=Path("/sys"), metavar="DIR",
                   help="where the counters are read (default /sys)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _gpu(args: argparse.Namespace) -> tuple[GpuBackend | None, str]:
    from cruxd.measure.sampling.gpu import NvmlUnavailable, Recorder, open_backend

    if args.gpu == "replay" and args.gpu_file is None:
        raise UsageError("--gpu replay needs --gpu-file")
    if args.gpu != "replay" and args.gpu_file is not None:
        raise UsageError("--gpu-file is only used with --gpu replay")
    try:
        backend = open_backend(args.gpu, args.gpu_file)  # GpuSourceError: a bad recording
    except NvmlUnavailable as exc:
        if args.record is not None:
            raise CruxError(f"cannot record: {exc}") from None
        return None, str(exc)
    if backend is None:
        return None, "GPUs not sampled (--gpu none)"
    return (Recorder(backend) if args.record is not None else backend), ""


@contextmanager
def _progress(window_s: float, counters: int, done: threading.Event) -> Iterator[None]:
    """A progress bar on stderr while the window is sampled, when stderr is a terminal
    (a script's pipe gets nothing; --json's stdout is never touched)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn(f"sampling {counters} counter(s)"), BarColumn(),
                   TextColumn("{task.completed:.0f}/{task.total:.0f} s"), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task("window", total=window_s)
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(0.25):
            bar.update(task, completed=min(window_s, time.monotonic() - t0))

    ticker = threading.Thread(target=tick, daemon=True)
    with bar:
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()


def cmd_measure(args: argparse.Namespace) -> int:
    from cruxd.measure.estimate import estimate_job
    from cruxd.measure.gpu_work import GpuSample
    from cruxd.measure.sampling.gpu import Recorder
    from cruxd.measure.sampling.nic import Sampler, net_counters, rdma_counters

    if not 1 <= args.rate <= 1000:
        raise UsageError("--rate must be 1..1000")
    if not 1 <= args.window <= 600 or args.window * args.rate < 16:
        raise UsageError("--window must be 1..600 s and hold at least 16 samples")
    counters = net_counters(args.sysfs, args.interface or None)
    missing = sorted(set(args.interface) - {c.name[4:] for c in counters})
    if missing:
        raise UsageError(f"no such interface under {args.sysfs}/class/net: {missing[0]}")
    if not args.no_rdma:
        counters += rdma_counters(args.sysfs)
    if not counters:
        raise UsageError(f"no NIC counters under {args.sysfs}")
    gpu, gpu_note = _gpu(args)
    inventory = gpu.inventory() if gpu is not None else []
    samples: list[GpuSample] = []
    stop = threading.Event()

    def gpus() -> None:
        while gpu is not None and not stop.wait(1.0):
            samples.append(gpu.sample())

    thread = threading.Thread(target=gpus, daemon=True)
    thread.start()
    t0 = time.monotonic()
    with _progress(args.window, len(counters), stop):
        series = Sampler(counters, args.rate).run(args.window)
        stop.set()
    thread.join()
    import numpy as np

    total = np.sum([s.rates for s in series.values()], axis=0)
    est = estimate_job(total, args.rate, samples, inventory, set(range(len(inventory))))
    if isinstance(gpu, Recorder):
        gpu.save(args.record)
    window_s = round(time.monotonic() - t0, 3)
    doc = {"window_s": window_s, "rate_hz": args.rate,
           "counters": sorted(series), "gpus": [g.name for g in inventory],
           "gpu_note": gpu_note, "estimate": None if est is None else {
               "period_s": est.period_s, "confidence": est.confidence,
               "iterations": est.iterations, "comm_s": est.comm_s,
               "bytes_per_iter": est.bytes_per_iter, "flops_per_iter": est.flops_per_iter,
               "compute_s": est.compute_s, "note": est.note}}
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    gpu_names = ", ".join(g.name for g in inventory) or gpu_note
    print(f"sampled {', '.join(sorted(series))} at {args.rate:g} Hz for {window_s} s; "
          f"GPUs: {gpu_names}")
    if est is None:
        print("period: none found (aperiodic, too short, or no bursts): nothing to estimate")
        return 0
    print(f"period {est.period_s:.4f} s (confidence {est.confidence:.2f}, "
          f"{est.iterations:.1f} iterations)\nt_j {est.comm_s:.4f} s on the wire per "
          f"iteration, {est.bytes_per_iter:.3g} bytes per iteration")
    print(f"W_j {est.flops_per_iter:.3g} FLOP per iteration, GPU busy {est.compute_s:.4f} s"
          if est.flops_per_iter else f"W_j unknown ({est.note or gpu_note})")
    if args.record is not None:
        print(f"GPU recording written to {args.record}")
    return 0
