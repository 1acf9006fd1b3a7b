"""cruxd: the host daemon (agent and/or leader).

Exit status: 0 stopped cleanly; 1 runtime failure that is not the configuration's; 2 bad
configuration or usage, including what the host refuses of it (a port in use, a directory
that cannot be created, a socket path too long, another cruxd holding the state_dir's
lock): one line on stderr naming the key or the holder. `--check-config` only validates:
it takes no lock and runs beside a running cruxd.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from cruxd import __version__
from cruxd.cli.exits import run_command
from cruxd.errors import UsageError

EPILOG = """\
Without --config, cruxd runs the embedded default: agent and leader on this host,
leader on 127.0.0.1:7470, agent socket and decision table under a runtime directory
(/run/crux as root, else $XDG_RUNTIME_DIR/crux or /tmp/crux-UID) and state under
/var/lib/crux (root) or ~/.local/state/crux. Every key: docs/configuration.md.

One cruxd per state directory: a second one exits 2 naming the pid that holds
<state_dir>/cruxd.lock, having written nothing.

signals: SIGTERM/SIGINT stop gracefully; SIGHUP re-reads --config (a bad file
keeps the running configuration).
exit status: 0 clean stop, 1 runtime failure, 2 bad configuration or usage
(also: another cruxd holds this state directory)."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="cruxd", description="crux host daemon: agent (job registry, decision table, "
        "reports) and leader (GPU-intensity scheduler, plan stream).", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"cruxd {__version__}")
    p.add_argument("--config", metavar="FILE", type=Path,
                   help="configuration file (TOML); default: the embedded default")
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration, print it resolved, and exit")
    args = p.parse_args(argv)

    from cruxd.config.parse import load_config
    from cruxd.daemon.logs import setup_logging
    from cruxd.daemon.notify import Notifier

    def run() -> int:
        config = load_config(args.config)
        if args.check_config:
            from cruxd.config.parse import ConfigError
            from cruxd.rpc.tls import check_files

            try:  # the files' contents too: they are part of the configuration
                check_files(config.tls)
            except UsageError as exc:
                raise ConfigError(config.source, exc.where, exc.why) from None
            _print_config(config)
            return 0
        setup_logging(config.log_level, log_format=config.log_format)
        try:
            notifier = Notifier.from_env()
        except ValueError as exc:  # malformed systemd environment (notify.py is stdlib-only)
            raise UsageError(str(exc)) from None
        from cruxd.daemon.main import serve

        return asyncio.run(serve(config, args.config, notifier))

    try:
        return run_command("cruxd", run)
    except KeyboardInterrupt:
        return 0


def _print_config(config: object) -> None:
    """The resolved configuration as JSON (paths as text, sets sorted)."""
    import dataclasses
    import json

    def plain(v: object) -> object:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, frozenset | set):
            return sorted(map(str, v))
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        return v if isinstance(v, int | float | bool | str) or v is None else str(v)

    print(json.dumps(plain(config), indent=2))


if __name__ == "__main__":
    sys.exit(main())
