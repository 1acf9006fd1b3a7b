"""Volcano HyperNodes and Kubernetes node labels (pure). See docs/hints/volcano-slurm.md.

Volcano's network-topology-aware scheduling reads a tree of cluster-scoped
`HyperNode` objects: tier 1 groups the nodes under one leaf (ToR), tier 2 groups
the leaves of one pod, tier 3 (only when cores exist or there are several pods)
groups the pods. A PodGroup's `highestTierAllowed` then bounds how far a gang may
spread. A dual-homed host is a member of its first leaf only, as in
`FabricView.leaf_hosts`: the HyperNodes must form a tree.

Switch, pod and fabric names become HyperNode names, which must be DNS-1123
labels; the same names are the values of the node labels, so a label selector and
a HyperNode always agree. Host names must be the Kubernetes node names, which are
DNS-1123 subdomains (Volcano's CRD checks `exactMatch.name` against the same rule):
a host name that is not one is lower-cased with other characters turned to '-', as
the kubelet lower-cases its own, with a warning; two hosts that would become one
node name are refused. tests/test_hints_volcano_crd.py validates against Volcano's
own CRD (docs/hints/vendor/).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from cruxd.errors import UsageError
from cruxd.hints.fabric_view import SCHEMA_VERSION, FabricView, natural

API_VERSION = "topology.volcano.sh/v1alpha1"
GENERATOR = "crux"
LABEL_PREFIX = "crux.io/"
MAX_NAME = 63  # DNS-1123 label and label-value limit alike
MAX_SUBDOMAIN = 253  # DNS-1123 subdomain: a Kubernetes node's name
TIER_LEAF, TIER_POD, TIER_FABRIC = 1, 2, 3

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class NodeNameWarning(UserWarning):
    """A host name exported under a sanitized Kubernetes node name."""


def dns_label(raw: str) -> str:
    """Lower-case, every other character to '-', trimmed to start and end alphanumeric
    and to 63 characters; '' when nothing is left."""
    s = re.sub(r"[^a-z0-9-]", "-", raw.lower()).strip("-")
    return s[:MAX_NAME].rstrip("-")


def _with_hash(base: str, seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()[:8]
    head = base[:MAX_NAME - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}" if head else f"x-{digest}"


def unique_names(keys: Iterable[tuple[str, str]],
                 sanitize: Callable[[str], str] = dns_label) -> dict[tuple[str, str], str]:
    """(namespace, raw name) -> a sanitized name unique across all keys.

    A raw name that is already valid keeps itself (claimed first, so an invalid
    name can never push a valid one aside); the rest get their sanitized form, or,
    when that is empty or taken, it plus a hash of the key: deterministic whatever
    the input order."""
    pending = sorted(set(keys), key=lambda k: (sanitize(k[1]) != k[1], natural(k[1]), k[0]))
    out: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for ns, raw in pending:
        name = sanitize(raw)
        n = 0
        while not name or name in taken:
            name = _with_hash(sanitize(raw), f"{ns}\0{raw}\0{n}")
            n += 1
        taken.add(name)
        out[(ns, raw)] = name
    return out


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= MAX_SUBDOMAIN and bool(_DNS_SUBDOMAIN.match(name))


def dns_subdomain(raw: str) -> str:
    """Lower-case, every character outside [a-z0-9.-] to '-', each dot-separated part
    trimmed to start and end alphanumeric, empty parts dropped; '' when nothing valid is
    left. Not shortened: a cut name would name some other node."""
    parts = (re.sub(r"[^a-z0-9-]", "-", p).strip("-") for p in raw.lower().split("."))
    name = ".".join(p for p in parts if p)
    return name if is_dns_subdomain(name) else ""


def node_names(view: FabricView) -> dict[str, str]:
    """host -> its Kubernetes node name: itself when valid, else sanitized (with a
    NodeNameWarning). Raises UsageError when a host has no valid form or two hosts would
    share one, since either would make a HyperNode select the wrong node."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    renamed = []
    for host in sorted(view.hosts, key=natural):
        name = host if is_dns_subdomain(host) else dns_subdomain(host)
        if not name:
            raise UsageError("not a Kubernetes node name (DNS-1123 subdomain) and nothing "
                             "valid is left after sanitizing", where=f"host {host!r}")
        if name in owner:
            raise UsageError(f"hosts {owner[name]!r} and {host!r} would both be the Kubernetes "
                             f"node {name!r}; rename one", where="volcano export")
        if name != host:
            renamed.append(f"{host!r} -> {name!r}")
        owner[name] = host
        out[host] = name
    if renamed:
        # the default warnings filter shows a given message once per process, so the
        # leader's periodic export does not repeat it every interval
        warnings.warn("host names that are not Kubernetes node names (DNS-1123 "
                      f"subdomains) exported sanitized: {', '.join(renamed)}",
                      NodeNameWarning, stacklevel=3)
    return out


def _names(view: FabricView) -> dict[tuple[str, str], str]:
    keys = [("leaf", leaf) for leaf in view.leaf_pod]
    keys += [("pod", pod) for pod in view.pods()]
    keys.append(("fabric", view.name or "fabric"))
    return unique_names(keys)


def has_fabric_tier(view: FabricView) -> bool:
    """A tier above the pods is real only when cores join pods or there are several."""
    return bool(view.cores) or len(view.pods()) > 1


def _meta(view: FabricView, fabric: str, name: str, tier: int, source: str
          ) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {
            "app.kubernetes.io/managed-by": GENERATOR,
            f"{LABEL_PREFIX}schema-version": str(SCHEMA_VERSION),
            f"{LABEL_PREFIX}fabric": fabric,
            f"{LABEL_PREFIX}tier": str(tier),
        },
        # The raw name survives in an annotation, where any string is allowed.
        "annotations": {
            f"{LABEL_PREFIX}generator": GENERATOR,
            f"{LABEL_PREFIX}source-name": source,
            f"{LABEL_PREFIX}generated-unix-ms": str(view.generated_unix_ms),
        },
    }


def _hypernode(view: FabricView, names: dict[tuple[str, str], str], key: tuple[str, str],
               tier: int, members: list[dict[str, Any]]) -> dict[str, Any]:
    fabric = names[("fabric", view.name or "fabric")]
    return {"apiVersion": API_VERSION, "kind": "HyperNode",
            "metadata": _meta(view, fabric, names[key], tier, key[1]),
            "spec": {"tier": tier, "members": members}}


def _member(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def hypernodes(view: FabricView) -> list[dict[str, Any]]:
    """HyperNode manifests, leaves first, then pods, then the fabric (when it exists)."""
    names = _names(view)
    nodes = node_names(view)
    out = []
    for leaf, hosts in view.leaf_hosts().items():
        if hosts:  # Volcano rejects a HyperNode without members
            out.append(_hypernode(view, names, ("leaf", leaf), TIER_LEAF,
                                  [_member("Node", nodes[h]) for h in hosts]))
    populated = {names[("leaf", leaf)] for leaf, hosts in view.leaf_hosts().items() if hosts}
    pods = []
    for pod, leaves in view.pods().items():
        members = [_member("HyperNode", names[("leaf", lf)]) for lf in leaves
                   if names[("leaf", lf)] in populated]
        if members:
            pods.append(names[("pod", pod)])
            out.append(_hypernode(view, names, ("pod", pod), TIER_POD, members))
    if pods and has_fabric_tier(view):
        fabric = view.name or "fabric"
        out.append(_hypernode(view, names, ("fabric", fabric), TIER_FABRIC,
                              [_member("HyperNode", p) for p in pods]))
    return out


def node_labels(view: FabricView) -> dict[str, dict[str, str]]:
    """Kubernetes node name -> labels naming its leaf, pod and fabric by their HyperNode
    names (node names as in `node_names`).

    The `topology.kubernetes.io/*` keys are left alone on purpose: they mean cloud
    failure domains and belong to the kubelet and the cloud controller."""
    names = _names(view)
    nodes = node_names(view)
    fabric = names[("fabric", view.name or "fabric")]
    out: dict[str, dict[str, str]] = {}
    for host in sorted(view.hosts, key=natural):
        hint = view.hosts[host]
        labels = {f"{LABEL_PREFIX}fabric": fabric}
        if hint.leaf:
            labels[f"{LABEL_PREFIX}leaf"] = names[("leaf", hint.leaf)]
            labels[f"{LABEL_PREFIX}pod"] = names[("pod", hint.pod)]
            # How many ToRs the host is cabled to: 2 marks a dual-homed host.
            labels[f"{LABEL_PREFIX}leaf-count"] = str(len(hint.leaves))
        out[nodes[host]] = labels
    return out


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Multi-document YAML, `kubectl apply -f` ready."""
    return yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True)


def to_json(docs: list[dict[str, Any]]) -> str:
    """One Kubernetes `List`, which `kubectl apply -f` also takes."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=1) + "\n"


def is_dns_label(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(_DNS_LABEL.match(name))
