"""cruxd: the host daemon (agent and/or leader).

The roles are not built yet: the control plane (gRPC agents and leader, decision
table, systemd) is its own issue. Until then this entry point says so plainly
instead of pretending to run.
"""

from __future__ import annotations

import argparse
import sys

from cruxd import __version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="cruxd", description="crux host daemon: agent (probing, measurement, decision "
        "table) and leader (scheduler). Not runnable yet: see `cruxctl plan` for the scheduler.")
    p.add_argument("--version", action="version", version=f"cruxd {__version__}")
    p.add_argument("--config", metavar="FILE", help="configuration file (TOML)")
    p.parse_args(argv)
    print("cruxd: the agent and leader roles are not implemented in this version; "
          "`cruxctl plan SCENARIO` runs the scheduler", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
