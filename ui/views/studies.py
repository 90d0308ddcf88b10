"""Studies: every study in the database with its job, state, trials done/failed/invalid and best so far."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import advice, common, data
from ui.settings import settings

s = settings()
st.title("Studies")
infos = common.load_studies(s)

left, right = st.columns([3, 1])
text = left.text_input("Filter by name, model or cluster", key="studies_filter", placeholder="e.g. qwen or H200")
states = right.multiselect("State", ["running", "stopped", "finished"], key="studies_state")
shown = [i for i in infos
         if (not text or text.lower() in f"{i.name} {i.model} {i.cluster} {i.description}".lower())
         and (not states or i.state in states)]

running = sum(1 for i in infos if i.state == "running")
st.caption(f"{len(infos)} stud{'y' if len(infos) == 1 else 'ies'} in `{s.storage_for_display}`"
           + (f", {running} running" if running else ""))
if not shown:
    st.info("No study matches the filter.")
    st.stop()

points = {i.name: data.best_point(s.storage, i.name, i.stamp, i.x_metric, i.y_metric) for i in shown}
frame = data.studies_frame(shown).drop(columns=["best", "best objective", "best trial"])
frame.insert(frame.columns.get_loc("running") + 1, "best under the SLOs",
             [advice.point_text(points[i.name], i.x_metric, i.y_metric) for i in shown])
frame.insert(frame.columns.get_loc("best under the SLOs") + 1, "best trial",
             pd.array([points[i.name][0] if points[i.name] else None for i in shown], dtype="Int64"))
st.dataframe(
    frame, hide_index=True, width="stretch", key="studies_table",
    column_config={
        "best under the SLOs": st.column_config.TextColumn(help="the level with the most throughput per GPU among "
                                                           "complete levels meeting every SLO, with its concurrency"),
        "updated": st.column_config.DatetimeColumn("updated", format="YYYY-MM-DD HH:mm"),
    },
)

st.subheader("Open a study")
cols = st.columns(3)
for k, info in enumerate(shown[:60]):
    with cols[k % 3]:
        st.page_link(common.STUDY_PAGE, label=f"Open {info.name}", icon=":material/insights:",
                     query_params={"study": info.name})
        bp = points[info.name]
        best = f"best {advice.point_text(bp, info.x_metric, info.y_metric)} (trial {bp[0]})" \
            if bp is not None else "no level meets the SLOs yet"
        st.caption(f"{info.state} · {info.finished}/{info.budget} trials · {best}")
if len(shown) > 60:
    st.caption(f"… and {len(shown) - 60} more: narrow the filter, or pick one in the Study page's sidebar.")
