"""Where the agent's W_j/t_j and path tables come from.

The agent's core sees a source only through `MeasurementSource` / `ProbingSource`, so a
new source needs no change there. The live ones (NVML and NIC counters in measuring.py,
source-port sweeps in sweeper.py) use every hook; the static ones here (declared hints, a
replayed file, a path table from a file) take the hooks they have no use for from
`MeasurementDefaults` / `ProbingDefaults`. `cruxctl status` shows which source each agent
uses, so nobody mistakes a static one for measurements.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path
from typing import Protocol

from cruxd.config.model import Config
from cruxd.control.records import (
    DECLARED_SOURCE,
    HostPlan,
    LinkObservation,
    LocalJob,
    Measurement,
    PathTable,
    ProbedPath,
)
from cruxd.control.validate import InvalidMessage, check_host_id, check_measurement

LOG = logging.getLogger(__name__)


class MeasurementSource(Protocol):
    """W_j and t_j per local job, and what the host's links carry."""

    name: str  # shown in `cruxctl status` and the host's inventory

    def start(self) -> None:
        """Begin sampling (in threads of its own: the event loop must never wait on it)."""

    def stop(self) -> None: ...

    def reconfigure(self, config: Config) -> None:
        """A reloaded configuration (only the keys that apply without a restart change)."""

    def plan_changed(self, hp: HostPlan) -> None:
        """The leader's plan for this host arrived (it says which jobs are profiled now)."""

    def forget(self, live: set[str]) -> None:
        """Drop what is kept about jobs not in `live` (the jobs registered now)."""

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement: ...

    def wants_profile(self, job_id: str) -> bool:
        """Whether the job asks the leader for a new profiling window."""

    def links(self) -> tuple[LinkObservation, ...]:
        """The host's links as observed since the last call."""


class ProbingSource(Protocol):
    """The paths toward the peers of local jobs."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def plan_changed(self, hp: HostPlan) -> None:
        """The leader's plan for this host arrived (its routes name the peers)."""

    def paths(self) -> tuple[PathTable, ...]: ...


class MeasurementDefaults:
    """The hooks of `MeasurementSource` for a source that runs nothing and observes no link."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def reconfigure(self, config: Config) -> None:
        pass

    def plan_changed(self, hp: HostPlan) -> None:
        pass

    def forget(self, live: set[str]) -> None:
        pass

    def wants_profile(self, job_id: str) -> bool:
        return False

    def links(self) -> tuple[LinkObservation, ...]:
        return ()


class ProbingDefaults:
    """The hooks of `ProbingSource` for a source that runs nothing and ignores the plan."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def plan_changed(self, hp: HostPlan) -> None:
        pass


class StaticMeasurement(MeasurementDefaults):
    """Declared figures from the job's registration (when hints are accepted)."""

    def __init__(self, accept_hints: bool) -> None:
        self.accept_hints = accept_hints
        self.name = self._name()

    def _name(self) -> str:
        return "static (declared hints)" if self.accept_hints else "static (none)"

    def reconfigure(self, config: Config) -> None:
        self.accept_hints = config.agent.accept_job_hints  # applies without a restart
        self.name = self._name()

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement:
        if not self.accept_hints:
            return Measurement(source="static")
        return Measurement(hints.flops_per_iter, hints.comm_s, hints.period_s,
                           hints.compute_s, hints.allreduce_bytes, DECLARED_SOURCE)


class _WatchedJson:
    """A JSON file re-read when its mtime changes; a bad version keeps the last good one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: float | None = None
        self.data: object = None

    def current(self) -> object:
        try:
            mtime = self.path.stat().st_mtime
        except OSError as exc:
            if self._mtime is not None or self.data is None:
                LOG.warning("%s: %s; keeping the last good contents", self.path, exc.strerror)
                self._mtime = None
            return self.data
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                new = json.loads(self.path.read_text())
                self.validate(new)
                self.data = new
            except (OSError, ValueError, InvalidMessage) as exc:
                LOG.error("%s: %s; keeping the last good contents", self.path, exc)
        return self.data

    def validate(self, doc: object) -> None:
        raise NotImplementedError


class ReplayMeasurement(MeasurementDefaults, _WatchedJson):
    """{"jobs": {"<job id>": {"flops_per_iter": .., "comm_s": .., ...}}} from a file."""

    name = "replay"
    _FIELDS = tuple(f.name for f in fields(Measurement) if f.name != "source")

    def validate(self, doc: object) -> None:
        if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), dict):
            raise ValueError('expected {"jobs": {"<job id>": {...}}}')
        for jid, m in doc["jobs"].items():
            if not isinstance(m, dict) or set(m) - set(self._FIELDS):
                raise ValueError(f"jobs.{jid}: expected an object with keys from "
                                 f"{', '.join(self._FIELDS)}")
            check_measurement(self._build(m), f"jobs.{jid}")

    def _build(self, m: dict[str, float]) -> Measurement:
        try:
            return Measurement(**{k: float(v) for k, v in m.items()}, source="replay")
        except (TypeError, ValueError):
            raise ValueError("measurement values must be numbers") from None

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement:
        doc = self.current()
        m = doc.get("jobs", {}).get(job.job_id) if isinstance(doc, dict) else None
        return self._build(m) if m else Measurement(source="replay")


class NoProbing(ProbingDefaults):
    name = "none"

    def paths(self) -> tuple[PathTable, ...]:
        return ()


class StaticPaths(ProbingDefaults, _WatchedJson):
    """A path table from a file ({"path_table": [{"src", "dst", "paths": [...]}]}, the
    scenario format), the rows whose src is this host."""

    name = "static (file)"

    def __init__(self, path: Path, host_id: str) -> None:
        super().__init__(path)
        self.host_id = host_id
        self._tables: tuple[PathTable, ...] = ()  # of the last good file

    def validate(self, doc: object) -> None:
        rows = doc.get("path_table") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise ValueError('expected {"path_table": [...]}')
        self._tables = self._parse(rows)  # kept only if the whole file parses

    def _parse(self, rows: list[dict[str, object]]) -> tuple[PathTable, ...]:
        out = []
        for i, row in enumerate(rows):
            try:
                src, dst = str(row["src"]), str(row["dst"])
                check_host_id(dst, f"path_table[{i}].dst")
                paths = tuple(ProbedPath(tuple(map(str, p["hops"])), tuple(map(int, p["sports"])))
                              for p in row["paths"])  # type: ignore[attr-defined]
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"path_table[{i}]: {exc}") from None
            if src == self.host_id:
                out.append(PathTable(dst, paths))
        return tuple(out)

    def paths(self) -> tuple[PathTable, ...]:
        self.current()  # re-reads (and re-parses) only when the file changed
        return self._tables
