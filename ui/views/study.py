"""Study: live progress, the Pareto front, each deployment's curve, what the parameters did, every trial.

The progress panel polls the database every few seconds (a fragment) and reruns the whole page only when a
trial started or finished, so the plots stay still while nothing changes.
"""

from __future__ import annotations

import time

import streamlit as st

from ui import common, data, jobs, plots
from ui.settings import settings

started = time.monotonic()
s = settings()
infos = common.load_studies(s)
picked = common.pick_study(infos)
info = data.study(s.storage, picked.name) or picked
url, name = s.storage, info.name
st.session_state["study_stamp"] = info.stamp

st.title(f"Study {name}")
if info.description:
    st.markdown(info.description)
common.study_header(info)


# ---------------------------------------------------------------------------------------------- live progress
def rerun_gap_s() -> float:
    """Seconds between automatic redraws while trials finish: never more often than every refresh, nor more
    than a quarter of the time (a big study's redraw takes a while; Refresh redraws at once)."""
    return max(s.refresh_s, 4 * st.session_state.get("study_render_s", 0.0))


@st.fragment(run_every=s.refresh_s)
def progress() -> None:
    live = data.study(url, name)
    if live is None:
        st.warning(f"Study {name!r} is no longer in the database.")
        return
    if live.stamp != st.session_state.get("study_stamp") and \
            time.monotonic() - st.session_state.get("study_rendered_at", 0.0) >= rerun_gap_s():
        st.rerun(scope="app")  # a trial started or finished: redraw everything
    cols = st.columns(7)
    cols[0].metric("state", live.state)
    cols[1].metric("trials run", f"{live.finished}/{live.budget}", help="complete + failed (what the budget counts)")
    cols[2].metric("complete", live.count("complete"))
    cols[3].metric("failed", live.count("failed"))
    cols[4].metric("invalid", live.count("invalid"), help="broke a validity rule; never launched")
    cols[5].metric("running", live.count("running"))
    cols[6].metric(f"best {live.best_objective or ''}".strip(), common.fmt(live.best),
                   help=f"trial {live.best_trial}" if live.best_trial is not None else "no trial meets the SLOs yet")
    if live.budget:
        st.progress(min(1.0, live.finished / live.budget), text=f"{live.finished} of {live.budget} trials")
    if live.count("running"):
        st.dataframe(data.running(url, name, live.stamp), hide_index=True, width="stretch")
    tp = jobs.registry().get(name)
    log = jobs.log_of(name, s.run_dir)
    if tp is not None:
        st.caption(f"Tuner started from this dashboard: `{tp.command}` — {tp.status()} (log `{tp.log}`)")
        if tp.running and s.allow_new_studies and st.button("Stop the tuner", key="stop_tuner",
                                                            icon=":material/stop_circle:"):
            jobs.stop(tp)
            st.toast("Sent Ctrl-C to the tuner; the running trial is closed as interrupted.")
    if log is not None:
        with st.expander("Tuner log (last lines)", expanded=tp is not None and tp.running):
            st.code(jobs.log_tail(log) or "(empty)", language="text")


progress()
for line in data.verdict(url, name, info.stamp):
    st.caption(line)
if info.best_trial is not None:
    common.trial_link(name, info.best_trial, f"Open the best trial ({info.best_trial})")

x, y = info.x_metric, info.y_metric
levels = data.levels(url, name, info.stamp, x, y)
trials_df, params_df = data.trials(url, name, info.stamp)

# ---------------------------------------------------------------------------------------------- Pareto front
st.subheader("Pareto front")
points = plots.plottable(levels, x, y)
if points.empty:
    st.info("No load level has been measured yet; the plot appears with the first complete trial.")
else:
    front = points[points["pareto"]].sort_values(x, ascending=False)
    st.caption(f"{len(points)} trial × load-level points · {len(front)} on the front (levels meeting every SLO) · "
               "click a point to open its trial")
    event = st.plotly_chart(plots.pareto_figure(levels, x, y, info.slos), key="pareto_chart", on_select="rerun",
                            selection_mode="points", width="stretch")
    picked_points = (event.selection.points if event is not None and hasattr(event, "selection") else []) or []
    for p in picked_points[:3]:
        custom = p.get("customdata")
        if custom:
            common.trial_link(name, int(custom[0]), f"Open trial {int(custom[0])} (concurrency {int(custom[1])})")
    if front.empty:
        st.warning("No measured level meets every SLO yet, so there is no front to recommend.")
    else:
        with st.expander(f"The front: {len(front)} points", expanded=False):
            st.dataframe(front[["trial", "concurrency", x, y, "p90_ttft_ms", "gpus", "config"]], hide_index=True,
                         width="stretch")

    # ------------------------------------------------------------------------------------------ curves
    st.subheader("Each deployment across load levels")
    front_trials = list(dict.fromkeys(int(t) for t in front["trial"]))[:8]
    chosen = st.multiselect("Highlight trials", sorted(points["trial"].unique().tolist()), default=front_trials,
                            key="curves_trials", help="Default: the trials on the Pareto front")
    st.plotly_chart(plots.curves_figure(levels, x, y, chosen), key="curves_chart", width="stretch")

# ------------------------------------------------------------------------------------ convergence, parameters
objective = info.objectives[0]
hist = data.history(url, name, info.stamp)
if not hist.empty and hist["value"].notna().any():
    st.subheader("Convergence")
    st.plotly_chart(plots.history_figure(hist, objective), key="history_chart", width="stretch")

@st.fragment
def parameters() -> None:
    """Importance and parallel coordinates. A fragment: turning importance on redraws this part only. For a big
    study importance waits for that toggle (``data.importance_at_once``), so the page's first paint does not."""
    st.subheader("Parameters")
    complete = info.count("complete")
    show = st.toggle("Parameter importance", value=data.importance_at_once(complete), key="importance_on",
                     help="Optuna's get_param_importances (PED-ANOVA) over the measured trials; it loads every "
                          "trial from Optuna's storage, about 2 s per 1,000 trials (then cached)")
    imp = data.Importance({})
    if show:
        imp = data.importance(url, info.optuna_study_name, data.importance_bucket(complete)) \
            if info.optuna_study_name else data.Importance({}, "this study has no Optuna study in the storage")
    left, right = st.columns([1, 2])
    with left:
        st.markdown(f"**Parameter importance** for {objective}")
        if not show:
            st.info(f"Turn on *Parameter importance* to compute it over the {complete} complete trials "
                    "(a few seconds for a study this size; the parallel coordinates then follow its order).")
        elif imp.values:
            st.plotly_chart(plots.importance_figure(imp.values), key="importance_chart", width="stretch")
            st.caption(f"Optuna's get_param_importances over the {imp.trials_used} measured trials.")
        else:
            st.info(imp.message[:1].upper() + imp.message[1:] + ".")
    with right:
        st.markdown(f"**Parallel coordinates**: the most important parameters of measured trials against {objective}"
                    if imp.values else f"**Parallel coordinates**: parameters of measured trials against {objective}")
        measured = trials_df[(trials_df["state"] == "complete") & trials_df["repeat_of"].isna()] \
            if not trials_df.empty else trials_df
        if objective in measured and len(measured) >= 2:
            p = params_df.set_index("trial").loc[measured["trial"]].reset_index()
            st.plotly_chart(plots.parcoords_figure(p, measured[objective].reset_index(drop=True), objective,
                                                   list(imp.values)), key="parcoords_chart", width="stretch")
        else:
            st.info("Parallel coordinates need at least two measured trials.")


parameters()

# ---------------------------------------------------------------------------------------------- trial table
st.subheader("Trials")
if trials_df.empty:
    st.info("No trial yet.")
else:
    c1, c2, c3, c4 = st.columns([2, 3, 2, 2])
    all_states = sorted(trials_df["state"].unique().tolist())
    states = c1.multiselect("State", all_states, key="trials_states", placeholder="all states")
    text = c2.text_input("Deployment contains", key="trials_text", placeholder="e.g. EPLB or TP8")
    sortable = ["trial", *info.objectives, "gpus", "violation", "measure_s", "state"]
    sort = c3.selectbox("Sort by", [c for c in sortable if c in trials_df.columns], key="trials_sort")
    descending = c4.toggle("Descending", key="trials_desc", value=sort != "trial")
    feasible_only = c4.checkbox("Meets the SLOs", key="trials_feasible")
    gpu_values = trials_df["gpus"].dropna()
    gpus = None
    if not gpu_values.empty and gpu_values.min() < gpu_values.max():
        lo, hi = int(gpu_values.min()), int(gpu_values.max())
        picked_gpus = st.slider("GPUs", lo, hi, (lo, hi), key="trials_gpus")
        gpus = None if picked_gpus == (lo, hi) else picked_gpus  # the full range keeps trials without a config
    table = data.filter_trials(trials_df, states=states, text=text, feasible_only=feasible_only, gpus=gpus,
                               sort=sort, descending=descending)
    st.caption(f"{len(table)} of {len(trials_df)} trials · select a row to open it")
    cols = ["trial", "state", "by", "gpus", "deployment", *[o for o in info.objectives if o in table], "violation",
            "deploy_s", "measure_s", "teardown_s", "reason"]
    picked_rows = st.dataframe(table[cols], hide_index=True, width="stretch", key="trials_table",
                               on_select="rerun", selection_mode="single-row")
    rows = picked_rows.selection.rows if picked_rows is not None and hasattr(picked_rows, "selection") else []
    if rows:
        common.trial_link(name, int(table.iloc[rows[0]]["trial"]))
    numbers = table["trial"].tolist()
    if numbers:
        c1, c2 = st.columns([1, 3])
        n = c1.selectbox("Trial", numbers, key="open_trial_number", label_visibility="collapsed")
        with c2:
            common.trial_link(name, int(n))

# ---------------------------------------------------------------------------------------------- failures
fails = data.failures(url, name, info.stamp)
st.subheader(f"Failed and invalid trials ({len(fails)})")
if fails.empty:
    st.caption("None so far.")
else:
    kinds = fails.assign(kind=fails["kind"].fillna(fails["state"])).groupby(["state", "kind"]).size()
    st.caption(" · ".join(f"{n} {state} ({kind})" for (state, kind), n in kinds.items()))
    st.dataframe(fails[["trial", "state", "kind", "reason", "deployment"]], hide_index=True, width="stretch",
                 key="failures_table")
    with_logs = fails[(fails["log tail"] != "")].head(10)
    for r in with_logs.to_dict("records"):
        with st.expander(f"trial {r['trial']}: {r['reason'][:100]}"):
            st.code("\n".join(str(r["log tail"]).splitlines()[-40:]), language="text")

st.session_state["study_rendered_at"] = time.monotonic()
st.session_state["study_render_s"] = time.monotonic() - started
