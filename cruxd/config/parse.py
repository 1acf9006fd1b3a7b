"""cruxd's configuration: one TOML file, or the embedded default, checked whole.

Every error is one line, ``<file>: <section.key>: <reason>``, so a bad file is fixed
in one look, at start-up and on a SIGHUP reload alike (docs/configuration.md). This
module only reads and checks: it creates no directories and opens no sockets.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path

from cruxd.config.fields import (
    FieldError,
    Range,
    Section,
    default_runtime_dir,
    default_state_dir,
    describe,
    did_you_mean,
    home_dir,
    private_dir_problem,
    quote_key,
    shared_tmp_runtime_dir,
)
from cruxd.config.ha_section import parse_ha
from cruxd.config.hostport import format_hostport, parse_hostport
from cruxd.config.measure_section import parse_measurement
from cruxd.config.model import (
    CONTROL_DSCP,
    EMBEDDED,
    LIVE_KEYS,
    LOG_FORMATS,
    LOG_LEVELS,
    ROLES,
    SECTION_KEYS,
    AgentConfig,
    Config,
    ControlConfig,
    LeaderConfig,
    MetricsConfig,
    ProbingConfig,
    TlsConfig,
    changed_keys,
    restart_required,
)
from cruxd.config.probing_section import parse_probing
from cruxd.config.toml_depth import MAX_DEPTH, too_deep
from cruxd.control.records import PATH_SELECTIONS, PATHS_BY_CRUX
from cruxd.errors import UsageError
from cruxd.scheduler.dscp import check_priorities, fabric_levels

__all__ = [
    "EMBEDDED",
    "LIVE_KEYS",
    "ROLES",
    "SECTION_KEYS",
    "AgentConfig",
    "Config",
    "ConfigError",
    "LeaderConfig",
    "MetricsConfig",
    "ProbingConfig",
    "TlsConfig",
    "changed_keys",
    "embedded_default",
    "format_hostport",
    "load_config",
    "parse_config",
    "parse_hostport",
    "restart_required",
]

_HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class ConfigError(UsageError):
    """A configuration that cannot be used: ``<file>: <section.key>: <reason>``.

    `key` is None for faults of the file as a whole (unreadable, not TOML).
    """

    def __init__(self, source: str, key: str | None, reason: str) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        text = f"{source}: {key}: {reason}" if key else f"{source}: {reason}"
        super().__init__(" ".join(text.splitlines()))


def load_config(path: Path | None, *, env: Mapping[str, str] = os.environ,
                euid: int | None = None) -> Config:
    """The configuration in `path`, or the embedded default when None."""
    if path is None:
        return embedded_default(env=env, euid=euid)
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(source, None, f"not UTF-8 text at line {line}") from exc
    return parse_config(text, source, env=env, euid=euid)


def embedded_default(*, env: Mapping[str, str] = os.environ, euid: int | None = None) -> Config:
    """What `cruxd` runs without --config: both roles, every key at its default."""
    return parse_config("", EMBEDDED, env=env, euid=euid)


def parse_config(text: str, source: str, *, env: Mapping[str, str] = os.environ,
                 euid: int | None = None) -> Config:
    """Parse TOML `text`; `source` names it in errors and anchors relative paths.

    A `source` in angle brackets (not a file) anchors relative paths at the
    current directory. `env` and `euid` pick the default directories.
    """
    deep = too_deep(text)
    if deep is not None:
        raise ConfigError(source, None, f"invalid TOML at line {deep[0]}: {deep[1] or 'a value'}"
                          f" nested more than {MAX_DEPTH} deep")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, None, _syntax(str(exc))) from exc
    except RecursionError:  # the scan above should have caught it; never a traceback
        raise ConfigError(source, None, "invalid TOML: nested too deeply") from None
    except ValueError as exc:  # Python's int-digits limit: `max_jobs = 1` and 5,000 zeros
        raise ConfigError(source, None, f"invalid TOML: {str(exc).split(';')[0]}") from None
    base = None if source.startswith("<") else Path(source).absolute().parent
    try:
        return _build(doc, source, base, env, os.geteuid() if euid is None else euid)
    except FieldError as exc:
        raise ConfigError(source, exc.key, exc.reason) from exc


def _syntax(message: str) -> str:
    m = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, re.DOTALL)
    if m:
        return f"invalid TOML at line {m[2]} column {m[3]}: {m[1]}"
    m = re.fullmatch(r"(.*) \(at end of document\)", message, re.DOTALL)
    if m:
        return f"invalid TOML at the end of the file: {m[1]}"
    return f"invalid TOML: {message}"


def _build(doc: Mapping[str, object], source: str, base: Path | None, env: Mapping[str, str],
           euid: int) -> Config:
    for name, value in doc.items():
        if name not in SECTION_KEYS:
            raise FieldError(quote_key(name), "unknown section" + _section_hint(name))
        if not isinstance(value, dict):
            raise FieldError(name, f"expected a table ([{name}]), got {describe(value)}")
    home = home_dir(env)
    sec = {name: Section(name, _table(doc, name), keys, base, home)
           for name, keys in SECTION_KEYS.items()}

    d = sec["daemon"]
    roles = frozenset(d.strings("roles", ("agent", "leader")))
    if not roles:
        raise d.error("roles", "must name at least one role: agent, leader")
    unknown = sorted(roles - ROLES)
    if unknown:
        raise d.error("roles", f"unknown role {json.dumps(unknown[0])}; roles are "
                      '"agent" and "leader"' + did_you_mean(unknown[0], ROLES, '"', '"'))
    host_id = d.string("host_id", "")
    if host_id and not _HOST_ID.fullmatch(host_id):
        raise d.error("host_id", "must be letters, digits, '.', '_', '-' (at most 253), "
                      f"starting with a letter or digit, got {json.dumps(host_id)}")
    state_dir = d.path("state_dir") or default_state_dir(env, euid)
    runtime_dir = d.path("runtime_dir") or default_runtime_dir(env, euid)
    # in /tmp another user may have made it first; checked for this process only, not for
    # a configuration parsed on behalf of another user
    if (runtime_dir == shared_tmp_runtime_dir(euid) and euid == os.geteuid()
            and (why := private_dir_problem(runtime_dir, euid))):
        raise d.error("runtime_dir", why)
    agent = _agent(sec["agent"], runtime_dir, state_dir)
    if "agent" in roles:
        _agent_paths(sec["agent"], d, agent)
    probing = parse_probing(sec["probing"], agent.probing == "sweep")
    measurement = parse_measurement(sec["measurement"], agent.measurement == "live")
    leader = _leader(sec["leader"], state_dir)
    if {"agent", "leader"} <= roles and leader.agent_timeout_s <= agent.report_interval_s:
        raise sec["leader"].error(
            "agent_timeout_s", f"must be greater than agent.report_interval_s "
            f"({agent.report_interval_s:g}) when this host runs both roles")
    metrics = _metrics(sec["metrics"], leader.listen if "leader" in roles else None)
    return Config(
        roles=roles, host_id=host_id or socket.gethostname().split(".")[0],
        state_dir=state_dir, runtime_dir=runtime_dir,
        log_level=d.choice("log_level", "info", LOG_LEVELS),
        log_format=d.choice("log_format", "auto", LOG_FORMATS),
        agent=agent, probing=probing, measurement=measurement, leader=leader,
        tls=_tls(sec["tls"]), metrics=metrics,
        source=source, control=_control(sec["control"]))


def _table(doc: Mapping[str, object], name: str) -> Mapping[str, object]:
    value = doc.get(name, {})
    assert isinstance(value, dict)
    return value


def _section_hint(name: str) -> str:
    for section, keys in SECTION_KEYS.items():
        if name in keys:  # a key written above every [section] header
            return f"; did you mean {section}.{name} (under [{section}])?"
    return did_you_mean(name, SECTION_KEYS, prefix="[", suffix="]")


def _agent(a: Section, runtime_dir: Path, state_dir: Path) -> AgentConfig:
    measurement = a.choice("measurement", "static", ("static", "replay", "live"))
    measurement_file = a.path("measurement_file")
    if measurement == "replay" and measurement_file is None:
        raise a.error("measurement_file", 'required with measurement = "replay"')
    if measurement != "replay" and measurement_file is not None:
        raise a.error("measurement_file", 'only used with measurement = "replay"')
    probing = a.choice("probing", "static", ("static", "sweep", "none"))
    path_table = a.path("path_table")
    if probing != "static" and path_table is not None:
        raise a.error("path_table", 'only used with probing = "static"')
    gpus = a.integer("gpus", -1, Range(-1, 1024))
    return AgentConfig(
        socket=a.path("socket") or runtime_dir / "agent.sock",
        socket_group=a.string("socket_group", "") or None,
        max_connections=a.integer("max_connections", 256, Range(1, 65536)),
        max_connections_per_uid=a.integer("max_connections_per_uid", 64, Range(1, 65536)),
        request_timeout_s=a.number("request_timeout_s", 5.0, Range(0, 3600, lo_open=True)),
        max_jobs=a.integer("max_jobs", 256, Range(1, 4096)),
        max_processes_per_job=a.integer("max_processes_per_job", 256, Range(1, 65536)),
        max_processes_per_user=a.integer("max_processes_per_user", 1024, Range(1, 65536)),
        leader=a.hostport("leader", "127.0.0.1:7470", min_port=1),
        report_interval_s=a.number("report_interval_s", 5.0, Range(0.05, 3600, lo_open=True)),
        refresh_s=a.number("refresh_s", 300.0, Range(1, 86400)),
        report_change=a.number("report_change", 0.05, Range(0, 1, lo_open=True)),
        decision_table=a.path("decision_table") or runtime_dir / "decisions",
        table_capacity=a.integer("table_capacity", 4096, Range(16, 1 << 20)),
        accept_job_hints=a.boolean("accept_job_hints", True),
        measurement=measurement, measurement_file=measurement_file,
        probing=probing, path_table=path_table,
        addresses=a.addresses("addresses"),
        gpus=None if gpus == -1 else gpus,
        reconnect_max_s=a.number("reconnect_max_s", 30.0, Range(0.1, 3600, lo_open=True)),
        leader_token=a.path("leader_token") or state_dir / "leader.token",
        leader_fallback=a.hostports("leader_fallback"),
        start_wait_s=a.number("start_wait_s", 2.0, Range(0, 60)),
    )


# sun_path holds 108 bytes; one is kept for the terminating NUL other tools expect
_SOCKET_PATH_MAX = 107
_PSEUDO_FS = (Path("/proc"), Path("/sys"))


def _agent_paths(a: Section, d: Section, agent: AgentConfig) -> None:
    """Paths the agent creates files at: where the kernel would refuse them, say so now."""
    socket_given = a.path("socket") is not None
    size = len(os.fsencode(agent.socket))
    if size > _SOCKET_PATH_MAX:
        where = (a, "socket") if socket_given else (d, "runtime_dir")
        raise where[0].error(where[1], f"the agent socket {agent.socket} is {size} bytes; a Unix "
                             f"socket path holds at most {_SOCKET_PATH_MAX} bytes")
    for key, path in (("decision_table", agent.decision_table), ("socket", agent.socket)):
        real = Path(os.path.realpath(path))
        for fs in _PSEUDO_FS:
            if real.is_relative_to(fs):
                given = a.path(key) is not None
                raise (a if given else d).error(key if given else "runtime_dir",
                                                f"{path} is under {fs}, a kernel file system "
                                                "where no file can be created")


def _leader(s: Section, state_dir: Path) -> LeaderConfig:
    topology = s.path("topology")
    if topology is not None and topology.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise s.error("topology", "expected a .json, .yaml or .yml file, "
                      f"got {json.dumps(topology.name)}")
    levels = s.integer("levels", 1, Range(1, 8)) if s.has("levels") else None
    dscp = s.integers("dscp")
    lossless = s.integers("lossless_priorities") if s.has("lossless_priorities") else None
    try:
        check_priorities(lossless or ())
    except ValueError as exc:
        raise s.error("lossless_priorities", str(exc)) from None
    try:
        fabric = fabric_levels(levels, dscp or None, lossless)
    except ValueError as exc:
        key = "dscp" if dscp else "levels" if levels is not None else "lossless_priorities"
        raise s.error(key, str(exc)) from None
    return LeaderConfig(
        listen=s.hostport("listen", "127.0.0.1:7470", min_port=0),
        topology=topology, levels=fabric.levels, dscp=fabric.dscp,
        lossless_priorities=fabric.lossless if fabric.declared else None,
        agent_timeout_s=s.number("agent_timeout_s", 30.0, Range(0, 86400, lo_open=True)),
        debounce_ms=s.number("debounce_ms", 50.0, Range(0, 10000)),
        profiling_s=s.number("profiling_s", 30.0, Range(0, 3600)),
        change_threshold=s.number("change_threshold", 0.10, Range(0, 10, lo_open=True)),
        change_hold_s=s.number("change_hold_s", 15.0, Range(0, 3600)),
        failure_settle_s=s.number("failure_settle_s", 3.0, Range(0, 600)),
        job_settle_s=s.number("job_settle_s", 3.0, Range(0, 600)),
        tie_tolerance=s.number("tie_tolerance", 0.10, Range(0, 0.9)),
        star_nic_gbps=s.number("star_nic_gbps", 100.0, Range(0, 100000, lo_open=True)),
        max_jobs=s.integer("max_jobs", 100000, Range(1, 10_000_000)),
        max_jobs_per_host=s.integer("max_jobs_per_host", 256, Range(1, 4096)),
        hosts=_host_ids(s, "hosts"),
        insecure_remote=s.boolean("insecure_remote", False),
        state_file=s.path("state_file") or state_dir / "leader-state.json",
        hints_dir=s.path("hints_dir"),
        hints_interval_s=s.number("hints_interval_s", 60.0, Range(1, 86400)),
        reflection=s.boolean("reflection", False),
        path_selection=s.choice("path_selection", PATHS_BY_CRUX, PATH_SELECTIONS),
        **parse_ha(s, s.hostport("listen", "127.0.0.1:7470", min_port=0)),
    )


def _host_ids(s: Section, key: str) -> tuple[str, ...]:
    ids = s.strings(key)
    for h in ids:
        if not _HOST_ID.fullmatch(h):
            raise s.error(key, f"{json.dumps(h)} is not a host id (letters, digits, '.', '_', "
                          "'-', at most 253, starting with a letter or digit)")
    return ids


def _tls(t: Section) -> TlsConfig:
    files = {"ca": t.path("ca"), "cert": t.path("cert"), "key": t.path("key")}
    missing = [k for k, v in files.items() if v is None]
    if 0 < len(missing) < 3:
        given = " and ".join(f"tls.{k}" for k in files if k not in missing)
        raise t.error(missing[0], f"required because {given} {'is' if len(missing) == 2 else 'are'}"
                      " set: mutual TLS needs ca, cert and key (set none for plaintext)")
    server_name = t.string("server_name", "") or None
    if server_name is not None and missing:
        raise t.error("server_name", "only used with TLS (tls.ca, tls.cert and tls.key set)")
    return TlsConfig(ca=files["ca"], cert=files["cert"], key=files["key"],
                     server_name=server_name)


def _control(c: Section) -> ControlConfig:
    # 6 bits: IP_TOS takes DSCP << 2; "system" sets nothing (the kernel's class, usually 0)
    return ControlConfig(dscp=c.integer_or("dscp", CONTROL_DSCP, Range(0, 63), "system"),
                         keepalive_s=c.number("keepalive_s", 10.0, Range(0.5, 3600)))


def _metrics(m: Section, leader_listen: str | None) -> MetricsConfig:
    listen = m.hostport("listen", "127.0.0.1:9477", min_port=0, optional=True) or None
    if listen and leader_listen and _clash(listen, leader_listen):
        raise m.error("listen", f"{listen} is also leader.listen ({leader_listen})")
    label = m.string("job_label", "")
    if label and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label):
        raise m.error("job_label", f"{label!r} is not a Prometheus label name "
                                   "([A-Za-z_][A-Za-z0-9_]*)")
    if label.startswith("__") or label in ("crux_job", "job", "instance"):
        raise m.error("job_label", f"{label!r} is reserved (crux_job is crux's own; job and "
                                   "instance are the labels Prometheus sets on every target)")
    return MetricsConfig(listen=listen, job_label=label)


def _clash(a: str, b: str) -> bool:
    """Whether two listen addresses would fight over one port (port 0 never does)."""
    (host_a, port_a), (host_b, port_b) = parse_hostport(a), parse_hostport(b)
    wildcard = {"0.0.0.0", "::"}
    return port_a == port_b != 0 and (host_a == host_b or bool({host_a, host_b} & wildcard))
