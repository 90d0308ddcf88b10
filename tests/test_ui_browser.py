"""The dashboard in a real browser: `advisor dashboard` on 127.0.0.1, driven by Playwright in headless
Chromium (Debian's /usr/bin/chromium; never `playwright install`).

Two real simulated studies fill the database; one dashboard and one browser serve every test of this module.
The tests visit every page, check that the Pareto plot holds one point per measured trial × load level, that
the recommendation names the best deployment under the SLOs and downloads a launch script vLLM's own parser
takes, that switching studies keeps nothing of the first, that an unknown study is said, that two studies'
fronts overlay, that every throughput shown carries its concurrency, and that no request leaves the machine.
Screenshots of each page go to ``artifacts/screenshots/``. The dashboard is stopped by its process groups in
the fixture's finalizer, also when a test fails. ``UI_DOCS_SCREENSHOT=1`` also refreshes the README's
pictures in ``docs/img/`` (``study-page.png``, ``trial-page.png``, ``compare-studies.png``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import db
from advisor import api
from advisor.exports import FORMATS
from advisor.job import job_from_dict
from advisor.tune import tune
from db import queries
from tests import knee_study

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "artifacts" / "screenshots"
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STUDY = "ui"
OTHER = "ui-tpe"


def _need_browser() -> Any:
    """Playwright's sync API, or a skip saying why — a failure under CI=true, where browser tests must run."""
    why = None
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} is missing (apt-get install -y chromium)"
    else:
        try:
            from playwright import sync_api
        except ImportError:
            why = "the playwright Python package is missing (pip install -e '.[test]')"
    if why:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"{why}; CI=true: browser tests must run, not skip")
        pytest.skip(why)
    return sync_api


@pytest.fixture(scope="module")
def study_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    _need_browser()
    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'advisor.db'}"
    tune(job_from_dict({"name": STUDY, "preset": "h200-qwen3-235b", "budget": {"trials": 15},
                        "objective": {"mode": "pareto"}}), storage=url)
    tune(job_from_dict({"name": OTHER, "preset": "h200-qwen3-235b", "budget": {"trials": 6},
                        "objective": {"mode": "pareto"}, "sampler": {"seed": 11, "guide": False}}),
         storage=url)
    return url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(pgid: int | None, sig: signal.Signals, wait_s: float,
                popen: subprocess.Popen[bytes] | None = None) -> None:
    """Signal the group and wait until no process of it is left, at most ``wait_s``. ``popen``: the group's
    leader when it is our child — reaped here, or its zombie keeps the group "alive" for the whole wait."""
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if popen is not None:
            popen.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


@contextlib.contextmanager
def _served(url: str, folder: Path) -> Iterator[str]:
    """`advisor dashboard` on ``url`` and a free port of 127.0.0.1; its base URL. Stopped by process group at the
    end."""
    port = _free_port()
    log = folder / "dashboard.log"
    env = {**os.environ, "ADVISOR_UI_RUN_DIR": str(folder / "runs"), "ADVISOR_UI_REFRESH_S": "30"}
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "advisor", "dashboard", "--storage", url,
                                 "--host", "127.0.0.1", "--port", str(port)], cwd=folder, env=env,
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    server_group: int | None = None
    try:
        deadline = time.monotonic() + 90
        while True:
            m = re.search(r"process group (\d+)", log.read_text())
            if m:
                server_group = int(m.group(1))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the dashboard did not start:\n{log.read_text()}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop_group(proc.pid, signal.SIGINT, 20, proc)  # Ctrl-C: the CLI stops Streamlit's group
        _stop_group(proc.pid, signal.SIGKILL, 5, proc)
        _stop_group(server_group, signal.SIGKILL, 5)  # should the CLI have died before it could
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def dashboard(study_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`advisor dashboard` on the simulated studies; its base URL."""
    with _served(study_url, tmp_path_factory.mktemp("dashboard")) as base:
        yield base


@pytest.fixture(scope="module")
def page(dashboard: str, browser: Any) -> Iterator[Any]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.on("request", lambda r: None if r.url.startswith(LOCAL) else OUTSIDE.append(r.url))
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (Playwright's sync API runs one at a time)."""
    sync_api = _need_browser()
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


#: Requests the browser made to anything but the dashboard (the page icon once came from fonts.gstatic.com).
OUTSIDE: list[str] = []
LOCAL = ("http://127.0.0.1:", "data:", "blob:", "about:")


def _settle(pg: Any, heading: str) -> None:
    """Wait until the page's title is ``heading`` and the script has finished running."""
    pg.wait_for_function("h => [...document.querySelectorAll('h1')].some(e => e.innerText.trim().startsWith(h))",
                         arg=heading, timeout=60_000)
    pg.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=60_000)
    pg.wait_for_timeout(500)
    errors = pg.locator("[data-testid=stException]")
    assert errors.count() == 0, errors.first.inner_text()


def _wait_plot(pg: Any, meta: str) -> None:
    """Wait until a Plotly figure with ``layout.meta == meta`` is drawn: Streamlit's status widget goes away
    when the script ends, the chart's JavaScript draws it after (seen: more than the settle's 0.5 s)."""
    pg.wait_for_function("m => [...document.querySelectorAll('.js-plotly-plot')].some(e => e.layout && "
                         "e.layout.meta === m)", arg=meta, timeout=60_000)


def _wait_topology(pg: Any) -> Any:
    """Wait until the recommendation's topology picture (a static SVG image) is loaded; its element."""
    img = pg.locator("[class*=st-key-rec_topology] img").first
    img.wait_for(timeout=60_000)
    pg.wait_for_function("e => e.complete && e.naturalWidth > 0", arg=img.element_handle(), timeout=60_000)
    return img


def _screenshot(pg: Any, name: str) -> Path:
    """The whole page (Streamlit scrolls an inner element, so the viewport grows to fit it first)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = pg.evaluate("() => (document.querySelector('[data-testid=stMain]') || document.body).scrollHeight")
    pg.set_viewport_size({"width": 1400, "height": min(int(height) + 40, 12_000)})
    pg.wait_for_timeout(800)
    path = SHOTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    pg.set_viewport_size({"width": 1400, "height": 1000})
    return path


def _plots(pg: Any) -> list[dict[str, Any]]:
    """Every Plotly figure on the page: its ``layout.meta`` and per trace ``meta`` and number of points.

    A trace's ``x`` is a plain array or, for a NumPy array, Plotly's typed-array spec ``{dtype, bdata}``
    (base64 of the raw values): its length is the decoded bytes over the item size."""
    return pg.evaluate("""() => {
        const size = {f8: 8, f4: 4, i4: 4, u4: 4, i2: 2, u2: 2, i1: 1, u1: 1, u1c: 1};
        const n = a => !a ? 0 : (a.length !== undefined ? a.length
                                 : (a.bdata ? atob(a.bdata).length / size[a.dtype] : 0));
        return [...document.querySelectorAll('.js-plotly-plot')].map(el => ({
            meta: el.layout && el.layout.meta,
            traces: (el.data || []).map(d => ({meta: d.meta, n: n(d.x)}))}));
    }""")


def _measured_points(url: str) -> int:
    database = db.connect(url)
    try:
        return sum(1 for lv in queries.measurements(database, STUDY)
                   if lv.throughput_per_gpu is not None and lv.p90_tokens_per_s_per_user is not None)
    finally:
        database.close()


def test_every_page_in_a_real_browser(page: Any, dashboard: str, study_url: str) -> None:
    pg = page
    # Studies
    pg.goto(dashboard)
    _settle(pg, "Studies")
    pg.get_by_text("Open ui").first.wait_for(timeout=60_000)  # the list redraws while it refreshes: wait for it
    assert pg.get_by_text("Open ui").count() >= 1
    _screenshot(pg, "studies")
    pg.locator("a", has_text="Open ui").first.click()

    # Study: the recommendation's topology and the open tab's convergence; the Pareto plot holds every measured
    # trial × load level once
    _settle(pg, f"Study {STUDY}")
    _wait_plot(pg, "history")
    _wait_topology(pg)  # the headline's static picture
    assert "pareto" not in {p["meta"] for p in _plots(pg)}  # only the open tab is drawn
    pg.get_by_role("tab", name="Pareto front").click()
    _wait_plot(pg, "pareto")
    plots = {p["meta"]: p for p in _plots(pg)}
    assert "pareto" in plots
    levels = sum(t["n"] for t in plots["pareto"]["traces"] if t["meta"] == "levels")
    expected = _measured_points(study_url)
    assert expected >= 15 * 3 and levels == expected  # every trial's 3 fixed levels and its knee search
    assert sum(t["n"] for t in plots["pareto"]["traces"] if t["meta"] == "pareto") >= 1
    assert pg.get_by_text(f"{expected} trial × load-level points", exact=False).count() >= 1
    _docs(_screenshot(pg, "study"), "study-page.png")
    for tab, metas in (("Curves", ["curves"]), ("Parameters", ["parcoords", "importance"])):
        pg.get_by_role("tab", name=tab).click()
        for meta in metas:
            _wait_plot(pg, meta)
    pg.get_by_role("tab", name="Pareto front").click()
    _wait_plot(pg, "pareto")

    # Trial: click through to the best one
    database = db.connect(study_url)
    try:
        best = _best(database, STUDY).trial_number
    finally:
        database.close()
    pg.locator("a", has_text=f"Open trial {best}").first.click()
    _settle(pg, f"Trial {best} of {STUDY}")
    _wait_plot(pg, "topology")
    _docs(_screenshot(pg, "trial"), "trial-page.png")
    downloads = {}
    for fmt in FORMATS:
        with pg.expect_download(timeout=60_000) as info:
            pg.locator(f".st-key-export_{fmt} button").first.click()
        downloads[fmt] = Path(info.value.path()).read_bytes()
    script = downloads["vllm"].decode()
    assert script.startswith("#!") and f"study '{STUDY}', trial {best}" in script
    doc = json.loads(downloads["json"])
    assert doc["evidence"]["trial"] == best and doc["evidence"]["study"] == STUDY and doc["config"]
    for fmt in FORMATS:
        if fmt not in ("vllm", "json"):  # folder formats come zipped
            archive = SHOTS.parent / f"export-{fmt}.zip"
            archive.write_bytes(downloads[fmt])
            assert zipfile.ZipFile(archive).namelist()

    # Compare: the best trial and another
    database = db.connect(study_url)
    try:
        other = next(t.number for t in queries.list_trials(database, STUDY, states=["complete"])
                     if t.number != best and not (t.reason or "").startswith("same configuration"))
        n_levels = [len(queries.get_trial(database, STUDY, n).measurements) for n in (best, other)]
    finally:
        database.close()
    pg.goto(f"{dashboard}/compare?study={STUDY}&trials={best},{other}")
    _settle(pg, "Compare trials")
    _wait_plot(pg, "compare")
    compare = next(p for p in _plots(pg) if p["meta"] == "compare")
    assert [t["n"] for t in compare["traces"][1:]] == n_levels  # each trial's measured levels
    _screenshot(pg, "compare")

    # New study: read-only by default, and says how to change that
    pg.goto(f"{dashboard}/new_study")
    _settle(pg, "New study")
    assert pg.get_by_text("read-only", exact=False).count() >= 1
    assert pg.get_by_text("--allow-new-studies", exact=False).count() >= 1
    _screenshot(pg, "new_study")


def _docs(shot: Path, name: str) -> None:
    """``UI_DOCS_SCREENSHOT=1``: the README's picture ``docs/img/NAME`` is retaken from this page."""
    if os.environ.get("UI_DOCS_SCREENSHOT") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / name)


def _best(database: db.Database, study: str) -> Any:
    """What `advisor best` recommends: the study's answer (``advisor.answer``) at its operating point."""
    from advisor.answer import study_answer

    answer = study_answer(database, study, job_from_dict(queries.get_study(database, study).job))
    return db.Best(answer.first, answer.point) if answer is not None else None


def _main_text(pg: Any) -> str:
    return pg.evaluate("() => document.querySelector('[data-testid=stMain]').innerText")


def _throughputs_carry_concurrency(text: str) -> int:
    """Every "N tok/s/GPU" on the page is followed by "@ c=" (the load level it was measured at)."""
    found = list(re.finditer(r"\d[\d,.]* tok/s/GPU", text))
    for m in found:
        assert re.match(r" @ c=\d+", text[m.end():]), text[max(0, m.start() - 80):m.end() + 40]
    return len(found)


def test_recommendation_exports_a_launch_script_vllm_parses(page: Any, dashboard: str, study_url: str) -> None:
    pg = page
    database = db.connect(study_url)
    try:
        best = _best(database, STUDY)
    finally:
        database.close()
    pg.goto(f"{dashboard}/study?study={STUDY}")
    _settle(pg, f"Study {STUDY}")
    head = pg.locator("h4", has_text="Run trial").first.inner_text()
    assert head.startswith(f"Run trial {best.trial_number}:"), head
    text = _main_text(pg)
    assert f"tok/s/GPU @ c={best.concurrency}," in text
    assert _throughputs_carry_concurrency(text) >= 2
    assert pg.locator("[data-testid=stAppDeployButton]").count() == 0  # Streamlit's toolbar in viewer mode
    folder = Path(study_url.removeprefix("sqlite:///")).parent
    before = {f: f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}
    with pg.expect_download(timeout=60_000) as info:
        pg.locator(".st-key-rec_export_vllm button").first.click()
    script = Path(info.value.path()).read_text()
    # read-only: the download wrote nothing (no export row in the database, no file beside it)
    assert {f: f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()} == before
    assert script.startswith("#!") and f"study '{STUDY}', trial {best.trial_number}" in script
    serve = [ln for ln in script.splitlines() if " serve " in ln and not ln.startswith("#")]
    assert serve
    from tests.vllm_parser import parse_serve_args  # vLLM's own parser, from the installed CPU build

    for line in serve:
        argv = shlex.split(line.split(" > ")[0].replace('"${NODE', "'${NODE").replace('_IP}"', "_IP}'"))
        args = argv[argv.index("serve") + 1:]
        ns = parse_serve_args(args)
        assert ns.model_tag == args[0] or getattr(ns, "model", None) == args[0]


def test_switching_studies_keeps_nothing_of_the_first(page: Any, dashboard: str, study_url: str) -> None:
    pg = page
    pg.goto(f"{dashboard}/study?study={STUDY}&tab=Curves")
    _settle(pg, f"Study {STUDY}")
    _wait_plot(pg, "curves")
    pg.get_by_role("tab", name="Trials").click()
    box = pg.locator(f".st-key-trials_text-{STUDY} input")
    box.wait_for(timeout=60_000)
    box.fill("TP8")
    box.press("Enter")
    pg.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=60_000)
    pg.locator("[data-testid=stSidebar] [data-testid=stSelectbox]").first.click()
    pg.get_by_role("option", name=OTHER, exact=True).click()
    _settle(pg, f"Study {OTHER}")
    mine = pg.locator(f".st-key-trials_text-{OTHER} input")  # widgets are keyed by study (common.key)
    mine.wait_for(timeout=60_000)
    assert "tab=Trials" in pg.url and f"study={OTHER}" in pg.url
    assert mine.input_value() == ""  # no filter of the first study
    assert pg.locator(f".st-key-trials_text-{STUDY}").count() == 0
    pg.get_by_role("tab", name="Curves").click()
    _wait_plot(pg, "curves")
    shown = pg.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .filter(e => e.layout && e.layout.meta === 'curves')
        .flatMap(e => e.data.map(d => d.meta)).filter(m => typeof m === 'number')""")
    database = db.connect(study_url)
    try:
        mine = {t.number for t in queries.list_trials(database, OTHER, states=["complete"])}
    finally:
        database.close()
    assert shown and set(shown) <= mine  # highlighted: trials of this study's front only


def test_unknown_study_in_the_url_is_said_as_text_and_shows_none(page: Any, dashboard: str) -> None:
    """A shared link naming no study: the name is shown as written (no link, no image the browser fetches),
    and no other study is shown in its place."""
    from urllib.parse import quote

    pg = page
    fetched: list[str] = []  # every request, the dashboard's own host included (127.0.0.1:9 is "local")
    pg.on("request", lambda r: fetched.append(r.url))
    planted = ("[Session expired](http://evil.example/login) ![i](http://127.0.0.1:9/t.png) "
               "<a href='http://evil.example/'>x</a>")
    pg.goto(f"{dashboard}/study?study={quote(planted)}")
    pg.get_by_text("There is no study named", exact=False).first.wait_for(timeout=60_000)
    pg.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=60_000)
    pg.wait_for_timeout(500)
    warning = pg.get_by_text("There is no study named", exact=False).first.inner_text().replace("\u2060", "")
    assert "[Session expired](http://evil.example/login)" in warning and "<a href='http://evil.example/'>" in warning
    assert pg.locator("a[href*='evil.example'], a[href*='127.0.0.1:9'], img[src*='127.0.0.1:9']").count() == 0
    assert pg.locator("h1").count() == 0 and pg.locator(".js-plotly-plot").count() == 0
    assert not [u for u in fetched if u.startswith(("http://evil.example", "http://127.0.0.1:9/"))]


def test_compare_studies_shows_both_fronts(page: Any, dashboard: str, study_url: str) -> None:
    pg = page
    pg.goto(f"{dashboard}/compare_studies?studies={STUDY},{OTHER}")
    _settle(pg, "Compare studies")
    _wait_plot(pg, "studies_front")
    front = next(p for p in _plots(pg) if p["meta"] == "studies_front")
    assert {t["meta"] for t in front["traces"]} == {STUDY, OTHER} and all(t["n"] >= 1 for t in front["traces"])
    _wait_plot(pg, "studies_history")
    _throughputs_carry_concurrency(_main_text(pg))
    _docs(_screenshot(pg, "compare-studies"), "compare-studies.png")
    pg.goto(dashboard)
    _settle(pg, "Studies")
    # a card's caption: the table's cells hold the same words in a grid the browser keeps hidden (its canvas shows
    # them), so the first match may be one that never becomes visible; the list redraws while it loads
    pg.get_by_text("search trials run", exact=False).filter(visible=True).first.wait_for(timeout=60_000)
    text = " ".join(_main_text(pg).replace("\u2060", "").split())
    cols, rows = api.studies_table(study_url)
    for r in rows:  # each card's best in `advisor studies`' words: the mean of the answer's runs
        row = dict(zip(cols, r, strict=True))
        assert f"best {row['best']} (trial {row['best trial']})" in text, row
    _throughputs_carry_concurrency(text)


def test_no_request_left_the_machine(page: Any) -> None:
    """Run last in this module: every page the tests opened asked only the dashboard."""
    assert OUTSIDE == []


# ---------------------------------------------------------------------------------------------- a real study
KNEE_STUDY = knee_study.STUDY


@pytest.fixture(scope="module")
def knee_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The committed real H200 knee study's database (``tests.knee_study``)."""
    _need_browser()
    return knee_study.unpack(tmp_path_factory.mktemp("knee"))


def _untouched(folder: Path, before: dict[Path, bytes]) -> None:
    """Every file as it was, but SQLite's own sidecars of a WAL database a reader opened: an index (-shm) and
    an empty log (-wal: nothing was written)."""
    after = {f: f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}
    sidecars = {f for f in after.keys() - before.keys() if f.name.endswith(("-shm", "-wal"))}
    assert {f: b for f, b in after.items() if f not in sidecars} == before
    assert all(after[f] == b"" for f in sidecars if f.name.endswith("-wal"))


@pytest.fixture(scope="module")
def knee_page(knee_url: str, browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """`advisor dashboard` (read-only) on the knee study's database and a browser page: (base URL, page)."""
    with _served(knee_url, tmp_path_factory.mktemp("knee-dashboard")) as base:
        context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
        try:
            yield base, context.new_page()
        finally:
            context.close()


@pytest.fixture(scope="module")
def knee_files(knee_url: str) -> tuple[Path, dict[Path, bytes]]:
    """The knee database's folder and its files before the dashboard opens it."""
    folder = Path(knee_url.removeprefix("sqlite:///")).parent
    return folder, {f: f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_a_real_study_headline_tells_the_truth(knee_files: tuple[Path, dict[Path, bytes]],
                                               knee_page: tuple[str, Any]) -> None:
    """On the real H200 knee study: the headline, in the first screen, carries the knee, the interval, the
    run-to-run spread and — the defaults having met the SLOs nowhere (measured at c ≥ 99 only) — both at the
    load both were measured at, with an error box because the recommendation is worse there; the 1-GPU
    topology is a small picture; a deep link asks nothing that 404s; the baseline is named on the plots;
    a failing export says why and asks for the model; the database and its folder stay byte-identical."""
    base, pg = knee_page
    folder, before = knee_files
    failed: list[str] = []
    pg.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    pg.goto(f"{base}/study?study={KNEE_STUDY}")
    _settle(pg, f"Study {KNEE_STUDY}")
    topology = _wait_topology(pg)
    assert failed == []  # no /study/_stcore/health, no /study/_stcore/host-config

    def top(text: str) -> float:
        box = pg.get_by_text(text, exact=False).first.bounding_box()
        assert box is not None, text
        return box["y"]

    text = _main_text(pg)
    for fact in ("Knee: c=37", "95 % interval", "11,051–11,622 tok/s/GPU @ c=37",
                 "run to run: trial 1 (the answer) measured 2× on fresh deploys: 11,331.3 @ c=37 / 11,267.8 @ c=37 "
                 "throughput_per_gpu (spread 0.6%)"):  # the spread in `advisor best`'s words
        assert fact in text, fact
    warning = pg.locator("[data-testid=stAlertContentError]", has_text="At equal load vLLM's defaults do better")
    assert warning.count() == 1
    said = warning.inner_text()
    assert "c=99" in said and "10,332 tok/s/GPU @ c=99, 14.2 tok/s/user" in said
    assert "24,584 tok/s/GPU @ c=99, 28.6 tok/s/user" in said and "0.42×" in said
    for fact in ("Knee: c=37", "run to run:", "At equal load vLLM's defaults do better"):
        assert top(fact) < 1000, fact  # the first screen, not 1,500 px below
    assert "1 GPUs" not in text and not re.search(r"(?<![\d.])0% headroom", text)  # a margin never rounds to 0%
    box = topology.bounding_box()
    assert box is not None and box["width"] <= 400 and box["height"] <= 400, box  # one GPU: a small picture

    # the export cannot name a model the cluster loads (the job's is a folder of the device): said, and asked for
    assert pg.locator(".st-key-rec_export_vllm button").count() == 0
    reason = pg.locator("[data-testid=stAlertContentWarning]", has_text="To export trial 1").inner_text()
    assert "is a folder on this machine" in reason.replace("\u2060", "")
    box = pg.locator(".st-key-rec_export_model input")
    box.fill("Qwen/Qwen3-30B-A3B")
    box.press("Enter")
    pg.locator(".st-key-rec_export_vllm button").first.wait_for(timeout=60_000)
    with pg.expect_download(timeout=60_000) as info:
        pg.locator(".st-key-rec_export_vllm button").first.click()
    script = Path(info.value.path()).read_text()
    assert script.startswith("#!") and "Qwen/Qwen3-30B-A3B" in script and "export failed" not in script

    # the baseline named on the plots; trials on whole-number ticks
    _wait_plot(pg, "history")
    history = next(p for p in pg.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                                          ".map(e => ({meta: e.layout.meta, dtick: e.layout.xaxis.dtick}))")
                   if p["meta"] == "history")
    assert history["dtick"] == 1
    for tab, meta, name in (("Pareto front", "pareto", "vLLM's defaults (trial 0, 3)"),
                            ("Curves", "curves", "trial 0 (vLLM's defaults)")):
        pg.get_by_role("tab", name=tab).click()
        _wait_plot(pg, meta)
        names = pg.evaluate("m => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.layout.meta === m)"
                            ".flatMap(e => e.data.map(d => d.name))", meta)
        assert name in names, names
    _screenshot(pg, "study-h200-knee")
    assert failed == []
    _untouched(folder, before)  # read-only
