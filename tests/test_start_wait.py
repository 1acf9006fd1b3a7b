"""crux-run's wait for a job's first decision (cruxd/cli/start_wait.py) against a real table
file, with the clock and the sleep stepped by the test: an entry written mid-wait is found,
a provisional one or one of a batch not yet whole is not, and the bound always ends it."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cruxd.cli.start_wait import POLL_S, wait_for_decision
from transport.decision_table import Decision, TableReader, TableWriter


class Steps:
    """A clock that moves only when the wait sleeps, running `at[n]` at the n-th sleep."""

    def __init__(self, at: dict[int, Callable[[], None]] | None = None) -> None:
        self.now, self.sleeps, self.at = 100.0, 0, at or {}

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s
        if (act := self.at.get(self.sleeps)) is not None:
            act()


def job(plan: int, provisional: bool = False) -> Decision:
    return Decision("j", None, 2, 24, 96, 0, plan, provisional=provisional)


def test_an_entry_written_while_waiting_ends_the_wait(tmp_path: Path) -> None:
    t = tmp_path / "decisions"
    with TableWriter.open(t, capacity=16) as w:
        steps = Steps({5: lambda: w.apply([job(3)], 3)})
        got = wait_for_decision(t, "j", 2.0, steps.clock, steps.sleep)
    assert got.found and got.plan_generation == 3 and steps.sleeps == 5
    assert abs(got.waited_s - 5 * POLL_S) < 1e-9


def test_a_provisional_entry_is_waited_past(tmp_path: Path) -> None:
    t = tmp_path / "decisions"
    with TableWriter.open(t, capacity=16) as w:
        w.apply([job(1, provisional=True)], 1)
        steps = Steps({3: lambda: w.apply([job(2)], 2)})
        got = wait_for_decision(t, "j", 2.0, steps.clock, steps.sleep)
        assert got.found and got.plan_generation == 2
        w.apply([job(3, provisional=True)], 3)
        steps = Steps()
        late = wait_for_decision(t, "j", 0.01, steps.clock, steps.sleep)
    assert not late.found and "provisional" in late.why


def test_an_entry_of_a_batch_not_yet_whole_is_not_taken(tmp_path: Path) -> None:
    """upsert() writes an entry without publishing its plan generation: the header then says
    the batch that entry belongs to is still being written."""
    t = tmp_path / "decisions"
    with TableWriter.open(t, capacity=16) as w:
        w.upsert(job(7))
        with TableReader(t) as r:
            assert r.header().plan_generation < 7
        steps = Steps({4: lambda: w.advance(7)})
        got = wait_for_decision(t, "j", 2.0, steps.clock, steps.sleep)
    assert got.found and steps.sleeps == 4


def test_no_table_and_no_entry_end_at_the_bound_with_a_reason(tmp_path: Path) -> None:
    steps = Steps()
    got = wait_for_decision(tmp_path / "missing", "j", 0.05, steps.clock, steps.sleep)
    assert not got.found and "cannot read the table" in got.why
    assert 0.05 <= got.waited_s <= 0.05 + POLL_S
    t = tmp_path / "decisions"
    with TableWriter.open(t, capacity=16) as w:
        w.apply([Decision("other", None, 1, 8, 32, 0, 1)], 1)
        steps = Steps()
        got = wait_for_decision(t, "j", 0.01, steps.clock, steps.sleep)
    assert not got.found and got.why == "the table holds no entry for the job"


def test_a_replaced_table_is_reopened(tmp_path: Path) -> None:
    """The agent replaces the file (a restart with another capacity): the wait follows it."""
    t = tmp_path / "decisions"
    first = TableWriter.open(t, capacity=16)
    first.apply([Decision("other", None, 1, 8, 32, 0, 1)], 1)
    second: list[TableWriter] = []

    def restart() -> None:
        first.close()
        second.append(TableWriter.open(t, capacity=32))  # a new file; the old one retired
        second[0].apply([job(9)], 9)

    steps = Steps({3: restart})
    got = wait_for_decision(t, "j", 2.0, steps.clock, steps.sleep)
    second[0].close()
    assert got.found and got.plan_generation == 9


@given(bound=st.floats(0.0, 0.2), arrive=st.integers(1, 200))
def test_the_wait_never_outlasts_its_bound(bound: float, arrive: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        t = Path(d) / "decisions"
        with TableWriter.open(t, capacity=16) as w:
            steps = Steps({arrive: lambda: w.apply([job(1)], 1)})
            got = wait_for_decision(t, "j", bound, steps.clock, steps.sleep)
    assert got.waited_s <= bound + POLL_S + 1e-9
    if arrive * POLL_S < bound - 1e-9:  # written before the bound: found, when written
        assert got.found and abs(got.waited_s - arrive * POLL_S) < 1e-9
    elif arrive * POLL_S > bound + POLL_S:
        assert not got.found


def test_a_bad_wait_bound_is_a_usage_error() -> None:
    import subprocess

    from cruxd.testing import BIN

    for bad in ("-1", "nan", "61"):
        r = subprocess.run([str(BIN / "crux-run"), "--wait-s", bad, "--", "true"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.startswith("crux-run: error: --wait-s must be 0..60 seconds"), r.stderr
