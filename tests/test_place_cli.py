"""`cruxctl place`: Arnold's MIP on a saved Arnold hints document, its answer as JSON and as
a table, and every bad input answered with exit status 2 and a reason. (The live path, hints
from a running leader, is in tests/test_hints_leader.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cruxd.cli.cruxctl import main
from cruxd.hints.arnold_mip import place
from tests.test_hints_arnold import document


def saved(tmp_path: Path, doc: object) -> str:
    f = tmp_path / "arnold.json"
    f.write_text(json.dumps(doc))
    return str(f)


def test_place_from_a_saved_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = document([6, 10, 4], load=[0.0, 0.5, 0.0])  # 20 free 8-GPU nodes
    f = saved(tmp_path, doc)
    assert main(["place", "--dp", "12", "--tp", "4", "--pp", "2", "--hints", f, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = place(doc, 12, 4, 2)
    assert out["nodes"] == want.to_dict()["nodes"] and len(out["nodes"]) == 12  # 96 GPUs
    assert out["max_pp_spread"] == 1 and out["weighted_spread"] == 0.0  # alpha 0: PP together
    hosts = [n["host"] for n in out["nodes"]]
    assert len(set(hosts)) == 12 and all(doc["nodes"][h]["free"] for h in hosts)
    assert main(["place", "--dp", "12", "--tp", "4", "--pp", "2", "--hints", f,
                 "--alpha", "1", "--beta", "0", "--unit", "dp"]) == 0
    text = capsys.readouterr().out
    assert "placement" in text and "minipod" in text and hosts[0] in text


@pytest.mark.parametrize(("args", "doc", "message"), [
    (["--dp", "64", "--tp", "8", "--pp", "1"], "ok", "needs 64 free 8-GPU nodes"),
    (["--dp", "0", "--tp", "8", "--pp", "1"], "ok", "--dp must be at least 1"),
    (["--dp", "1", "--tp", "8", "--pp", "1", "--time-limit", "0"], "ok", "--time-limit"),
    (["--dp", "1", "--tp", "8", "--pp", "1", "--alpha", "0", "--beta", "0"], "ok",
     "alpha and beta"),
    (["--dp", "1", "--tp", "8", "--pp", "1"], "{not json", "not JSON"),
    (["--dp", "1", "--tp", "8", "--pp", "1"], [1, 2], "expected a JSON object, got list"),
    (["--dp", "1", "--tp", "8", "--pp", "1"], {"format": "crux.slurm"},
     "not a crux.arnold v1 document"),
    (["--dp", "1", "--tp", "8", "--pp", "1"], {"format": "crux.arnold", "version": 1},
     "not a usable Arnold hints document"),
    (["--dp", "1", "--tp", "8", "--pp", "1", "--scenario", "testbed96"], "ok", "takes no"),
])
def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    args: list[str], doc: object, message: str) -> None:
    if doc == "ok":
        f = saved(tmp_path, document([2, 2]))
    elif isinstance(doc, str):
        f = str(tmp_path / "bad.json")
        Path(f).write_text(doc)
    else:
        f = saved(tmp_path, doc)
    assert main(["place", *args, "--hints", f]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cruxctl: error: ") and message in err, err


def test_missing_file_and_a_full_scenario(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--dp", "1", "--tp", "8", "--pp", "1", "--hints",
                 str(tmp_path / "none.json")]) == 2
    assert "No such file" in capsys.readouterr().err
    # what-if on the bundled testbed: its scenario's jobs hold every GPU
    assert main(["place", "--dp", "1", "--tp", "8", "--pp", "1", "--scenario",
                 "testbed96"]) == 2
    assert "the fabric has 0" in capsys.readouterr().err
