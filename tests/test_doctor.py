"""`cruxctl doctor`: each check right and deliberately wrong.

The file checks run on trees laid out as sysfs and procfs lay them out (a test can write
them); the sysctls again on the kernel itself, in a network namespace where they can be set
wrong (root). The DCB checks parse dcb's and mlnx_qos's output in their documented formats;
on a veth, real dcb answers "not supported" and the verdict is unknown.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cruxd.doctor import checks as c
from cruxd.doctor import dcb

BIN = Path(sys.executable).parent


def rdma_tree(root: Path, state: str = "4: ACTIVE", gid_type: str = "RoCE v2",
              gid: str = "0000:0000:0000:0000:0000:ffff:0a00:0001",
              link_layer: str = "Ethernet") -> Path:
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text(link_layer + "\n")
    (port / "gids" / "3").write_text(gid + "\n")
    (port / "gid_attrs" / "types" / "3").write_text(gid_type + "\n")
    (port / "gid_attrs" / "ndevs" / "3").write_text("eth0\n")
    return root


def test_rdma_ok_and_each_way_it_goes_wrong(tmp_path: Path) -> None:
    ok = c.check_rdma(c.rdma_ports(rdma_tree(tmp_path / "ok")))
    assert ok.status == c.OK and "mlx5_0/1 ACTIVE, RoCE v2 GID index 3 on eth0" in ok.detail
    down = c.check_rdma(c.rdma_ports(rdma_tree(tmp_path / "down", state="1: DOWN")))
    assert down.status == c.FAIL and "mlx5_0/1 DOWN" in down.detail and down.fix
    v1 = c.check_rdma(c.rdma_ports(rdma_tree(tmp_path / "v1", gid_type="IB/RoCE v1")))
    assert v1.status == c.FAIL and "no RoCE v2 GID" in v1.detail
    ib = c.check_rdma(c.rdma_ports(rdma_tree(tmp_path / "ib", link_layer="InfiniBand")))
    assert ib.status == c.WARN and "InfiniBand" in ib.detail
    assert c.check_rdma(c.rdma_ports(tmp_path / "none")).status == c.WARN


def test_a_traffic_class_override_is_named(tmp_path: Path) -> None:
    root = rdma_tree(tmp_path)
    assert c.check_tc_override(root).status == c.OK
    tc = root / "class" / "infiniband" / "mlx5_0" / "tc" / "1"
    tc.mkdir(parents=True)
    (tc / "traffic_class").write_text("Global tclass=106\n")
    got = c.check_tc_override(root)
    assert got.status == c.WARN and "mlx5_0/1 sets traffic class 106" in got.detail


def proc_tree(root: Path, **sysctls: str) -> Path:
    for name, value in sysctls.items():
        path = root / "sys" / Path(*name.split("__"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return root


def test_sysctls_right_and_wrong(tmp_path: Path) -> None:
    good = proc_tree(tmp_path / "good", net__ipv4__ip_local_port_range="32768\t60999",
                     net__ipv4__fib_multipath_hash_policy="1",
                     net__ipv4__conf__all__rp_filter="2", net__ipv4__conf__eth0__rp_filter="0")
    assert c.check_port_range(good, (61000, 65535)).status == c.OK
    assert c.check_multipath_hash(good).status == c.OK
    assert c.check_rp_filter(good, ["eth0"]).status == c.OK
    bad = proc_tree(tmp_path / "bad", net__ipv4__ip_local_port_range="32768 65000",
                    net__ipv4__fib_multipath_hash_policy="0",
                    net__ipv4__conf__all__rp_filter="0", net__ipv4__conf__eth0__rp_filter="1")
    ports = c.check_port_range(bad, (61000, 65535))
    assert ports.status == c.WARN and "4001 of crux's TCP source ports" in ports.detail
    assert "ip_local_reserved_ports=61000-65535" in ports.fix
    assert c.check_multipath_hash(bad).status == c.WARN
    rp = c.check_rp_filter(bad, ["eth0"])
    assert rp.status == c.WARN and "on eth0" in rp.detail
    # the overlap reserved: fine again
    proc_tree(bad, net__ipv4__ip_local_reserved_ports="60000-65535")
    assert c.check_port_range(bad, (61000, 65535)).status == c.OK
    assert c.check_port_range(tmp_path / "none", (61000, 65535)).status == c.UNKNOWN


def canned(answers: dict[str, tuple[int, str]]) -> dcb.Run:
    def runner(cmd: list[str]) -> tuple[int, str]:
        return answers.get(" ".join(cmd[:2]), (127, f"{cmd[0]}: not installed"))
    return runner


LEVELS = (8, 16, 24, 32, 40)  # 5 levels on a lossy fabric: priorities 1-5


def test_pfc_behind_crux_levels() -> None:
    app = (0, "dscp-prio 8:3 16:3 24:3 32:3 40:3\n")  # every level on the lossless priority
    ok = dcb.check_pfc("eth0", LEVELS, canned({
        "dcb pfc": (0, "prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n"),
        "dcb app": app}))
    assert ok.status == c.OK
    lossy = dcb.check_pfc("eth0", LEVELS, canned({
        "dcb pfc": (0, "prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n"),
        "dcb app": (0, "dscp-prio\n")}))  # no map: DSCP / 8, priorities 1-5, PFC on 3 only
    assert lossy.status == c.FAIL and "priorities [1, 2, 4, 5] where PFC is off" in lossy.detail
    off = dcb.check_pfc("eth0", LEVELS, canned({"dcb pfc": (0, "prio-pfc " + " ".join(
        f"{p}:off" for p in range(8)) + "\n"), "dcb app": app}))
    assert off.status == c.WARN and "lossy" in off.detail
    unknown = dcb.check_pfc("veth0", LEVELS, canned({
        "dcb pfc": (1, "Attribute read: Operation not supported\n")}))
    assert unknown.status == c.UNKNOWN and "Operation not supported" in unknown.detail


def test_dscp_trust() -> None:
    mlnx = "DCBX mode: OS controlled\nPriority trust state: pcp\n"
    assert dcb.check_trust("eth0", canned({"mlnx_qos -i": (0, mlnx)})).status == c.FAIL
    assert dcb.check_trust("eth0", canned({"mlnx_qos -i": (0, mlnx.replace("pcp", "dscp"))})
                           ).status == c.OK
    assert dcb.check_trust("eth0", canned({"dcb apptrust": (0, "order dscp\n")})
                           ).status == c.OK
    assert dcb.check_trust("eth0", canned({"dcb apptrust": (0, "order pcp\n")})
                           ).status == c.FAIL
    assert dcb.check_trust("eth0", canned({})).status == c.UNKNOWN


def test_ecn_per_priority(tmp_path: Path) -> None:
    assert dcb.check_ecn(tmp_path, "eth0", LEVELS).status == c.UNKNOWN
    for side in ("roce_rp", "roce_np"):
        d = tmp_path / "class" / "net" / "eth0" / "ecn" / side / "enable"
        d.mkdir(parents=True)
        for p in range(8):
            (d / str(p)).write_text("1\n")
    assert dcb.check_ecn(tmp_path, "eth0", LEVELS).status == c.OK
    (tmp_path / "class/net/eth0/ecn/roce_np/enable/3").write_text("0\n")
    got = dcb.check_ecn(tmp_path, "eth0", LEVELS)
    assert got.status == c.WARN and "roce_np/3" in got.detail


def test_the_command_reports_every_check_and_fails_on_a_failure(tmp_path: Path) -> None:
    sysfs = rdma_tree(tmp_path / "sys", state="1: DOWN")
    (sysfs / "class" / "net" / "eth0").mkdir(parents=True)
    proc = proc_tree(tmp_path / "proc", net__ipv4__ip_local_port_range="32768 60999",
                     net__ipv4__fib_multipath_hash_policy="1")
    run = subprocess.run([str(BIN / "cruxctl"), "doctor", "--json", "--sysfs", str(sysfs),
                          "--proc", str(proc), "--socket", str(tmp_path / "none.sock")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr  # the port is down, and no agent answers
    doc = json.loads(run.stdout)
    by = {x["name"]: x for x in doc["checks"]}
    assert by["rdma"]["status"] == "fail" and doc["failed"] is True
    assert by["agent"]["status"] == "fail" and by["agent"]["fix"]
    assert {"pfc eth0", "dscp-trust eth0", "ecn eth0", "port-range", "rp-filter",
            "multipath-hash"} <= by.keys()
    assert all(by[f"library {n}"]["status"] == "ok" for n in (
        "libcrux_ibverbs.so", "libcrux_sock.so", "libcrux_nccl_profiler.so"))
    text = subprocess.run([str(BIN / "cruxctl"), "doctor", "--sysfs", str(sysfs), "--proc",
                           str(proc), "--socket", str(tmp_path / "none.sock"),
                           "--interface", "eth9"], capture_output=True, text=True, timeout=60)
    assert text.returncode == 2 and "no such interface" in text.stderr


@pytest.mark.root
def test_sysctls_wrong_in_a_real_network_namespace() -> None:
    """The kernel's own per-namespace sysctls, set wrong and then right; dcb on a veth."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespaces)")
    ns = f"crux-doctor-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        def sh(cmd: str) -> None:
            subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", cmd], check=True)

        sh("ip link add dv0 type veth peer name dv1 && ip link set dv0 up && ip link set dv1 up")
        sh("sysctl -qw net.ipv4.ip_local_port_range='32768 65000' "
           "net.ipv4.fib_multipath_hash_policy=0 net.ipv4.conf.all.rp_filter=1")

        def doctor() -> dict[str, dict[str, str]]:
            run = subprocess.run(["ip", "netns", "exec", ns, str(BIN / "cruxctl"), "doctor",
                                  "--json", "--interface", "dv0", "--socket", "/nonexistent"],
                                 capture_output=True, text=True, timeout=60)
            return {x["name"]: x for x in json.loads(run.stdout)["checks"]}

        wrong = doctor()
        assert [wrong[n]["status"] for n in ("port-range", "multipath-hash", "rp-filter")] == [
            "warn", "warn", "warn"]
        assert wrong["pfc dv0"]["status"] == "unknown"  # a veth has no DCB
        if shutil.which("dcb") is not None:
            assert "not supported" in wrong["pfc dv0"]["detail"].lower()
        sh("sysctl -qw net.ipv4.ip_local_port_range='32768 60999' "
           "net.ipv4.fib_multipath_hash_policy=1 net.ipv4.conf.all.rp_filter=2")
        right = doctor()
        assert [right[n]["status"] for n in ("port-range", "multipath-hash", "rp-filter")] == [
            "ok", "ok", "ok"]
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
