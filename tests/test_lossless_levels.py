"""crux's levels on the fabric's lossless classes (cruxd.scheduler.dscp.fabric_levels, the
`[leader] lossless_priorities` key, and `cruxctl doctor`'s PFC check against it): the
recipes of docs/operations.md, and no level ever off a declared lossless priority."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.doctor import checks as c
from cruxd.doctor import dcb
from cruxd.scheduler.dscp import FabricLevels, fabric_levels
from tests.test_config import parse
from tests.test_doctor import canned

PFC_3 = "prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n"


def test_the_recipes() -> None:
    # nothing set: a stock RoCE fabric, one lossless class on DSCP 26 (paths only)
    assert fabric_levels(None, None, None) == FabricLevels(1, (26,), (3,), True)
    # two and three lossless classes
    assert fabric_levels(None, None, [4, 3]) == FabricLevels(2, (26, 34), (3, 4), True)
    assert fabric_levels(None, None, [2, 3, 4]) == FabricLevels(3, (18, 26, 34), (2, 3, 4),
                                                                True)
    assert fabric_levels(1, None, [3, 4]) == FabricLevels(1, (26,), (3, 4), True)
    assert fabric_levels(None, [24, 32], [3, 4]) == FabricLevels(2, (24, 32), (3, 4), True)
    # lossy RoCE: the class selectors, up to 8 levels with explicit DSCP
    assert fabric_levels(None, None, []) == FabricLevels(5, (8, 16, 24, 32, 40), (), True)
    assert fabric_levels(8, list(range(0, 64, 8)), []).levels == 8
    # levels without the key (configurations from before it): as given, unchecked
    assert fabric_levels(4, None, None) == FabricLevels(4, (16, 24, 32, 40), (), False)
    assert fabric_levels(None, [26], None) == FabricLevels(1, (26,), (), False)


@pytest.mark.parametrize(("levels", "dscp", "lossless", "why"), [
    (2, None, [3], "2 levels need 2 lossless priorities, and PFC is on 1 (priority 3)"),
    (None, [26, 40], [3, 4], "DSCP 40 is priority 5, which is not lossless (PFC on "
                             "priorities 3, 4)"),
    (None, [26, 30], [3, 4], "DSCP 26 and 30 are both priority 3"),
    (None, None, [3, 3], "priorities must be distinct"),
    (None, None, [8], "priorities are integers 0..7, got 8"),
    (3, [26, 34], [3, 4], "need one DSCP value per level: 3 levels, 2 values"),
])
def test_what_cannot_work_is_refused_with_why(levels: int | None, dscp: list[int] | None,
                                               lossless: list[int], why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        fabric_levels(levels, dscp, lossless)


@given(st.sets(st.integers(0, 7), min_size=1).map(sorted), st.data())
def test_every_level_is_on_its_own_lossless_priority(lossless: list[int],
                                                     data: st.DataObject) -> None:
    """Defaults or any DSCP values the model accepts: each level on a declared lossless
    priority, no two on one."""
    levels = data.draw(st.none() | st.integers(1, len(lossless)))
    dscp = data.draw(st.none() | st.lists(st.integers(0, 63), min_size=1, max_size=8,
                                          unique=True))
    try:
        got = fabric_levels(levels, dscp, lossless)
    except ValueError:
        assert dscp is not None  # the defaults always fit
        return
    prios = [d >> 3 for d in got.dscp]
    assert set(prios) <= set(lossless) and len(set(prios)) == len(prios) == got.levels
    assert got.lossless == tuple(lossless) and got.declared


def test_the_configuration_key() -> None:
    assert (parse("").leader.levels, parse("").leader.dscp,
            parse("").leader.lossless_priorities) == (1, (26,), (3,))
    two = parse("[leader]\nlossless_priorities = [3, 4]\n").leader
    assert (two.levels, two.dscp, two.lossless_priorities) == (2, (26, 34), (3, 4))
    lossy = parse("[leader]\nlossless_priorities = []\nlevels = 3\n").leader
    assert (lossy.levels, lossy.dscp, lossy.lossless_priorities) == (3, (24, 32, 40), ())
    old = parse("[leader]\nlevels = 4\n").leader
    assert (old.levels, old.dscp, old.lossless_priorities) == (4, (16, 24, 32, 40), None)
    for text, want in [
        ("[leader]\nlossless_priorities = [3]\nlevels = 2\n",
         "leader.levels: 2 levels need 2 lossless priorities"),
        ("[leader]\nlossless_priorities = [3, 4]\ndscp = [26, 40]\n",
         "leader.dscp: DSCP 40 is priority 5, which is not lossless"),
        ("[leader]\nlossless_priorities = [3, 9]\n",
         "leader.lossless_priorities: priorities are integers 0..7, got 9"),
    ]:
        with pytest.raises(Exception, match=want):
            parse(text)


def test_doctor_checks_the_declared_priorities_against_the_nic() -> None:
    app = (0, "dscp-prio\n")  # no map on the NIC: DSCP / 8
    runner = canned({"dcb pfc": (0, PFC_3), "dcb app": app})
    # declared [3, 4], the NIC pauses 3 only: refused, with the command that fixes it
    bad = dcb.check_pfc("eth0", (26, 34), runner, lossless=(3, 4))
    assert bad.status == c.FAIL and "PFC is off here on [4]" in bad.detail
    assert "dcb pfc set dev eth0 prio-pfc 4:on" in bad.fix
    # the stock default on a stock NIC
    assert dcb.check_pfc("eth0", (26,), runner, lossless=(3,)).status == c.OK
    # declared lossy: PFC off is what was asked for
    lossy = dcb.check_pfc("eth0", (8, 16, 24, 32, 40), runner, lossless=())
    assert lossy.status == c.OK and "lossy RoCE, as configured" in lossy.detail
    # not declared: a level off the paused priorities is still reported
    assert dcb.check_pfc("eth0", (8, 16, 24, 32, 40), runner).status == c.FAIL


# --- cruxctl status ------------------------------------------------------------------------


@pytest.mark.parametrize(("toml", "says", "lossless"), [
    ("", "levels: DSCP 26 on priority 3, lossless (PFC)", "declared"),
    ("lossless_priorities = [2, 3, 4]", "levels: DSCP 18/26/34 on priorities 2/3/4, lossless "
                                        "(PFC)", "declared"),
    ("lossless_priorities = []", "levels: DSCP 8/16/24/32/40 on priorities 1/2/3/4/5, lossy "
                                 "RoCE (lossless_priorities = [])", "lossy"),
    ("levels = 2", "levels: DSCP 32/40 on priorities 4/5; whether they are lossless is not "
                   "checked", "unchecked"),
])
def test_status_shows_where_the_levels_land(toml: str, says: str, lossless: str) -> None:
    from google.protobuf import json_format
    from rich.console import Console

    from cruxd.cli.status_view import print_status
    from cruxd.leader.status import _fabric_levels
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

    lc = parse(f"[leader]\n{toml}\n").leader
    cluster = cpb.ClusterStatus(leader_host="h0", levels=lc.levels)
    _fabric_levels(cluster, lc)
    console = Console(record=True, width=200)
    print_status(console, None, cluster, 0.0)
    assert says in console.export_text()
    doc = json_format.MessageToDict(cluster, preserving_proto_field_name=True)
    assert doc["lossless"] == lossless
    assert [lv["dscp"] for lv in doc["fabric_levels"]] == list(lc.dscp or ())
    declared = set(lc.lossless_priorities or ())
    assert all(lv.get("lossless", False) == (lv["priority"] in declared)
               for lv in doc["fabric_levels"])


def test_status_flags_a_level_off_the_lossless_priorities() -> None:
    from cruxd.cli.status_cells import fabric_levels as line
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

    # a leader whose configuration was checked cannot say this; an older or hand-made one can
    cluster = cpb.ClusterStatus(lossless="declared", fabric_levels=[
        cpb.FabricLevel(dscp=26, priority=3, lossless=True),
        cpb.FabricLevel(dscp=40, priority=5, lossless=False)])
    assert line(cluster).endswith("lossless (PFC) [red]except 5[/]")
