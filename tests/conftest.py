import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from exactness import tiny_llamagen  # noqa: E402  (tests/ on the path first)

from specvis.models.drafter import EagleDrafter  # noqa: E402

# The test models are tiny: one thread is faster, and far faster on a busy machine, where
# oversubscribed intra-op threads slow small ops by an order of magnitude.
torch.set_num_threads(1)


# The tiny harness target and its EAGLE head, one pair per module; a module that needs another
# target (other vocabulary, grid or seed) defines its own ``target`` fixture, which wins.
@pytest.fixture(scope="module")
def target():
    return tiny_llamagen(0)


@pytest.fixture(scope="module")
def drafter(target):
    return EagleDrafter.from_target(target, seed=1).eval()


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face home, offline, with no other cache variable set; cwd is tmp_path (so no
    local directory shadows a hub id)."""
    home = tmp_path / "hf"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home
