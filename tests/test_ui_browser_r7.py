"""The real H200 study r7 in a real browser (`advisor dashboard`, headless Chromium through Playwright, as
``tests/test_ui_browser.py`` drives it): a reader walks the Studies page, the study, its answer's trial and a
comparison, and every page says the gain, the counts and the best in the very words `advisor best` and `advisor
studies` print for the same database.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from advisor import api
from tests import r7_study
from tests.test_ui_browser import CHROMIUM, CHROMIUM_ARGS, _main_text, _need_browser, _served, _settle, _wait_plot

pytestmark = pytest.mark.browser

STUDY = r7_study.STUDY


@pytest.fixture(scope="module")
def r7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any]]:
    """(database URL, dashboard base URL, page) on the r7 database."""
    sync_api = _need_browser()
    url = r7_study.unpack(tmp_path_factory.mktemp("r7-db"))
    with _served(url, tmp_path_factory.mktemp("r7-dashboard")) as base, sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(viewport={"width": 1400, "height": 1000})
            yield url, base, context.new_page()
        finally:
            chromium.close()


def _plain(text: str) -> str:
    """A page's text as a reader reads it: no word joiners, one space between words."""
    return " ".join(text.replace("\u2060", "").split())


def test_each_page_says_what_advisor_best_and_studies_print(r7: tuple[str, str, Any]) -> None:
    url, base, pg = r7
    cols, rows = api.studies_table(url)
    cli = {r[0]: dict(zip(cols, r, strict=True)) for r in rows}[STUDY]
    best = api.best_report(url, STUDY)
    said = api.verdict_of(url, STUDY)
    assert said.gain is not None

    # Studies: the counts and the best, cell for cell as `advisor studies`
    pg.goto(base)
    _settle(pg, "Studies")
    pg.get_by_text(f"Open {STUDY}").first.wait_for(timeout=60_000)
    text = _plain(_main_text(pg))
    assert _plain(f"{cli['state']} · {cli['trials']} · best {cli['best']} (trial {cli['best trial']})") in text
    assert "21,846.5 throughput_per_gpu (mean of 2 runs)" in text

    # Study: the gain, the spread, the cluster and the counts, word for word
    pg.locator("a", has_text=f"Open {STUDY}").first.click()
    _settle(pg, f"Study {STUDY}")
    _wait_plot(pg, "history")
    text = _plain(_main_text(pg))
    for line in (said.gain.text(), said.spread, said.cluster, str(cli["trials"])):
        assert _plain(line) in text, line
    verdict = said.lines()  # the sentences under `advisor best`'s table, each on the page
    assert set(verdict) <= set(best.notes) and all(_plain(n) in text for n in verdict), verdict
    assert "1.08× vLLM's defaults" in text and "Run trial 4" in text
    traces = pg.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].find(e => e.layout.meta === "
                         "'history').data.map(d => d.meta).filter(m => m)")
    assert {"search", "baseline", "repeat", "answer"} <= set(traces), traces

    # the answer's trial: every row of its level table in view (nothing cut off), its SLO on the right axis
    pg.goto(f"{base}/trial?study={STUDY}&trial=4")
    _settle(pg, f"Trial 4 of {STUDY}")
    _wait_plot(pg, "levels")
    grid = pg.locator("[data-testid=stDataFrame]").first  # the first table of the page: the levels'
    grid.wait_for(timeout=60_000)
    box = grid.bounding_box()
    assert box is not None and box["height"] >= 35 * 15, box  # one row per metric and SLO mark: 18 rows
    hidden = grid.evaluate("e => { const s = e.querySelector('.dvn-scroller'); "
                           "return s ? s.scrollHeight - s.clientHeight : -1; }")
    assert 0 <= hidden <= 2, hidden  # nothing scrolled out of view
    y2 = pg.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].find(e => e.layout.meta === "
                     "'levels').data.filter(d => d.meta === 'slo:p90_tokens_per_s_per_user').map(d => d.yaxis)")
    assert y2 == ["y2"]

    # Compare: two trials that share no load
    pg.goto(f"{base}/compare?study={STUDY}&trials=0,3")
    _settle(pg, "Compare trials")
    text = _plain(_main_text(pg))
    assert "no shared concurrency" in text and "None" not in text


def test_assets_go_compressed_and_plotly_loads_with_the_page(r7: tuple[str, str, Any]) -> None:
    """Asked for gzip, the server compresses its JavaScript (Plotly's 4.7 MB chunk the most) and the page; the
    page prefetches the Plotly chunk, so a chart does not wait for it to be fetched after the data."""
    import gzip
    import urllib.request

    from ui.server import plotly_chunk

    _, base, _ = r7
    chunk = plotly_chunk()
    assert chunk is not None

    def get(path: str) -> tuple[dict[str, str], bytes]:
        req = urllib.request.Request(base + path, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return {k.lower(): v for k, v in r.headers.items()}, r.read()

    headers, body = get(chunk)
    assert headers.get("content-encoding") == "gzip" and len(body) < len(gzip.decompress(body)) / 2
    headers, body = get(f"/study?study={STUDY}")
    assert headers.get("content-encoding") == "gzip"
    page = gzip.decompress(body).decode()
    assert f'<link rel="prefetch" href="{chunk}">' in page and "BACKEND_BASE_URL" in page


def test_optuna_dashboard_shows_the_answer_s_note(r7: tuple[str, str, Any],
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """optuna-dashboard on the same database: its study page shows the note the tuner writes, naming the trial
    `advisor best` names (skipped where optuna-dashboard is not installed; the test extra installs it)."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    import optuna

    from advisor.study import storage_for

    exe = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or shutil.which("optuna-dashboard")
    if exe is None:
        pytest.skip("optuna-dashboard is not installed (pip install optuna-dashboard)")
    url, _, pg = r7
    body = api.note_answer(url, STUDY)
    assert body is not None
    sid = optuna.load_study(study_name=STUDY, storage=storage_for(url))._study_id  # noqa: SLF001
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("optuna-dashboard") / "log"
    with log.open("w") as fh:
        proc = subprocess.Popen([exe, url, "--host", "127.0.0.1", "--port", str(port)], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/meta", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"optuna-dashboard did not start:\n{log.read_text()}")
                time.sleep(0.5)
        pg.goto(f"http://127.0.0.1:{port}/dashboard/studies/{sid}/note")  # its study note page
        pg.get_by_text("deploy-advisor's answer", exact=False).first.wait_for(timeout=60_000)
        text = _plain(pg.evaluate("() => document.body.innerText"))
        assert "deploy-advisor's answer (advisor best): trial 4 — 21,846.5 throughput_per_gpu (mean of 2 runs)" \
            in text.replace("`", "")
        assert "Optuna's best trial is the same trial (4)." in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
