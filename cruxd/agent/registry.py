"""Local jobs and the processes that own them.

A job is registered by a process on the agent's socket (crux-run, later the
shim); the agent learns that process's pid from the kernel (SO_PEERCRED) and
watches it with a pidfd, so a job that exits without deregistering (killed,
crashed) still leaves: the pidfd becomes readable when the process ends, which
the event loop notices without polling.

A job id belongs to the user who registered it first: other processes of that user join
it (another rank), another user is refused (`owner_uid`, checked by the core). Every change
is announced only once the registry holds it, owners included, so what the core saves on
a change is what a restarted agent must find.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cruxd.agent.job_ports import merge_ports
from cruxd.control.records import LocalJob, Measurement

LOG = logging.getLogger(__name__)


def process_start_time(pid: int, proc: str = "/proc") -> int | None:
    """Field 22 of /proc/PID/stat: tells a live process from a recycled pid."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class _Entry:
    job: LocalJob
    hints: Measurement
    uid: int
    owners: dict[int, int] = field(default_factory=dict)  # pid -> pidfd
    started: dict[int, int | None] = field(default_factory=dict)  # pid -> start time


@dataclass(frozen=True, slots=True)
class SavedJob:
    """What the state file keeps of a job: enough to re-adopt it after a restart."""
    job: LocalJob
    hints: Measurement
    uid: int
    owners: tuple[tuple[int, int | None], ...]  # (pid, its start time)


class Registry:
    def __init__(self, on_change: Callable[[str, str], None]) -> None:
        self._jobs: dict[str, _Entry] = {}
        self._on_change = on_change  # (job_id, "registered" | "deregistered" | "exited")
        self._loop: asyncio.AbstractEventLoop | None = None

    def register(self, job: LocalJob, hints: Measurement, pid: int, uid: int) -> LocalJob:
        """Add (or join) `job`, owned by live process `pid` of user `uid` (the caller checks
        `owner_uid` first); raises ProcessLookupError, or OSError (EMFILE) from pidfd_open."""
        loop = self._loop = self._loop or asyncio.get_running_loop()
        entry = self._jobs.get(job.job_id)
        if entry is not None and pid in entry.owners:
            entry.job = replace(entry.job, gpus=job.gpus, node_rank=job.node_rank,
                                nnodes=job.nnodes, command=job.command or entry.job.command,
                                tcp_ports=merge_ports(job.tcp_ports, entry.job.tcp_ports))
            entry.hints = hints
            self._on_change(job.job_id, "updated")
            return entry.job
        started = process_start_time(pid)
        pidfd = os.pidfd_open(pid)  # ProcessLookupError if already gone
        loop.add_reader(pidfd, self._owner_exited, job.job_id, pid)
        if entry is None:
            job = replace(job, registered_unix_ms=int(time.time() * 1000))
            entry = self._jobs[job.job_id] = _Entry(job, hints, uid)
            what = "registered"
        else:
            entry.job = replace(entry.job, gpus=max(entry.job.gpus, job.gpus),
                                tcp_ports=merge_ports(entry.job.tcp_ports, job.tcp_ports))
            what = f"joined by process {pid}"
        entry.owners[pid] = pidfd
        entry.started[pid] = started
        self._on_change(job.job_id, what)  # after the owner is in: the save must hold it
        return entry.job

    def deregister(self, job_id: str, pid: int | None = None) -> bool:
        """Drop `pid`'s ownership (every owner's when pid is None); True if the job left."""
        entry = self._jobs.get(job_id)
        if entry is None:
            return False
        for owner in [pid] if pid is not None else list(entry.owners):
            fd = entry.owners.pop(owner, None)
            entry.started.pop(owner, None)
            if fd is not None:
                self._unwatch(fd)
        if entry.owners:  # other processes of the job still run here
            self._on_change(job_id, f"left by process {pid}")
            return False
        del self._jobs[job_id]
        self._on_change(job_id, "deregistered")
        return True

    def _owner_exited(self, job_id: str, pid: int) -> None:
        entry = self._jobs.get(job_id)
        fd = entry.owners.pop(pid, None) if entry else None
        if fd is not None:
            self._unwatch(fd)
        LOG.info("job %s: process %d exited", job_id, pid)
        if entry is None:
            return
        entry.started.pop(pid, None)
        if not entry.owners:
            del self._jobs[job_id]
            self._on_change(job_id, "exited")
        elif fd is not None:
            self._on_change(job_id, f"left by process {pid}")

    def _unwatch(self, fd: int) -> None:
        if self._loop is not None:
            self._loop.remove_reader(fd)
        os.close(fd)

    def claim(self, job_id: str) -> str | None:
        """Who the job is (LocalJob.claim), None if it is not here."""
        entry = self._jobs.get(job_id)
        return None if entry is None else entry.job.claim

    def owners(self, job_id: str) -> tuple[int, ...]:
        entry = self._jobs.get(job_id)
        return tuple(entry.owners) if entry else ()

    def processes(self, job_id: str) -> int:
        """Processes registered in the job here."""
        entry = self._jobs.get(job_id)
        return len(entry.owners) if entry else 0

    def processes_of(self, uid: int) -> int:
        """Processes registered here by user `uid`, in all its jobs."""
        return sum(len(e.owners) for e in self._jobs.values() if e.uid == uid)

    def owner_uid(self, job_id: str) -> int | None:
        entry = self._jobs.get(job_id)
        return entry.uid if entry else None

    def __len__(self) -> int:
        return len(self._jobs)

    def hints(self, job_id: str) -> Measurement:
        return self._jobs[job_id].hints

    def jobs(self) -> list[LocalJob]:
        return [e.job for _, e in sorted(self._jobs.items())]

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def saved(self, job_id: str) -> SavedJob | None:
        """What the state file keeps of `job_id` now (None: it is gone); start times were
        read at registration, so this costs nothing per owner."""
        e = self._jobs.get(job_id)
        return None if e is None else SavedJob(e.job, e.hints, e.uid, tuple(e.started.items()))

    def snapshot(self) -> list[SavedJob]:
        return [s for job_id in sorted(self._jobs) if (s := self.saved(job_id)) is not None]

    def adopt(self, saved: SavedJob) -> int:
        """Re-register a job saved before a restart, for the owners still alive (same pid
        and start time, so a recycled pid is not mistaken for the job). Returns how many."""
        job, hints = saved.job, saved.hints
        if not job.claim:  # saved by an agent from before claims: its user's
            job = replace(job, claim=f"uid:{saved.uid}")
        alive = 0
        for pid, started in saved.owners:
            if started is None or process_start_time(pid) != started:
                continue
            try:
                registered = self.register(job, hints, pid, saved.uid)
            except ProcessLookupError:
                continue
            if alive == 0 and registered.registered_unix_ms != job.registered_unix_ms:
                self._jobs[job.job_id].job = replace(
                    registered, registered_unix_ms=job.registered_unix_ms)
            alive += 1
        return alive

    def close(self) -> None:
        for entry in self._jobs.values():
            for fd in entry.owners.values():
                self._unwatch(fd)
            entry.owners.clear()
