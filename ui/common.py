"""What every page shares: opening the database with a friendly empty state, the study and trial pickers
(kept in the URL's query parameters so that a page can be linked to), and number formatting."""

from __future__ import annotations

import math
from typing import Any

import streamlit as st

from ui import data
from ui.data import StudyInfo
from ui.settings import Settings

STUDY_PAGE = "views/study.py"
TRIAL_PAGE = "views/trial.py"
COMPARE_PAGE = "views/compare.py"
NEW_STUDY_PAGE = "views/new_study.py"
EXAMPLE_JOB = "examples/gb300-rack.yaml"


def fmt(v: Any) -> str:
    """A number for people: thousands separators, one decimal above 10, "–" for no data (never 0)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


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
    """The study in the URL (``?study=``), else the last one looked at, else the most recently updated one."""
    names = [i.name for i in infos]
    key = "pick_study"
    wanted = st.query_params.get("study")
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


def pick_trial(numbers: list[int], default: int | None) -> int:
    """The trial in the URL (``?trial=``), else ``default`` (the best), else the first."""
    key = "pick_trial"
    raw = st.query_params.get("trial")
    wanted = int(raw) if raw is not None and raw.lstrip("-").isdigit() else None
    if wanted in numbers and st.session_state.get(key) != wanted:
        st.session_state[key] = wanted
    elif st.session_state.get(key) not in numbers:
        st.session_state[key] = default if default in numbers else numbers[0]

    def changed() -> None:
        st.query_params["trial"] = str(st.session_state[key])

    choice = int(st.sidebar.selectbox("Trial", numbers, key=key, on_change=changed))
    st.query_params["trial"] = str(choice)
    return choice


def study_header(info: StudyInfo) -> None:
    st.caption(
        f"{info.model} on {info.cluster} · {info.workload} · executor {info.executor} · objective "
        f"{info.objective_mode} ({', '.join(info.objectives)}) · SLOs: {', '.join(map(str, info.slos)) or 'none'}"
    )
    if info.job_problem:
        st.warning(f"The stored job no longer validates: {info.job_problem}")


def trial_link(study: str, number: int, label: str | None = None) -> None:
    st.page_link(TRIAL_PAGE, label=label or f"Open trial {number}", icon=":material/open_in_new:",
                 query_params={"study": study, "trial": str(number)})
