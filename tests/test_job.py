"""``specvis.job.Job``: one job built by every door (generate, sample, bench, the server) and run
through the pipeline's public call; along ``specvis generate`` each of ``batch_size``, ``seed`` and
``classes`` is checked once, by the pipeline."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest
import torch

import specvis as sv
from specvis import checks
from specvis.cli import main
from specvis.job import Job
from specvis.sampling import Sampling


@pytest.fixture(scope="module")
def emoji():
    return sv.load("emoji")


class Tiny:
    """Stands for a pipeline where a job asks it only its number of classes."""

    num_classes = 4


# ---------------------------------------------------------------- what a job means


def test_image_i_takes_condition_i_mod_the_number_given():
    job = Job(classes=(1, 3), num=5).for_pipe(Tiny())
    assert job.classes == (1, 3, 1, 3, 1) and job.num == 5
    assert Job().for_pipe(Tiny()).classes == (0, 1, 2, 3, 0, 1, 2, 3)  # no classes: every class, 8 images
    assert Job(classes=(2, 0)).for_pipe(Tiny()).classes == (2, 0)  # no num: one per class
    text = Job(prompts=("a", "b", "c"), negative_prompts=("x",), num=4).for_pipe(Tiny())
    assert text.prompts == ("a", "b", "c", "a") and text.negative_prompts == ("x",) * 4
    per = Job(prompts=("a", "b"), negative_prompts=("x", "y"), num=3).for_pipe(Tiny())
    assert per.negative_prompts == ("x", "y", "x")
    assert per.for_pipe(Tiny()) == per  # resolving again changes nothing


def test_a_job_refuses_what_no_image_would_check():
    """A class given but beyond ``num`` never reaches the pipeline: the job refuses it (the pipeline
    checks those the images take); negative prompts must be one, or one per prompt."""
    with pytest.raises(ValueError, match=r"classes\[1\] = 9 is out of range: give class ids in 0..3"):
        Job(classes=(1, 9), num=1).for_pipe(Tiny())
    with pytest.raises(ValueError, match=r"negative_prompts: give one, or one per prompt \(3\), got 2"):
        Job(prompts=("a", "b", "c"), negative_prompts=("x", "y")).for_pipe(Tiny())


def test_a_job_runs_as_the_pipeline_call_it_stands_for(emoji):
    """``Job.run`` is ``pipe(...)`` with the job's fields: same tokens as the direct call, and the
    first ``num`` images of it on request."""
    job = Job(method="ar", classes=(3, 5), num=3, seed=11, batch_size=2)
    direct = emoji([3, 5, 3], sv.AR(), seed=11, batch_size=2, decode=False)
    out = job.run(emoji, decode=False)
    assert torch.equal(out.tokens, direct.tokens)
    assert torch.equal(job.run(emoji, 1, decode=False).tokens, emoji([3], sv.AR(), seed=11, decode=False).tokens)


def test_the_pipeline_checks_the_job(emoji):
    for job, needle in ((Job(classes=(99,)), r"classes\[0\] = 99 is out of range"),
                        (Job(classes=(1,), batch_size=0), "batch_size must be an integer >= 1"),
                        (Job(classes=(1,), seed=-1), "seed must be an integer in 0..2\\*\\*64-1")):
        with pytest.raises(ValueError, match=needle):
            job.run(emoji)


# ---------------------------------------------------------------- each argument checked once


def count_checks(monkeypatch) -> Counter:
    """Calls of the functions that check a batch size (``checks.integer`` with ``what`` naming it),
    a seed (``checks.seed``) or class ids (``checks.class_ids``, ``generate.check_conditions``),
    counted by argument. Every binding of them in every loaded specvis module is replaced (as
    tests/test_validated_once.py does), so a check reached under another name counts too; the CLI's
    own checks go through them (``cli.check_common``)."""
    from specvis.generate import check_conditions

    names = {"batch_size": "batch_size", "--batch-size": "batch_size"}
    counted = {id(checks.integer): (checks.integer, lambda value, what, *a, **k: names.get(what)),
               id(checks.seed): (checks.seed, lambda *a, **k: "seed"),
               id(checks.class_ids): (checks.class_ids, lambda *a, **k: "classes"),
               id(check_conditions): (check_conditions, lambda *a, **k: "classes")}
    seen: Counter = Counter()

    def counting(fn, field_of):
        def wrapper(*args, **kwargs):
            field = field_of(*args, **kwargs)
            if field is not None:
                seen[field] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name, module in list(sys.modules.items()):
        if module is not None and (name == "specvis" or name.startswith("specvis.")):
            for attr, value in list(vars(module).items()):
                if id(value) in counted:
                    monkeypatch.setattr(module, attr, counting(*counted[id(value)]))
    return seen


GENERATE = ["generate", "--model", "emoji", "--method", "ar", "--class", "3", "5", "--num", "2", "--seed", "7",
            "--batch-size", "2", "--quiet"]


def test_generate_adds_no_check_to_the_pipeline_call(emoji, tmp_path, monkeypatch):
    """Along one ``specvis generate`` the batch size, seed and classes are checked exactly as often as
    along the one ``pipe(...)`` call it makes: the CLI checks none of them itself (it did: ``--batch-size``
    and ``--seed`` in ``check_common``, ``--batch-size`` again and every ``--class`` in ``cmd_generate``)."""
    seen = count_checks(monkeypatch)
    emoji([3, 5], sv.AR(), seed=7, batch_size=2, decode=False)
    direct = dict(seen)
    seen.clear()
    assert main([*GENERATE, "--out", str(tmp_path / "g")]) == 0
    assert dict(seen) == direct
    assert set(direct) == {"batch_size", "seed", "classes"}  # the counter sees each of them


def test_generate_checks_each_argument_once(tmp_path, monkeypatch):
    """The gauge: one check each of ``batch_size``, ``seed``, ``classes`` along one ``specvis
    generate`` (the pipeline's, tests/test_validated_once.py; the CLI adds none)."""
    seen = count_checks(monkeypatch)
    assert main([*GENERATE, "--out", str(tmp_path / "g")]) == 0
    assert dict(seen) == {"batch_size": 1, "seed": 1, "classes": 1}


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    (["--seed", str(2**64)], f"--seed must be an integer in 0..2**64-1, got {2**64}"),
    (["--class", "3", "11", "--num", "1"], "--class 11 is out of range: give class ids in 0..10"),
    (["--class", "12"], "--class 12 is out of range: give class ids in 0..10"),
])
def test_the_pipelines_errors_name_the_flag(args, needle, tmp_path, capsys):
    """Checked once, by the pipeline, and still one line naming the flag, exit 2, nothing written."""
    out = tmp_path / "o"
    assert main(["generate", "--model", "emoji", "--method", "ar", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"specvis: error: {needle}"]
    assert not out.exists()


def test_generate_records_the_job_it_ran(tmp_path):
    out = tmp_path / "g"
    assert main([*GENERATE, "--class", "1", "--num", "3", "--out", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["classes"] == [3, 5, 1] and stats["seed"] == 7 and stats["batch_size"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["000.png", "001.png", "002.png", "grid.png", "heatmap.png",
                                                     "stats.json"]


# ---------------------------------------------------------------- the server's door


def test_a_request_becomes_a_job():
    from specvis.serve.request import ServedModel, parse

    text = ServedModel("t2i", None, {"64x32": (4, 8)}, "64x32", 16, Sampling(), "ar")
    req = parse({"prompt": "a cat", "n": 3, "seed": 5, "negative_prompt": "blur", "temperature": 0.5}, text)
    assert req.job == Job(model="t2i", method="ar", sampling=req.sampling, prompts=("a cat",),
                          negative_prompts=("blur",), height=4, width=8, num=3, seed=5)
    classes = ServedModel("emoji", ["cat", "dog"], {"32x32": (4, 4)}, "32x32", 16, Sampling(), "ar")
    req = parse({"prompt": "dog", "n": 2}, classes)
    assert req.job == Job(model="emoji", method="ar", sampling=req.sampling, classes=(1,), num=2, seed=None)
    assert req.job.for_pipe(Tiny()).classes == (1, 1)
