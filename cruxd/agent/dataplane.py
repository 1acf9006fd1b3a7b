"""The agent's side of the data plane: the shims' QP records and the PCIe semaphore file.

Both live next to the decision table in the runtime directory (/run/crux): `qps/`, where each
job process's shim records the QPs it connected (transport/qp_records.py), and `pcie`, one
priority semaphore per PCIe switch shared by a GPU and a NIC (transport/pcie.py). Everything
here fails open: a problem is logged and reported, and the jobs run without it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from transport.decision_table import TableError, TableReader
from transport.pcie import PcieLockError, PcieLocks, shared_links
from transport.qp_records import ProcessRecords, classify, read_dir

LOG = logging.getLogger("cruxd.agent")


class DataPlane:
    def __init__(self, table_path: Path, sysfs_root: str = "/sys") -> None:
        self.table_path = table_path
        self.qp_dir = table_path.parent / "qps"
        self.pcie_path = table_path.parent / "pcie"
        self.sysfs_root = sysfs_root
        self.pcie_links = 0
        self.problems: list[str] = []

    def start(self) -> None:
        try:  # any job's shim writes its own file here, like /tmp: sticky and world-writable
            self.qp_dir.mkdir(exist_ok=True)
            os.chmod(self.qp_dir, 0o1777)
        except OSError as exc:
            LOG.warning("QP records directory %s: %s (jobs run unrecorded)", self.qp_dir, exc)
        links = shared_links(self.sysfs_root)
        if not links:
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

    def records(self) -> list[ProcessRecords]:
        """The live job processes' QP records (the measurement reads which ports they use)."""
        return read_dir(self.qp_dir)[0]

    def qp_status(self) -> list[apb.QpStatus]:
        """The local jobs' QPs against the decisions in the table now; prunes the records
        of processes that are gone."""
        records, self.problems = read_dir(self.qp_dir, prune=True)
        for p in self.problems:
            LOG.debug("QP records: %s", p)
        if not records:
            return []
        try:
            with TableReader(self.table_path) as t:
                states = classify(records, t.decision_for)
        except (OSError, TableError) as exc:
            LOG.warning("decision table %s: %s", self.table_path, exc)
            states = classify(records, lambda job, peer: None)
        return [apb.QpStatus(pid=s.qp.pid, job_id=s.qp.job_id, device=s.qp.device,
                             qpn=s.qp.qpn, peer=s.qp.peer, state=s.state, sport=s.qp.sport,
                             traffic_class=s.qp.traffic_class, want_sport=s.want_sport,
                             want_traffic_class=s.want_traffic_class, outcome=s.qp.outcome)
                for s in states]
