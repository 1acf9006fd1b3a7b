"""The TCP ports a local job listens on: declared by crux-run, learned from the interposer.

Peers' agents probe toward these ports, and the leader puts the job's port at a host into
the routes toward that host (cruxd.control.tcp_routes). Declared ports (`crux-run
--tcp-port`) come first, in the order given: a route steers the first port with probed
source ports, so a job names the port its collective uses. Learned ports follow: the ports
the socket interposer saw the job's processes listen on (`listen_ports` in their
`sock-<pid>` records, transport/sock_records.py). At most MAX_JOB_PORTS in all.

A record is another process's claim, in a world-writable directory: its ports count for a
job only when the process runs as the user who registered the job, so no other user can
point a job's probing and routes at ports of their choosing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cruxd.control.validate import MAX_JOB_TCP_PORTS
from transport.pid_files import process_uids
from transport.sock_records import SockCounts

MAX_JOB_PORTS = MAX_JOB_TCP_PORTS


def merge_ports(declared: Iterable[int], learned: Iterable[int]) -> tuple[int, ...]:
    """Declared then learned ports, each once, only 1..65535, at most MAX_JOB_PORTS."""
    out: dict[int, None] = {}
    for port in (*declared, *learned):
        if 1 <= port <= 65535 and len(out) < MAX_JOB_PORTS:
            out.setdefault(port)
    return tuple(out)


def learned_ports(records: Iterable[SockCounts], job_uid: Callable[[str], int | None],
                  uids_of: Callable[[int], set[int] | None] = process_uids
                  ) -> dict[str, tuple[int, ...]]:
    """Per registered job (`job_uid`: its user, None for a job not registered here), the
    ports its processes' records say they listen on, in pid order then listen order."""
    out: dict[str, dict[int, None]] = {}
    for r in sorted(records, key=lambda r: r.pid):
        uid = job_uid(r.job_id) if r.job_id else None
        # a version 1 record (an interposer from before listen_ports) has none
        if uid is None or not r.listen_ports or uid not in (uids_of(r.pid) or ()):
            continue
        mine = out.setdefault(r.job_id, {})
        for port in r.listen_ports:
            mine.setdefault(port)
    return {job: tuple(ports) for job, ports in out.items()}
