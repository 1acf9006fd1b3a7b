"""The agent's side of the data plane: the shims' QP records and the PCIe semaphore file.

Both live next to the decision table in the runtime directory (/run/crux): `qps/`, where each
job process's shim records the QPs it connected (transport/qp_records.py), and `pcie`, one
priority semaphore per PCIe switch shared by a GPU and a NIC (transport/pcie.py), with
`pcie-links`, which RDMA device crosses which of them (transport/pcie_links.py). Everything
here fails open: a problem is logged and reported, and the jobs run without it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import NamedTuple

from cruxd.agent.nic_tc import tc_overrides, winning_class
from cruxd.agent.process_tree import belongs
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from transport.decision_table import TableError, TableReader
from transport.pcie import PcieLockError, PcieLocks, PcieSwitch, shared_links
from transport.pcie_links import LinkMap, LinkMapError, device_links, write_map
from transport.pid_files import MAX_FILES, SkippedFiles
from transport.qp_records import ProcessRecords, classify, read_dir
from transport.sock_records import U64_MAX, SockCounts, by_job, sat_sum
from transport.sock_records import read_dir as read_sock_dir

LOG = logging.getLogger("cruxd.agent")
# LinkStats counts of holds and queue slots the semaphores took away (issue 37's attacks)
PCIE_TAKEOVERS = ("expired", "stopped", "foreign", "stale", "revoked", "repairs", "recovered")


class JobOwners(NamedTuple):
    """Who a registered job is on this host: the records that name it must be theirs."""

    uid: int
    pids: frozenset[int]


class DataPlane:
    def __init__(self, table_path: Path, sysfs_root: str = "/sys") -> None:
        self.table_path = table_path
        self.qp_dir = table_path.parent / "qps"
        self.pcie_path = table_path.parent / "pcie"
        self.pcie_map_path = table_path.parent / "pcie-links"  # device -> link, for the shims
        self.sysfs_root = sysfs_root
        self.pcie_links = 0
        self.problems: list[str] = []
        self.skips = SkippedFiles(LOG)  # record files refused, over all scans
        # ports-busy connects of the registered jobs (`_jobs`): the live processes' counters
        # as last read, by (job, file, file creation), and per job the sum of those of its
        # processes that exited since it registered (their files go, the count stays)
        self._jobs: Mapping[str, JobOwners] = {}
        self._busy_live: dict[tuple[str, str, int], int] = {}
        self._busy_gone: dict[str, int] = {}
        self.last_busy: dict[str, int] = {}  # ports_busy's last answer (the metrics read it)
        self.sock_records: list[SockCounts] = []  # the socket counters as last read
        self._locks: PcieLocks | None = None  # the semaphore file, open for revoke_stuck

    @property
    def skipped_files(self) -> int:
        return self.skips.count

    def start(self) -> None:
        try:  # any job's shim writes its own file here, like /tmp: sticky and world-writable
            self.qp_dir.mkdir(exist_ok=True)
            os.chmod(self.qp_dir, 0o1777)
        except OSError as exc:
            LOG.warning("QP records directory %s: %s (jobs run unrecorded)", self.qp_dir, exc)
        links = shared_links(self.sysfs_root)
        if not links:
            try:  # a stale map would gate on links this host does not have
                self.pcie_map_path.unlink(missing_ok=True)
            except OSError as exc:
                LOG.warning("PCIe link map %s: %s", self.pcie_map_path, exc)
            return
        try:  # a restarted agent keeps a matching file: jobs hold it mapped, maybe locked
            kept = PcieLocks.open(self.pcie_path)
            same = kept.links == len(links)
            kept.close()
        except PcieLockError:
            same = False  # missing or not a valid semaphore file: make a new one
        try:
            if not same:
                PcieLocks.create(self.pcie_path, len(links)).close()
            self.pcie_links = len(links)
            LOG.info("PCIe semaphores: %d shared link(s) in %s", len(links), self.pcie_path)
        except PcieLockError as exc:
            LOG.warning("PCIe semaphores unavailable (jobs run without them): %s", exc)
            return
        self._write_link_map(links)

    def pcie_takeovers(self) -> dict[str, int]:
        """What the semaphores took from whom, summed over the links (PCIE_TAKEOVERS of
        LinkStats); {} without shared links or a readable file."""
        locks = self._pcie()
        if locks is None:
            return {}
        try:
            stats = [locks.stats(link) for link in range(locks.links)]
        except PcieLockError:
            self.close()
            return {}
        return {k: sum(getattr(s, k) for s in stats) for k in PCIE_TAKEOVERS}

    def _pcie(self) -> PcieLocks | None:
        """The semaphore file, opened once (None without shared links, or unreadable)."""
        if not self.pcie_links:
            return None
        if self._locks is None:
            try:
                self._locks = PcieLocks.open(self.pcie_path)
            except PcieLockError as exc:
                LOG.debug("PCIe semaphores %s: %s", self.pcie_path, exc)
                return None
        return self._locks

    def revoke_stuck(self, max_hold_s: float) -> list[tuple[int, int]]:
        """Take back every PCIe link held for `max_hold_s` or more ((link, pid) of each):
        a job stopped or looping with a link would hold it from every other job's posts,
        however its waiters' leases judge it (issue 37). Nothing without shared links."""
        locks = self._pcie()
        if locks is None:
            return []
        try:
            return locks.revoke_stuck(max_hold_s)
        except PcieLockError as exc:  # replaced or damaged: open it afresh next time
            LOG.debug("PCIe semaphores %s: %s", self.pcie_path, exc)
            self.close()
            return []

    def close(self) -> None:
        if self._locks is not None:
            self._locks.close()
            self._locks = None

    def _write_link_map(self, links: list[PcieSwitch]) -> None:
        """Tell the jobs' shims which link each RDMA device's traffic crosses."""
        devices = device_links(self.sysfs_root, links)
        try:
            write_map(self.pcie_map_path, LinkMap(len(links), tuple(devices)))
            LOG.info("PCIe link map: %d RDMA device(s) in %s", len(devices), self.pcie_map_path)
        except (OSError, LinkMapError) as exc:
            LOG.warning("PCIe link map %s: %s (jobs run ungated)", self.pcie_map_path, exc)

    def records(self) -> list[ProcessRecords]:
        """The live job processes' QP records (the measurement reads which ports they use)."""
        records, problems = read_dir(self.qp_dir)
        self.skips.note("QP records", problems)
        return records

    def tc_overrides(self) -> list[apb.NicTcOverride]:
        """RDMA ports whose driver overrides every QP's traffic class."""
        return [apb.NicTcOverride(port=o.port, traffic_class=o.traffic_class)
                for o in tc_overrides(Path(self.sysfs_root))]

    def qp_status(self, overrides: Sequence[apb.NicTcOverride] | None = None
                  ) -> list[apb.QpStatus]:
        """The local jobs' QPs against the decisions in the table now, with the class each one's
        packets carry (`overrides`: the ports' traffic-class overrides, read here when not
        given); prunes the records of processes that are gone."""
        records, self.problems = read_dir(self.qp_dir, prune=True)
        self.skips.note("QP records", self.problems)
        if not records:
            return []
        try:
            with TableReader(self.table_path) as t:
                states = classify(records, t.decision_for)
        except (OSError, TableError) as exc:
            LOG.warning("decision table %s: %s", self.table_path, exc)
            states = classify(records, lambda job, peer: None)
        if overrides is None:
            overrides = self.tc_overrides()
        override = {o.port: o.traffic_class for o in overrides}
        out = []
        for s in states:
            q = s.qp
            wire, source = winning_class(override.get(f"{q.device}/{q.port}"),
                                         q.outcome in ("applied", "sport-range"),
                                         q.traffic_class, q.orig_traffic_class)
            out.append(apb.QpStatus(
                pid=q.pid, job_id=q.job_id, device=q.device, qpn=q.qpn, peer=q.peer,
                state=s.state, sport=q.sport, traffic_class=q.traffic_class,
                want_sport=s.want_sport, want_traffic_class=s.want_traffic_class,
                outcome=q.outcome, orig_traffic_class=q.orig_traffic_class,
                wire_traffic_class=wire, traffic_class_source=source))
        return out

    def _sock_records(self) -> list[SockCounts]:
        """The live processes' socket counters; prunes the files of processes that are gone,
        keeping their ports-busy counts for their job (ports_busy)."""
        gone: list[SockCounts] = []
        records, problems = read_sock_dir(self.qp_dir, prune=True, gone=gone)
        self.skips.note("socket counters", problems)
        # by file, not pid: a gone file's pid is the job's own view, a live one's the host's.
        # A file counts for the job it names only when it is the job's (issue 37: any process
        # can name any job): a live writer must be one of its processes, a gone one's file its
        # user's (the process cannot be asked any more)
        jobs = self._jobs
        live = {(r.job_id, r.file, r.created_ns): r.counters["ports-busy"] for r in records
                if r.job_id in jobs and belongs(r.pid, jobs[r.job_id].pids)}
        ended = {(r.job_id, r.file, r.created_ns): r.counters["ports-busy"] for r in gone
                 if r.job_id in jobs and r.owner_uid in (0, jobs[r.job_id].uid)}
        for key in self._busy_live.keys() - live.keys():  # exited: its file's last word
            if key[0] in self._jobs:
                ended[key] = max(ended.get(key, 0), self._busy_live[key])
        for (job, _, _), n in ended.items():
            if n:
                self._busy_gone[job] = self._busy_gone.get(job, 0) + n
        self._busy_live = {k: n for k, n in live.items() if n}
        self.sock_records = records
        return records

    def ports_busy(self, jobs: Mapping[str, JobOwners]) -> dict[str, int]:
        """Per registered job (`jobs`: its user and registered processes), its TCP connects
        that fell back to a kernel port because every decided port of the route was in use,
        since it registered here (the interposer's ports-busy outcome, summed over its
        processes, exited ones included)."""
        self._jobs = dict(jobs)
        self._busy_gone = {j: n for j, n in self._busy_gone.items() if j in self._jobs}
        self._sock_records()
        out = dict(self._busy_gone)
        for (job, _, _), n in self._busy_live.items():
            out[job] = out.get(job, 0) + n
        out = {job: min(n, U64_MAX) for job, n in out.items()}  # the jobs wrote them
        self.last_busy = out  # replaced whole: a scrape thread reads it
        return out

    def nccl_status(self) -> list[apb.NcclProfilerStatus]:
        """The NCCL profiler plugin's records (`qps/nccl-<pid>`), per job over its live
        processes; prunes the files of processes that are gone."""
        # here: numpy (the reader's) loads only on a host whose jobs left such records
        if not any(p.name.startswith("nccl-") for p in _listing(self.qp_dir)):
            return []
        from transport.nccl_records import CHAIN, NcclRecord, read_dir

        records, problems = read_dir(self.qp_dir, prune=True)
        self.skips.note("NCCL profiler records", problems)
        now = time.monotonic_ns()
        jobs: dict[str, list[NcclRecord]] = {}
        for r in records:
            jobs.setdefault(r.job_id, []).append(r)
        return [apb.NcclProfilerStatus(
            job_id=job, processes=len(rs), api_version=max(r.api_version for r in rs),
            communicators=sat_sum(len(r.comms) for r in rs),
            communicators_dropped=sat_sum(r.comms_dropped for r in rs),
            collectives=sat_sum(c.colls for r in rs for c in r.comms),
            events=sat_sum(r.events for r in rs), bad_events=sat_sum(r.bad_events for r in rs),
            chain=max((r.chain for r in rs), key=lambda c: CHAIN.index(c) if c in CHAIN else 9),
            chained=next((r.chained for r in rs if r.chained), ""),
            last_write_age_s=max(0.0, (now - max(r.written_ns for r in rs)) / 1e9))
            for job, rs in sorted(jobs.items())]

    def sock_status(self) -> list[apb.SockStatus]:
        """The TCP interposer's connect counters (`qps/sock-<pid>`), summed per job over live
        processes; prunes the files of processes that are gone."""
        records = self._sock_records()
        return [apb.SockStatus(job_id=j.job_id, processes=j.processes, calls=j.calls,
                               accepts=j.accepts,
                               **{k.replace("-", "_"): v for k, v in j.counters.items()})
                for j in by_job(records)]


def _listing(directory: Path) -> Iterator[Path]:
    """The directory's entries, at most pid_files.MAX_FILES of them; none if it is missing."""
    try:
        yield from islice(directory.iterdir(), MAX_FILES)
    except OSError:
        return
