"""The agent's jobs across restarts: a snapshot plus a journal of changes since it.

Rewriting the whole state file on every registration made registering O(jobs) (4,100
sequential registrations took 490 s in the audit). Instead a change appends one line for
the job it touched to `<state>.journal`, and the snapshot is rewritten (atomically) only
when the journal has grown past the number of jobs: O(1) per change, amortised. Loading
applies the journal's lines in order over the snapshot; each line holds a job's whole
entry (or its removal), so replaying a journal that a crash left beside a newer snapshot
gives the same result.

Appends are written, not fsynced: what must survive is a crash of the agent (SIGKILL), and
the page cache outlives that. After a power loss every job process is gone too, so a lost
line loses nothing the restart would have kept.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cruxd.agent.registry import SavedJob
from cruxd.config.statefile import read_bounded, write_atomic
from cruxd.control.codec import from_dict, to_dict
from cruxd.control.records import LocalJob, Measurement
from cruxd.control.validate import (
    InvalidMessage,
    check_job_id,
    check_local_job,
    check_measurement,
)

STATE_FORMAT = "crux-agent-state/1"
COMPACT_MIN = 256  # journal lines kept before the first rewrite, whatever the job count


def to_doc(s: SavedJob) -> dict[str, Any]:
    return {"job": to_dict(s.job), "hints": to_dict(s.hints), "uid": s.uid,
            "owners": [list(o) for o in s.owners]}


def from_doc(e: dict[str, Any]) -> SavedJob:
    owners = tuple((int(p), None if t is None else int(t)) for p, t in e["owners"])
    uid = e.get("uid")
    if uid is None:  # saved by an agent that did not bind ids to users: the first owner's
        uid = _process_uid(owners[0][0]) if owners else 0
    return SavedJob(from_dict(LocalJob, e["job"]), from_dict(Measurement, e["hints"]),
                    int(uid), owners)


def _process_uid(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return 0


# what json, from_doc and the checks raise on an entry this agent did not write whole
_DAMAGED = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
            OverflowError, InvalidMessage)
MAX_LINE = 64 << 10  # one job's entry is well under 2 KiB: a longer line is damage
MAX_SNAPSHOT = 64 << 20  # 4,096 jobs' entries are a few MB


def _entry(e: Any) -> SavedJob:
    """A saved job, checked as a Report's job is (a job id the leader would refuse, adopted
    unchecked, had the leader refuse every Report of the host: issue 37)."""
    s = from_doc(e)
    check_local_job(s.job)
    check_measurement(s.hints, "hints")
    return s


class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal")
        self._lines = 0
        self.skipped = 0  # entries the last load found damaged or invalid, and skipped
        self.snapshot_error = ""  # why the last load could not use the snapshot

    def load(self) -> list[SavedJob]:
        """The saved jobs: the snapshot's, then the journal's changes over them.
        FileNotFoundError when there is nothing saved. A damaged snapshot costs its own
        entries (`snapshot_error` says why), not the journal's; a damaged or invalid entry
        or line costs that entry (`skipped` counts them); a torn last journal line (a crash
        mid-append) is one of those."""
        jobs: dict[str, SavedJob] = {}
        self.skipped, self.snapshot_error = 0, ""
        try:
            doc = json.loads(read_bounded(self.path, MAX_SNAPSHOT))
            if doc.get("format") == STATE_FORMAT:
                for e in doc["jobs"]:
                    try:
                        s = _entry(e)
                    except _DAMAGED:
                        self.skipped += 1
                        continue
                    jobs[s.job.job_id] = s
        except FileNotFoundError:
            if not self.journal.exists():
                raise
        except (OSError, *_DAMAGED) as exc:  # the journal may still hold the jobs
            self.snapshot_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            jobs.clear()
        for line in _lines(self.journal):
            try:  # a damaged line costs that change, not the jobs around it
                change = json.loads(line)
                if "drop" in change:
                    jobs.pop(check_job_id(str(change["drop"])), None)
                else:
                    s = _entry(change["set"])
                    jobs[s.job.job_id] = s
            except _DAMAGED:
                self.skipped += 1
        return list(jobs.values())

    def changed(self, job_id: str, saved: SavedJob | None, jobs: int) -> bool:
        """Append `job_id`'s new entry (None: it left). True when the journal is now longer
        than `jobs` (and COMPACT_MIN): time to `rewrite`. OSError if it cannot be written."""
        change = {"drop": job_id} if saved is None else {"set": to_doc(saved)}
        line = (json.dumps(change, separators=(",", ":"), allow_nan=False) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)  # one write: a line is whole or torn at the end, never mixed
        finally:
            os.close(fd)
        self._lines += 1
        return self._lines > max(COMPACT_MIN, jobs)

    def rewrite(self, jobs: list[SavedJob]) -> None:
        """The whole state as a new snapshot; the journal it covers is then emptied."""
        write_atomic(self.path, {"format": STATE_FORMAT, "jobs": [to_doc(s) for s in jobs]})
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.journal, 0)
        self._lines = 0


def _lines(path: Path) -> Iterator[bytes]:
    """The file's lines, each at most MAX_LINE bytes: a longer one is yielded as b"" (a
    damaged line) and its rest skipped unread into memory (a 200 MB one-line journal cost
    497 MB of RSS: issue 37)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; a missing file yields nothing)
    except FileNotFoundError:
        return
    with f:
        while line := f.readline(MAX_LINE + 1):
            if len(line) <= MAX_LINE:
                yield line
                continue
            while line and not line.endswith(b"\n"):  # the rest of the long line
                line = f.readline(MAX_LINE + 1)
            yield b""
