"""Runs tests/test_rdma*.py where RDMA exists: in the soft-RoCE VM on kernels without it.

On a host whose kernel has RDMA devices the rdma tests run directly and this test skips; on
one without (CI's), it boots the VM (tests/rig/rxe_vm.py: Debian's 6.1 kernel under qemu TCG,
rxe0/rxe1 over a veth pair) and runs the rdma tests inside with this interpreter, then asserts
that every one of them ran and passed: a skip inside the VM is a failure here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.rig.rxe_vm import run_in_vm, vm_available

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.root
@pytest.mark.slow
def test_rdma_suite_in_the_soft_roce_vm() -> None:
    if Path("/sys/class/infiniband").is_dir():
        pytest.skip("this kernel has RDMA: tests/test_rdma.py runs directly")
    reason = vm_available()
    if reason:
        pytest.skip(reason)
    files = " ".join(str(p.relative_to(REPO)) for p in sorted(REPO.glob("tests/test_rdma*.py")))
    res = run_in_vm(f"exec {sys.executable} -m pytest -p no:cacheprovider -q -rA "
                    f"-m rdma {files}", repo=REPO, timeout_s=900)
    summary = res.output.strip().splitlines()[-1] if res.output.strip() else ""
    assert res.rc == 0, f"rdma tests in the VM failed (rc {res.rc}):\n{res.output[-6000:]}"
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 15, res.output[-3000:]  # every rdma test
    assert not re.search(r"skipped|xfail|deselected", summary), res.output[-3000:]
