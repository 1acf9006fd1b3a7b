"""Build steps: the gRPC/protobuf stubs from proto/, and the C libraries from shim/.

pyproject.toml holds the metadata; this file only hooks three steps into the build:

* build_py generates the stubs (never checked in). Editable installs (`pip install -e .`) get
  them in the source tree's cruxd/rpc/gen/ (git-ignored); wheels get them in the build
  directory. protoc writes absolute imports (`from crux.v1 import common_pb2`) that would need
  a top-level `crux` package, so they are made package-relative here.
* build_py also copies the systemd files, examples and hint schemas into cruxd/share/ of the
  wheel (package data; cruxd/share.py finds them there, or in a checkout's top level).
* build_ext compiles the C libraries the daemon, jobs and simulator load (plain shared objects for
  ctypes and the dynamic loader, not Python extension modules) into transport/native/, where
  transport/native.py finds them. Nothing compiles at run time. The wrapper libibverbs is
  built twice: libcrux_ibverbs.so (LD_PRELOAD, NCCL_IBVERBS_LIB) and ibverbs/libibverbs.so,
  the name NCCL <= 2.29 dlopen()s, for a directory crux-run puts first on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = ROOT / "proto"
GEN_PKG = ("cruxd", "rpc", "gen")
_ABS_IMPORT = re.compile(r"^from crux\.v1 import (\w+_pb2)", re.MULTILINE)
NATIVE = "transport.native"
VERBS_H = Path("/usr/include/infiniband/verbs.h")


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # build-time dependency (pyproject build-system)

    protos = sorted(PROTO.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO}")
    out = out_root.joinpath(*GEN_PKG)
    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *map(str, protos)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on " + ", ".join(p.name for p in protos))
    written = []
    for d in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        init = d / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from proto/ at build time; do not edit."""\n')
        written.append(init)
    for f in out.rglob("*.py*"):
        text = f.read_text()
        fixed = _ABS_IMPORT.sub(r"from . import \1", text)
        if fixed != text:
            f.write_text(fixed)
        written.append(f)
    return written


# Package data from outside the packages (cruxd/share.py finds them): the systemd files
# (`cruxctl install-unit`), the examples and the hint schemas, so a wheel alone is enough to
# follow the README. A checkout and an editable install read them in place.
SHARE = {"systemd": ("systemd", "*"), "examples": ("examples", "**/*"),
         "hints": ("docs/hints", "*.schema.json")}


def copy_share(package_root: Path) -> list[Path]:
    written = []
    for kind, (src, pattern) in SHARE.items():
        for f in sorted((ROOT / src).glob(pattern)):
            if f.is_file() and not f.name.startswith("."):
                dst = package_root / "cruxd" / "share" / kind / f.relative_to(ROOT / src)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst)
                written.append(dst)
    return written


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        editable = getattr(self, "editable_mode", False)
        root = ROOT if editable else Path(self.build_lib)
        self.announce(f"generating protobuf stubs under {root.joinpath(*GEN_PKG)}", level=2)
        generate(root)
        if not editable:
            copy_share(root)
        super().run()


class SharedLib(Extension):
    """A plain shared object built from shim/ sources: no Python ABI tag in its name."""

    def __init__(self, name: str, sources: list[str], *, verbs: bool = False,
                 version_script: str | None = None, soname: str | None = None,
                 libraries: tuple[str, ...] = ()) -> None:
        super().__init__(name, [f"shim/{s}" for s in sources], libraries=list(libraries))
        self.verbs = verbs
        self.version_script = version_script
        self.soname = soname


WRAPPER = dict(verbs=True, version_script="shim/crux_ibverbs.map", soname="libcrux_ibverbs.so",
               libraries=("ibverbs", "dl"))
WRAPPER_SRC = ["crux_ibverbs.c", "crux_decide.c", "crux_repath.c", "crux_gate.c",
               "crux_gate_setup.c", "crux_links.c", "crux_pcie.c"]
LIBS = [
    SharedLib(f"{NATIVE}.libcrux_pcie", ["crux_pcie.c"]),
    SharedLib(f"{NATIVE}.libcrux_sampler", ["agent/crux_sampler.c"]),
    SharedLib(f"{NATIVE}.libcrux_ibverbs", WRAPPER_SRC, **WRAPPER),  # type: ignore[arg-type]
    SharedLib(f"{NATIVE}.ibverbs.libibverbs", WRAPPER_SRC, **WRAPPER),  # type: ignore[arg-type]
    SharedLib(f"{NATIVE}.libcrux_sock", ["crux_sock.c", "crux_sockbytes.c"],
              libraries=("dl",)),
    SharedLib(f"{NATIVE}.libcrux_rates", ["sim/crux_rates.c"], libraries=("m",)),
    SharedLib(f"{NATIVE}.libcrux_nccl_profiler", ["crux_nccl_profiler.c", "crux_nccl_out.c"],
              version_script="shim/crux_nccl_profiler.map", libraries=("dl",)),
]


class BuildSharedLibs(build_ext):
    """Compile each SharedLib with the configured C compiler ($CC honoured)."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extensions(self) -> None:
        # a plain `cc -shared`: Python's LDSHARED would add its own rpath and -L flags
        self.compiler.set_executable("linker_so", [*self.compiler.compiler_so[:1], "-shared"])
        super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        assert isinstance(ext, SharedLib)
        if ext.verbs and not VERBS_H.exists():
            raise SystemExit(f"building {ext.name}: {VERBS_H} is missing; install rdma-core's "
                             "headers (Debian: apt-get install libibverbs-dev)")
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(self.build_temp) / ext.name
        # -ffp-contract=off: no fused multiply-adds, so libcrux_rates gives numpy's doubles
        cflags = ["-std=c11", "-O2", "-ffp-contract=off", "-fPIC", "-pthread", "-Wall",
                  "-Wextra",
                  "-fvisibility=hidden" if ext.version_script else "-fvisibility=default"]
        objects = self.compiler.compile(ext.sources, output_dir=str(tmp),
                                        extra_postargs=cflags, depends=list(_headers()))
        link = ["-pthread"]
        if ext.version_script:
            link.append(f"-Wl,--version-script={ext.version_script}")
        if ext.soname:
            link.append(f"-Wl,-soname,{ext.soname}")
        # --no-as-needed before the libraries, so the wrapper keeps its libibverbs.so.1 entry
        self.compiler.link_shared_object(objects, str(out), libraries=ext.libraries,
                                         extra_preargs=["-Wl,--no-as-needed"],
                                         extra_postargs=link)

    def copy_extensions_to_source(self) -> None:
        # inplace builds (editable installs, `setup.py build_ext -i`): same layout in the tree
        for ext in self.extensions:
            src = Path(self.build_lib, self.get_ext_filename(ext.name))
            if src.exists():
                dst = ROOT / self.get_ext_filename(ext.name)
                dst.parent.mkdir(parents=True, exist_ok=True)
                # a new inode by rename: truncating the old file in place would SIGBUS every
                # process that has it mapped (a running job, the agent's sampler)
                tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)


def _headers() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in (*(ROOT / "shim").glob("*.h"),
                                               *(ROOT / "shim" / "nccl").glob("*.h"))]


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the C libraries tie the wheel to a platform, not to a CPython ABI.

    `auditwheel repair --exclude libibverbs.so.1` then turns linux_<arch> into the manylinux
    tag the libraries' glibc symbols allow (docs/install.md).
    """

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


setup(cmdclass={"build_py": BuildPyWithStubs, "build_ext": BuildSharedLibs,
                "bdist_wheel": PlatformWheel}, ext_modules=LIBS)
