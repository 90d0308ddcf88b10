"""The README, docs/ and product code read as reference: what is true now and why, never the story of past runs.

A dated paragraph ("on 5 Dec a session …"), a run's name ("study r6", "stop 46") or an issue number says when
something was learnt, which the git log and ``research/diary.md`` keep; in a docstring or a doc it goes stale the
day after and hides the reason. These tests fail when such a pattern comes back, when the reference docs outgrow
their limits, or when a relative link in the README or docs/ points at a file or heading that is not there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("advisor", "executors", "search_spaces", "ui", "db", "scripts")
SUFFIXES = {".py", ".sh", ".md", ".yaml", ".yml", ".toml"}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
         r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
           r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth)")
#: Each pattern with what it catches; one line of product code, README or docs matching any of them fails.
STORY = {
    "a day and month": re.compile(rf"\b\d{{1,2}} {MONTH}\b|\b{MONTH} \d{{1,2}}\b"),
    "a calendar date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a session's ordinal": re.compile(rf"\b{ORDINAL} session\b", re.IGNORECASE),
    "a run's name": re.compile(r"\b(?:stud(?:y|ies)|sessions?|runs?) r\d+\b|\br\d+(?:'s)? (?:run|study|session)\b"),
    "a numbered stop": re.compile(r"\bstops? \d+\b(?!\s*(?:s|ms|min|seconds?|minutes?)\b)"),
    "an issue number": re.compile(r"\bissues? #?\d+|(?<![\w&\"'#{}])#\d{1,4}\b|\bprofile #\d+", re.IGNORECASE),
}
#: Alembic writes its revision header itself (``Create Date: …``); it dates a migration, not a story.
GENERATED = re.compile(r"^Create Date: ")


def _product_files() -> list[Path]:
    files = [p for d in PRODUCT for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return [p for p in files if "__pycache__" not in p.parts] + DOCS


def stories(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the match) for every story pattern in ``text``."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if GENERATED.match(line):
            continue
        found += [(n, what, m.group(0)) for what, rx in STORY.items() for m in rx.finditer(line)]
    return found


def test_no_dated_story_in_product_code_readme_or_docs() -> None:
    hits = [f"{p.relative_to(ROOT)}:{n}: {what} ({got!r})"
            for p in _product_files() for n, what, got in stories(p.read_text(encoding="utf-8"))]
    assert not hits, "say why in the present tense (history goes to the git log or research/diary.md):\n" + \
        "\n".join(hits)


@pytest.mark.parametrize("text", [
    "on 5 Dec a session was lent an H100", "measured December 4", "Create: 2026-12-03", "the Eighth session",
    "the ~30B studies r6 and r7", "the r7 run of the job", "the code of stop 45", "see issue #51", "issue 30's job",
    "(benchmarks/ui_render.py, #16)", "profile #1's probes",
])
def test_the_patterns_catch_each_kind_of_story(text: str) -> None:
    assert stories(text), text


@pytest.mark.parametrize("text", [
    '"color": "#555"', "%&#123;", 'f"{study}#{number}"', "Decode 4 prompts", "a decode step of 2.6 ms",
    "Create Date: 2026-12-03", "stop 10 s after the level", "the first run of the baseline", "deepseek-r1",
])
def test_the_patterns_leave_ordinary_text_alone(text: str) -> None:
    assert not stories(text), text


def _section(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [line for line in lines[start:end] if line.strip()]


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 160
    assert len(_section(text, "## Limits")) <= 10


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> list[str]:
    out, fence = [], False
    for line in text.splitlines():
        fence ^= line.startswith("```")
        if not fence and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(m.group(1))
    return out


def test_benchmarks_doc_is_a_reference_with_contents() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 500
    contents = _section(text, "## Contents")
    linked = {m.group(1) for line in contents for m in re.finditer(r"\]\(#([^)]+)\)", line)}
    sections = {slug(h) for h in _headings(text)[1:] if h != "Contents"}
    top = {slug(line[3:]) for line in text.splitlines() if line.startswith("## ") and line != "## Contents"}
    assert top <= linked <= sections


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in _headings(dest.read_text())}:
            broken.append(f"{target}: no such heading")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)
