"""crux-run's wait for a job's first decision, before the job starts.

NCCL and gloo make their connections while a communicator is set up, right after start, and
a TCP connection is never re-steered (most RDMA QPs neither: only mlx5 can move a live one).
So crux-run waits until the job's entry is in the decision table the shim reads, and only then
starts the job. The profiling slot is such an entry: a job being profiled already has its
level. A provisional entry (the leader has not yet heard from every host of the job, or has
no probed path between them) is not enough: its paths and ports come with the next plan.
The wait is bounded and fails open: past the bound the job starts anyway.

The table is read, not the agent asked: what counts is what the shim will read. An entry
counts once the table's header says its plan's batch is whole (the writer publishes the
header's plan generation after every entry of the batch), so a job never starts between its
job-wide entry and its per-peer ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transport.decision_table import TableError, TableReader

POLL_S = 0.002  # the header's generation is one pread: cheap enough to look every 2 ms


@dataclass(frozen=True, slots=True)
class Waited:
    found: bool
    waited_s: float
    plan_generation: int  # of the job's entry; 0 when not found
    why: str  # when not found: what the table looked like at the end


def wait_for_decision(table: Path, job_id: str, bound_s: float,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> Waited:
    """Wait until `table` holds a whole plan with an entry for `job_id`, at most `bound_s`."""
    start = clock()
    deadline = start + bound_s
    reader: TableReader | None = None
    seen = -1  # the table generation last looked through
    why = "no entry for the job yet"
    try:
        while True:
            try:
                if reader is not None and reader.retired:  # the agent replaced the file
                    reader.close()
                    reader, seen = None, -1
                if reader is None:
                    reader = TableReader(table)
                header = reader.header()
                if header.generation != seen:
                    seen = header.generation
                    d = reader.lookup(job_id)
                    if d is None:
                        why = "the table holds no entry for the job"
                    elif d.provisional:
                        why = ("its decision is provisional: the leader has not heard from "
                               "every host of the job, or has no probed path between them")
                    elif header.plan_generation >= d.plan_generation:
                        return Waited(True, clock() - start, d.plan_generation, "")
            except (OSError, TableError) as exc:  # not there yet, or being replaced
                if reader is not None:
                    reader.close()
                reader, seen = None, -1
                why = f"cannot read the table: {exc}"
            if clock() >= deadline:
                return Waited(False, clock() - start, 0, why)
            sleep(POLL_S)
    finally:
        if reader is not None:
            reader.close()
