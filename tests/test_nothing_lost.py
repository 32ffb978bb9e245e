"""Nothing lost, nothing hangs: a user's file that is not ours is never overwritten, a weights file
changed under a loaded model stops the next call in one line, and every input that could block or
grow without bound ends in one line within seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import specvis as sv
from specvis.cli import main


def one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "warning" not in ln]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


BENCH = ["bench", "--model", "random-tiny", "--methods", "ar", "--num", "1", "--no-cost-curve", "--metrics", "none"]


@pytest.mark.parametrize("content", ['{"model": "mine", "notes": [1, 2]}', "[1, 2, 3]", "{not json", "",
                                     '{"specvis_version": "0", "model": "x", "runs": "abc"}'])
def test_bench_refuses_a_json_that_is_not_a_report(content, tmp_path, capsys):
    """``bench --json FILE`` on a JSON object, a list or a corrupt file that is not a bench report: one line
    naming --json, exit 2, the file byte-identical. Catches: "not a bench report; starting afresh" and
    an overwrite (data loss), an AttributeError on a list."""
    mine = tmp_path / "mine.json"
    mine.write_text(content)
    assert main(BENCH + ["--json", str(mine)]) == 2
    line = one_error_line(capsys)
    assert "--json" in line and "not a specvis bench report" in line
    assert mine.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]


def test_bench_resumes_its_own_report_and_merge_refuses_a_list(tmp_path, capsys):
    """A report ``bench`` wrote carries its marker and is resumed; ``--merge`` of a list is one line
    naming --merge. Catches: a marker check that refuses our own reports; merge's AttributeError."""
    js = tmp_path / "r.json"
    assert main(BENCH + ["--json", str(js)]) == 0
    report = json.loads(js.read_text())
    assert report["specvis_report"] == "bench"
    capsys.readouterr()
    assert main(BENCH + ["--json", str(js)]) == 0
    assert "reusing ar" in capsys.readouterr().err
    lst = tmp_path / "list.json"
    lst.write_text("[]")
    assert main(["bench", "--merge", str(js), str(lst), "--json", str(tmp_path / "m.json")]) == 2
    line = one_error_line(capsys)
    assert "--merge" in line and "list.json" in line


@pytest.mark.parametrize("flag", ["--json", "--md", "--plots"])
def test_bench_checks_its_outputs_before_running(flag, tmp_path, capsys, monkeypatch):
    """An output path that cannot be written (a directory for a file, a file for a directory) is one line
    naming the flag before the model loads. Catches: the whole bench run, then a failed write."""
    import specvis.zoo

    monkeypatch.setattr(specvis.zoo, "load", lambda *a, **k: pytest.fail("loaded the model"))
    target = tmp_path / ("afile" if flag == "--plots" else "adir")
    target.mkdir() if flag != "--plots" else target.write_text("x")
    assert main(BENCH + [flag, str(target)]) == 2
    assert flag in one_error_line(capsys)
