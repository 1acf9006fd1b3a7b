"""cruxd's process: the roles this host runs, signals, systemd, metrics.

One asyncio event loop carries everything. SIGTERM/SIGINT stop gracefully
(in-flight RPCs get `GRACE_S`, state is flushed); SIGHUP re-reads the
configuration file and keeps the running one if the new file is bad.

One cruxd per state directory (instance_lock.py): the lock is taken before anything in
the state or runtime directory is read or written, so a daemon refused it writes nothing;
and a leader that never started serving does not save its state on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from cruxd import __version__
from cruxd.config.hostport import format_hostport, parse_hostport
from cruxd.config.model import Config, LeaderConfig, changed_keys
from cruxd.config.parse import ConfigError, load_config, restart_required
from cruxd.daemon import instance_lock
from cruxd.daemon.exporter import Metrics
from cruxd.daemon.listen_check import bind_problem
from cruxd.daemon.logs import setup_logging
from cruxd.daemon.notify import Notifier, watchdog_loop
from cruxd.errors import UsageError
from cruxd.scheduler.dscp import level_dscp
from cruxd.waits import within

if TYPE_CHECKING:  # imported when a role starts: an agent-only host never loads the leader
    from cruxd.agent.core import Agent
    from cruxd.leader.ha import Candidate
    from cruxd.leader.service import Leader

LOG = logging.getLogger("cruxd")
GRACE_S = 5.0
SERVICE = "crux.v1.Leader"


def _loopback(listen_host: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listen_host, listen_host)
    return format_hostport(host, port)


class Daemon:
    def __init__(self, config: Config, path: Path | None, notifier: Notifier) -> None:
        self.config = config
        self.path = path
        self.notifier = notifier
        self.metrics = Metrics()
        self.stop_event = asyncio.Event()
        self.reload_event = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.health: HealthServicer | None = None
        self.leader: Leader | None = None
        self.candidate: Candidate | None = None  # [leader] ha = "etcd"
        self.agent: Agent | None = None
        self.lock: instance_lock.InstanceLock | None = None
        self.running = False  # start() completed

    def preflight(self) -> None:
        """What the configuration names but the host refuses is the operator's to fix: one
        line naming the key and exit 2, before anything starts (docs/configuration.md)."""
        from cruxd.rpc import tls

        c = self.config
        _require_extras(c)  # an agent-only install asked to lead: nothing written yet
        self._directory(c.state_dir, 0o750, "daemon.state_dir")
        try:  # first: a second cruxd on this state_dir must not touch the first's files
            self.lock = instance_lock.acquire(c.state_dir)
        except UsageError as exc:
            raise (self._refused(exc.where, exc.why) if exc.where else exc) from None
        self._directory(c.runtime_dir, 0o755, "daemon.runtime_dir")
        try:
            tls.check_files(c.tls)
        except UsageError as exc:
            raise self._refused(exc.where, exc.why) from None

    async def start(self) -> None:
        c = self.config
        leader_address = c.agent.leader
        if "leader" in c.roles:
            leader_address = await self._start_leader()
        if "agent" in c.roles:
            await self._start_agent(leader_address)
        self.metrics.leader, self.metrics.agent = self.leader, self.agent
        self.metrics.job_label = c.metrics.job_label
        try:  # last: "metrics on" in the log tells tests and operators the roles are up
            self.metrics.serve(c.metrics.listen)
        except OSError as exc:
            raise self._refused("metrics.listen",
                                f"cannot listen on {c.metrics.listen}: {_cause(exc)}") from None

    async def _start_agent(self, leader_address: str) -> None:
        from cruxd.agent.core import Agent
        from transport.decision_table import TableError

        try:
            self.agent = Agent(self.config, leader_address)
        except TableError as exc:  # cannot create, foreign file, another writer holds it
            raise self._refused("agent.decision_table", str(exc)) from None
        await self.agent.start()

    def _directory(self, path: Path, mode: int, key: str) -> None:
        try:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
        except OSError as exc:
            raise self._refused(key, f"cannot create {path}: {_cause(exc)}") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise self._refused(key, f"{path} is not writable by uid {os.geteuid()}")

    def _refused(self, key: str, why: str) -> ConfigError:
        return ConfigError(self.config.source, key, why)

    async def _start_leader(self) -> str:
        from cruxd.leader.handlers import add_leader
        from cruxd.leader.service import Leader, load_topology
        from cruxd.rpc import tls

        c = self.config
        # before the state is restored, and before gRPC, whose C core logs a failed bind
        # to stderr ahead of the one line the operator should see
        if why := bind_problem(c.leader.listen):
            raise self._refused("leader.listen", f"cannot listen on {c.leader.listen}: {why}")
        if c.leader.agent_timeout_s <= 1.5 * c.control.keepalive_s:
            LOG.warning("leader.agent_timeout_s (%g s) is not above 1.5 x control.keepalive_s "
                        "(%g s): agents of a leader that hangs find out by keepalive only after "
                        "that, and a successor may expire them first", c.leader.agent_timeout_s,
                        c.control.keepalive_s)
        leader = Leader(c, load_topology(c.leader.topology), self.metrics.on_plan,
                        self.metrics.on_reject)
        if not c.leader.ha:
            leader.restore()
        # gRPC sets SO_REUSEPORT by default: a second leader on a taken port would bind it
        # too and take half the agents' connections. A taken port is the operator's to fix.
        self.server = grpc.aio.server(options=[*tls.server_options(c.control.keepalive_s),
                                               ("grpc.so_reuseport", 0),
                                               *tls.dscp_options(c.control.dscp)])
        add_leader(leader, self.server, self.metrics.on_reject)
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if c.leader.reflection:
            _enable_reflection(self.server)
        creds = tls.server_credentials(c.tls)
        try:
            port = (self.server.add_secure_port(c.leader.listen, creds) if creds
                    else self.server.add_insecure_port(c.leader.listen))
        except RuntimeError:  # the TLS files were checked: binding itself failed
            raise self._refused("leader.listen", f"cannot listen on {c.leader.listen} (in use, "
                                "or not an address of this host)") from None
        await self.server.start()
        host, _ = parse_hostport(c.leader.listen)
        leader.address = c.leader.advertise or format_hostport(host, port)
        if c.leader.ha:
            from cruxd.leader.ha import Candidate

            if c.leader.etcd_insecure:
                LOG.warning("etcd without TLS (leader.etcd_insecure): whoever reaches etcd can "
                            "name the leader; a lab configuration (docs/security.md)")
            self.candidate = Candidate(leader, c.host_id)
            self.candidate.start()
        else:
            leader.start()
        # only now: shutdown() flushes self.leader's state, and a leader that never ran
        # has nothing to flush but what it read (rewriting it is how issue 31 lost state)
        self.leader = leader
        for name in (SERVICE, ""):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        LOG.info("leader listening on %s%s", leader.address, " (mTLS)" if creds else "")
        _lossless_note(c.leader)
        return _loopback(host, port)

    def status_line(self) -> str:
        parts: list[str] = []
        if self.agent is not None:
            parts.append(f"agent {self.config.host_id} ({len(self.agent.registry.jobs())} jobs)")
        if self.leader is not None:
            plan = self.leader.plan
            role = "" if self.leader.role == "single" else f"{self.leader.role} "
            parts.append(f"{role}leader {self.leader.address} "
                         f"(plan {plan.generation if plan else 0})")
        return ", ".join(parts)

    async def run(self) -> int:
        await self.start()
        self.running = True
        # A leader holds ~1M long-lived objects at 5,000 jobs; full collections of them
        # took 0.2-0.5 s each and freed nothing (bench/control_plane.py). Move what
        # start-up built out of the collector's sight and collect the young less often.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        self.notifier.ready(status=self.status_line())
        LOG.info("cruxd %s running: %s (config: %s)", __version__, self.status_line(),
                 self.config.source)
        dog = asyncio.create_task(watchdog_loop(self.notifier, self.stop_event))
        while not self.stop_event.is_set():
            waits = [asyncio.create_task(self.stop_event.wait()),
                     asyncio.create_task(self.reload_event.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if self.reload_event.is_set() and not self.stop_event.is_set():
                self.reload_event.clear()
                self.reload()
        await self.shutdown()
        await dog
        return 0

    def reload(self) -> None:
        self.notifier.reloading()
        try:
            if self.path is None:
                LOG.info("SIGHUP: running the embedded default, no file to re-read")
                return
            try:
                new = load_config(self.path)
            except ConfigError as exc:
                LOG.error("SIGHUP: %s; keeping the running configuration", exc)
                return
            later = restart_required(self.config, new)
            if later:
                LOG.warning("SIGHUP: %s changed but take effect only after a restart",
                            ", ".join(later))
            live = [k for k in changed_keys(self.config, new) if k not in later]
            self.config = new
            setup_logging(new.log_level, log_format=new.log_format)
            if self.leader is not None:
                self.leader.reload(new)
                _lossless_note(new.leader)
            if self.agent is not None:
                self.agent.reload(new)
            self.metrics.job_label = new.metrics.job_label  # the next scrape has it
            LOG.info("SIGHUP: configuration reloaded (%s)", ", ".join(live) or "no live change")
        finally:
            self.notifier.ready(status=self.status_line())

    async def shutdown(self) -> None:
        self.notifier.stopping()
        # a daemon that never ran says why in one line; "stopping" would only bury it
        level = logging.INFO if self.running else logging.DEBUG
        LOG.log(level, "stopping")
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        # each step is bounded: a stuck peer must not keep the daemon from exiting
        if self.agent is not None:
            await _bounded(self.agent.stop(), "agent")
        if self.candidate is not None:  # resigns: a standby takes over without the lease wait
            await _bounded(self.candidate.stop(), "election")
        if self.leader is not None:
            await _bounded(self.leader.stop(), "leader")
        if self.server is not None:
            await _bounded(self.server.stop(GRACE_S), "gRPC server", GRACE_S + 1)
        self.metrics.close()
        LOG.log(level, "stopped")


def _require_extras(c: Config) -> None:
    """The extras this host's roles need (cruxd/extras.py), before anything starts: an agent
    install asked to lead gets one line naming `crux[leader]`, not a traceback."""
    from cruxd.extras import require

    if "leader" in c.roles:
        require("scipy", "the leader role (daemon.roles)")
        if c.leader.reflection:
            require("grpc_reflection", "leader.reflection")
    if c.leader.ha == "etcd":
        require("aetcd", 'leader.ha = "etcd"')


def _enable_reflection(server: grpc.aio.Server) -> None:
    """Let grpcurl and grpc_cli list and call the leader's services without the .proto files."""
    from grpc_reflection.v1alpha import reflection

    from cruxd.rpc.gen.crux.v1 import leader_pb2

    names = (leader_pb2.DESCRIPTOR.services_by_name["Leader"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    LOG.info("gRPC reflection on: %s", ", ".join(names))


def _cause(exc: OSError) -> str:
    return exc.strerror or str(exc)


async def _bounded(step: Awaitable[object], what: str, timeout: float = GRACE_S) -> None:
    try:
        await within(step, timeout)
    except TimeoutError:
        LOG.error("stopping the %s took over %g s; going on without it", what, timeout)


async def serve(config: Config, path: Path | None, notifier: Notifier) -> int:
    daemon = Daemon(config, path, notifier)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop_event.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload_event.set)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks to stderr, for hangs
    try:
        daemon.preflight()
        try:
            return await daemon.run()
        except BaseException:
            with contextlib.suppress(Exception):
                await daemon.shutdown()
            raise
    finally:  # after shutdown's last write; a daemon refused the lock never held it
        if daemon.lock is not None:
            daemon.lock.release()


def _lossless_note(lc: LeaderConfig) -> None:
    """What the levels mean for RoCE: said once at start and on each reload, since a
    level off the fabric's lossless priorities turns its jobs' RoCE lossy."""
    where = ", ".join(f"DSCP {d} (priority {d >> 3})" for d in level_dscp(lc.levels, lc.dscp))
    if lc.lossless_priorities is None:
        LOG.warning("%d level(s) on %s, with no [leader] lossless_priorities: whether they "
                    "are lossless is not checked; declare the priorities the fabric runs PFC "
                    "on (docs/operations.md)", lc.levels, where)
    elif lc.lossless_priorities:
        LOG.info("%d level(s) on %s; lossless priorities %s", lc.levels, where,
                 list(lc.lossless_priorities))
    else:
        LOG.info("%d level(s) on %s; lossy RoCE (lossless_priorities = [])", lc.levels, where)
