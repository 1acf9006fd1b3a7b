"""Build step: generate the gRPC/protobuf stubs from proto/ (never checked in).

pyproject.toml holds the metadata; this file only hooks stub generation into
build_py. Editable installs (`pip install -e .`) get the stubs in the source
tree's cruxd/rpc/gen/ (git-ignored); wheels get them in the build directory.
protoc writes absolute imports (`from crux.v1 import common_pb2`) that would
need a top-level `crux` package, so they are made package-relative here.
"""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = ROOT / "proto"
GEN_PKG = ("cruxd", "rpc", "gen")
_ABS_IMPORT = re.compile(r"^from crux\.v1 import (\w+_pb2)", re.MULTILINE)


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


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        root = ROOT if getattr(self, "editable_mode", False) else Path(self.build_lib)
        self.announce(f"generating protobuf stubs under {root.joinpath(*GEN_PKG)}", level=2)
        generate(root)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
