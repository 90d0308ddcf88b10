"""Compare studies: several studies' Pareto fronts and best-so-far curves on one plot, and what each recommends.

For instance the guided search against TPE alone on the same job: which found the better front, and after how
many trials. The studies are named in the URL (``?studies=a,b``), so a comparison can be linked to.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import advice, common, data, plots
from ui.settings import settings

MAX_STUDIES = 6

s = settings()
infos = common.load_studies(s)
url = s.storage
by_name = {i.name: i for i in infos}
names = list(by_name)
st.title("Compare studies")
if len(names) < 2:
    st.info(f"Comparing needs at least two studies; `{s.storage_for_display}` has {len(names)}.")
    st.stop()

key = "compare_studies"
raw = st.query_params.get("studies", "")
asked = [n for n in raw.split(",") if n]
unknown = [n for n in asked if n not in by_name]
if unknown:
    st.warning(f"No study named {', '.join(f'**{common.md(n)}**' for n in unknown)} in "
               f"`{s.storage_for_display}`; left out.", icon=":material/warning:")
from_url = [n for n in asked if n in by_name][:MAX_STUDIES]
if asked and st.session_state.get(key) != from_url:  # a link's studies, and no other: none to fill the gap
    st.session_state[key] = from_url
elif key not in st.session_state or any(n not in by_name for n in st.session_state[key]):
    newest = sorted(infos, key=lambda i: str(i.updated_at), reverse=True)
    st.session_state[key] = [i.name for i in newest[:2]]


def changed() -> None:
    st.query_params["studies"] = ",".join(st.session_state[key])


chosen = st.multiselect(f"Studies (2–{MAX_STUDIES})", names, key=key, max_selections=MAX_STUDIES,
                        on_change=changed)
st.query_params["studies"] = ",".join(chosen)
if len(chosen) < 2:
    st.info(f"Pick two to {MAX_STUDIES} studies.")
    st.stop()

first = by_name[chosen[0]]
levels = {n: data.levels(url, n, by_name[n].stamp, by_name[n].x_metric, by_name[n].y_metric) for n in chosen}
options = list(dict.fromkeys([first.x_metric, first.y_metric,
                              *[m for n in chosen for m in data.axis_options(levels[n])]]))
c1, c2, _ = st.columns([1, 1, 2])
x = c1.selectbox("x axis", options, index=options.index(first.x_metric), key="compare_studies_x",
                 format_func=plots.label)
rest = [o for o in options if o != x]
y = c2.selectbox("y axis", rest, index=rest.index(first.y_metric) if first.y_metric in rest else 0,
                 key="compare_studies_y", format_func=plots.label)
jobs = {n: common.job_line(by_name[n]) for n in chosen}
if len(set(jobs.values())) > 1:
    st.caption("The studies ask different things (model, cluster, workload or SLOs): " +
               " · ".join(f"**{common.md(n)}**: {j}" for n, j in jobs.items()))

# ---------------------------------------------------------------------------------------------- fronts
fronts, rows = {}, []
for n in chosen:
    i = by_name[n]
    lv = levels[n] if (x, y) == (i.x_metric, i.y_metric) else data.levels(url, n, i.stamp, x, y)
    fronts[n] = lv[lv["pareto"]] if not lv.empty else lv
    trials_df, _ = data.trials(url, n, i.stamp)
    answer = data.chosen(url, n, i.stamp)
    rec = advice.recommend(lv, trials_df, i.slos, x, y, chosen=answer)
    dedup = advice.front_by_deployment(lv, x, y)
    # the answer's runs on fresh deploys: a single run's best is one draw, so each study's figure is the mean
    # of its runs with their range, and two studies are told apart only where the ranges do not overlap
    values = [v for _, v, _ in answer.runs] if answer is not None and rec.best is not None and \
        rec.best.trial == answer.trial and x == i.x_metric else []
    rows.append({"study": n, "search trials run": f"{i.finished} of {i.budget}", "complete": i.count("complete"),
                 "front deployments": len(dedup), "best trial": rec.best.trial if rec.best else None,
                 "runs": len(values) or None,
                 f"mean {advice.short(x)}": sum(values) / len(values) if values else (rec.best.x if rec.best else None),
                 "run range": (f"{min(values):,.1f}–{max(values):,.1f} (spread "
                               f"{advice.percent((max(values) - min(values)) / (sum(values) / len(values)))})"
                               if len(values) > 1 else "one run: spread not known"),
                 "_low": min(values) if values else None, "_high": max(values) if values else None,
                 "first run @ c": rec.best.concurrency if rec.best else None,
                 advice.short(y): rec.best.y if rec.best else None, "GPUs": rec.best.gpus if rec.best else None,
                 "deployment": rec.best.deployment if rec.best else "no level meets the SLOs"})
st.subheader("Pareto fronts")
st.caption("Each study's front: its non-dominated levels meeting its own SLOs. Up and to the right is better "
           "for throughputs; hover a point for its trial and concurrency.")
st.plotly_chart(plots.studies_front_figure(fronts, x, y), key="compare_studies_front", width="stretch")

table = pd.DataFrame(rows)
mean_x = f"mean {advice.short(x)}"
ref = table[mean_x].iloc[0]
if ref and pd.notna(ref):
    table[f"Δ {advice.short(x)} vs {chosen[0]}"] = table[mean_x] - ref
    table[f"% vs {chosen[0]}"] = (table[mean_x] / ref - 1) * 100
    lo, hi = table["_low"].iloc[0], table["_high"].iloc[0]
    table[f"vs {chosen[0]}"] = ["—" if k == 0 else "unknown (one run)" if pd.isna(a) or pd.isna(lo) or a == b
                                or lo == hi else "a tie: the run ranges overlap" if a <= hi and lo <= b
                                else "apart: the run ranges do not overlap"
                                for k, (a, b) in enumerate(zip(table["_low"], table["_high"], strict=True))]
table = table.drop(columns=["_low", "_high"])
st.caption("Each study's answer (what `advisor best` names): the mean of its runs on fresh deploys, their range "
           "and spread; Δ and % compare the means, and the last column says whether the run ranges overlap "
           "(a difference within the run-to-run spread is a tie).")
st.dataframe(table, hide_index=True, width="stretch", key="compare_studies_table", column_config={
    mean_x: st.column_config.NumberColumn(format="%,.1f"),
    advice.short(y): st.column_config.NumberColumn(format="%,.1f"),
    **{c: st.column_config.NumberColumn(format="%+,.1f") for c in table.columns if c.startswith("Δ")},
    **{c: st.column_config.NumberColumn(format="%+.1f %%") for c in table.columns if c.startswith("%")},
})
for n in chosen:
    st.page_link(common.STUDY_PAGE, label=f"Open {n}", icon=":material/insights:", query_params={"study": n})

# ---------------------------------------------------------------------------------------------- convergence
st.subheader("Best so far")
objective = first.objectives[0]
same = [n for n in chosen if by_name[n].objectives[0] == objective]
if len(same) < len(chosen):
    st.caption(f"Left out (another objective than {advice.short(objective)}): "
               + ", ".join(n for n in chosen if n not in same))
hist = {n: data.history(url, n, by_name[n].stamp) for n in same}
st.plotly_chart(plots.studies_history_figure(hist, objective), key="compare_studies_history", width="stretch")
