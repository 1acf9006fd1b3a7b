"""One error root for crux; the CLI maps these to one line and an exit status.

Every error says where and why: `where` (a file, a flag, a key, a job) and `why`, shown as
``where: why``. Errors the core raises for bad input also derive from ValueError, so code and
tests written against ValueError (``pytest.raises(ValueError)``) keep working.
"""

from __future__ import annotations


class CruxError(Exception):
    """Root of every error crux raises on purpose."""

    exit_status = 1

    def __init__(self, why: str, *, where: str = "") -> None:
        self.where = where
        self.why = why
        super().__init__(f"{where}: {why}" if where else why)


class UsageError(CruxError):
    """Bad input from a person or a file: shown as one line, exit status 2."""

    exit_status = 2


class MissingExtra(UsageError):
    """A command needs an optional extra that is not installed (`pip install 'crux[plot]'`):
    the invocation asked for more than this install offers, exit status 2 like any usage
    error, before any work is done."""


class TopologyError(UsageError):
    """A topology that cannot be built as described."""


class PlanningError(UsageError, ValueError):
    """A workload the scheduler cannot plan as given (hosts with no path between them, a
    reference job without traffic). ValueError too: what the core raised before."""


class ScenarioError(UsageError):
    """A scenario (or topology) file with an invalid field.

    `where` is the file and `path` the JSON path of the offending field, so the
    message reads ``file: $.jobs[2].hosts[0]: unknown host 'h99'``.
    """

    def __init__(self, message: str, *, where: str = "", path: str = "$") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}", where=where)

    def located(self, where: str) -> ScenarioError:
        """This error placed in file `where`, unless an inner file already claimed it."""
        if self.where:
            return self
        return ScenarioError(self.reason, where=where, path=self.path)
