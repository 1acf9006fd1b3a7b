"""The commands of README.md's fenced code blocks, and how tests/test_readme.py runs each.

Blocks in a shell language (or none) hold commands, one per line (a trailing `\\` joins
lines; in a ```console block only `$ ` lines are commands). Blocks in a language of
PROSE_LANGS are shown, not run. Any other language is an error until it is added to one
of the two sets, so a new block is never silently left out.

Commands are classified by their program, not their exact text, so rewording a comment
in the README needs no change here: a `cruxd` that serves (not --check-config, --help,
--version) is a daemon; `crux-run ... -- COMMAND` is a job; both stay in the foreground
when a person runs them, so the test runs them in the background. SKIPPED lists, by
command, what cannot run inside the test suite, each with the reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

COMMAND_LANGS = frozenset({"", "sh", "bash", "shell", "console"})
PROSE_LANGS = frozenset({"text", "toml", "json", "yaml", "python", "c", "ini", "diff"})
SKIPPED = {
    "bash .ci/bootstrap test": "runs ruff, mypy, vulture and the whole suite, this test "
                               "included: inside the suite it would run itself",
}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
_QUIET = frozenset({"--check-config", "--help", "-h", "--version"})


@dataclass(frozen=True)
class Command:
    text: str  # as written, continuation lines joined
    line: int  # where it starts in README.md

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def key(self) -> str:
        """The command without its comment, for SKIPPED."""
        return shlex.join(self.argv)

    @property
    def kind(self) -> str:
        """'skip', 'daemon', 'job' or 'run' (in the foreground, must exit 0)."""
        argv = self.argv
        program = Path(argv[0]).name
        if self.key in SKIPPED:
            return "skip"
        if program == "cruxd" and not _QUIET & set(argv):
            return "daemon"
        if program == "crux-run" and "--" in argv and "--print-env" not in argv:
            return "job"
        return "run"

    def option(self, name: str) -> str | None:
        """The value of `name VALUE` before any `--`, if given."""
        argv = self.argv
        end = argv.index("--") if "--" in argv else len(argv)
        for i, arg in enumerate(argv[:end - 1]):
            if arg == name:
                return argv[i + 1]
        return None


def fenced_blocks(text: str) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """(line of the opening fence, language, [(line number, line)]) of every block."""
    blocks: list[tuple[int, str, list[tuple[int, str]]]] = []
    fence, lang, start = "", "", 0
    body: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not fence:
            m = _FENCE.match(line)
            if m:
                fence, lang, start, body = m[1], m[2].lower(), n, []
            continue
        s = line.strip()
        if s and set(s) == {fence[0]} and len(s) >= len(fence):
            blocks.append((start, lang, body))
            fence = ""
        else:
            body.append((n, line))
    if fence:
        raise ValueError(f"README.md:{start}: the code block is never closed")
    return blocks


def readme_commands(text: str) -> list[list[Command]]:
    """The commands of each block that has any, in order."""
    out: list[list[Command]] = []
    for start, lang, body in fenced_blocks(text):
        if lang in PROSE_LANGS:
            continue
        if lang not in COMMAND_LANGS:
            raise ValueError(f"README.md:{start}: a ```{lang} block: add {lang!r} to "
                             "COMMAND_LANGS or PROSE_LANGS in tests/readme_commands.py")
        commands: list[Command] = []
        pending, first = "", 0
        for n, line in body:
            s = line.strip()
            if lang == "console" and not pending:
                if not s.startswith("$ "):
                    continue  # the command's output
                s = s[2:]
            if not pending and (not s or s.startswith("#")):
                continue
            if not pending:
                first = n
            if s.endswith("\\"):
                pending += s[:-1] + " "
                continue
            commands.append(Command(pending + s, first))
            pending = ""
        if pending:
            raise ValueError(f"README.md:{first}: the command's last line ends in '\\'")
        if commands:
            out.append(commands)
    return out
