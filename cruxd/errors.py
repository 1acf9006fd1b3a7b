"""One error root for crux; the CLI maps these to one line and an exit status."""

from __future__ import annotations


class CruxError(Exception):
    """Root of every error crux raises on purpose."""

    exit_status = 1


class UsageError(CruxError):
    """Bad input from a person or a file: shown as one line, exit status 2."""

    exit_status = 2


class TopologyError(UsageError):
    """A topology that cannot be built as described."""


class ScenarioError(UsageError):
    """A scenario (or topology) file with an invalid field.

    `where` is the file and `path` the JSON path of the offending field, so the
    message reads ``file: $.jobs[2].hosts[0]: unknown host 'h99'``.
    """

    def __init__(self, message: str, *, where: str = "", path: str = "$") -> None:
        self.where = where
        self.path = path
        self.reason = message
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{self.where}: " if self.where else ""
        return f"{head}{self.path}: {self.reason}"

    def located(self, where: str) -> ScenarioError:
        """This error placed in file `where`, unless an inner file already claimed it."""
        if self.where:
            return self
        return ScenarioError(self.reason, where=where, path=self.path)


class DeviceError(CruxError):
    """An OS or device call failed; carries errno where there is one."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        self.errno = errno
        super().__init__(message if errno is None else f"{message} (errno {errno})")
