"""Studies: every study in the database with its job, state, trials done/failed/invalid and best so far."""

from __future__ import annotations

import streamlit as st

from ui import common, data
from ui.settings import settings

s = settings()
st.title("Studies")
infos = common.load_studies(s)

left, right = st.columns([3, 1])
text = left.text_input("Filter by name, model or cluster", key="studies_filter", placeholder="e.g. qwen or H200")
states = right.multiselect("State", ["running", "left running", "stopped", "finished"], key="studies_state")
shown = [i for i in infos
         if (not text or text.lower() in f"{i.name} {i.model} {i.cluster} {i.description}".lower())
         and (not states or i.state in states)]

running = sum(1 for i in infos if i.state == "running")
st.caption(f"{len(infos)} stud{'y' if len(infos) == 1 else 'ies'} in `{s.storage_for_display}`"
           + (f", {running} running" if running else ""))
if not shown:
    st.info("No study matches the filter.")
    st.stop()

# the best and the counts in the words `advisor studies` prints (``advisor.answer.best_text``,
# ``advisor.study_counts``): the mean of the answer's runs, never one run's level
frame = data.studies_frame(shown)
st.dataframe(
    frame, hide_index=True, width="stretch", key="studies_table",
    column_config={
        "state": st.column_config.TextColumn(help="running: a tuner's heartbeat is fresh; left running: trials "
                                                  "in RUNNING with no live tuner (`advisor cleanup` closes them)"),
        "best": st.column_config.TextColumn(help="the study's answer (what `advisor best` names): the mean of its "
                                                 "runs at their operating points, as `advisor studies` says it"),
        "updated": st.column_config.DatetimeColumn("updated", format="YYYY-MM-DD HH:mm"),
    },
)

st.subheader("Open a study")
cols = st.columns(3)
for k, info in enumerate(shown[:60]):
    with cols[k % 3]:
        st.page_link(common.STUDY_PAGE, label=f"Open {info.name}", icon=":material/insights:",
                     query_params={"study": info.name})
        best = f"best {info.best_text} (trial {info.best_trial})" if info.best_text is not None \
            else "no level meets the SLOs yet"
        st.caption(f"{info.state} · {info.counts_text} · {best}")
if len(shown) > 60:
    st.caption(f"… and {len(shown) - 60} more: narrow the filter, or pick one in the Study page's sidebar.")
