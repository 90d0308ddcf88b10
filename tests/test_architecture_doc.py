"""docs/architecture.md names every product module, names none that is gone, and says every import between
packages that the code makes.

A module nobody can find on the architecture page is a module the next maintainer reads by accident; a page
that names a moved module, or claims arrows the code does not keep, misleads them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("search_spaces", "executors", "db", "advisor", "ui")
#: Alembic revisions are one idea together, the schema's history: the page names their folder.
FOLDERS_NAMED_WHOLE = ("db/migrations/versions/",)
#: The arrows the page's table allows between packages ("may import"), and the one it lists as pointing up.
MAY_IMPORT = {
    "search_spaces": set(),
    "executors": {"search_spaces"},
    "db": {"search_spaces"},
    "advisor": {"search_spaces", "executors", "db"},
    "ui": {"advisor", "db", "search_spaces"},
}
UPWARD: set[tuple[str, str]] = set()  # no import points up


def product_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def unnamed(doc: str, modules: list[str]) -> list[str]:
    """The modules the page does not name as ``path`` (or through a folder it names whole)."""
    return [m for m in modules
            if f"`{m}`" not in doc and not any(m.startswith(f) and f"`{f}`" in doc for f in FOLDERS_NAMED_WHOLE)]


def named_but_missing(doc: str) -> list[str]:
    """Paths of product files the page names that do not exist."""
    pattern = r"`((?:%s)/[\w/.-]*\.py)`" % "|".join(PACKAGES)
    return sorted({m for m in re.findall(pattern, doc) if not (ROOT / m).exists()})


def test_every_product_module_is_named():
    modules = product_modules()
    assert len(modules) > 100  # the walk found the packages
    assert unnamed(DOC.read_text(), modules) == []


def test_a_missing_name_is_caught():
    doc = DOC.read_text()
    grid = "advisor/proposers/grid.py"
    assert unnamed(doc.replace(f"`{grid}`", "grid"), product_modules()) == [grid]
    assert named_but_missing(doc + " `executors/perf/batch.py`") == ["executors/perf/batch.py"]


def test_every_named_module_exists():
    assert named_but_missing(DOC.read_text()) == []


def test_vllm_plugins_are_named_with_their_entry_points():
    doc = DOC.read_text()
    plugins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    assert "vllm.general_plugins" in doc
    for name, target in plugins.items():
        module = target.split(":")[0].replace(".", "/") + ".py"
        assert name in doc and f"`{module}`" in doc, (name, module)


def test_imports_between_packages_are_the_ones_the_page_allows():
    """Runtime and type-only imports alike: an arrow the table does not allow is either a bug or a line here."""
    doc = DOC.read_text()
    found: set[tuple[str, str]] = set()
    for module in product_modules():
        pkg = module.split("/")[0]
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                target = name.split(".")[0]
                if target in PACKAGES and target != pkg and target not in MAY_IMPORT[pkg]:
                    found.add((module, name))
    assert found <= UPWARD, f"imports the page does not allow: {sorted(found - UPWARD)}"
    for module, name in UPWARD & found:
        assert f"`{module}`" in doc and f"`{name}`" in doc


#: The folders beside the product: its benchmarks (one script per question a user or maintainer asks) and the
#: research annex (GPU run scripts, refits, one-off studies and their re-derivation tests). Neither ships.
BESIDE = ("benchmarks", "research")


def imported(source: str) -> set[str]:
    """Every absolute module name ``source`` imports, at run time or for types only."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def imports_of(paths: list[Path], roots: tuple[str, ...]) -> list[tuple[str, str]]:
    """(file, module) for each import of a module under one of ``roots`` by one of ``paths``."""
    return sorted((str(p.relative_to(ROOT)), n) for p in paths for n in imported(p.read_text())
                  if n.split(".")[0] in roots)


def test_the_product_imports_neither_its_benchmarks_nor_research():
    assert imports_of([ROOT / m for m in product_modules()], BESIDE) == []


def test_the_product_tests_and_benchmarks_do_not_import_research():
    """``tests/`` is the product's test suite (``scripts/test.sh``) and ``benchmarks/`` its benchmarks: research
    may use them, never the other way round."""
    paths = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    assert len(paths) > 50
    assert imports_of(paths, ("research",)) == []


def test_an_import_of_research_or_benchmarks_is_caught():
    source = "from research.raw import raw_file\nimport benchmarks.truths as t\nfrom . import x\nimport db\n"
    assert sorted(n for n in imported(source) if n.split(".")[0] in BESIDE) == ["benchmarks.truths", "research.raw"]


#: A lent GPU machine receives the working tree only while it and the ~50 MiB install bundle stay under 64 MiB.
TRACKED_TREE_MAX_BYTES = 12 * 2**20


def test_raw_runs_stay_out_of_the_tracked_tree():
    """A GPU run's raw tarball lives in git history (research/README.md), never in the tree: the tree stays small
    enough to travel to a GPU machine."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [ROOT / p for p in listed.stdout.decode().split("\0") if p]
    assert [f for f in files if f.name == "raw.tar.xz"] == []
    assert sum(f.stat().st_size for f in files if f.is_file()) < TRACKED_TREE_MAX_BYTES


def research_paths(source: str) -> list[str]:
    """String literals (docstrings aside) naming a path under research/: ``"research"`` as a path part, or text
    beginning ``research/``."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings and (n.value == "research" or n.value.startswith("research/"))]


def test_the_product_tests_read_no_research_file():
    """A product test that reads a research file breaks when research moves on; the data it needs is in tests/data."""
    here = Path(__file__).resolve()
    found = {str(p.relative_to(ROOT)): research_paths(p.read_text())
             for p in sorted((ROOT / "tests").rglob("*.py")) if p != here}
    assert {k: v for k, v in found.items() if v} == {}
    assert sorted(research_paths('ROOT / "research" / "gpu"\nx = "research/results/a.json"\n"""research/ doc"""')) == \
        ["research", "research/results/a.json"]
