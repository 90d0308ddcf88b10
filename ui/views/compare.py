"""Compare: two to four trials side by side — deployments, curves, every load level, differing parameters."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import common, data, plots
from ui.settings import settings

MAX_TRIALS = 4
METRICS = ["throughput_per_gpu", "p90_tokens_per_s_per_user", "p90_ttft_ms", "p90_tpot_ms", "p90_e2el_ms",
           "request_throughput", "dp_imbalance"]

s = settings()
infos = common.load_studies(s)
info = common.pick_study(infos)
url, name = s.storage, info.name
x, y = info.x_metric, info.y_metric
st.title(f"Compare trials of {name}")

levels = data.levels(url, name, info.stamp, x, y)
trials_df, params_df = data.trials(url, name, info.stamp)
measured = sorted(int(n) for n in levels["trial"].unique()) if not levels.empty else []
if len(measured) < 2:
    st.info("Comparing needs at least two measured trials; this study has "
            f"{len(measured)} so far.")
    st.stop()

key = "compare_trials"
raw = st.query_params.get("trials", "")
from_url = [int(p) for p in raw.split(",") if p.strip().isdigit() and int(p) in measured][:MAX_TRIALS]
if from_url and st.session_state.get(key) != from_url:
    st.session_state[key] = from_url  # a link (or a reload) names the trials
elif key not in st.session_state or any(n not in measured for n in st.session_state[key]):
    front = levels[levels["pareto"]].sort_values(x, ascending=False)["trial"].tolist()
    st.session_state[key] = list(dict.fromkeys([*map(int, front), *measured]))[:2]


def changed() -> None:
    st.query_params["trials"] = ",".join(map(str, st.session_state[key]))


chosen = st.multiselect(f"Trials (2–{MAX_TRIALS})", measured, key=key, max_selections=MAX_TRIALS, on_change=changed)
st.query_params["trials"] = ",".join(map(str, chosen))
if len(chosen) < 2:
    st.info(f"Pick two to {MAX_TRIALS} trials.")
    st.stop()

# ---------------------------------------------------------------------------------------------- side by side
by_trial = trials_df.set_index("trial")
cols = st.columns(len(chosen))
for col, n in zip(cols, chosen, strict=True):
    r = by_trial.loc[n]
    with col:
        st.markdown(f"### Trial {n}")
        st.caption(f"{r['state']} · {common.fmt(r['gpus'])} GPUs")
        st.markdown(str(r["config"]))
        for o in info.objectives:
            if o in by_trial.columns:
                st.metric(o, common.fmt(r[o]))
        common.trial_link(name, n)

st.plotly_chart(plots.compare_figure(levels, chosen, x, y), key="compare_chart", width="stretch")

metric = st.selectbox("Metric per load level", METRICS, key="compare_metric")
sel = levels[levels["trial"].isin(chosen)]
pivot = sel.pivot_table(index="concurrency", columns="trial", values=metric, aggfunc="first")
pivot.columns = [f"trial {c}" for c in pivot.columns]
st.dataframe(pivot, width="stretch", key="compare_levels")

st.markdown("**Parameters**")
only_diff = st.toggle("Only parameters that differ", value=True, key="compare_only_diff")
p = params_df[params_df["trial"].isin(chosen)].set_index("trial").drop(columns=["state"]).T
p.columns = [f"trial {c}" for c in p.columns]
p = p.astype(object).map(lambda v: "–" if v is None or (isinstance(v, float) and pd.isna(v))
                        else str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
if only_diff:
    p = p[p.nunique(axis=1) > 1]
st.dataframe(p, width="stretch", key="compare_params")
