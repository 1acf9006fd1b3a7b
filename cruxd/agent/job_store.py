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
from pathlib import Path
from typing import Any

from cruxd.agent.registry import SavedJob
from cruxd.config.statefile import write_atomic
from cruxd.control.codec import from_dict, to_dict
from cruxd.control.records import LocalJob, Measurement

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


# what json and from_doc raise on a line this agent did not write whole
_DAMAGED = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
            OverflowError)

class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal")
        self._lines = 0

    def load(self) -> list[SavedJob]:
        """The saved jobs; FileNotFoundError when there is nothing saved, ValueError (and
        KeyError, TypeError, AttributeError) when the snapshot is not one this agent wrote.
        A torn last journal line (a crash mid-append) is ignored."""
        jobs: dict[str, SavedJob] = {}
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("format") == STATE_FORMAT:
                for e in doc["jobs"]:
                    s = from_doc(e)
                    jobs[s.job.job_id] = s
        except FileNotFoundError:
            if not self.journal.exists():
                raise
        except (RecursionError, OverflowError) as exc:  # nesting, or int(1e400): damaged
            raise ValueError(f"{self.path}: {type(exc).__name__}: {exc}") from None
        with contextlib.suppress(FileNotFoundError), open(self.journal) as f:
            for line in f:
                try:  # a damaged line costs that change, not the jobs around it
                    change = json.loads(line)
                    if "drop" in change:
                        jobs.pop(str(change["drop"]), None)
                    else:
                        s = from_doc(change["set"])
                        jobs[s.job.job_id] = s
                except _DAMAGED:
                    continue
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
