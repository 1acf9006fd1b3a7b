"""The leader's placement hints: the view of its fabric, measured bandwidth from the agents'
reports, `GetHints`, and the periodic export to a directory (docs/hints.md)."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from cruxd.control.host_plans import fabric_for, plan_inputs
from cruxd.control.records import AgentReport, JobAssignment
from cruxd.hints.bandwidth import LIVE_SOURCE, BandwidthLog, samples_from
from cruxd.hints.collect import leader_view
from cruxd.hints.fabric_view import FabricView
from cruxd.hints.formats import FILE_NAMES, FORMATS, Rendered, render

if TYPE_CHECKING:
    from cruxd.leader.view import LeaderView

LOG = logging.getLogger(__name__)


class LeaderHints:
    def __init__(self, leader: LeaderView) -> None:
        self.leader = leader
        self.bandwidth = BandwidthLog()
        self._task: asyncio.Task[None] | None = None
        self._written: dict[str, str] = {}
        self._assignments: tuple[int, dict[str, JobAssignment]] = (-1, {})
        self._purged_at = 0  # leader.state.hosts_removed when the samples were last purged

    def observe(self, report: AgentReport) -> None:
        """Every report passes here: only reports with live-measured jobs cost anything,
        and the plan's job index is built once per plan generation, not per report."""
        self._purge()
        plan = self.leader.plan
        live = [j for j in report.jobs if j.measurement.source.startswith(LIVE_SOURCE)]
        if plan is None or not live:
            return
        if self._assignments[0] != plan.generation:
            self._assignments = (plan.generation, {a.job_id: a for a in plan.jobs})
        self.bandwidth.add(samples_from(report.host.host_id, live, self._assignments[1],
                                        int(self.leader.clock() * 1000)))

    def _purge(self) -> None:
        """Drop the samples of hosts the cluster state no longer holds (O(samples), and
        only after a host was removed)."""
        state = self.leader.state
        if self._purged_at == state.hosts_removed:
            return
        self._purged_at = state.hosts_removed
        kept = [x for x in self.bandwidth.samples()
                if x.src in state.agents and x.dst in state.agents]
        self.bandwidth = BandwidthLog(self.bandwidth.keep)
        self.bandwidth.add(kept)

    def view(self) -> FabricView | None:
        """None before any agent has reported (nothing is known of the fabric)."""
        self._purge()
        ld = self.leader
        if not ld.state.live_agents():
            return None
        lc = ld.config.leader
        now = ld.clock()
        inputs = plan_inputs(ld.state, now)
        plan = ld.plan
        topo = plan.fabric if plan is not None else None
        if topo is None:  # no plan yet, or one restored from disk: build it as planning does
            topo, _, _ = fabric_for(inputs, ld.topology, ld.plan_config())
        return leader_view(
            topo, gpus={h: r.inventory.gpus for h, r in ld.state.live_agents().items()},
            jobs=inputs.jobs, assignments=plan.jobs if plan else (),
            plan=plan.result if plan else None, levels=lc.levels,
            measured=self.bandwidth.link_measured(), now_ms=int(now * 1000))

    def render(self, fmt: str) -> Rendered | None:
        view = self.view()
        return None if view is None else render(fmt, view, self.bandwidth.samples())

    # --- periodic export ---------------------------------------------------------
    def start(self) -> None:
        if self.leader.config.leader.hints_dir is not None:
            self._task = asyncio.create_task(self._exporter(), name="hints-export")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _exporter(self) -> None:
        while True:
            self.export_once()
            await asyncio.sleep(self.leader.config.leader.hints_interval_s)

    def export_once(self) -> int:
        """Write every format whose text changed; returns how many files were written."""
        out = self.leader.config.leader.hints_dir
        view = self.view() if out is not None else None
        if out is None or view is None:
            return 0
        written = 0
        samples = self.bandwidth.samples()
        for fmt in FORMATS:
            try:
                text = render(fmt, view, samples).text
            except Exception:  # one broken format must not stop the others
                LOG.exception("hints: cannot render %s", fmt)
                continue
            if self._written.get(fmt) == text:
                continue
            try:
                _write_atomic(out / FILE_NAMES[fmt], text)
            except OSError as exc:
                LOG.error("hints: cannot write %s: %s", out / FILE_NAMES[fmt], exc.strerror)
                continue
            self._written[fmt] = text
            written += 1
        if written:
            LOG.info("hints: wrote %d file(s) to %s", written, out)
        return written


def _write_atomic(path: Path, text: str) -> None:
    """Pollers never see half a file: write a temporary beside it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
