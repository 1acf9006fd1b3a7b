"""The one owner of levels -> DSCP (cruxd/scheduler/dscp.py) and of the TOS byte and RoCE
ports (transport/roce.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.scheduler.dscp import (
    DEFAULT_LEVELS,
    DEFAULT_RESERVED,
    can_profile,
    default_dscp,
    level_dscp,
    profiling_slot,
    scheduled_dscp,
    unmeasured_slot,
)
from transport.roce import ROCE_DPORT, ROCE_SPORT_MAX, ROCE_SPORT_MIN, ROCE_SPORTS, tos

_reserved = st.sets(st.integers(0, 7), max_size=7).map(sorted)


@given(_reserved, st.integers(1, 8))
def test_levels_map_to_distinct_unreserved_class_selectors(reserved: list[int],
                                                           levels: int) -> None:
    free = 8 - len(reserved)
    if levels > free:
        with pytest.raises(ValueError, match="do not fit"):
            default_dscp(levels, reserved)
        return
    dscp = default_dscp(levels, reserved)
    assert len(dscp) == levels and len(set(dscp)) == levels
    assert list(dscp) == sorted(dscp)  # level 0 lowest
    assert all(d % 8 == 0 and d // 8 not in reserved for d in dscp)
    # the highest unreserved priorities: nothing free sits above the top level
    assert not [p for p in range(dscp[-1] // 8 + 1, 8) if p not in reserved]


def test_the_default_map() -> None:
    assert DEFAULT_LEVELS == 5 and DEFAULT_RESERVED == (0, 6, 7)
    assert level_dscp(DEFAULT_LEVELS) == (8, 16, 24, 32, 40)
    assert level_dscp(2, (26, 46)) == (26, 46)
    with pytest.raises(ValueError, match="distinct"):
        level_dscp(2, (26, 26))
    with pytest.raises(ValueError, match="one DSCP value per level"):
        level_dscp(3, (26, 46))


@given(st.integers(1, 5), st.booleans())
def test_profiling_takes_the_top_level_alone(levels: int, profiling: bool) -> None:
    dscp = level_dscp(levels)
    left = scheduled_dscp(dscp, profiling)
    assert can_profile(levels) == (levels >= 2)
    if profiling and can_profile(levels):
        assert left == dscp[:-1] and profiling_slot(dscp) == (levels - 1, dscp[-1])
        assert profiling_slot(dscp)[1] not in left
    else:
        assert left == dscp
    assert unmeasured_slot(dscp) == (0, dscp[0])


@given(st.integers(0, 63))
def test_tos_carries_dscp_in_its_upper_six_bits(dscp: int) -> None:
    assert 0 <= tos(dscp) <= 0xFF and tos(dscp) >> 2 == dscp and tos(dscp) & 0b11 == 0
    assert tos(46) == 184 and tos(32) == 128


def test_roce_ports() -> None:
    assert ROCE_DPORT == 4791
    assert (ROCE_SPORT_MIN, ROCE_SPORT_MAX) == (0xC000, 0xFFFF)
    assert (ROCE_SPORTS.start, ROCE_SPORTS.stop) == (0xC000, 0x10000)
