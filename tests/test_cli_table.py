"""`cruxctl table`: the decision table as the job-side libraries read it, from the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cruxd.cli import cruxctl
from transport.decision_table import Decision, TableWriter


def write(path: Path) -> None:
    with TableWriter.open(path, capacity=16) as w:
        w.apply([Decision("gpt", None, 3, 26, 104, 0, 7),
                 Decision("gpt", "10.0.0.2", 3, 26, 104, 0xC123, 7, 29500, (40001, 40002)),
                 Decision("bert", "10.0.0.3", 1, 10, 40, 0, 7, provisional=True)], 7)


def test_the_table_as_json_and_as_text(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "decisions"
    write(path)
    assert cruxctl.main(["table", "--table", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan_generation"] == 7 and doc["capacity"] == 16
    assert [(e["job_id"], e["peer"]) for e in doc["entries"]] == [
        ("bert", "10.0.0.3"), ("gpt", None), ("gpt", "10.0.0.2")]
    gpt = doc["entries"][2]
    assert (gpt["level"], gpt["dscp"], gpt["sport"], gpt["tcp_dport"], gpt["tcp_sports"]) == (
        3, 26, 0xC123, 29500, [40001, 40002])
    assert doc["entries"][0]["provisional"] is True
    assert cruxctl.main(["table", "--table", str(path), "--job", "gpt", "--json"]) == 0
    assert {e["job_id"] for e in json.loads(capsys.readouterr().out)["entries"]} == {"gpt"}
    assert cruxctl.main(["table", "--table", str(path)]) == 0
    text = capsys.readouterr().out
    assert "(job-wide)" in text and "49443" in text and "(provisional)" in text


def test_a_missing_or_foreign_file_is_one_clear_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cruxctl.main(["table", "--table", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no decision table at" in err
    junk = tmp_path / "junk"
    junk.write_bytes(b"x" * 4096)
    assert cruxctl.main(["table", "--table", str(junk)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a crux decision table" in err
