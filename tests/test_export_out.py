"""``advisor export --out`` onto something that is no folder it may write (an existing file, ``/dev/null``, a
path under ``/proc``, a foreign folder where a format's folder goes) is one line, exit 2, and nothing written:
every format is rendered and every target checked before the first byte is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import advisor, one_line


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``advisor.db`` with a two-trial simulated study ``out-study``."""
    d = tmp_path_factory.mktemp("export-out")
    (d / "job.yaml").write_text(json.dumps({"name": "out-study", "preset": "h200-qwen3-235b",
                                            "budget": {"trials": 2}}))
    p = advisor("tune", "job.yaml", cwd=d)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", ["a-file", "/dev/null", "/proc/advisor-export", "/proc/advisor-export/deeper"])
def test_out_that_is_no_writable_folder_is_one_line_and_nothing_written(study: Path, target: str) -> None:
    (study / "a-file").write_text("kept\n")
    before = _tree(study)
    line = one_line(advisor("export", "out-study", "--format", "all", "--out", target, cwd=study))
    assert line.startswith("error: --out: ") and target in line, line
    assert _tree(study) == before  # the file kept byte for byte, nothing beside it (the database records nothing)
    assert not Path("/proc/advisor-export").exists()


def test_a_foreign_folder_in_the_way_stops_every_format_before_any_is_written(study: Path) -> None:
    out = study / "exports"
    (out / "k8s").mkdir(parents=True)
    (out / "k8s" / "mine.yaml").write_text("a user's own file\n")
    line = one_line(advisor("export", "out-study", "--format", "all", "--out", str(out), cwd=study))
    assert "k8s exists and was not written by `advisor export`" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["k8s"]  # no launch.sh or deployment.json beside it
    assert [p.name for p in (out / "k8s").iterdir()] == ["mine.yaml"]


def test_a_new_nested_folder_is_created_and_written(study: Path) -> None:
    p = advisor("export", "out-study", "--format", "all", "--out", "new/nested", cwd=study)
    assert p.returncode == 0, p.stdout + p.stderr
    names = sorted(x.name for x in (study / "new" / "nested").iterdir())
    assert names == ["deployment.json", "k8s", "launch.sh", "ray-serve"]  # no temporary file left beside them
    assert (study / "new" / "nested" / "launch.sh").stat().st_mode & 0o111
