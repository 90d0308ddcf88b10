"""What every page shares: opening the database with a friendly empty state, the study and trial pickers
(kept in the URL's query parameters so that a page can be linked to), and number formatting."""

from __future__ import annotations

import math
import re
from typing import Any

import streamlit as st

from ui import advice, data
from ui.data import StudyInfo
from ui.settings import Settings

STUDY_PAGE = "views/study.py"
TRIAL_PAGE = "views/trial.py"
COMPARE_PAGE = "views/compare.py"
NEW_STUDY_PAGE = "views/new_study.py"
EXAMPLE_JOB = "examples/gb300-rack.yaml"


#: Every ASCII punctuation mark: CommonMark lets each be backslash-escaped, and escaped none starts a link, an
#: image, emphasis, HTML, a formula (``$``) or a directive (``:red[…]``).
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
#: GitHub-style autolinks (``http://…``, ``www.…``, ``a@b.c``) are found in the text *after* escapes are undone
#: (Streamlit's renderer links them in text nodes), so an invisible word joiner follows ``:``, ``.`` and ``@``.
_AUTOLINK_BREAK = re.compile(r"([:.@])")
WORD_JOINER = "\u2060"


def md(text: Any) -> str:
    """User text (a study name from a URL, a job's description) for Markdown: shown as written, rendered as
    nothing (a shared link could otherwise plant a link or an image the browser fetches)."""
    one_line = " ".join(str(text).split())
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", _AUTOLINK_BREAK.sub(rf"\1{WORD_JOINER}", one_line))


#: What Markdown would read as markup in our own sentences (a metric's ``_``, a ``*``, a ``:red[…]``).
_MARKUP = re.compile(r"([\\`*_\[\]<>$~|#])")


def plain(text: str) -> str:
    """One of our own sentences (``advisor best``'s) for Markdown, every character shown as written — unlike
    ``md``, no word joiners, so the page's text is the CLI's text."""
    return _MARKUP.sub(r"\\\1", text)


def fmt(v: Any) -> str:
    """A number for people: thousands separators, no decimals above 1,000, one above 10, "–" for no data
    (never 0)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return advice.num(v)
    return str(v)


def key(study: str, name: str) -> str:
    """A widget key that belongs to one study: switching studies starts every filter, highlight and selection
    afresh instead of carrying the previous study's trial numbers over to unrelated deployments."""
    return f"{name}@{study}"


def tune_command(s: Settings) -> str:
    return f"advisor tune {EXAMPLE_JOB} --storage {s.storage_for_display}"


def empty_state(s: Settings, *, why: str) -> None:
    """No database or no study yet: say what to do next, not an error."""
    st.info(why, icon=":material/info:")
    st.markdown("Run a study, then come back — this page refreshes by itself:")
    st.code(tune_command(s), language="bash")
    st.markdown("Search spaces shipped with deploy-advisor (use one with `preset:` in a job file):")
    st.code("advisor presets", language="bash")
    if s.allow_new_studies:
        st.page_link(NEW_STUDY_PAGE, label="Start a study from the dashboard", icon=":material/add:")
    else:
        st.caption("Or start the dashboard with `advisor dashboard --allow-new-studies` to start studies from here.")


def load_studies(s: Settings) -> list[StudyInfo]:
    """Every study; stops the page with the empty state or a one-line error when there is nothing to show."""
    if not data.exists(s.storage):
        empty_state(s, why=f"No database at `{data.sqlite_file(s.storage)}` yet.")
        st.stop()
    try:
        infos = data.studies(s.storage)
    except data.Unavailable as e:
        st.error(str(e), icon=":material/error:")
        st.stop()
    if not infos:
        empty_state(s, why=f"No studies in `{s.storage_for_display}` yet.")
        st.stop()
    return infos


def pick_study(infos: list[StudyInfo]) -> StudyInfo:
    """The study in the URL (``?study=``), else the last one looked at, else the most recently updated one.

    A URL naming no study of the database says so and stops the page, showing none: a shared link to a study
    that is not there must not silently show another study's recommendation."""
    names = [i.name for i in infos]
    key = "pick_study"
    wanted = st.query_params.get("study")
    if wanted is not None and wanted not in names:
        _no_such_study(wanted, names)
    if wanted in names and st.session_state.get(key) != wanted:
        st.session_state[key] = wanted
    elif st.session_state.get(key) not in names:
        last = st.session_state.get("last_study")
        newest = max(infos, key=lambda i: str(i.updated_at)).name
        st.session_state[key] = last if last in names else newest

    def changed() -> None:
        st.query_params["study"] = st.session_state[key]
        st.query_params.pop("trial", None)
        st.query_params.pop("trials", None)

    choice = st.sidebar.selectbox("Study", names, key=key, on_change=changed)
    st.query_params["study"] = choice
    st.session_state["last_study"] = choice
    return infos[names.index(choice)]


def _no_such_study(wanted: str, names: list[str]) -> None:
    """The warning for a URL naming no study, a picker with nothing picked, and the page stopped."""
    key = "pick_study_instead"

    def picked() -> None:
        st.query_params["study"] = st.session_state[key]
        st.query_params.pop("trial", None)
        st.query_params.pop("trials", None)

    st.sidebar.selectbox("Study", names, key=key, index=None, placeholder="pick a study", on_change=picked)
    st.warning(f"There is no study named **{md(wanted)}** in `{_storage_name()}`. Pick one in the sidebar.",
               icon=":material/warning:")
    st.stop()


def _storage_name() -> str:
    from ui.settings import settings

    return settings().storage_for_display


def pick_trial(numbers: list[int], default: int | None) -> int:
    """The trial in the URL (``?trial=``), else ``default`` (the best), else the first."""
    key = "pick_trial"
    raw = st.query_params.get("trial")
    wanted = int(raw) if raw is not None and raw.lstrip("-").isdigit() else None
    unknown = raw is not None and wanted not in numbers
    if wanted in numbers and st.session_state.get(key) != wanted:
        st.session_state[key] = wanted
    elif st.session_state.get(key) not in numbers:
        st.session_state[key] = default if default in numbers else numbers[0]

    def changed() -> None:
        st.query_params["trial"] = str(st.session_state[key])

    choice = int(st.sidebar.selectbox("Trial", numbers, key=key, on_change=changed))
    if unknown:
        st.warning(f"This study has no trial **{raw}**; showing trial **{choice}** instead.",
                   icon=":material/warning:")
    st.query_params["trial"] = str(choice)
    return choice


def study_header(info: StudyInfo) -> None:
    slos = " · ".join(advice.slo_text(s) for s in info.slos) or "none"
    st.caption(
        f"{info.model} on {info.cluster} · {info.workload} · executor {info.executor} · objective "
        f"{info.objective_mode} ({', '.join(advice.short(o) for o in info.objectives)}) · SLOs: {slos}"
    )
    if info.job_problem:
        st.warning(f"The stored job no longer validates: {info.job_problem}")


def trial_link(study: str, number: int, label: str | None = None) -> None:
    st.page_link(TRIAL_PAGE, label=label or f"Open trial {number}", icon=":material/open_in_new:",
                 query_params={"study": study, "trial": str(number)})


def number_columns(df: Any, metrics: list[str]) -> dict[str, Any]:
    """Streamlit column settings for a table's number columns: a header with its unit (``P90 TTFT (ms)``,
    ``tok/s/GPU``, ``deploy (s)``) and thousands separators with one decimal, never a raw float like 25028.2104."""
    out: dict[str, Any] = {}
    for c in metrics:
        if c not in getattr(df, "columns", ()):
            continue
        if c == "violation":
            out[c] = st.column_config.NumberColumn("SLO violation", format="%.3f",
                                                   help="worst SLO violation over the trial's levels (≤ 0: met)")
        elif c.endswith("_s") and c[:-2] in ("deploy", "warmup", "measure", "teardown"):
            out[c] = st.column_config.NumberColumn(f"{c[:-2]} (s)", format="%,.1f")
        else:
            out[c] = st.column_config.NumberColumn(advice.short(c), format="%,.1f")
    for c in ("gpus", "GPUs"):
        if c in getattr(df, "columns", ()):
            out[c] = st.column_config.NumberColumn("GPUs", format="%d")
    if "at c" in getattr(df, "columns", ()):
        out["at c"] = st.column_config.NumberColumn("@ concurrency", format="%d",
                                                    help="the load level (concurrency) of the numbers beside it")
    return out


def job_line(info: StudyInfo) -> str:
    """What a study asked, in one line (to tell whether two studies can be compared)."""
    return f"{info.model} on {info.cluster}, {info.workload}, SLOs {' · '.join(advice.slo_text(s) for s in info.slos)}"
