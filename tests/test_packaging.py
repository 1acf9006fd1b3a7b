"""What an install carries and says: the extras named in one line when a role needs one, the
files shipped beside the code, and `cruxctl install-unit`.

The installs themselves (an agent-only wheel in a fresh venv, the manylinux tag) are in
tests/test_install.py; here the extras are taken away inside one process (`sys.modules[m] =
None` makes `import m` fail as if it were not installed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cruxd import share
from cruxd.cli import unit_cmd
from cruxd.cli.cruxctl import main as cruxctl
from cruxd.errors import MissingExtra, UsageError
from cruxd.extras import EXTRA_OF, missing_extra, require

REPO = Path(__file__).resolve().parent.parent


def without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter where `modules` cannot be imported."""
    block = "; ".join(f"sys.modules[{m!r}] = None" for m in modules)
    return subprocess.run([sys.executable, "-c", f"import sys; {block}; {code}"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_every_extra_module_is_named_in_pyproject() -> None:
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    dist = {"scipy": "scipy", "grpc_reflection": "grpcio-reflection", "aetcd": "aetcd",
            "matplotlib": "matplotlib"}
    for module, extra in EXTRA_OF.items():
        assert any(d.startswith(dist[module]) for d in extras[extra]), (module, extra)
        assert not any(d.startswith(dist[module]) for d in meta["dependencies"]), module
    # an agent's install: no solver, no etcd client, no packet library, no plots
    for heavy in ("scipy", "aetcd", "scapy", "matplotlib", "grpcio-reflection"):
        assert not any(d.startswith(heavy) for d in meta["dependencies"]), heavy


def test_require_names_the_extra_and_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aetcd", None)
    with pytest.raises(MissingExtra) as err:
        require("aetcd", 'leader.ha = "etcd"')
    msg = str(err.value)
    assert msg.startswith('leader.ha = "etcd" needs crux[ha] (')
    assert msg.endswith("pip install 'crux[ha]'") and "\n" not in msg
    assert err.value.exit_status == 2


def test_a_deep_import_of_an_extra_becomes_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(ImportError) as err:
        import scipy  # noqa: F401
    mapped = missing_extra(err.value)
    assert mapped is not None and "crux[leader]" in str(mapped)
    assert missing_extra(ModuleNotFoundError("x", name="not_an_extra")) is None


def test_cruxctl_plan_without_the_leader_extra_exits_2_naming_it() -> None:
    r = without(["scipy"], "from cruxd.cli.cruxctl import main; "
                           "sys.exit(main(['plan', 'examples/testbed-fig20.json']))")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "cruxctl: error: this command needs crux[leader] (scipy is not installed): "
        "pip install 'crux[leader]'"]


def test_an_unrelated_import_error_keeps_its_traceback() -> None:
    r = without(["json"], "from cruxd.cli.exits import run_command\n"
                          "def body():\n    import json\n"
                          "sys.exit(run_command('cruxctl', body))")
    assert r.returncode == 1 and "Traceback" in r.stderr and "crux[" not in r.stderr


@pytest.mark.parametrize(("block", "toml", "line"), [
    (["scipy"], '[daemon]\nroles = ["leader"]\n',
     "cruxd: error: the leader role (daemon.roles) needs crux[leader]"),
    (["grpc_reflection"], '[daemon]\nroles = ["leader"]\n[leader]\nreflection = true\n',
     "cruxd: error: leader.reflection needs crux[leader]"),
    (["aetcd"], '[daemon]\nroles = ["agent"]\n[leader]\nha = "etcd"\netcd_insecure = true\n'
                'etcd_endpoints = ["127.0.0.1:2379"]\n',
     'cruxd: error: leader.ha = "etcd" needs crux[ha]'),
])
def test_cruxd_refuses_a_role_whose_extra_is_missing(tmp_path: Path, block: list[str],
                                                     toml: str, line: str) -> None:
    conf = tmp_path / "cruxd.toml"
    dirs = f'[daemon]\nstate_dir = "{tmp_path}/s"\nruntime_dir = "{tmp_path}/r"\n'
    conf.write_text(toml.replace("[daemon]\n", dirs, 1) + '[metrics]\nlisten = ""\n')
    r = without(block, "from cruxd.cli.daemon import main; "
                       f"sys.exit(main(['--config', {str(conf)!r}]))")
    assert r.returncode == 2, r.stderr[-2000:]
    assert line in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()  # refused before it wrote anything


def test_shared_files_are_found_in_a_checkout() -> None:
    assert (share.path("systemd") / "cruxd.service").is_file()
    assert (share.path("examples") / "cruxd.toml").is_file()
    assert (share.path("hints") / "arnold.schema.json").is_file()
    with pytest.raises(KeyError):
        share.path("nothing")


def test_setup_copies_every_shipped_file(tmp_path: Path) -> None:
    # setup.py calls setup() when run: its copy step, through a fresh interpreter
    code = ("import sys, runpy, pathlib; sys.argv = ['setup.py', '--name']; "
            "g = runpy.run_path('setup.py'); "
            f"g['copy_share'](pathlib.Path({str(tmp_path)!r}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "cruxd" / "share"
    assert (out / "systemd" / "cruxd.service").read_bytes() == \
        (REPO / "systemd" / "cruxd.service").read_bytes()
    assert (out / "examples" / "kubernetes" / "agent.yaml").is_file()
    assert (out / "examples" / "grafana" / "crux-dashboard.json").is_file()
    assert sorted(p.name for p in (out / "hints").iterdir()) == sorted(
        p.name for p in (REPO / "docs" / "hints").glob("*.schema.json"))


def install(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cruxd.cli.cruxctl", "install-unit", "--root",
                           str(root), "--cruxd", "/opt/crux/bin/cruxd", *extra],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_install_unit_writes_the_files_with_this_installs_cruxd(tmp_path: Path) -> None:
    assert cruxctl(["install-unit", "--root", str(tmp_path), "--cruxd", "/opt/crux/bin/cruxd",
                    "--dry-run"]) == 0
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    assert cruxctl(["install-unit", "--root", str(tmp_path), "--cruxd",
                    "/opt/crux/bin/cruxd"]) == 0
    unit = (tmp_path / "etc/systemd/system/cruxd.service").read_text()
    shipped = (REPO / "systemd" / "cruxd.service").read_text()
    assert unit == shipped.replace("ExecStart=/usr/local/bin/cruxd ",
                                   "ExecStart=/opt/crux/bin/cruxd ")
    assert (tmp_path / "etc/sysusers.d/crux.conf").read_text() == \
        (REPO / "systemd" / "crux.sysusers").read_text()
    assert (tmp_path / "etc/tmpfiles.d/crux.conf").stat().st_mode & 0o777 == 0o644


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_installed_unit_verifies_with_systemd(tmp_path: Path) -> None:
    cruxd = Path(sys.executable).parent / "cruxd"  # this venv's: verify checks it exists
    if str(cruxd).startswith(unit_cmd.HIDDEN):
        pytest.skip(f"{cruxd} is under a directory the unit's ProtectHome hides")
    assert cruxctl(["install-unit", "--root", str(tmp_path), "--cruxd", str(cruxd)]) == 0
    v = subprocess.run(["systemd-analyze", "verify",
                        str(tmp_path / "etc/systemd/system/cruxd.service")],
                       capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stderr


def test_install_unit_keeps_the_operators_files(tmp_path: Path) -> None:
    env = tmp_path / "etc/default/cruxd"
    env.parent.mkdir(parents=True)
    env.write_text("CRUXD_ARGS=--log-level debug\n")
    r = install(tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    actions = {Path(f["path"]).name: f["action"] for f in json.loads(r.stdout)["files"]}
    assert actions == {"cruxd.service": "write", "crux.conf": "write", "cruxd": "kept"}
    assert env.read_text() == "CRUXD_ARGS=--log-level debug\n"
    r = install(tmp_path, "--json")
    assert {f["action"] for f in json.loads(r.stdout)["files"]} == {"unchanged", "kept"}

    unit = tmp_path / "etc/systemd/system/cruxd.service"
    unit.write_text(unit.read_text() + "# edited in place\n")
    r = install(tmp_path)
    assert r.returncode == 2
    assert "differs from the shipped unit" in r.stderr and "--force" in r.stderr
    assert unit.read_text().endswith("# edited in place\n")  # refused: nothing written
    assert install(tmp_path, "--force").returncode == 0
    assert not unit.read_text().endswith("# edited in place\n")


@pytest.mark.parametrize(("cruxd", "why"), [
    ("bin/cruxd", "absolute path"), ("/opt/my crux/cruxd", "without spaces"),
    ("/home/me/venv/bin/cruxd", "ProtectHome=yes")])
def test_install_unit_refuses_a_cruxd_systemd_could_not_run(cruxd: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        unit_cmd.unit_text((REPO / "systemd" / "cruxd.service").read_text(), cruxd)
