"""scripts/gpu_scale_page.py: the goals read off a gpu_scale report (met, not met, not measured), and the
page of the committed smoke report says it is a smoke run."""

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = json.loads((ROOT / "docs" / "results" / "gpu-scale-smoke.json").read_text())


def load_page():
    spec = importlib.util.spec_from_file_location("gpu_scale_page", ROOT / "scripts" / "gpu_scale_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gp = load_page()


def goal_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.split("## Goals")[1].split("##")[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("goal", "---"):
            rows[cells[0]] = cells[3]
    return rows


def test_goals_are_judged_against_their_bounds():
    r = copy.deepcopy(SMOKE)
    r["smoke"] = False
    b7 = r["shapes"]["7b"]
    b7["ar_step_over_floor"] = {"1": 1.2}
    b7["cost_ratio"] = {"1": {"17": 1.16, "33": 1.3}}
    r["vs_transformers"]["1"] = None
    r["emoji"]["1"]["ar_img_s"] = 12.0
    r["emoji_t2i"]["1"]["best_lossless_speedup"] = 1.9
    rows = goal_rows(gp.page(r))
    assert rows["7B AR step over the bandwidth floor (batch 1)"] == "met"
    assert rows["7B cost c(17)/c(1), batch 1 with CFG"] == "**not met**"
    assert rows["7B cost c(33)/c(1), batch 1 with CFG"] == "met"  # the bound itself is met
    assert rows["specvis AR over transformers' generate (Janus-Pro-1B shape, batch 1)"] == "not measured"
    assert rows["emoji AR images/s, batch 1"] == "met"
    assert rows["emoji-t2i best lossless speedup, batch 1"] == "**not met**"
    assert len(rows) == 10
    assert "SMOKE" not in gp.page(r)


def test_the_smoke_page_says_it_is_a_smoke_run_and_lists_every_section():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_scale_page.py"),
                           str(ROOT / "docs" / "results" / "gpu-scale-smoke.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "SMOKE RUN" in proc.stdout
    for name in SMOKE["sections"]:
        assert f"| {name} |" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_scale_page.py"), "/no/such.json"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a readable JSON report" in bad.stderr
