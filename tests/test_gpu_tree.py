"""scripts/gpu_tree.sh: in a copy of the repository, ``slim`` brings what a device call copies (tracked +
untracked-not-ignored files) to at most 60 MiB without deleting a file, only what travels is enough for the
GPU script's CPU smoke run and for loading both shipped bundles, and ``restore`` puts the index and the
exclude file back exactly (``git status`` clean)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/gpu_tree.sh"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def listed(repo: Path) -> list[str]:
    """The paths a device call copies: tracked and untracked-not-ignored, present on disk."""
    out = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sorted({p for p in out if p and os.path.lexists(repo / p)})


def tree(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", SCRIPT, *args], cwd=repo, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def source_files() -> list[str]:
    """This tree's files: what travels from a git checkout, or every file of a plain copy (a mutant scratch)."""
    if (ROOT / ".git").exists():
        return listed(ROOT)
    skip = {"__pycache__", ".pytest_cache"}
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A repository holding this tree's files as they are now (committed), with an exclude file of its own."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    dst = tmp_path_factory.mktemp("gpu_tree") / "repo"
    for rel in source_files():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel, follow_symlinks=False)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "copy")
    (dst / ".git" / "info").mkdir(exist_ok=True)
    (dst / ".git" / "info" / "exclude").write_text("# exclude as found\n/local-notes/\n")
    return dst


def test_slim_travels_under_the_limit_and_restore_puts_everything_back(repo, tmp_path):
    git_dir = repo / ".git"
    index_before = (git_dir / "index").read_bytes()
    exclude_before = (git_dir / "info" / "exclude").read_bytes()
    on_disk = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts)
    full = float(tree(repo, "size").stdout)
    assert full > 64, "the full tree no longer needs slimming: revisit gpu_tree.sh"

    assert "untracked and ignored" in tree(repo, "slim").stdout
    assert float(tree(repo, "size").stdout) <= 60
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts) == on_disk
    again = tree(repo, "slim", check=False)
    assert again.returncode == 2 and "already slim" in again.stderr
    travels = listed(repo)
    assert "docs/results/data/emoji-t2i-prompt-ids.json" in travels
    assert not any(p.startswith(("docs/img/", "specvis/assets/emoji/mar_")) for p in travels)
    assert float(tree(repo, "size").stdout) == pytest.approx(
        sum(os.lstat(repo / p).st_size for p in travels) / 2 ** 20, abs=0.06)

    # only what travels: the GPU script's smoke run and both bundles
    device = tmp_path / "device"
    for rel in travels:
        (device / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, device / rel, follow_symlinks=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(device), "PYTHONUNBUFFERED": "1"}
    load = subprocess.run([sys.executable, "-c", "import specvis as sv, sys; sv.load('emoji'); sv.load('emoji-t2i');"
                           "assert sv.__file__.startswith(sys.argv[1]), sv.__file__", str(device)],
                          cwd=device, env=env, capture_output=True, text=True, timeout=300)
    assert load.returncode == 0, load.stderr[-2000:]
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_scale.py", "--smoke", "--out", str(out)],
                          cwd=device, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    bad = {k: v for k, v in report["sections"].items() if v["status"] == "error"}
    assert not bad, bad
    assert report["emoji_t2i"]["1"]["ar_img_s"] and report["cuda_tests"]["skipped"] > 0

    assert "back as before slim" in tree(repo, "restore").stdout
    assert git(repo, "status", "--porcelain") == ""
    assert (git_dir / "index").read_bytes() == index_before
    assert (git_dir / "info" / "exclude").read_bytes() == exclude_before
    assert float(tree(repo, "size").stdout) == full
    assert tree(repo, "restore", check=False).returncode == 2


def test_restore_refuses_after_a_commit_made_while_slim(repo):
    tree(repo, "slim")
    head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "while slim")
    refused = tree(repo, "restore", check=False)
    assert refused.returncode == 1 and "HEAD moved" in refused.stderr
    git(repo, "reset", "-q", "--soft", head)
    tree(repo, "restore")
    assert git(repo, "status", "--porcelain") == ""


def test_bad_verb_names_the_allowed_ones(repo):
    proc = tree(repo, "shrink", check=False)
    assert proc.returncode == 2 and "size|slim|restore" in proc.stderr
