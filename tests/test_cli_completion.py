"""`cruxctl completion`: bash completes cruxctl's and crux-run's own commands and options."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def complete(prog: str, words: list[str]) -> list[str]:
    """What bash offers for the last of `words`, with the generated script sourced."""
    script = subprocess.run([str(BIN / "cruxctl"), "completion", "bash", "--prog", prog],
                            capture_output=True, text=True, check=True).stdout
    line = " ".join(words)
    func = "_shtab_" + prog.replace("-", "_")
    run = subprocess.run(
        ["bash", "-c", f'source /dev/stdin; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
                       f'COMP_LINE="{line}"; COMP_POINT={len(line)}; {func}; '
                       'printf "%s\\n" "${COMPREPLY[@]}"'],
        input=script, capture_output=True, text=True, check=True)
    return run.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_subcommands_and_options() -> None:
    assert complete("cruxctl", ["cruxctl", "ta"]) == ["table"]
    assert set(complete("cruxctl", ["cruxctl", "st"])) == {"status"}
    assert set(complete("cruxctl", ["cruxctl", "table", "--j"])) == {"--job", "--json"}
    assert "--no-profiler" in complete("crux-run", ["crux-run", "--no-"])


def test_zsh_script_names_its_command() -> None:
    out = subprocess.run([str(BIN / "cruxctl"), "completion", "zsh"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("#compdef cruxctl") and "completion" in out
    zsh = shutil.which("zsh")
    if zsh is not None:  # not installed here: the syntax check runs where it is
        assert subprocess.run([zsh, "-n"], input=out, text=True).returncode == 0
