"""[leader]'s high-availability keys (docs/control-plane.md, "A highly available leader").

Every host reads them, not only leader candidates: an agent looks the active leader up in
the same etcd when its leader stops answering.
"""

from __future__ import annotations

import json
from typing import Any

from cruxd.config.fields import Range, Section
from cruxd.config.hostport import parse_hostport

HA_MODES = ("none", "etcd")
_PREFIX_MAX = 128


def parse_ha(s: Section, listen: str) -> dict[str, Any]:
    """LeaderConfig's ha* and etcd* keywords (`listen`: leader.listen, checked)."""
    ha = s.choice("ha", "none", HA_MODES)
    endpoints = s.hostports("etcd_endpoints")
    files = {k: s.path(k) for k in ("etcd_ca", "etcd_cert", "etcd_key")}
    prefix = s.string("etcd_prefix", "/crux")
    if ha == "etcd" and not endpoints:
        raise s.error("etcd_endpoints", 'required with ha = "etcd": the etcd members\' client '
                      'addresses, e.g. ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]')
    if ha != "etcd":
        for key in ("etcd_endpoints", *files):
            if s.has(key):
                raise s.error(key, 'only used with ha = "etcd"')
    given = [k for k, v in files.items() if v is not None]
    if 0 < len(given) < 3:
        missing = next(k for k in files if files[k] is None)
        raise s.error(missing, "TLS to etcd needs etcd_ca, etcd_cert and etcd_key (set none "
                      "for plaintext)")
    insecure = s.boolean("etcd_insecure", False)
    if ha != "etcd" and s.has("etcd_insecure"):
        raise s.error("etcd_insecure", 'only used with ha = "etcd"')
    if ha == "etcd" and not given and not insecure:
        # issue 37: a local user wrote the election key through etcd's JSON gateway and
        # took the agents over; etcd must only let the candidates in (client certificates)
        raise s.error("etcd_ca", 'ha = "etcd" without TLS to etcd: whoever reaches etcd can '
                      "name the leader and take the cluster over (docs/security.md); set "
                      "etcd_ca, etcd_cert and etcd_key, with etcd requiring client "
                      "certificates, or etcd_insecure = true for a lab")
    if ha == "etcd" and given and insecure:
        raise s.error("etcd_insecure", "TLS to etcd is set: etcd_insecure says the opposite")
    if not prefix.startswith("/") or len(prefix) > _PREFIX_MAX or prefix.endswith("/"):
        raise s.error("etcd_prefix", f"must start with '/', not end with one, and be at most "
                      f"{_PREFIX_MAX} bytes, got {json.dumps(prefix)}")
    advertise = s.hostport("advertise", "", min_port=1, optional=True)
    host, port = parse_hostport(listen)
    if ha == "etcd" and not advertise and (host in ("0.0.0.0", "::", "") or port == 0):
        raise s.error("advertise", f"required with ha = \"etcd\" when listen ({listen}) is "
                      "no address another host can dial: agents are told to dial it")
    return {"ha": "" if ha == "none" else ha, "etcd_endpoints": endpoints,
            "etcd_prefix": prefix,
            # etcd counts leases in whole seconds, and refuses them shorter than its
            # election timeout's 1.5 times (1.5 s with its defaults)
            "etcd_lease_s": s.integer("etcd_lease_s", 3, Range(2, 600)),
            **files, "advertise": advertise or "", "etcd_insecure": insecure}
