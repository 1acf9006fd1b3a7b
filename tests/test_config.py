"""cruxd's configuration: defaults, every key, and one-line `file: key: reason` errors."""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.config.parse import (
    EMBEDDED,
    SECTION_KEYS,
    Config,
    ConfigError,
    embedded_default,
    format_hostport,
    load_config,
    parse_config,
    parse_hostport,
    restart_required,
)
from cruxd.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
USER = {"HOME": "/home/ann"}
SRC = "/etc/crux/cruxd.toml"

FULL = """
[daemon]
roles = ["leader"]
host_id = "gpu-17"
state_dir = "/srv/crux/state"
runtime_dir = "/srv/crux/run"
log_level = "debug"

[agent]
socket = "/srv/crux/agent.sock"
socket_group = "jobs"
leader = "[fd00::1]:7000"
report_interval_s = 2
decision_table = "/srv/crux/table"
table_capacity = 16
accept_job_hints = false
measurement = "replay"
measurement_file = "/srv/crux/replay.json"
probing = "none"
path_table = ""
addresses = ["10.0.0.1", "fd00:0:0::2"]
gpus = 0
reconnect_max_s = 3600

[leader]
listen = "[::]:0"
topology = "/srv/crux/fabric.YAML"
levels = 2
dscp = [10, 20]
agent_timeout_s = 1.0
debounce_ms = 0
profiling_s = 0
change_threshold = 10
star_nic_gbps = 400
max_jobs = 1
state_file = "/srv/crux/leader.json"

[tls]
ca = "/srv/tls/ca.pem"
cert = "/srv/tls/cert.pem"
key = "/srv/tls/key.pem"
server_name = "leader.internal"

[metrics]
listen = ""
"""


def parse(text: str) -> Config:
    return parse_config(text, SRC, env=USER, euid=1000)


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- defaults ---------------------------------------------------------------------------

def test_embedded_default_for_a_user() -> None:
    c = embedded_default(env=USER, euid=1000)
    assert c.source == EMBEDDED
    assert c.roles == {"agent", "leader"}
    assert c.host_id == socket.gethostname().split(".")[0]
    assert c.state_dir == Path("/home/ann/.local/state/crux")
    assert c.runtime_dir == Path("/tmp/crux-1000")
    assert c.log_level == "info"
    a = c.agent
    assert (a.socket, a.decision_table) == (Path("/tmp/crux-1000/agent.sock"),
                                            Path("/tmp/crux-1000/decisions"))
    assert (a.socket_group, a.leader, a.report_interval_s) == (None, "127.0.0.1:7470", 5.0)
    assert (a.table_capacity, a.accept_job_hints, a.gpus) == (4096, True, None)
    assert (a.measurement, a.measurement_file, a.probing, a.path_table) == \
        ("static", None, "static", None)
    assert (a.addresses, a.reconnect_max_s) == ((), 30.0)
    ld = c.leader
    assert (ld.listen, ld.topology, ld.levels, ld.dscp) == ("127.0.0.1:7470", None, 1, (26,))
    assert ld.lossless_priorities == (3,)  # a stock RoCE fabric: PFC on priority 3 alone
    assert (ld.agent_timeout_s, ld.debounce_ms, ld.profiling_s) == (30.0, 50.0, 30.0)
    assert (ld.change_threshold, ld.star_nic_gbps, ld.max_jobs) == (0.10, 100.0, 100000)
    assert ld.tie_tolerance == 0.10
    assert ld.state_file == Path("/home/ann/.local/state/crux/leader-state.json")
    assert not c.tls.enabled and c.tls.server_name is None
    assert c.metrics.listen == "127.0.0.1:9477"
    assert c.control.dscp == 48  # CS6, crux's own RPCs
    assert parse('[control]\ndscp = "system"').control.dscp is None
    assert parse("[control]\ndscp = 0").control.dscp == 0
    assert load_config(None, env=USER, euid=1000) == c


def test_default_directories_as_root() -> None:
    c = embedded_default(env={}, euid=0)
    assert (c.state_dir, c.runtime_dir) == (Path("/var/lib/crux"), Path("/run/crux"))
    assert c.leader.state_file == Path("/var/lib/crux/leader-state.json")
    assert c.agent.socket == Path("/run/crux/agent.sock")


@pytest.mark.parametrize("euid", [0, 1000])
def test_systemd_directories_win(euid: int) -> None:
    env = {"STATE_DIRECTORY": "/var/lib/crux:/var/lib/other", "RUNTIME_DIRECTORY": "/run/x",
           "XDG_STATE_HOME": "/xdg/state", "XDG_RUNTIME_DIR": "/xdg/run", **USER}
    c = embedded_default(env=env, euid=euid)
    assert (c.state_dir, c.runtime_dir) == (Path("/var/lib/crux"), Path("/run/x"))


def test_xdg_directories() -> None:
    c = embedded_default(env={"XDG_STATE_HOME": "/x/state", "XDG_RUNTIME_DIR": "/run/user/7"},
                         euid=7)
    assert (c.state_dir, c.runtime_dir) == (Path("/x/state/crux"), Path("/run/user/7/crux"))
    relative = embedded_default(env={"XDG_STATE_HOME": "rel", **USER}, euid=7)
    assert relative.state_dir == Path("/home/ann/.local/state/crux")


def test_reading_creates_no_directories(tmp_path: Path) -> None:
    env = {"STATE_DIRECTORY": str(tmp_path / "s"), "RUNTIME_DIRECTORY": str(tmp_path / "r")}
    c = embedded_default(env=env, euid=1000)
    assert c.agent.socket == tmp_path / "r" / "agent.sock"
    assert list(tmp_path.iterdir()) == []


# -- every key --------------------------------------------------------------------------

def test_every_section_parses() -> None:
    c = parse(FULL)
    assert (c.roles, c.host_id, c.log_level) == (frozenset({"leader"}), "gpu-17", "debug")
    assert (c.state_dir, c.runtime_dir) == (Path("/srv/crux/state"), Path("/srv/crux/run"))
    a = c.agent
    assert (a.socket, a.socket_group, a.leader) == (Path("/srv/crux/agent.sock"), "jobs",
                                                    "[fd00::1]:7000")
    assert a.report_interval_s == 2.0 and isinstance(a.report_interval_s, float)
    assert (a.decision_table, a.table_capacity, a.accept_job_hints) == \
        (Path("/srv/crux/table"), 16, False)
    assert (a.measurement, a.measurement_file) == ("replay", Path("/srv/crux/replay.json"))
    assert (a.probing, a.path_table, a.gpus) == ("none", None, 0)
    assert a.addresses == ("10.0.0.1", "fd00::2")  # normalised
    assert a.reconnect_max_s == 3600.0
    ld = c.leader
    assert (ld.listen, ld.topology) == ("[::]:0", Path("/srv/crux/fabric.YAML"))
    assert (ld.levels, ld.dscp, ld.agent_timeout_s) == (2, (10, 20), 1.0)
    assert (ld.debounce_ms, ld.profiling_s, ld.change_threshold) == (0.0, 0.0, 10.0)
    assert (ld.star_nic_gbps, ld.max_jobs, ld.state_file) == \
        (400.0, 1, Path("/srv/crux/leader.json"))
    assert c.tls.enabled and c.tls.server_name == "leader.internal"
    assert c.tls.key == Path("/srv/tls/key.pem")
    assert c.metrics.listen is None


def test_probes_default_to_the_probing_class() -> None:
    assert parse("").probing.dscp == 56  # CS7, reserved for probing (cruxd/scheduler/dscp.py)
    assert parse("[probing]\ndscp = 0").probing.dscp == 0


def test_example_runs_on_one_host_without_tls() -> None:
    # examples/cruxd.toml is the README's first command: plaintext on loopback, nothing
    # under /etc, so it starts from a checkout
    c = load_config(REPO / "examples" / "cruxd.toml", env={}, euid=0)
    assert not c.tls.enabled and c.roles == {"agent", "leader"}
    assert (c.agent.leader, c.leader.listen) == ("127.0.0.1:7470", "127.0.0.1:7470")
    assert c.metrics.listen == "127.0.0.1:9477"
    assert c.leader.topology is None and c.agent.path_table is None
    assert (c.leader.levels, c.leader.dscp, c.leader.lossless_priorities) == (1, (26,), (3,))


def test_example_dirs_follow_the_user() -> None:
    c = load_config(REPO / "examples" / "cruxd.toml", env=USER, euid=1000)
    assert c.state_dir == Path("/home/ann/.local/state/crux")
    assert c.runtime_dir == Path("/tmp/crux-1000")


def test_tls_example_loads() -> None:
    c = load_config(REPO / "examples" / "cruxd-tls.toml", env={}, euid=0)
    assert c.tls.enabled and c.roles == {"agent", "leader"}
    assert c.tls.ca == Path("/etc/crux/tls/ca.pem")
    assert (c.leader.levels, c.leader.dscp, c.leader.lossless_priorities) == (1, (26,), (3,))


def test_docs_list_every_key() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    documented: dict[str, set[str]] = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        head = re.match(r"`\[(\w+)\]`", block)
        if head:
            documented[head[1]] = set(re.findall(r"^\| `(\w+)` \|", block, flags=re.M))
    assert documented == {k: set(v) for k, v in SECTION_KEYS.items()}


def test_relative_paths_are_beside_the_file(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "c.toml").write_text(
        '[tls]\nca = "tls/ca.pem"\ncert = "../cert.pem"\nkey = "~/k.pem"\n'
        '[daemon]\nstate_dir = "state"\n')
    monkeypatch.chdir(tmp_path)
    c = load_config(Path("etc/c.toml"), env=USER, euid=1000)
    assert c.tls.ca == tmp_path / "etc" / "tls" / "ca.pem"
    assert c.tls.cert == tmp_path / "etc" / ".." / "cert.pem"
    assert c.tls.key == Path("/home/ann/k.pem")
    assert c.leader.state_file == tmp_path / "etc" / "state" / "leader-state.json"
    assert c.source == "etc/c.toml"


# -- errors -----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("[probing]\ndscp = 64", "probing.dscp: must be in [0, 63], got 64"),
    ("[agent]\nreport_intervl_s = 1",
     "agent.report_intervl_s: unknown key; did you mean agent.report_interval_s?"),
    ("[agent]\nzzz = 1", "agent.zzz: unknown key"),
    ("[agnet]", "agnet: unknown section; did you mean [agent]?"),
    ('roles = ["agent"]', "roles: unknown section; did you mean daemon.roles (under [daemon])?"),
    ("agent = 5", "agent: expected a table ([agent]), got the integer 5"),
    ("[agent]\ntable_capacity = true", "agent.table_capacity: expected an integer, "
     "got the boolean true"),
    ("[agent]\ntable_capacity = 1.5", "agent.table_capacity: expected an integer, "
     "got the float 1.5"),
    ('[agent]\nreport_interval_s = "5"', 'agent.report_interval_s: expected a number, '
     'got the string "5"'),
    ("[agent]\naccept_job_hints = 1", "agent.accept_job_hints: expected a boolean "
     "(true or false), got the integer 1"),
    ('[daemon]\nroles = "agent"', 'daemon.roles: expected an array of strings, '
     'got the string "agent"'),
    ("[leader]\ndscp = [8, 16, 24, 32, true]", "leader.dscp: expected an array of integers, "
     "got the boolean true at index 4"),
    ("[agent]\nreport_interval_s = 0.05", "agent.report_interval_s: must be in (0.05, 3600], "
     "got 0.05"),
    ("[agent]\ntable_capacity = 8", "agent.table_capacity: must be in [16, 1048576], got 8"),
    ("[leader]\nlevels = 9", "leader.levels: must be in [1, 8], got 9"),
    ("[agent]\ngpus = -2", "agent.gpus: must be in [-1, 1024], got -2"),
    ("[leader]\ndebounce_ms = inf", "leader.debounce_ms: expected a finite number, got inf"),
    ("[tls]\nca = \"/ca.pem\"\ncert = \"/c.pem\"",
     "tls.key: required because tls.ca and tls.cert are set: mutual TLS needs ca, cert "
     "and key (set none for plaintext)"),
    ('[tls]\nserver_name = "x"',
     "tls.server_name: only used with TLS (tls.ca, tls.cert and tls.key set)"),
    ('[agent]\nleader = "::1:7470"',
     "agent.leader: an IPv6 address needs brackets, as in [::1]:7470"),
    ('[agent]\nleader = "leader"', "agent.leader: expected host:port, got 'leader'"),
    ('[agent]\nleader = "h:0"', "agent.leader: port must be in [1, 65535], got 0"),
    ('[leader]\nlisten = "10.0.0.300:1"', "leader.listen: '10.0.0.300' is not an IPv4 address"),
    ('[metrics]\nlisten = "h:99999"', "metrics.listen: port 99999 is out of range [0, 65535]"),
    ("[control]\ndscp = 64", 'control.dscp: must be in [0, 63] (or "system"), got 64'),
    ('[control]\ndscp = "cs6"',
     'control.dscp: expected an integer in [0, 63] or "system", got the string "cs6"'),
    ("[control]\ndscp = true",
     'control.dscp: expected an integer in [0, 63] or "system", got the boolean true'),
    ('[metrics]\nlisten = "0.0.0.0:7470"',
     "metrics.listen: 0.0.0.0:7470 is also leader.listen (127.0.0.1:7470)"),
    ('[metrics]\njob_label = "hpc-job"',
     "metrics.job_label: 'hpc-job' is not a Prometheus label name ([A-Za-z_][A-Za-z0-9_]*)"),
    ('[metrics]\njob_label = "job"', "metrics.job_label: 'job' is reserved (crux_job is "
     "crux's own; job and instance are the labels Prometheus sets on every target)"),
    ('[agent]\naddresses = ["10.0.0.1", "10.0.1"]',
     'agent.addresses: "10.0.1" is not an IPv4 or IPv6 address'),
    ('[agent]\naddresses = ["::1", "0::1"]', "agent.addresses: ::1 is listed twice"),
    ("[leader]\nlevels = 5\ndscp = [8, 16]",
     "leader.dscp: need one DSCP value per level: 5 levels, 2 values"),
    ("[leader]\nlevels = 2\ndscp = [8, 8]",
     "leader.dscp: DSCP values must be distinct: two levels would share a queue"),
    ("[leader]\nlevels = 1\ndscp = [64]", "leader.dscp: DSCP values are integers 0..63, got 64"),
    ("[leader]\nlevels = 6", "leader.levels: 6 levels do not fit the 5 unreserved priorities "
     "(reserved: 0, 6, 7); give explicit DSCP values per level"),
    ("[leader]\nagent_timeout_s = 5", "leader.agent_timeout_s: must be greater than "
     "agent.report_interval_s (5) when this host runs both roles"),
    ("[daemon]\nroles = []", "daemon.roles: must name at least one role: agent, leader"),
    ('[daemon]\nroles = ["agnet"]', 'daemon.roles: unknown role "agnet"; roles are "agent" '
     'and "leader"; did you mean "agent"?'),
    ('[daemon]\nlog_level = "warn"', 'daemon.log_level: must be one of "debug", "info", '
     '"warning", "error", got "warn"; did you mean "warning"?'),
    ('[daemon]\nhost_id = "a b"', "daemon.host_id: must be letters, digits, '.', '_', '-' "
     '(at most 253), starting with a letter or digit, got "a b"'),
    ('[agent]\nmeasurement = "replay"',
     'agent.measurement_file: required with measurement = "replay"'),
    ('[agent]\nmeasurement_file = "r.json"',
     'agent.measurement_file: only used with measurement = "replay"'),
    ('[agent]\nprobing = "none"\npath_table = "p.json"',
     'agent.path_table: only used with probing = "static"'),
    ('[leader]\ntopology = "fabric.txt"',
     'leader.topology: expected a .json, .yaml or .yml file, got "fabric.txt"'),
    ('[agent]\nsocket = "~bob/s"',
     'agent.socket: only ~/ (this user\'s home) is expanded, got "~bob/s"'),
    ('[agent]\n"a\\nb" = 1', 'agent."a\\nb": unknown key'),
    ('[measurement]\nsampler = "c"',
     'measurement.sampler: must be "auto" or "python", got "c"'),
])
def test_error_names_file_and_key(text: str, expected: str) -> None:
    assert error(text) == f"{SRC}: {expected}"


@pytest.mark.parametrize(("text", "expected"), [
    ('[leader]\nha = "etcd"', "leader.etcd_endpoints: required with ha = \"etcd\""),
    ('[leader]\netcd_endpoints = ["127.0.0.1:2379"]',
     'leader.etcd_endpoints: only used with ha = "etcd"'),
    ('[leader]\nha = "etcd"\netcd_endpoints = ["e:2379", "e:2379"]',
     "leader.etcd_endpoints: e:2379 is listed twice"),
    ('[leader]\nha = "etcd"\netcd_endpoints = ["e:2379"]\netcd_insecure = true\n'
     'listen = "0.0.0.0:7470"',
     "leader.advertise: required with ha = \"etcd\" when listen (0.0.0.0:7470)"),
    ('[leader]\nha = "etcd"\netcd_endpoints = ["e:2379"]',
     'leader.etcd_ca: ha = "etcd" without TLS to etcd: whoever reaches etcd can name the '
     "leader"),
    ('[leader]\netcd_insecure = true', 'leader.etcd_insecure: only used with ha = "etcd"'),
    ('[leader]\nha = "etcd"\netcd_endpoints = ["e:2379"]\netcd_key = "k.pem"',
     "leader.etcd_ca: TLS to etcd needs etcd_ca, etcd_cert and etcd_key"),
    ('[leader]\nha = "etcd"\netcd_endpoints = ["e:2379"]\netcd_insecure = true\n'
     'etcd_prefix = "/crux/"',
     "leader.etcd_prefix: must start with '/', not end with one"),
    ('[leader]\nha = "raft"', 'leader.ha: must be "none" or "etcd", got "raft"'),
    ('[agent]\nleader_fallback = ["a:1", "b"]', "agent.leader_fallback: [1]: expected"),
])
def test_ha_keys_are_checked(text: str, expected: str) -> None:
    assert error(text).startswith(f"{SRC}: {expected}")


def test_ha_etcd_parses() -> None:
    c = parse('[leader]\nha = "etcd"\netcd_endpoints = ["10.0.0.1:2379", "[::1]:2379"]\n'
              'etcd_insecure = true\n[agent]\nleader_fallback = ["10.0.0.2:7470"]')
    assert (c.leader.ha, c.leader.etcd_endpoints, c.leader.etcd_prefix) == (
        "etcd", ("10.0.0.1:2379", "[::1]:2379"), "/crux")
    assert c.agent.leader_fallback == ("10.0.0.2:7470",) and parse("").leader.ha == ""


def test_agent_only_host_skips_the_timeout_cross_check() -> None:
    c = parse('[daemon]\nroles = ["agent"]\n[leader]\nagent_timeout_s = 1')
    assert c.roles == {"agent"} and c.metrics.listen == "127.0.0.1:9477"


def test_toml_syntax_error_has_line_and_column() -> None:
    assert error("[agent]\ntable_capacity = 16\nleader 7470\n") == \
        f"{SRC}: invalid TOML at line 3 column 8: Expected '=' after a key in a key/value pair"


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(info.value) == f"{missing}: cannot read: No such file or directory"
    assert isinstance(info.value, UsageError) and info.value.exit_status == 2
    with pytest.raises(ConfigError, match=r": cannot read: Is a directory$"):
        load_config(tmp_path)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[daemon]\nhost_id = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin.toml: not UTF-8 text at line 2$"):
        load_config(latin)


def test_error_attributes() -> None:
    with pytest.raises(ConfigError) as info:
        parse("[leader]\nlevels = 0")
    assert (info.value.source, info.value.key) == (SRC, "leader.levels")
    assert info.value.reason == "must be in [1, 8], got 0"


# -- reload -----------------------------------------------------------------------------

def test_restart_required() -> None:
    old = parse("")
    assert restart_required(old, parse("")) == []
    live = parse('[daemon]\nlog_level = "debug"\n[agent]\nreport_interval_s = 1\n'
                 "[leader]\nlevels = 3\ndebounce_ms = 5\nchange_threshold = 0.5\n")
    assert restart_required(old, live) == []
    changed = parse('[daemon]\nroles = ["agent"]\nlog_level = "error"\n'
                    '[agent]\nsocket = "/s"\ntable_capacity = 64\n'
                    '[leader]\nlisten = "0.0.0.0:1"\nprofiling_s = 0\n'
                    '[tls]\nca = "/a"\ncert = "/b"\nkey = "/c"\n[metrics]\nlisten = ""\n'
                    "[control]\ndscp = 10\n")
    assert restart_required(old, changed) == [
        "daemon.roles", "agent.socket", "agent.table_capacity", "leader.listen",
        "tls.ca", "tls.cert", "tls.key", "metrics.listen", "control.dscp"]
    moved = dataclasses.replace(old, source="/other.toml")
    assert restart_required(old, moved) == []


# -- host:port --------------------------------------------------------------------------

_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_NAME = st.lists(_LABEL, min_size=1, max_size=4).map(".".join).filter(
    lambda h: not all(p.isdigit() for p in h.split(".")))
_HOST = st.one_of(_NAME, st.ip_addresses().map(str))


@given(_HOST, st.integers(0, 65535))
def test_hostport_round_trips(host: str, port: int) -> None:
    assert parse_hostport(format_hostport(host, port)) == (host, port)


@pytest.mark.parametrize(("text", "reason"), [
    ("[::1]", "expected [IPv6 address]:port, got '[::1]'"),
    ("[x]:80", "'x' in brackets is not an IPv6 address"),
    ("h:", "no port after the host in 'h:'"),
    ("h:+1", "port '+1' is not a number"),
    (":80", "the host is empty"),
    ("-a:1", "'-a' is not a valid host name or address"),
])
def test_hostport_rejects(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_hostport(text)
    assert str(info.value) == reason


def test_hostport_accepts_zones_and_names() -> None:
    assert parse_hostport("[fe80::1%eth0]:1") == ("fe80::1%eth0", 1)
    assert parse_hostport("Leader-1.example.net:7470") == ("Leader-1.example.net", 7470)


@given(st.text(max_size=30))
def test_hostport_fails_only_with_value_error(text: str) -> None:
    try:
        host, port = parse_hostport(text)
    except ValueError:
        return
    assert 0 <= port <= 65535 and host


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=5000))
def test_report_interval_range(value: float) -> None:
    text = f"[agent]\nreport_interval_s = {value!r}\n[leader]\nagent_timeout_s = 86400"
    if 0.05 < value <= 3600:
        assert parse(text).agent.report_interval_s == value
    else:
        assert "agent.report_interval_s: must be in (0.05, 3600]" in error(text)


def test_an_integer_past_pythons_digit_limit_is_a_config_error() -> None:
    """issue 37, item 11: `max_jobs = 1` and 5,000 zeros was a traceback."""
    with pytest.raises(ConfigError, match="invalid TOML: Exceeds the limit"):
        parse("[leader]\nmax_jobs = 1" + "0" * 5000 + "\n")


def test_tls_files_that_are_not_regular_files_are_refused_not_waited_on(tmp_path: Path) -> None:
    """issue 37, item 11: tls.ca naming a FIFO hung `cruxd --check-config` in OpenSSL's read."""
    import os
    import subprocess

    from cruxd.testing import BIN

    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    conf = tmp_path / "cruxd.toml"
    conf.write_text(f'[tls]\nca = "{fifo}"\ncert = "{fifo}"\nkey = "{fifo}"\n')
    run = subprocess.run([str(BIN / "cruxd"), "--config", str(conf), "--check-config"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stderr
    assert f"tls.ca: cannot read {fifo}: not a regular file" in run.stderr
