"""The shape of cruxd's configuration, and what changed between two of them.

config.py reads and checks a file into these; keeping the dataclasses apart lets
code that only consumes a configuration import them without the parser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

ROLES = frozenset({"agent", "leader"})
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "text", "json", "journal")  # cruxd/daemon/logs.py
EMBEDDED = "<embedded default>"

# Keys a SIGHUP applies to the running daemon; a change to any other key is
# reported by restart_required and waits for a restart.
LIVE_KEYS = frozenset({
    "daemon.log_level", "daemon.log_format", "agent.report_interval_s", "agent.refresh_s",
    "agent.report_change",
    "agent.accept_job_hints",
    "agent.start_wait_s",
    "leader.levels", "leader.dscp", "leader.lossless_priorities", "leader.debounce_ms",
    "leader.profiling_s",
    "leader.change_threshold", "leader.change_hold_s", "leader.failure_settle_s",
    "leader.job_settle_s", "leader.tie_tolerance",
    "leader.agent_timeout_s",
    "metrics.job_label",
})


@dataclass(frozen=True, slots=True)
class AgentConfig:
    socket: Path
    socket_group: str | None  # None: the daemon's own group only
    leader: str  # host:port
    report_interval_s: float  # how often it looks whether a report is due (not a cadence)
    decision_table: Path
    table_capacity: int
    accept_job_hints: bool
    measurement: str  # "static" | "replay" | "live"
    measurement_file: Path | None  # set exactly when measurement == "replay"
    probing: str  # "static" | "sweep" | "none"
    path_table: Path | None
    addresses: tuple[str, ...]  # normalised IP texts; () -> discover at run time
    gpus: int | None  # None: detect with NVML
    reconnect_max_s: float
    leader_token: Path  # the leader's bearer token (plaintext leader); read per call
    # what one local user can make the agent hold (docs/configuration.md)
    max_connections: int = 256  # local-socket connections at once, all users
    max_connections_per_uid: int = 64
    request_timeout_s: float = 5.0  # for a whole request frame, and for sending its reply
    max_jobs: int = 256  # jobs registered here; matches leader.max_jobs_per_host's default
    # processes registered (one pidfd each): one job, and all jobs of one non-root user
    max_processes_per_job: int = 256
    max_processes_per_user: int = 1024
    refresh_s: float = 300.0  # a report at least this often, changed or not
    report_change: float = 0.05  # a measurement figure moving this much (relative) reports
    leader_fallback: tuple[str, ...] = ()  # other leaders to try, in turn, when it fails
    start_wait_s: float = 2.0  # crux-run's bound on waiting for a job's first decision


@dataclass(frozen=True, slots=True)
class ProbingConfig:
    """Source-port sweeps toward the peers of local jobs (agent.probing = "sweep")."""

    method: str  # "ttl" | "int"
    fabric_prefixes: tuple[str, ...]  # CIDR; probes go only to addresses inside these
    rate_pps: float  # source ports probed per second, all peers together (hard limit)
    interval_s: float  # re-verify each peer this often
    sports: tuple[int, int]  # first and last source port swept
    dport: int
    max_probes: int  # source ports per sweep at most
    expected_paths: int  # 0: unknown (stop by the coupon-collector rule)
    miss: float  # accepted chance of missing a path when the count is unknown
    max_hops: int
    timeout_s: float  # wait for each reply
    responder: bool  # answer other agents' INT probes
    responder_port: int
    responder_rate_pps: float
    tcp_dport: int = 0  # a TCP port probed toward every peer, beyond the jobs' own; 0: none
    tcp_sports: tuple[int, int] = (61000, 65535)  # first and last TCP source port swept
    tcp_ports_per_path: int = 8  # TCP ports collected per path (a decision holds 8)
    dscp: int = 56  # the probes' DSCP: CS7, the priority reserved for probing
    # jobs' listening ports probed toward one peer per sweep, at most (0: none, tcp_dport only)
    tcp_dports_per_peer: int = 8


@dataclass(frozen=True, slots=True)
class MeasureConfig:
    """NIC counters and GPUs sampled per job (agent.measurement = "live")."""

    rate_hz: float  # NIC counter samples per second
    sampler: str  # "auto" (the C loop where it can be loaded) | "python"
    window_s: float  # seconds of traffic one estimate looks at
    gpu: str  # "nvml" | "replay" | "none"
    gpu_file: Path | None  # the recording, with gpu = "replay"
    gpu_interval_s: float
    interfaces: tuple[str, ...]  # netdevs for TCP traffic; () -> those holding agent NICs
    rdma: bool  # sample RDMA port counters
    peak_tflops: float  # per GPU; 0 -> the datasheet table by device name
    settle_s: float  # skipped at the start of a profiling window
    sysfs: Path | None  # None: /sys


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    listen: str  # host:port; port 0 lets the OS pick
    topology: Path | None  # None: a star of the known hosts at star_nic_gbps
    levels: int
    dscp: tuple[int, ...] | None  # None: cruxd.scheduler.dscp.default_dscp(levels)
    # the priorities the fabric runs PFC on (cruxd.scheduler.dscp.fabric_levels): the
    # levels stay on them; (): lossy RoCE; None: not declared (levels and DSCP unchecked)
    lossless_priorities: tuple[int, ...] | None
    agent_timeout_s: float
    debounce_ms: float
    profiling_s: float
    change_threshold: float
    change_hold_s: float  # a measurement change must hold this long before it re-plans
    failure_settle_s: float  # after hops vanish: the longest a re-plan waits for reprobes
    job_settle_s: float  # a multi-host job's event: the longest a re-plan waits for its hosts
    tie_tolerance: float  # PlanConfig.tie_tolerance
    star_nic_gbps: float
    max_jobs: int
    max_jobs_per_host: int  # one host's report may hold at most this many jobs
    hosts: tuple[str, ...]  # host ids admitted; () -> any authenticated host
    insecure_remote: bool  # allow a plaintext listen address that is not loopback
    state_file: Path
    hints_dir: Path | None  # None: no periodic placement-hint export
    hints_interval_s: float
    reflection: bool  # serve grpc.reflection.v1alpha for grpcurl and friends
    # High availability (docs/control-plane.md): "" for one leader with its state file,
    # "etcd" for candidates elected through etcd, which also holds the state.
    ha: str = ""
    etcd_endpoints: tuple[str, ...] = ()  # host:port of the etcd members (client URLs)
    etcd_prefix: str = "/crux"  # keys: <prefix>/leader, /generation, /state
    etcd_lease_s: int = 3  # a dead leader is replaced about this long after it died
    etcd_ca: Path | None = None  # TLS to etcd: all three, or none
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_insecure: bool = False  # ha = "etcd" without TLS to etcd, knowingly (a lab)
    advertise: str = ""  # the address agents dial; "" -> leader.listen
    # "crux": probed source ports steer each flow onto its planned path; "fabric": adaptive
    # routing picks paths, crux sets levels and DSCP only (records.PATH_SELECTIONS)
    path_selection: str = "crux"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    ca: Path | None
    cert: Path | None
    key: Path | None
    server_name: str | None  # None: the host part of agent.leader

    @property
    def enabled(self) -> bool:
        return self.ca is not None and self.cert is not None and self.key is not None


# CS6, the class docs/scheduler.md reserves for crux's own RPCs
CONTROL_DSCP = 48


@dataclass(frozen=True, slots=True)
class ControlConfig:
    # DSCP of crux's own gRPC traffic (agent <-> leader, cruxctl, etcd); None: the kernel's
    # default class (no socket option set)
    dscp: int | None = CONTROL_DSCP
    # gRPC keepalive on both ends: a ping every keepalive_s, keepalive_s / 2 to answer it
    # (an agent's open plan stream is its liveness: docs/control-plane.md#liveness)
    keepalive_s: float = 10.0


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen: str | None  # None: no metrics endpoint
    # a second label with each job's id on every per-job series, for joins with exporters
    # that name jobs their own way (DCGM's hpc_job under Slurm, pod under Kubernetes)
    job_label: str = ""


@dataclass(frozen=True, slots=True)
class Config:
    roles: frozenset[str]
    host_id: str
    state_dir: Path
    runtime_dir: Path
    log_level: str
    agent: AgentConfig
    probing: ProbingConfig
    measurement: MeasureConfig
    leader: LeaderConfig
    tls: TlsConfig
    metrics: MetricsConfig
    source: str  # EMBEDDED or the file's path
    control: ControlConfig = ControlConfig()
    log_format: str = "auto"  # [daemon] log_format: one of LOG_FORMATS


DAEMON_KEYS = ("roles", "host_id", "state_dir", "runtime_dir", "log_level", "log_format")
_SECTIONS: dict[str, type] = {
    "agent": AgentConfig, "probing": ProbingConfig, "measurement": MeasureConfig,
    "leader": LeaderConfig,
    "tls": TlsConfig, "metrics": MetricsConfig, "control": ControlConfig}
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "daemon": DAEMON_KEYS,
    **{name: tuple(f.name for f in dataclasses.fields(cls)) for name, cls in _SECTIONS.items()},
}


def _flat(config: Config) -> dict[str, object]:
    out: dict[str, object] = {f"daemon.{k}": getattr(config, k) for k in DAEMON_KEYS}
    for name in _SECTIONS:
        part = getattr(config, name)
        out.update({f"{name}.{k}": getattr(part, k) for k in SECTION_KEYS[name]})
    return out


def changed_keys(old: Config, new: Config) -> list[str]:
    """Dotted keys whose effective values differ, in file order."""
    before, after = _flat(old), _flat(new)
    return [k for k in before if before[k] != after[k]]


def restart_required(old: Config, new: Config) -> list[str]:
    """Changed keys that a SIGHUP cannot apply: they take effect at the next restart."""
    return [k for k in changed_keys(old, new) if k not in LIVE_KEYS]
