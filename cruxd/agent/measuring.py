"""Live measurement: NIC counters and GPUs sampled in the background, W_j and t_j per job.

Two daemon threads sample (they block in sysfs reads and NVML calls, which must never stall
the event loop): NIC byte counters at `rate_hz` into a `CounterWindow`, GPU utilisation and
processes every `gpu_interval_s`. `measure(job)` runs on the event loop when the agent
reports; it takes the job's share of both over the last window:

* traffic: first the job's own collectives, from the NCCL profiler plugin's records while
  they are fresh (cruxd/measure/sampling/nccl_figures.py; source `nvml+nccl`); else
  the RDMA ports the job's QPs use (the shim's records name device and port);
  a job without QP records (TCP, or no shim) gets the netdevs' counters. Counters shared by
  several jobs mix their traffic; the period estimator then follows the stronger job. So on
  a host with several jobs, a job whose processes count their own bytes (the TCP
  interposer's records, sampled with the NIC counters: cruxd/measure/sampling/job_bytes.py)
  is measured from those instead, and its figures say so (source `nvml+sock`); the NIC
  counters stay for a host's only job and for jobs without such counters;
* GPUs: the devices NVML lists for the job's processes (its registered pid and their
  descendants); with no process list (replay, or NVML without permission) a host's only
  job gets all of them.

While the leader profiles a job (JobState.PROFILING in the plan) only samples from inside
the window count, after `settle_s`; the result is kept as the job's profiled figures (W_j,
t_j, period, compute, bytes) and reported until the next profiling window, so contention
later on cannot move them: under contention the period and t_j stretch, and so does the GPU
time per iteration wherever waiting looks busy (NCCL's kernels spin on the GPU while the
network is slow; a replayed GPU is busy at a fixed share). The job keeps being measured,
and it asks to be profiled again only when its own standalone behaviour changed, judged on
what contention cannot cause: bytes per iteration moving by more than `drift` either way,
or the period or W_j falling by more than `drift` (contention only raises them), for
`drift_windows` estimates in a row. A job whose compute per iteration grows while its
traffic stays the same is therefore not re-profiled: that looks exactly like contention.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cruxd.agent.inventory import netdevs_for
from cruxd.agent.process_tree import belongs
from cruxd.agent.sources import MeasurementDefaults
from cruxd.config.model import MeasureConfig
from cruxd.control.records import (
    HostPlan,
    JobState,
    LinkObservation,
    LocalJob,
    Measurement,
    Nic,
)
from cruxd.measure.estimate import (
    SHORT_BURSTS,
    JobEstimate,
    drifted,
    estimate_job,
    job_estimate,
)
from cruxd.measure.gpu_work import GpuInfo, GpuSample
from cruxd.measure.sampling.csampler import BatchSampler, SamplerUnavailable
from cruxd.measure.sampling.gpu import GpuBackend, NvmlUnavailable, open_backend
from cruxd.measure.sampling.job_bytes import JobBytes, JobCounterSource
from cruxd.measure.sampling.links import PortLinks
from cruxd.measure.sampling.nccl_figures import SOURCE as NCCL_SOURCE
from cruxd.measure.sampling.nccl_figures import NcclFigures
from cruxd.measure.sampling.nic import Counter, CounterReader, net_counters, rdma_counters
from cruxd.measure.window import CounterWindow
from transport.qp_records import ProcessRecords

LOG = logging.getLogger(__name__)
SOURCE = "nvml+nic"
# bursts are timed on the series averaged over this, capped at half the burst
# (cruxd/measure/comm.py): per-job bytes arrive in the job's own pieces, and NIC counters
# read at a few hundred Hz on a loaded host jitter from sample to sample
BURST_BOX_S = 0.02
NIC = "nic"  # the kind of traffic source that is the host's NIC counters, not a job's own


@dataclass
class _JobTrack:
    profiling_since: float | None = None  # monotonic start of the current window
    at: float = -math.inf  # when `last` was estimated
    drift_at: float = -math.inf  # when drift was last judged
    profiled: JobEstimate | None = None
    last: JobEstimate | None = None
    drifted: int = 0  # consecutive estimates off the profiled figures
    wants_profile: bool = False
    counters: tuple[str, ...] = field(default_factory=tuple)
    warned: bool = False  # about bursts too short for the sampling rate
    source: str = SOURCE  # where `last` was measured
    profiled_source: str = SOURCE  # where `profiled` was


class LiveMeasurement(MeasurementDefaults):  # reconfigure: nothing reloads
    def __init__(self, cfg: MeasureConfig, nics: tuple[Nic, ...],
                 owners: Callable[[str], Iterable[int]],
                 qp_records: Callable[[], list[ProcessRecords]],
                 job_count: Callable[[], int],
                 drift: float = 0.25, drift_windows: int = 3, *,
                 job_sources: Sequence[JobCounterSource] = (),
                 nccl: NcclFigures | None = None) -> None:
        self.cfg = cfg
        self.owners, self.qp_records, self.job_count = owners, qp_records, job_count
        self.drift, self.drift_windows = drift, drift_windows
        root = cfg.sysfs or Path("/sys")
        names = cfg.interfaces or netdevs_for(tuple(n.address for n in nics))
        self.net = net_counters(root, names)
        self.rdma = rdma_counters(root) if cfg.rdma else []
        self.counters: list[Counter] = self.net + self.rdma
        self.window = CounterWindow([c.name for c in self.counters] or ["none"], cfg.rate_hz,
                                    2 * cfg.window_s)
        self.gpu: GpuBackend | None = None
        self.inventory: list[GpuInfo] = []
        self.gpu_samples: deque[GpuSample] = deque(
            maxlen=max(2, math.ceil(2 * cfg.window_s / cfg.gpu_interval_s)))
        self.tracks: dict[str, _JobTrack] = {}
        # each job's own bytes, for hosts that run several (sampled with the NIC counters)
        self.job_bytes = JobBytes(job_sources, cfg.rate_hz, 2 * cfg.window_s, owners,
                                  belongs) if job_sources else None
        self.nccl = nccl  # the NCCL profiler plugin's records: preferred while fresh
        self.ports = PortLinks(root, [c.name for c in self.counters])
        self._links_at = time.monotonic()  # the last reading links() has looked at
        self._last_links: dict[str, float] = {}  # utilisation by port, as last reported
        self._reader = CounterReader()
        self._gpu_failures = 0
        self._stop = threading.Event()
        self._batch: BatchSampler | None = None
        self.sampler = ""  # "c" or "python" once the NIC thread runs
        self._threads: list[threading.Thread] = []
        self.name = f"live ({SOURCE})"

    # --- sampling threads -----------------------------------------------------
    def start(self) -> None:
        if not self.counters:
            LOG.warning("live measurement: no NIC counters under %s (interfaces %s); t_j "
                        "stays unknown%s", self.cfg.sysfs or "/sys", self.cfg.interfaces or
                        "auto", " but for jobs that count their own bytes"
                        if self.job_bytes is not None else "")
        else:
            LOG.info("live measurement: %d counter(s) at %g Hz: %s", len(self.counters),
                     self.cfg.rate_hz, ", ".join(c.name for c in self.counters))
        if self.job_bytes is not None:
            LOG.info("live measurement: per-job byte counters from %s",
                     ", ".join(s.kind for s in self.job_bytes.sources))
        if self.counters or self.job_bytes is not None:
            self._spawn("crux-nic-sampler", self._nic_loop)
        self.gpu = self._open_gpu()
        if self.gpu is not None:
            self.inventory = self.gpu.inventory()
            self._spawn("crux-gpu-sampler", self._gpu_loop)

    @property
    def failed_cycles(self) -> int:
        """Counter readings and GPU samples that failed (each logged once per cause)."""
        own = self.job_bytes.failed if self.job_bytes is not None else 0
        return self._reader.failed + self._gpu_failures + own

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        if self._batch is not None:
            self._batch.stop()
        self.ports.close()
        for t in self._threads:
            t.join(timeout=2)

    def _open_gpu(self) -> GpuBackend | None:
        c = self.cfg
        try:
            return open_backend(c.gpu, c.gpu_file, c.peak_tflops)
        except (ValueError, NvmlUnavailable) as exc:
            LOG.warning("live measurement: %s; W_j stays unknown", exc)
            return None

    def _nic_loop(self) -> None:
        if self.cfg.sampler == "auto":
            try:
                self._batch = BatchSampler(self.counters, self.cfg.rate_hz, self._reader,
                                           job_bytes=self.job_bytes)
            except SamplerUnavailable as exc:
                LOG.warning("C sampler unavailable (%s); sampling in Python, which costs "
                            "more CPU at %g Hz", exc, self.cfg.rate_hz)
            else:
                self.sampler = "c"
                LOG.info("live measurement: the C loop samples the NIC counters")
                try:
                    self._batch.run(self.window, self._stop)
                finally:
                    self._close_readers()
                return
        self.sampler = "python"
        reader, period = self._reader, 1.0 / self.cfg.rate_hz
        next_t = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self.counters:
                self.window.add(now, [reader.read_or_none(c) for c in self.counters])
            if self.job_bytes is not None:
                self.job_bytes.sample(now)
            next_t += period
            delay = next_t - time.monotonic()
            if delay < -period:  # fell behind (suspended?): restart the grid, leave a gap
                next_t = time.monotonic()
            elif delay > 0 and self._stop.wait(delay):
                break
        self._close_readers()

    def _close_readers(self) -> None:
        self._reader.close()
        if self.job_bytes is not None:
            self.job_bytes.close()

    def _gpu_loop(self) -> None:
        assert self.gpu is not None
        while not self._stop.wait(self.cfg.gpu_interval_s):
            try:
                s = self.gpu.sample()
            except Exception as exc:  # a driver hiccup must not end sampling
                self._gpu_failures += 1
                LOG.warning("GPU sample failed: %s", exc)
                continue
            self.gpu_samples.append(GpuSample(time.monotonic(), s.util, s.pids))

    # --- per job ----------------------------------------------------------------
    def plan_changed(self, hp: HostPlan) -> None:
        """Track which local jobs the leader is profiling now."""
        now = time.monotonic()
        profiling = {a.job_id for a in hp.jobs if a.state is JobState.PROFILING}
        for jid, track in self.tracks.items():
            if jid in profiling and track.profiling_since is None:
                track.profiling_since = now
                track.wants_profile = False
            elif jid not in profiling and track.profiling_since is not None:
                est = self.estimate(jid, fresh=True)  # the whole window, up to its end
                track.profiling_since = None
                if est is not None:
                    LOG.info("job %s profiled from %s: period %.4g s, t_j %.4g s, W_j %.4g "
                             "FLOP over %.3g s", jid, track.profiled_source, est.period_s,
                             est.comm_s, est.flops_per_iter, est.window_s)
        for jid in profiling - self.tracks.keys():
            self.tracks[jid] = _JobTrack(profiling_since=now)

    def forget(self, live: set[str]) -> None:
        for jid in list(self.tracks):
            if jid not in live:
                del self.tracks[jid]
        if self.job_bytes is not None:
            self.job_bytes.forget(live)

    def job_counters(self, job_id: str, records: list[ProcessRecords] | None = None
                     ) -> tuple[str, ...]:
        if records is None:
            records = self.qp_records()
        ports = {f"rdma:{q.device}/{q.port}" for r in self._of_job(job_id, records)
                 for q in r.qps}
        have = {c.name for c in self.counters}
        mine = tuple(sorted(ports & have))
        return mine or tuple(c.name for c in self.net)

    def job_source(self, job_id: str, records: list[ProcessRecords] | None = None) -> str:
        """Where the job's traffic is read: NIC (the host's counters), or the kind of its own
        per-job counters ("sock": its processes' TCP bytes) when the host runs several jobs
        and the job's processes have such counters. An RDMA job (QP records) only takes a
        per-QP source ("qp"), never its TCP side channel's bytes."""
        if self.job_bytes is None or self.job_count() <= 1:
            return NIC
        if records is None:
            records = self.qp_records()
        kind = "qp" if self._of_job(job_id, records) else "sock"
        return kind if self.job_bytes.counted(kind, job_id) else NIC

    def _of_job(self, job_id: str, records: list[ProcessRecords]) -> list[ProcessRecords]:
        """The records that are the job's: its id, written by one of its registered processes
        or their descendants. Any process can write a record naming any job; its claim alone
        would choose which NIC counters measure that job (issue 37)."""
        claimed = [r for r in records if r.job_id == job_id]
        if not claimed:
            return []
        owners = set(self.owners(job_id))
        return [r for r in claimed if belongs(r.pid, owners)]

    def job_devices(self, job_id: str) -> set[int]:
        owners = set(self.owners(job_id))
        samples = list(self.gpu_samples)
        seen = {p for s in samples for p in s.pids}
        devices = {d for s in samples for p, devs in s.pids.items()
                   if p in owners or (p in seen and belongs(p, owners)) for d in devs}
        if not devices and not seen and self.job_count() == 1:
            devices = set(range(len(self.inventory)))
        return devices

    def estimate(self, job_id: str, fresh: bool = False) -> JobEstimate | None:
        """The job's figures over the last window (or its profiling window so far);
        reused for a second, since status and reports both ask."""
        track = self.tracks.setdefault(job_id, _JobTrack())
        now = time.monotonic()
        if not fresh and now - track.at < 1.0:
            return track.last
        track.at = now
        since = now - self.cfg.window_s
        if track.profiling_since is not None:
            since = max(since, track.profiling_since + self.cfg.settle_s)
        if (est := self._from_nccl(job_id, track, since, now)) is not None:
            return est
        records = self.qp_records()
        kind = self.job_source(job_id, records)
        names = self.job_counters(job_id, records) if kind == NIC else (f"{kind}:{job_id}",)
        track.counters = names
        if not names:
            return None
        if kind == NIC:
            start, rates = self.window.rates(names, since)
        else:
            assert self.job_bytes is not None
            start, rates = self.job_bytes.rates(kind, job_id, since)
        if rates.size == 0 or math.isnan(start):
            return None
        gpu = [s for s in self.gpu_samples if s.t >= start]
        est = estimate_job(rates, self.cfg.rate_hz, gpu, self.inventory,
                           self.job_devices(job_id), BURST_BOX_S)
        if est is not None:
            track.source = SOURCE if kind == NIC else f"nvml+{kind}"
            self._track(track, est, now)
            if SHORT_BURSTS in est.note and track.profiled is est and not track.warned:
                track.warned = True
                LOG.warning("job %s: %s", job_id, est.note)
        return est

    def _from_nccl(self, job_id: str, track: _JobTrack, since: float, now: float
                   ) -> JobEstimate | None:
        """The job's figures from its NCCL profiler records, if they are fresh: its own
        collectives' network time, which no other job on the NIC can enter."""
        comm = self.nccl.estimate(job_id, since) if self.nccl is not None else None
        if comm is None:
            return None
        start = now - comm.window_s
        est = job_estimate(comm, [s for s in self.gpu_samples if s.t >= start], self.inventory,
                           self.job_devices(job_id))
        track.counters = ("nccl:" + job_id,)
        track.source = NCCL_SOURCE
        self._track(track, est, now)
        return est

    def _track(self, track: _JobTrack, est: JobEstimate, now: float) -> None:
        track.last = est
        if track.profiling_since is not None:
            track.profiled, track.drifted = est, 0
            track.profiled_source = track.source
            return
        ref = track.profiled
        if ref is None or now - track.drift_at < self.cfg.window_s / 2:
            return  # judge drift on windows that mostly do not overlap
        track.drift_at = now
        track.drifted = track.drifted + 1 if drifted(ref, est, self.drift) else 0
        if track.drifted >= self.drift_windows and not track.wants_profile:
            LOG.info("job behaviour changed (bytes/iteration %.3g -> %.3g, period %.3g -> "
                     "%.3g s, W_j %.3g -> %.3g); asking to profile it again",
                     ref.bytes_per_iter, est.bytes_per_iter, ref.period_s, est.period_s,
                     ref.flops_per_iter, est.flops_per_iter)
            track.wants_profile = True

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement:
        self.estimate(job.job_id)
        track = self.tracks[job.job_id]
        best = track.profiled or track.last
        if best is None:
            return Measurement(source=SOURCE)
        # all of it from the profile: W_j read under contention is inflated wherever the
        # GPU looks busy while it waits (see the module docstring)
        w = best.flops_per_iter or (track.last.flops_per_iter if track.last else 0.0)
        source = track.profiled_source if track.profiled else track.source + " (unprofiled)"
        return Measurement(flops_per_iter=w, comm_s=best.comm_s, period_s=best.period_s,
                           compute_s=best.compute_s, allreduce_bytes=best.bytes_per_iter,
                           source=source)

    def links(self) -> tuple[LinkObservation, ...]:
        """Each sampled port over the readings that arrived since the last call (about a
        report interval). The C sampler delivers a second of readings at a time, so a
        report may find none new: the ports' utilisation is then the previous one."""
        span = self.window.span()
        since = self._links_at
        if span is not None and span[1] > since:
            self._links_at = span[1]
        out = []
        each = self.window.rates_each(since)
        for c in self.counters:
            rates = each[c.name]
            obs = self.ports.observe(c.name, rates)
            if rates.size == 0 and c.name in self._last_links:
                obs = replace(obs, utilization=self._last_links[c.name])
            self._last_links[c.name] = obs.utilization
            out.append(obs)
        return tuple(out)

    def wants_profile(self, job_id: str) -> bool:
        track = self.tracks.get(job_id)
        return track is not None and track.wants_profile

