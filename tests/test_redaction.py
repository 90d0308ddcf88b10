"""A database password never reaches output or the database, whatever form it takes in the URL: in the
userinfo (percent-encoded or not, with ``/``, ``@``, ``:``, ``?``, ``#`` in it) or as a ``?password=`` parameter.
``db.redact_url`` is the one place a URL is made fit to print or store; these tests hold it to that, and hold
the places that print or store a URL (the stored job, a connection error, ``validate --show``) to using it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from db import redact_url, scrub

#: Passwords made of the characters that break URL parsing, among ordinary ones.
PASSWORDS = st.text(alphabet=st.sampled_from("aZ9/@:?#&=%+ ;!$'()*,[]~-._"), min_size=1, max_size=24)
HOST = "db.example:5432/results"


@settings(max_examples=300, deadline=None)
@given(PASSWORDS)
def test_userinfo_password_in_any_spelling_is_hidden(pw: str) -> None:
    for spelled in (pw, quote(pw, safe="")):
        assert redact_url(f"postgresql+psycopg://alice:{spelled}@{HOST}") == f"postgresql+psycopg://alice:***@{HOST}"
        assert redact_url(f"postgresql://alice:{spelled}@{HOST}?sslmode=require") == \
            f"postgresql://alice:***@{HOST}?sslmode=require"


@settings(max_examples=300, deadline=None)
@given(PASSWORDS)
def test_query_password_in_any_spelling_is_hidden(pw: str) -> None:
    for spelled in (pw, quote(pw, safe="")):
        assert redact_url(f"postgresql://alice@{HOST}?sslmode=require&password={spelled}") == \
            f"postgresql://alice@{HOST}?sslmode=require&password=***"
        # first of several: the rest of the query goes too (an unencoded & cannot be told from the next key)
        assert redact_url(f"postgresql://alice@{HOST}?PASSWORD={spelled}&sslmode=require") == \
            f"postgresql://alice@{HOST}?PASSWORD=***"


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from("aZ9/@:?#%+"), min_size=6, max_size=24))
def test_scrub_hides_the_password_in_a_drivers_message(pw: str) -> None:
    url = f"postgresql://alice:{quote(pw, safe='')}@{HOST}"
    msg = f'could not parse {url!r}; connection to "{HOST}" failed for user "alice" with password "{pw}"'
    out = scrub(msg, url)
    assert pw not in out and quote(pw, safe="") not in out and "***" in out


def test_urls_without_a_password_are_unchanged() -> None:
    for url in ("sqlite:///runs/advisor.db", "sqlite:////tmp/a@b:c.db", "postgresql://alice@db.example/results",
                "postgresql://db.example/results?sslmode=require"):
        assert redact_url(url) == url


def _advisor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_stored_job_error_lines_and_show_never_hold_the_password(tmp_path: Path) -> None:
    from advisor.job import job_from_dict

    pw = "s3cr/et@pa:ss"
    urls = [f"postgresql://alice:{pw}@127.0.0.1:1/results", f"postgresql://alice@127.0.0.1:1/results?password={pw}",
            f"alice:{pw}@127.0.0.1:1"]  # the last is no URL at all: the error that says so must not echo it
    for url in urls:
        job = job_from_dict({"name": "r", "preset": "h200-qwen3-235b", "storage": url})
        assert "s3cr" not in str(job.to_document()), url  # what the study's row stores
        p = _advisor("studies", "--storage", url, cwd=tmp_path)
        assert p.returncode == 2 and "***" in p.stderr, (url, p.stderr)
        assert not any(part in p.stdout + p.stderr for part in ("s3cr", "et@pa", "ss@")), (url, p.stderr)
    (tmp_path / "job.yaml").write_text(f"name: r\npreset: h200-qwen3-235b\nstorage: '{urls[0]}'\n")
    p = _advisor("validate", "job.yaml", "--show", cwd=tmp_path)
    assert p.returncode == 0 and "s3cr" not in p.stdout + p.stderr and "alice:***@127.0.0.1:1" in p.stdout
