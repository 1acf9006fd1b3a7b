"""How every crux command ends on purpose: a CruxError becomes one line on stderr and its
exit status, never a traceback. The one place that maps errors for cruxctl, cruxd and
crux-run (kept free of rich and numpy, which crux-run must not pay for before exec)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from cruxd.errors import CruxError
from cruxd.extras import missing_extra


def run_command(prog: str, body: Callable[[], int]) -> int:
    """`body()`'s exit status; for a CruxError, ``prog: error: where: why`` and its status.

    A closed stdout (``cruxctl plan | head``) is a normal end, not an error.
    """
    try:
        try:
            return body()
        except ImportError as exc:  # an optional extra this install lacks: name it
            extra = missing_extra(exc)
            if extra is None:
                raise
            raise extra from exc
    except CruxError as exc:
        logging.getLogger(prog).debug("fatal", exc_info=True)  # the trace, at debug level
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        return 0
