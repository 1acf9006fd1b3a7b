"""Which measurement and probing sources an agent runs, picked from its configuration.

The core asks these factories for its sources and then sees them only through the
protocols in sources.py: a new source is a branch here, never an edit of the core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cruxd.agent.sources import (
    MeasurementSource,
    NoProbing,
    ProbingSource,
    ReplayMeasurement,
    StaticMeasurement,
    StaticPaths,
)
from cruxd.config.model import Config
from cruxd.control.records import Nic

if TYPE_CHECKING:
    from transport.qp_records import ProcessRecords


@dataclass(frozen=True, slots=True)
class SourceInputs:
    """What an agent offers its sources: its configuration and views of its local state."""

    config: Config
    nics: tuple[Nic, ...]
    owners: Callable[[str], Iterable[int]]  # a job's registered pids
    qp_records: Callable[[], list[ProcessRecords]]  # the shims' QP records
    job_count: Callable[[], int]
    report_now: Callable[[], None]  # paths changed: tell the leader without waiting


MeasurementFactory = Callable[[SourceInputs], MeasurementSource]
ProbingFactory = Callable[[SourceInputs], ProbingSource]


def measurement_for(inputs: SourceInputs) -> MeasurementSource:
    a = inputs.config.agent
    if a.measurement == "replay" and a.measurement_file is not None:
        return ReplayMeasurement(a.measurement_file)
    if a.measurement == "live":
        # here, not at the top: numpy (~15 MB) loads only on hosts that measure live
        from cruxd.agent.measuring import LiveMeasurement
        from cruxd.agent.process_tree import belongs
        from cruxd.measure.sampling.job_bytes import QpBytesSource, SockBytesSource
        from cruxd.measure.sampling.nccl_figures import NcclFigures

        # the interposer's records beside the table's (DataPlane.qp_dir): each job's own bytes
        records = Path(a.decision_table).parent / "qps"
        return LiveMeasurement(inputs.config.measurement, inputs.nics, inputs.owners,
                               inputs.qp_records, inputs.job_count,
                               job_sources=[SockBytesSource(records),
                                            QpBytesSource(records)],
                               nccl=NcclFigures(records, inputs.owners, belongs))
    return StaticMeasurement(a.accept_job_hints)


def probing_for(inputs: SourceInputs) -> ProbingSource:
    c = inputs.config
    if c.agent.probing == "static" and c.agent.path_table is not None:
        return StaticPaths(c.agent.path_table, c.host_id)
    if c.agent.probing == "sweep":
        # here, not at the top: the probers and their raw sockets load only to sweep
        from cruxd.agent.sweeper import SweepProbing

        return SweepProbing(c.probing, c.host_id, inputs.report_now)
    return NoProbing()
