"""examples/kubernetes/: every manifest valid against Kubernetes' own schemas (offline,
kubernetes-validate, strict: no unknown field), and the crux configurations they carry
loaded by crux's own configuration reader. Nothing here runs a cluster (docs/kubernetes.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cruxd.config.parse import load_config
from tests.paths import EXAMPLES

K8S = EXAMPLES / "kubernetes"
VERSIONS = ("1.30", "1.33")


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates(version: str) -> None:
    docs = documents()
    assert {d["kind"] for _, d in docs} >= {"Namespace", "ConfigMap", "DaemonSet",
                                             "StatefulSet", "Service", "Job"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {exc.message}") from None


@pytest.mark.parametrize("name", ["cruxd-agent", "cruxd-leader"])
def test_the_configurations_load(name: str, tmp_path: Path) -> None:
    (cm,) = [d for _, d in documents() if d["kind"] == "ConfigMap"
             and d["metadata"]["name"] == name]
    conf = tmp_path / "cruxd.toml"
    conf.write_text(cm["data"]["cruxd.toml"].replace("@POD@", "crux-leader-0"))
    c = load_config(conf, env={}, euid=0)
    assert c.tls.enabled and c.metrics.listen == "0.0.0.0:9477"
    if name == "cruxd-leader":
        assert c.roles == {"leader"} and c.leader.ha == "etcd"
        assert c.leader.advertise.startswith("crux-leader-0.crux-leader-peers.")
    else:
        assert c.roles == {"agent"} and c.agent.leader.startswith("crux-leader.crux-system")
        assert c.runtime_dir == Path("/run/crux") and c.metrics.job_label == "pod"


def test_what_the_pods_mount_and_select_is_there() -> None:
    docs = {name.split(":", 1)[1]: d for name, d in documents()}
    # the agent shares /run/crux with the jobs on the node: the same host path
    agent = docs["DaemonSet/cruxd-agent"]["spec"]["template"]["spec"]
    job = docs["Job/gpt-pretrain"]["spec"]["template"]["spec"]
    host = {v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
    assert {v["hostPath"]["path"] for v in job["volumes"]} <= host
    # Services select pods that exist
    for key, d in docs.items():
        if d["kind"] != "Service":
            continue
        sel = d["spec"]["selector"]
        assert any(sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()
                   for w in docs.values() if w["kind"] in ("StatefulSet", "DaemonSet")), key
