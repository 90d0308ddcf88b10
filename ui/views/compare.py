"""Compare trials: two to four trials of one study side by side — deployments, operating points, curves, every
load level with its difference to the first trial (absolute and %), differing parameters."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import advice, common, data, plots
from ui.settings import settings

MAX_TRIALS = 4
METRICS = ["throughput_per_gpu", "p90_tokens_per_s_per_user", "p90_ttft_ms", "p90_tpot_ms", "p90_e2el_ms",
           "request_throughput", "dp_imbalance"]

s = settings()
infos = common.load_studies(s)
info = common.pick_study(infos)
url, name = s.storage, info.name
x, y = info.x_metric, info.y_metric
st.title(f"Compare trials of {common.md(name)}")

levels = data.levels(url, name, info.stamp, x, y)
trials_df, params_df = data.trials(url, name, info.stamp)
measured = sorted(int(n) for n in levels["trial"].unique()) if not levels.empty else []
if len(measured) < 2:
    st.info("Comparing needs at least two measured trials; this study has "
            f"{len(measured)} so far.")
    st.stop()

key = common.key(name, "compare_trials")
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
ops = {int(r["trial"]): r for r in advice.trial_points(levels, x, y).to_dict("records")}
cols = st.columns(len(chosen))
for col, n in zip(cols, chosen, strict=True):
    r = by_trial.loc[n]
    with col:
        st.markdown(f"### Trial {n}")
        st.caption(f"{r['state']} · {advice.plural(int(r['gpus']), 'GPU') if pd.notna(r['gpus']) else '? GPUs'}")
        st.markdown(str(r["config"]))
        op = ops.get(n)
        st.markdown(f"**{advice.value_text(x, op[x])} @ c={int(op['concurrency'])}, "
                    f"{advice.value_text(y, op[y])}**" + ("" if op["meets_slo"] else " (misses an SLO)")
                    if op is not None else "no level measured")
        common.trial_link(name, n)

st.plotly_chart(plots.compare_figure(levels, chosen, x, y), key=common.key(name, "compare_chart"), width="stretch")

metric = st.selectbox("Metric per load level", METRICS, key=common.key(name, "compare_metric"),
                      format_func=plots.label)
sel = levels[levels["trial"].isin(chosen)]
pivot = sel.pivot_table(index="concurrency", columns="trial", values=metric, aggfunc="first")
pivot = pivot[[c for c in chosen if c in pivot.columns]]
pivot.columns = [f"trial {c}" for c in pivot.columns]
ref = pivot.columns[0]
shown = pivot.map(advice.num).astype(object)
apart = []
for c in list(pivot.columns[1:]):
    shared = pivot[c].notna() & pivot[ref].notna()
    if not shared.any():  # nothing to subtract: said in words, not a column of empty cells
        apart.append(c)
        continue
    delta, share = pivot[c] - pivot[ref], (pivot[c] / pivot[ref] - 1) * 100
    shown[f"Δ {c} − {ref}"] = [f"{v:+,.1f}" if ok else "—" for v, ok in zip(delta, shared, strict=True)]
    shown[f"% {c} vs {ref}"] = [f"{v:+.1f} %" if ok else "—" for v, ok in zip(share, shared, strict=True)]
shown = shown.replace("–", "—")
shown.index.name = "concurrency"
st.caption(f"{plots.label(metric)} per load level; Δ and % against {ref} at the same concurrency "
           "(— where one of the two did not measure that level).")
for c in apart:
    st.info(f"{c} and {ref}: no shared concurrency — each was measured at loads the other was not, so no Δ is "
            "stated; their levels sit side by side above.", icon=":material/info:")
st.dataframe(shown, width="stretch", key=common.key(name, "compare_levels"))

st.markdown("**Parameters**")
only_diff = st.toggle("Only parameters that differ", value=True, key=common.key(name, "compare_only_diff"))
p = params_df[params_df["trial"].isin(chosen)].set_index("trial").drop(columns=["state"]).T
p.columns = [f"trial {c}" for c in p.columns]
p = p.astype(object).map(lambda v: "–" if v is None or (isinstance(v, float) and pd.isna(v))
                        else str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
if only_diff:
    p = p[p.nunique(axis=1) > 1]
st.dataframe(p, width="stretch", key=common.key(name, "compare_params"))
