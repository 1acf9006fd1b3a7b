"""tcpdump inside a namespace of the rig fabric, read back with scapy."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.rig.fabric import Fabric


class Tcpdump:
    """What reaches `host` matching the BPF filter `bpf`, written to `path`. It listens on
    the host's one Ethernet port: scapy reads no "any" captures. Ready when built."""

    def __init__(self, f: Fabric, host: str, path: Path, bpf: str) -> None:
        self.path = path
        links = json.loads(f.exec(host, "ip", "-j", "link", "show").stdout)
        port = next(link["ifname"] for link in links if link["ifname"] != "lo")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", f.ns(host), "tcpdump", "-i", port, "--immediate-mode",
             "-U", "-n", "-w", str(path), bpf],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # "listening on ..." once it captures
        assert "listening" in line, line

    def stop(self) -> list[Any]:
        """Every packet captured (scapy packets), once the last ones are in the file."""
        time.sleep(0.5)
        self.proc.terminate()
        self.proc.wait(10)
        import scapy.layers.l2  # noqa: F401  (registers Ethernet for rdpcap)
        from scapy.utils import rdpcap

        return list(rdpcap(str(self.path)))
