"""Helpers for crux's own tests and benchmarks, shipped with the package the way grpc and
prometheus ship theirs: real `cruxd` processes on loopback (cruxd.testing.rig). Nothing
the daemon or the tools run imports this package."""

from cruxd.testing.rig import (
    BIN,
    Daemon,
    crux_run,
    cruxctl,
    free_port,
    running,
    spawn,
    status,
    stop_processes,
    toml,
    wait_for,
)

__all__ = ["BIN", "Daemon", "crux_run", "cruxctl", "free_port", "running", "spawn", "status",
           "stop_processes", "toml", "wait_for"]
