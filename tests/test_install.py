"""A clean install works: `python -m build`, then the wheel in a fresh virtualenv.

The sdist must carry what the wheel is built from (proto/, shim/, the hint schemas), and
`python -m build` builds the wheel from the sdist, so a good wheel proves both. The fresh venv
then plans a scenario, runs an embedded cruxd whose live sampler loads the installed C loop,
and has the wrapper libibverbs and the socket interposer at the paths crux-run exports.
Slow (a build in an isolated environment, and an install with every dependency): marked slow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900,
                       **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{cmd}: {r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
                 "shim/crux_nccl_profiler.c", "shim/nccl/profiler_v6.h", "shim/nccl/LICENSE.txt"):
        assert need in names, f"the sdist lacks {need}"
    assert not any(n.endswith(".so") for n in names), "the sdist ships a built library"
    (wheel,) = dist.glob("crux-*.whl")
    assert "linux" in wheel.name, f"{wheel.name}: a wheel with C libraries is not pure"
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    run(env_dir / "bin" / "python", "-m", "pip", "install", "-q", wheel)
    return env_dir


def test_the_wheel_plans(installed: Path) -> None:
    r = run(installed / "bin" / "cruxctl", "plan", REPO / "examples" / "testbed-fig20.json",
            "--json", cwd="/")
    assert '"jobs"' in r.stdout


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


def test_the_wheel_runs_cruxd_with_the_c_sampler(installed: Path, tmp_path: Path) -> None:
    conf = tmp_path / "cruxd.toml"
    conf.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'runtime_dir = "{tmp_path / "run"}"\n[metrics]\nlisten = ""\n'
                    '[leader]\nlisten = "127.0.0.1:0"\n'
                    '[agent]\nmeasurement = "live"\n[measurement]\ninterfaces = ["lo"]\n'
                    'gpu = "none"\n')
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    with open(log, "wb") as out:
        p = subprocess.Popen([str(installed / "bin" / "cruxd"), "--config", str(conf)],
                             stdout=out, stderr=out, cwd="/", env=env)
    try:
        end = time.monotonic() + 60
        while "the C loop samples" not in log.read_text() and time.monotonic() < end:
            assert p.poll() is None, log.read_text()
            time.sleep(0.2)
        assert "the C loop samples the NIC counters" in log.read_text(), log.read_text()
        assert "C sampler unavailable" not in log.read_text()
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-3000:]
