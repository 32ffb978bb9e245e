"""CPU intra-op threads chosen by sv.load: 1 for small targets on CPU unless SPECVIS_THREADS,
OMP_NUM_THREADS or threads= say otherwise (torch's count is restored after each test)."""

import os

import pytest
import torch

import specvis as sv
from specvis.cli import main
from specvis.zoo import SMALL_MODEL_PARAMS, threads_for


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("SPECVIS_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(3)  # a count none of the rules below gives by accident
    yield
    torch.set_num_threads(before)


def test_small_target_on_cpu_gets_one_thread():
    pipe = sv.load("random-tiny")
    assert torch.get_num_threads() == 1 and pipe.extras["threads"] == 1
    assert "under 50M parameters" in pipe.extras["threads_source"]


def test_the_rule():
    assert threads_for(SMALL_MODEL_PARAMS - 1, "cpu") == (1, "default: target under 50M parameters on CPU")
    assert threads_for(SMALL_MODEL_PARAMS, "cpu")[0] is None  # big target: torch's default
    assert threads_for(1000, "cuda")[0] is None  # not the CPU
    assert threads_for(1000, torch.device("cpu"))[0] == 1


def test_omp_num_threads_leaves_torchs_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    pipe = sv.load("random-tiny")
    assert torch.get_num_threads() == 3 and "threads" not in pipe.extras


def test_specvis_threads_overrides(monkeypatch):
    monkeypatch.setenv("SPECVIS_THREADS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # SPECVIS_THREADS wins over OMP_NUM_THREADS
    pipe = sv.load("random-tiny")
    assert torch.get_num_threads() == 2 and pipe.extras["threads"] == 2
    assert pipe.extras["threads_source"] == "SPECVIS_THREADS"
    assert threads_for(10 ** 9, "cuda") == (2, "SPECVIS_THREADS")  # explicit: any model, any device


def test_threads_argument_wins(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # any machine: 4 threads within its cores
    monkeypatch.setenv("SPECVIS_THREADS", "2")
    pipe = sv.load("random-tiny", threads=4)
    assert torch.get_num_threads() == 4 and pipe.extras["threads"] == 4 and pipe.extras["threads_source"] == "threads="


def test_zero_means_torchs_default(monkeypatch):
    monkeypatch.setenv("SPECVIS_THREADS", "0")
    pipe = sv.load("random-tiny")
    assert torch.get_num_threads() == 3 and "threads" not in pipe.extras


@pytest.mark.parametrize("env,arg,message", [
    ("abc", None, "SPECVIS_THREADS 'abc': give a whole number of CPU threads in 1.."),
    (str(10**9), None, "SPECVIS_THREADS '1000000000': give a whole number of CPU threads in 1.."),
    (None, 10**9, "threads= 1000000000: give a whole number of CPU threads in 1.."),
    ("-2", None, "SPECVIS_THREADS '-2': give a whole number"),
    (None, 2.5, "threads= 2.5: give a whole number"),
    (None, "x", "threads= 'x': give a whole number"),
])
def test_bad_value_is_one_line(monkeypatch, env, arg, message):
    if env is not None:
        monkeypatch.setenv("SPECVIS_THREADS", env)
    with pytest.raises(ValueError) as e:
        sv.load("random-tiny", threads=arg)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert torch.get_num_threads() == 3


def test_cli_bad_specvis_threads(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECVIS_THREADS", "abc")
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specvis: error: SPECVIS_THREADS 'abc'") and "\n" not in err
