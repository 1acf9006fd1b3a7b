"""`cruxctl completion bash|zsh`: tab completion for cruxctl and crux-run.

The scripts are generated from the commands' own argparse parsers by shtab (so they list
exactly the subcommands and options `--help` does, with file arguments completing paths),
and printed for the user to install:

    cruxctl completion bash > /etc/bash_completion.d/cruxctl
    cruxctl completion bash --prog crux-run > /etc/bash_completion.d/crux-run
    cruxctl completion zsh > "${fpath[1]}/_cruxctl"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

PROGS = ("cruxctl", "crux-run")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               own: Callable[[], argparse.ArgumentParser]) -> None:
    """`own`: cruxctl's parser, handed in (cruxctl imports this module)."""
    p = sub.add_parser(
        "completion", help="print a shell completion script for cruxctl or crux-run",
        description="Print a bash or zsh completion script, generated from the commands' own "
                    "options. Install it where your shell looks, e.g. "
                    "`cruxctl completion bash > /etc/bash_completion.d/cruxctl`, or "
                    "`cruxctl completion zsh > \"${fpath[1]}/_cruxctl\"`.")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.add_argument("--prog", choices=PROGS, default="cruxctl",
                   help="the command to complete (default cruxctl)")
    p.set_defaults(cruxctl_parser=own)


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    if args.prog == "crux-run":
        from cruxd.cli.crux_run import _parser as parser
    else:
        parser = args.cruxctl_parser
    sys.stdout.write(shtab.complete(parser(), args.shell))
    return 0
