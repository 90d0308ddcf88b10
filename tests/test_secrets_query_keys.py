"""A password given as a query parameter is hidden whatever spelling its *key* takes. The driver reads a query key
through ``parse_qsl`` (``%XX`` decoded, ``+`` a space) and libpq trims the spaces around it, so ``?%70assword=``,
``?pass%77ord=`` and ``?+password=`` all log in with the value; ``?password%3D…`` puts the secret in the key
itself. Every place that prints or stores a URL goes through ``db.redact_url`` and ``db.scrub``: the unit tests
hold those to every spelling, the process tests hold the commands (error lines, ``validate --show``, the stored
job, the ``studies`` header and the ``tune`` summary on a real PostgreSQL login) to using them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from db import redact_url, scrub
from tests.cli_run import advisor, one_line

#: How a key the driver reads as ``password`` can be written.
KEY_SPELLINGS = ["password", "PASSWORD", "%70assword", "pass%77ord", "%70%61%73%73%77%6F%72%64", "+password",
                 "password+", "++password", "%20password", "sslpassword", "ssl%70assword"]
SECRET = "Hunter2-s3cr/et@pa:ss"
HOST = "postgresql://alice@127.0.0.1:1/results"
PASSWORDS = st.text(alphabet=st.sampled_from("aZ9/@:?#&=%+ ;!$'()*,[]~-._"), min_size=6, max_size=24)


def _leaks(text: str, pw: str) -> bool:
    return any(s in text for s in {pw, quote(pw, safe=""), quote(pw, safe="/@:")})


@settings(max_examples=200, deadline=None)
@given(PASSWORDS, st.sampled_from(KEY_SPELLINGS), st.booleans())
def test_a_query_password_under_any_key_spelling_is_hidden(pw: str, key: str, first: bool) -> None:
    for spelled in (pw, quote(pw, safe="")):
        url = f"{HOST}?{key}={spelled}" if first else f"{HOST}?sslmode=require&{key}={spelled}"
        shown = redact_url(url)
        assert shown == url[: url.index(f"{key}=") + len(key) + 1] + "***", (url, shown)
        msg = f"connection to {url!r} failed: password {pw!r} (as sent: {spelled})"
        assert not _leaks(scrub(msg, url), pw), (url, scrub(msg, url))


@settings(max_examples=200, deadline=None)
@given(PASSWORDS)
def test_a_secret_inside_the_key_is_hidden_with_its_key(pw: str) -> None:
    for url in (f"{HOST}?password%3D{quote(pw, safe='')}", f"{HOST}?sslmode=require&password%3D{quote(pw, safe='')}=x",
                f"{HOST}?%70assword%3D{quote(pw, safe='')}"):
        shown = redact_url(url)
        assert shown.endswith("?***") or shown.endswith("&***"), (url, shown)
        msg = f'invalid connection option "password={pw}" in {url}'
        assert not _leaks(scrub(msg, url), pw), (url, scrub(msg, url))


def test_ordinary_query_parameters_are_kept() -> None:
    for url in (f"{HOST}?sslmode=require", f"{HOST}?sslmode=require&application_name=advisor",
                "sqlite:///runs/advisor.db?timeout=30"):
        assert redact_url(url) == url


@pytest.mark.parametrize("key", ["%70assword", "pass%77ord", "+password", "password%3D"])
def test_error_lines_show_and_the_stored_job_never_hold_a_query_password(tmp_path: Path, key: str) -> None:
    from advisor.job import job_from_dict

    url = f"{HOST}?{key}={quote(SECRET, safe='')}"
    job = job_from_dict({"name": "r", "preset": "h200-qwen3-235b", "storage": url})
    assert "Hunter2" not in json.dumps(job.to_document()), "the stored job holds the password"
    line = one_line(advisor("studies", "--storage", url, cwd=tmp_path))
    assert "***" in line and "Hunter2" not in line, line
    sqlite = f"sqlite:///{tmp_path}/x.db?{key}={quote(SECRET, safe='')}"
    line = one_line(advisor("studies", "--storage", sqlite, cwd=tmp_path))
    assert "Hunter2" not in line, line
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "r", "preset": "h200-qwen3-235b", "storage": url}))
    p = advisor("validate", "job.yaml", "--show", cwd=tmp_path)
    assert p.returncode == 0 and "Hunter2" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert f"?{key}=***" in p.stdout or "?***" in p.stdout, p.stdout


@pytest.mark.postgres
def test_a_real_login_by_a_percent_encoded_key_prints_and_stores_no_password(tmp_path: Path, pg_url: str) -> None:
    """The finding was real on PostgreSQL: ``?%70assword=`` logged in and the password was printed (``studies``
    header, ``tune`` summary) and stored (the study's job)."""
    parts = urlsplit(pg_url)
    password = parts.password
    assert password
    netloc = f"{parts.username}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    for key in ("%70assword", "+password"):
        url = urlunsplit((parts.scheme, netloc, parts.path, f"{key}={quote(password, safe='')}", ""))
        name = f"qkey-{os.getpid()}-{len(key)}"
        (tmp_path / "job.yaml").write_text(json.dumps({"name": name, "preset": "h200-qwen3-235b",
                                                       "budget": {"trials": 2}, "storage": url}))
        out = ""
        for args in (("tune", "job.yaml"), ("studies", "--storage", url)):
            p = advisor(*args, cwd=tmp_path)
            assert p.returncode == 0, p.stdout + p.stderr  # it logged in with the key as spelled
            out += p.stdout + p.stderr
        leaks = (f"={password}", f"={quote(password, safe='')}")  # the role may share the password's text
        assert f"?{key}=***" in out and not any(x in out for x in leaks), out
        import sqlalchemy as sa

        eng = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
        with eng.connect() as c:
            stored = c.execute(sa.text("SELECT job FROM advisor_studies WHERE name = :n"), {"n": name}).scalar_one()
        eng.dispose()
        assert not any(x in json.dumps(stored) for x in leaks), "the stored job holds the password"
        assert f"?{key}=***" in stored["storage"], stored["storage"]
