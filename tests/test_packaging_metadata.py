"""What a package index and pip read from pyproject.toml: the licence, where the project
lives, classifiers, and dependency floors the generated gRPC stubs actually need.
(tests/test_install.py builds the sdist and wheel themselves.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
STUBS = sorted((REPO / "cruxd" / "rpc" / "gen").rglob("*_grpc.py"))


def _floors() -> dict[str, tuple[int, ...]]:
    """The version floors of every requirement, the extras' included (grpcio-reflection
    is crux[leader]'s)."""
    out = {}
    extras = PROJECT["optional-dependencies"].values()
    for dep in [*PROJECT["dependencies"], *(d for deps in extras for d in deps)]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", dep.replace(" ", ""))
        if m:
            out[m.group(1).lower()] = tuple(int(x) for x in m.group(2).split("."))
    return out


def test_license_file_is_the_apache_2_0_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for section in ("1. Definitions.", "2. Grant of Copyright License.",
                    "3. Grant of Patent License.", "4. Redistribution.",
                    "5. Submission of Contributions.", "6. Trademarks.",
                    "7. Disclaimer of Warranty.", "8. Limitation of Liability.",
                    "9. Accepting Warranty or Additional Liability.",
                    "END OF TERMS AND CONDITIONS"):
        assert section in text, section
    assert len(text.split()) > 1500, "the full text, not a summary"


def test_urls_and_classifiers() -> None:
    assert {"Homepage", "Documentation", "Issues"} <= set(PROJECT["urls"])
    assert all(u.startswith("https://") for u in PROJECT["urls"].values())
    classifiers = PROJECT["classifiers"]
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert "Operating System :: POSIX :: Linux" in classifiers
    # PEP 639: with a licence expression, licence classifiers are an error
    assert not any(c.startswith("License ::") for c in classifiers)
    py = PROJECT["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {py}" in classifiers


@pytest.mark.parametrize("stub", STUBS, ids=lambda p: p.name)
def test_grpc_floors_cover_the_generated_stubs(stub: Path) -> None:
    m = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'", stub.read_text(), re.M)
    assert m, stub
    need = tuple(int(x) for x in m.group(1).split("."))
    floors = _floors()
    for pkg in ("grpcio", "grpcio-health-checking", "grpcio-reflection"):
        assert floors.get(pkg, ()) >= need, f"{pkg} floor below the stubs' {m.group(1)}"


def test_the_sdist_carries_the_licence_and_the_vendored_crd() -> None:
    manifest = (REPO / "MANIFEST.in").read_text()
    assert "include docs/hints/vendor/*.yaml" in manifest
    assert (REPO / "docs/hints/vendor/volcano-hypernodes-crd.yaml").is_file()
