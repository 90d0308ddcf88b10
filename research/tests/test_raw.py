"""``research.raw``: every raw run the index lists is the blob git holds, read back whole and checked; a file the
tree has wins; a clone without the history gets a one-line reason, never a wrong file."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from research import raw
from research.tests.gpu_records import ROOT

SMALL = "research/results/cpu-profile/raw.tar.xz"  # the smallest tarball (27 KB): read here for real


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOY_ADVISOR_RAW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_indexed_file_is_in_git_history_at_its_size() -> None:
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the raw runs are in its history")
    for key, entry in raw.index().items():
        got = _git("cat-file", "-s", f"{entry['commit']}:{entry['git_path']}")
        if got.returncode != 0:
            pytest.skip(f"git history lacks {entry['commit']} (a shallow clone?): {got.stderr.strip()}")
        assert int(got.stdout) == entry["bytes"], key
        assert key.startswith("research/results/"), key


def test_a_file_comes_out_of_history_checked_and_cached(cache) -> None:
    try:
        path = raw.raw_file(SMALL)
    except raw.RawUnavailable as e:
        pytest.skip(str(e))
    entry = raw.index()[SMALL]
    assert path.parent == cache and hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    assert raw.raw_file(ROOT / SMALL) == path  # an absolute path names the same file; the copy is reused


def test_the_working_trees_file_wins(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(raw, "ROOT", tmp_path)
    (tmp_path / "research/results/x").mkdir(parents=True)
    (tmp_path / "research/results/x/raw.tar.xz").write_bytes(b"brought back")
    assert raw.raw_file("research/results/x/raw.tar.xz") == tmp_path / "research/results/x/raw.tar.xz"


def test_an_unlisted_file_or_a_blob_of_another_sha_is_refused(cache, monkeypatch) -> None:
    with pytest.raises(raw.RawUnavailable, match="not listed in research/results/raw-index.json"):
        raw.raw_file("research/results/nowhere/raw.tar.xz")
    wrong = {**raw.index()[SMALL], "sha256": "0" * 64}
    monkeypatch.setattr(raw, "index", lambda: {SMALL: wrong})
    if _git("cat-file", "-e", f"{wrong['commit']}:{wrong['git_path']}").returncode != 0:
        pytest.skip("git history lacks the blob")
    with pytest.raises(raw.RawUnavailable, match="the index says 0000"):
        raw.raw_file(SMALL)
    assert not list(cache.glob("*"))  # nothing written


def test_without_history_the_reason_is_one_line(cache, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-such-repository"))
    with pytest.raises(raw.RawUnavailable) as e:
        raw.raw_file(SMALL)
    assert "git history does not hold" in str(e.value) and "\n" not in str(e.value)


def test_the_index_is_sorted_json_with_one_entry_per_file() -> None:
    doc = json.loads(raw.INDEX.read_text())
    assert list(doc["files"]) == sorted(doc["files"])
    assert all(set(e) == {"commit", "git_path", "sha256", "bytes"} for e in doc["files"].values())
