"""specvis.hub.resolve_model_dir against a fake huggingface_hub cache in tmp_path (never the network)."""

import hashlib
import os
import sys

import pytest

pytest.importorskip("huggingface_hub")

from specvis.hub import is_hub_id, resolve_model_dir  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(hf_home, repo_id, files=None, commit=COMMIT):
    """Lay out ``repo_id`` as huggingface_hub does: blobs/<hash>, snapshots/<commit>/<file> -> blob, refs/main."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for fname, text in (files or {"config.json": '{"model_type": "fake"}'}).items():
        blob = repo / "blobs" / hashlib.sha1(text.encode()).hexdigest()
        blob.write_text(text)
        (snapshot / fname).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)  # huggingface_hub writes the hash with no newline
    return snapshot


def test_cached_id_resolves_to_snapshot(hf_home):
    snapshot = cache_repo(hf_home, "deepseek-ai/Janus-Pro-1B")
    got = resolve_model_dir("deepseek-ai/Janus-Pro-1B")
    assert got == snapshot.resolve()
    assert (got / "config.json").read_text() == '{"model_type": "fake"}'


def test_uncached_id_is_one_line_naming_id_and_cache(hf_home):
    cache_repo(hf_home, "deepseek-ai/Janus-Pro-1B")
    with pytest.raises(ValueError) as err:
        resolve_model_dir("BAAI/Emu3-Gen")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("BAAI/Emu3-Gen: neither a local directory nor in the Hugging Face cache")
    assert str(hf_home / "hub") in msg and "HF_HUB_OFFLINE" in msg


def test_local_directory_wins_over_cache(hf_home, tmp_path):
    cache_repo(hf_home, "BAAI/Emu3-Gen")
    (tmp_path / "BAAI" / "Emu3-Gen").mkdir(parents=True)
    got = resolve_model_dir("BAAI/Emu3-Gen")
    assert got.resolve() == (tmp_path / "BAAI" / "Emu3-Gen").resolve()


@pytest.mark.parametrize("name", ["no-such-dir/a/b", "./missing", "owner/", "/abs/missing", "a--b/c",
                                  "owner/name.git", "own er/name", "owner/-name"])
def test_malformed_name_rejected(hf_home, name):
    assert not is_hub_id(name)
    with pytest.raises(ValueError, match=r"not a local directory, and not a Hugging Face Hub id \(owner/name\)$"):
        resolve_model_dir(name)


def test_offline_never_tries_network_online_does(hf_home, monkeypatch):
    import huggingface_hub

    calls = []

    def fake(repo_id, **kw):
        calls.append(kw.get("local_files_only", False))
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(ValueError):
        resolve_model_dir("owner/name")
    assert calls == [True]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls.clear()
    with pytest.raises(ValueError, match="downloading it failed: LocalEntryNotFoundError$") as err:
        resolve_model_dir("owner/name")
    assert calls == [True, False] and "\n" not in str(err.value)


def test_without_huggingface_hub(hf_home, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ValueError, match=r"pip install specvis\[hf\]$"):
        resolve_model_dir("owner/name")
