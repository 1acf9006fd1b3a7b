"""The wrapper libibverbs reaches NCCL of both generations through crux-run's environment.

tests/c/rc_pair.c --resolve reproduces NCCL's loader (src/misc/ibvsymbols.cc): built with
-DNCCL_LOADER=229 it opens "libibverbs.so", then "libibverbs.so.1", by name (NCCL <= 2.29);
with 230 it tries $NCCL_IBVERBS_LIB first (NCCL >= 2.30). It resolves every verb NCCL requires
with dlvsym(..., "IBVERBS_1.1") and prints which file each came from (dladdr), so no RDMA
device is needed here; tests/test_rdma.py puts the same loaders' packets on the wire.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from cruxd.testing import BIN, Daemon, running
from tests.cbuild import build
from transport import native

LOADERS = (229, 230)


def wrapper_exports(lib: Path) -> set[str]:
    out = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return {ln.split()[-1] for ln in out.splitlines() if " DF .text" in ln and "IBVERBS_1.1" in ln}


def print_env(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "crux-run"), "--print-env", *args], capture_output=True,
                          text=True, env=env if env is not None else dict(os.environ))


def exports_of(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        assert word == "export", line
        name, _, value = rest.partition("=")
        (out[name],) = shlex.split(value)
    return out


@pytest.fixture(scope="module")
def loaders(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    if not Path("/usr/lib/x86_64-linux-gnu/libibverbs.so.1").exists() and not any(
            Path(d, "libibverbs.so.1").exists() for d in ("/lib64", "/usr/lib64", "/usr/lib")):
        pytest.skip("no libibverbs.so.1 (apt-get install libibverbs1)")
    out = tmp_path_factory.mktemp("loaders")
    return {g: build(out, f"nccl{g}", ["tests/c/rc_pair.c"], f"-DNCCL_LOADER={g}", "-ldl")
            for g in LOADERS}


def resolve(prog: Path, env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "NCCL_IBVERBS_LIB")}
    r = subprocess.run([str(prog), "--resolve"], env={**base, **env}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    verbs: dict[str, str] = doc["verbs"]
    return verbs


def test_print_env_is_exactly_the_exports_in_shell_syntax() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRUX_", "NCCL_"))}
    env["LD_LIBRARY_PATH"] = "/opt/cuda/lib64"
    # --table: these exports as they are, without asking an agent (none runs here)
    r = print_env("--job-id", "gpt 'big'", "--table", "/run/crux/decisions", env=env)
    assert r.returncode == 0, r.stderr
    got = exports_of(r.stdout)
    wrapper = native.ibverbs_dir() / "libibverbs.so"
    plugin = native.library(native.NCCL_PROFILER)
    want = {"CRUX_JOB_ID": "gpt 'big'", "CRUX_DECISION_TABLE": "/run/crux/decisions",
            "LD_LIBRARY_PATH": f"{wrapper.parent}:{plugin.parent}:/opt/cuda/lib64",
            "NCCL_IBVERBS_LIB": str(wrapper), "LD_PRELOAD": str(native.library(native.SOCK)),
            "NCCL_PROFILER_PLUGIN": "libcrux_nccl_profiler.so"}
    assert got == want
    # a POSIX shell evaluating the lines gets the same values, quoting included
    sh = subprocess.run(["sh", "-c", 'eval "$1"; printf "%s|%s" "$CRUX_JOB_ID" '
                         '"$LD_LIBRARY_PATH"', "sh", r.stdout], capture_output=True, text=True)
    assert sh.stdout == f"gpt 'big'|{wrapper.parent}:{plugin.parent}:/opt/cuda/lib64"
    assert exports_of(print_env("--job-id", "j", "--no-shim", "--table", "/t",
                                env=env).stdout) == {"CRUX_JOB_ID": "j",
                                                     "CRUX_DECISION_TABLE": "/t"}
    assert "LD_PRELOAD" not in exports_of(print_env("--job-id", "j", "--no-sock", "--table",
                                                    "/t", env=env).stdout)
    no_prof = exports_of(print_env("--job-id", "j", "--no-profiler", "--table", "/t",
                                   env=env).stdout)
    assert "NCCL_PROFILER_PLUGIN" not in no_prof
    assert no_prof["LD_LIBRARY_PATH"] == f"{wrapper.parent}:/opt/cuda/lib64"
    # a plugin the job names itself is chained behind crux's, and said so
    r = print_env("--job-id", "j", "--table", "/t",
                  env={**env, "NCCL_PROFILER_PLUGIN": "inspector"})
    assert exports_of(r.stdout)["CRUX_NCCL_PROFILER_NEXT"] == "inspector"
    assert exports_of(r.stdout)["NCCL_PROFILER_PLUGIN"] == "libcrux_nccl_profiler.so"
    assert "chained" in r.stderr
    r = print_env("--job-id", "j", "--table", "/t", env={**env, "NCCL_PROFILER_PLUGIN": "NONE"})
    assert "NCCL_PROFILER_PLUGIN" not in exports_of(r.stdout) and "NONE" not in r.stdout
    # without --table it asks the agent that serves this user: none, so nothing at all
    r = print_env("--job-id", "j", env={**env, "CRUX_SOCKET": "/nonexistent/agent.sock"})
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no crux agent at /nonexistent/agent.sock" in r.stderr


def test_print_env_refuses_what_it_cannot_do() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CRUX_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")}
    r = print_env(env=env)
    assert r.returncode == 2 and "needs --job-id" in r.stderr and r.stdout == ""
    r = print_env("--job-id", "j", "--", "true")
    assert r.returncode == 2 and "takes no COMMAND" in r.stderr


@pytest.mark.parametrize("gen", LOADERS)
def test_both_nccl_generations_resolve_through_the_wrapper(loaders: dict[int, Path],
                                                          gen: int) -> None:
    env = exports_of(print_env("--job-id", "j", "--table", "/t").stdout)
    wrapper = env["NCCL_IBVERBS_LIB"]
    verbs = resolve(loaders[gen], env)
    mine = {v for v, f in verbs.items() if f == wrapper}
    assert "ibv_modify_qp" in mine
    assert mine == wrapper_exports(Path(wrapper)) & set(verbs)
    # everything else from the real library, which the wrapper's own dependency still finds
    real = {f for v, f in verbs.items() if v not in mine and f}
    assert len(real) == 1 and Path(real.pop()).name.startswith("libibverbs.so")
    # without crux-run's environment, nothing comes from the wrapper
    assert wrapper not in resolve(loaders[gen], {}).values()


def test_env_alone_does_not_reach_nccl_229(loaders: dict[int, Path]) -> None:
    """Why crux-run sets both: NCCL <= 2.29 never reads NCCL_IBVERBS_LIB, so only the
    library path reaches it; NCCL >= 2.30 takes the variable alone."""
    lib = str(native.ibverbs_dir() / "libibverbs.so")
    assert lib not in resolve(loaders[229], {"NCCL_IBVERBS_LIB": lib}).values()
    assert resolve(loaders[230], {"NCCL_IBVERBS_LIB": lib})["ibv_modify_qp"] == lib


def test_crux_run_gives_a_registered_job_the_wrapper(loaders: dict[int, Path],
                                                     tmp_path: Path) -> None:
    d = Daemon(tmp_path, "h0", {"leader": {"listen": "127.0.0.1:0", "profiling_s": 0},
                                "agent": {"addresses": ["10.1.0.1"], "gpus": 8}})
    base = {k: v for k, v in os.environ.items()
            if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "NCCL_IBVERBS_LIB")}
    lib = str(native.ibverbs_dir() / "libibverbs.so")

    def job(*extra: str, sock: Path = d.socket) -> tuple[dict[str, str], str]:
        r = subprocess.run([str(BIN / "crux-run"), "--socket", str(sock), "--job-id", "j",
                            *extra, "--", str(loaders[229]), "--resolve"], env=base,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["verbs"], r.stderr

    with running([d], " applied: "):
        verbs, _ = job()
        assert verbs["ibv_modify_qp"] == lib
        verbs, _ = job("--no-shim")
        assert lib not in verbs.values()
    # no agent: the job runs untouched, after one warning
    verbs, err = job(sock=tmp_path / "none.sock")
    assert lib not in verbs.values() and "running without crux" in err
