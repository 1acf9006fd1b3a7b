"""The daemon rig the control-plane tests use: real cruxd processes on loopback. It lives in
the package (cruxd.testing) so that bench/ uses the same one."""

from cruxd.testing.rig import (
    BIN,
    Daemon,
    crux_run,
    cruxctl,
    free_port,
    running,
    status,
    toml,
    wait_for,
)

__all__ = ["BIN", "Daemon", "crux_run", "cruxctl", "free_port", "running", "status", "toml",
           "wait_for"]
