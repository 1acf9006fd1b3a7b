"""Where the agent's W_j/t_j and path tables come from.

Later work plugs real sources in behind these two small interfaces (NVML and NIC
counters for measurement, source-port sweeps for probing). What exists now is
static: declared hints, a replayed file, a path table from a file; `cruxctl
status` shows which source each agent uses, so nobody mistakes them for
measurements.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path
from typing import Protocol

from cruxd.control.records import LocalJob, Measurement, PathTable, ProbedPath
from cruxd.control.validate import InvalidMessage, check_host_id, check_measurement

LOG = logging.getLogger(__name__)


class MeasurementSource(Protocol):
    name: str

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement: ...


class ProbingSource(Protocol):
    name: str

    def paths(self) -> tuple[PathTable, ...]: ...


class StaticMeasurement:
    """Declared figures from the job's registration (when hints are accepted)."""

    def __init__(self, accept_hints: bool) -> None:
        self.accept_hints = accept_hints
        self.name = "static (declared hints)" if accept_hints else "static (none)"

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement:
        if not self.accept_hints:
            return Measurement(source="static")
        return Measurement(hints.flops_per_iter, hints.comm_s, hints.period_s,
                           hints.compute_s, hints.allreduce_bytes, "hints")


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


class ReplayMeasurement(_WatchedJson):
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


class NoProbing:
    name = "none"

    def paths(self) -> tuple[PathTable, ...]:
        return ()


class StaticPaths(_WatchedJson):
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
