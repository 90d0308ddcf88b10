"""Study: which deployment to run and why, then in tabs the search's convergence (open first), the Pareto front,
each deployment's curve, what the parameters did, every trial.

The recommendation comes first: the study's answer as `advisor best` names it (``advisor.answer``; vLLM's
defaults when no searched deployment beats them) at its operating point, or the level with the most throughput
per GPU that gives the reader's operating point; its margins, its gain over vLLM's defaults, its alternatives
and its exports. Every throughput shown carries the concurrency it was measured at.

Widgets are keyed by study (``common.key``): switching studies starts every highlight, filter and selection
afresh. The progress panel polls the database every few seconds (a fragment) and reruns the whole page only
when a trial started or finished, so the plots stay still while nothing changes.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from advisor import api
from ui import advice, common, data, downloads, importance, jobs, plots, tables, trial_plots
from ui.settings import settings

started = time.monotonic()
s = settings()
infos = common.load_studies(s)
info = common.pick_study(infos)  # the progress panel reads it afresh every few seconds
url, name = s.storage, info.name
st.session_state["study_stamp"] = info.stamp


def K(widget: str) -> str:  # noqa: N802 — a key of this study's widgets
    return common.key(name, widget)


st.title(f"Study {common.md(name)}")
if info.description:
    st.markdown(common.md(info.description))
common.study_header(info)
x, y = info.x_metric, info.y_metric
levels = data.levels(url, name, info.stamp, x, y)
trials_df, params_df = data.trials(url, name, info.stamp)


# ---------------------------------------------------------------------------------------------- recommendation
def point_line(p: advice.OperatingPoint) -> str:
    gpus = f" on {advice.plural(p.gpus, 'GPU')}" if p.gpus else ""
    return f"trial {p.trial}{gpus}: {p.text()} — {p.deployment}"


def topology(b: advice.OperatingPoint) -> None:
    # drawn to the deployment's scale (its own width): one GPU is a small picture, not a page-wide box; a static
    # SVG (a glance; the trial page has hovers), kept per database state: the page's first picture waits for no
    # Plotly bundle and no figure built afresh
    picture = data.topology_picture(url, name, b.trial, info.stamp)
    if picture is not None:
        t = data.trial(url, name, b.trial, info.stamp)
        policy = t.config.router_policy if t is not None and t.config else "?"
        with st.container(key=K("rec_topology")):
            st.markdown(trial_plots.svg_markdown(picture, f"where trial {b.trial}'s instances run"))
        st.caption(f"Where each instance runs ({advice.plural(b.gpus, 'GPU') if b.gpus else '?'}): prefill blue, "
                   f"decode orange, mixed green; lines from the router ({policy}).")


def missed(p: advice.OperatingPoint) -> str:
    """``misses P90 tok/s/user ≥ 30.0 (14.2)`` / ``meets every SLO`` at that point."""
    misses = [m for m in advice.margins(p, info.slos) if m.headroom is not None and m.headroom < 0]
    if not misses:
        return "meets every SLO"
    return "misses " + ", ".join(f"{advice.slo_text(m)} at {advice.bare(m.metric, m.measured)}" for m in misses)


def equal_load(rec: advice.Recommendation) -> None:
    """The recommendation against vLLM's defaults at the load both were measured at, where the defaults met the
    SLOs nowhere (so no gain can be stated): said loudly when the recommendation is worse there."""
    a, d = rec.equal_answer, rec.equal_defaults
    assert a is not None and d is not None
    theirs = sorted(int(c) for c in levels.loc[levels["trial"] == d.trial, "concurrency"])
    ratio = a.x / d.x if d.x else None
    body = (f"vLLM's defaults (baseline trial {d.trial}) met every SLO at none of their measured loads "
            f"(c = {', '.join(map(str, theirs))}), so their knee is unknown and no gain over them can be stated. "
            f"At **c={a.concurrency}**, the load both were measured at: trial {a.trial} made **{a.text()}** "
            f"({missed(a)}); vLLM's defaults made **{d.text()}** ({missed(d)})"
            + (f" — **{ratio:.2f}×** the defaults ({ratio - 1:+.0%})." if ratio is not None else "."))
    if rec.worse_than_defaults:
        st.error(f"**At equal load vLLM's defaults do better than this recommendation.** {body} Measure the "
                 "defaults at lower loads (their knee) before preferring this deployment over them.",
                 icon=":material/warning:")
    else:
        st.info(f"**At equal load this recommendation does better than vLLM's defaults.** {body}",
                icon=":material/info:")


def headline(rec: advice.Recommendation, said: api.Verdict, is_answer: bool) -> None:
    """What to run and how sure the numbers are: the operating point, its knee, its interval, the run-to-run
    spread, the whole cluster, who found it and the comparison with vLLM's defaults — before anything else on the
    page. The spread, the gain, the cluster and the proposer are the sentences `advisor best` prints (``said``),
    word for word, while the recommendation is the study's answer (``is_answer``)."""
    b = rec.best
    st.markdown(f"#### Run trial {b.trial}{' (vLLM’s defaults)' if rec.defaults_best else ''}: {b.deployment}")
    st.markdown(f"**{b.text()}** on **{advice.plural(b.gpus, 'GPU') if b.gpus else '? GPUs'}**"
                + (" (its first run)" if is_answer and len(rec.runs) > 1 else ""), help=b.config)
    facts = [advice.knee_text(b, levels), advice.interval_text(b)]
    if is_answer:
        facts += [common.plain(said.spread), common.plain(said.cluster), common.plain(said.found)]
    st.markdown("\n".join(f"- {f}" for f in facts if f))
    if rec.equal_answer is not None and rec.equal_defaults is not None:
        equal_load(rec)
    elif is_answer and said.gain is not None:
        g = said.gain
        lead = "**vLLM's defaults stay the answer**" if g.defaults_best else f"**{g.ratio:.2f}× vLLM's defaults**"
        st.markdown(f"{lead} — {common.plain(g.text())}")
    elif is_answer and said.defaults_alone:
        st.markdown(common.plain(said.defaults_alone))
    elif is_answer and said.no_gain:
        st.markdown(common.plain(said.no_gain))
    elif rec.gain is not None and rec.baseline is not None:  # the reader's own operating point: one level each
        st.markdown(f"At this operating point: {rec.gain:.2f}× vLLM's defaults' best level meeting it (baseline "
                    f"trial {rec.baseline.trial}: {rec.baseline.text()}), one measured level against another.")
    elif rec.baseline_note:
        st.markdown(rec.baseline_note)
    else:
        st.caption("This study measured no baseline (vLLM's defaults), so no gain over it is stated.")


def recommendation(rec: advice.Recommendation) -> None:
    b = rec.best
    st.markdown("**Margins to the SLOs**\n" + ("\n".join(f"- {m.text()}" for m in rec.margins)
                                                or "- the study has no SLOs"))
    for line in advice.routing_lines(levels["expert_routing"] if "expert_routing" in levels else []):
        st.caption(f"{line}: {advice.ROUTING_NOTE}")
    alts = [("Cheaper in GPUs", rec.cheaper), ("Faster per user", rec.faster)]
    if rec.cheaper is not None and rec.cheaper == rec.faster:
        alts = [("Cheaper in GPUs and faster per user", rec.cheaper)]
    alts = [(k, p) for k, p in alts if p is not None]
    if alts:
        st.markdown("**Alternatives to weigh**\n" + "\n".join(f"- {k}: {point_line(p)}" for k, p in alts))
    st.caption(f"{rec.front_deployments} distinct deployment(s) on the Pareto front (the Pareto tab lists them).")
    downloads.buttons(url, name, b.trial, prefix="rec_export", formats=("vllm", "k8s", "ray-serve",
                                                                                 "json"), titles=True)
    common.trial_link(name, b.trial, f"Open trial {b.trial}")


# The recommendation comes before the live progress, its headline (point, knee, interval, spread, the defaults)
# first: the page's answer is what a reader looks for first. The reader's operating point is asked below it
# (drawn there, read first: the headline depends on it).
st.subheader("Recommendation")
head = st.container()
y_slo = next((sl for sl in info.slos if sl.metric == y), None)
c_op, c_note = st.columns([1, 3])
op_y = c_op.number_input(f"Operating point: at least {advice.short(y)}", min_value=0.0,
                         value=float(y_slo.value) if y_slo is not None else None, step=5.0, key=K("op_y"),
                         placeholder="the SLOs alone",
                         help="The tokens/s each user must see, on top of the study's SLOs; empty: the SLOs alone")
answer = data.chosen(url, name, info.stamp)
rec = advice.recommend(levels, trials_df, info.slos, x, y, op_y or None, answer)
said = data.verdict(url, name, info.stamp)
is_answer = rec.best is not None and answer is not None and (rec.best.trial, rec.best.concurrency) == \
    (answer.trial, answer.concurrency)
with head:
    if rec.best is None:
        st.warning(rec.why_none + " There is nothing to recommend yet.", icon=":material/warning:")
    else:
        left, right = st.columns([3, 2])
        with left:
            headline(rec, said, is_answer)
        with right:
            topology(rec.best)
if rec.best is not None:
    recommendation(rec)
c_note.caption("What `advisor best` answers: the deployment whose runs give the most "
               f"{advice.short(x)} at their operating points (vLLM's defaults unless a searched deployment beats "
               "them)" + (f", unless it gives a user less than {advice.num(op_y)} "
                          f"{advice.short(y).split(' ', 1)[-1]}: then the measured level with the most "
                          f"{advice.short(x)} that does" if op_y else "") + ". Numbers are operating points: "
               f"{advice.short(x)} @ concurrency, {advice.short(y)} at that same level.")
shown_above = {said.spread, said.cluster, said.found, said.gain.text() if said.gain else "",
               said.defaults_alone, said.no_gain} if is_answer else set()
for line in said.lines():
    if line not in shown_above:
        st.caption(common.plain(line))


# ---------------------------------------------------------------------------------------------- live progress
def rerun_gap_s() -> float:
    """Seconds between automatic redraws while trials finish: never more often than every refresh, nor more
    than a quarter of the time (a big study's redraw takes a while; Refresh redraws at once)."""
    return max(s.refresh_s, 4 * st.session_state.get("study_render_s", 0.0))


#: A study that is done is polled slowly (a tuner may resume it); a running one every refresh.
POLL_S = s.refresh_s if info.state == "running" or info.finished < info.budget else max(s.refresh_s, 30.0)


@st.fragment(run_every=POLL_S)
def progress() -> None:
    live = data.study(url, name)
    if live is None:
        st.warning(f"Study {name!r} is no longer in the database.")
        return
    if live.stamp != st.session_state.get("study_stamp") and \
            time.monotonic() - st.session_state.get("study_rendered_at", 0.0) >= rerun_gap_s():
        st.rerun(scope="app")  # a trial started or finished: redraw everything
    tally = live.tally
    cols = st.columns([1.4, 1.2, 1, 1, 1, 1, 1])
    cols[0].metric("state", live.state)
    cols[1].metric("search trials run", f"{live.finished} of {live.budget}",
                   help="what the budget counts: search trials that ran (`advisor studies` says the same)")
    cols[2].metric("defaults' runs", tally.baseline_runs if tally else 0,
                   help="runs of vLLM's defaults: the baseline and its repeats, outside the search")
    cols[3].metric("repeats", tally.repeats if tally else 0,
                   help="searched deployments measured again on fresh deploys, outside the search")
    cols[4].metric("complete", live.count("complete"), help="every kind above that completed")
    cols[5].metric("failed", live.count("failed"))
    cols[6].metric("invalid", live.count("invalid"), help="broke a validity rule; never launched")
    st.caption(common.plain(live.counts_text))
    # the page's own levels table (cached by the same stamp), not a second read
    best = advice.recommend(data.levels(url, name, live.stamp, x, y), trials_df.iloc[0:0], info.slos, x, y,
                            chosen=data.chosen(url, name, live.stamp)).best
    st.markdown(f"**Best under the SLOs so far:** trial {best.trial}, {best.text()}" if best is not None
                else "**Best under the SLOs so far:** no measured level meets every SLO yet")
    if live.budget:
        st.progress(min(1.0, live.finished / live.budget),
                    text=tally.searched_text() if tally else f"{live.finished} of {live.budget} search trials run")
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


st.subheader("Progress")
progress()


# ---------------------------------------------------------------------------------------------- the tabs' parts
#: vLLM's defaults: the baseline trial and its repeats on fresh deploys (labelled on the Pareto and Curves plots).
base_first = set() if trials_df.empty else set(trials_df.loc[trials_df["by"] == "baseline", "trial"].astype(int))
baseline_trials = base_first | (set() if trials_df.empty else
                                set(trials_df.loc[trials_df["repeats"].isin(list(base_first)), "trial"].astype(int)))


def axes() -> tuple[str, str]:
    """The Pareto plot's axes: the study's own, or two stored metrics the reader picks (kept per study)."""
    options = data.axis_options(levels, x, y)
    ax1, ax2, _ = st.columns([1, 1, 2])
    px = ax1.selectbox("x axis", options, index=options.index(x), key=K("axis_x"), format_func=plots.label)
    rest = [o for o in options if o != px]
    py = ax2.selectbox("y axis", rest, index=rest.index(y) if y in rest else 0, key=K("axis_y"),
                       format_func=plots.label)
    return px, py


def chosen_axes() -> tuple[str, str]:
    """The axes picked on the Pareto tab (the study's own until then)."""
    px = st.session_state.get(K("axis_x"), x)
    py = st.session_state.get(K("axis_y"), y)
    return (px, py) if px != py else (x, y)


def levels_on(px: str, py: str):  # noqa: ANN201 — a DataFrame
    return levels if (px, py) == (x, y) else data.levels(url, name, info.stamp, px, py)


def pareto() -> None:
    px, py = axes()
    plevels = levels_on(px, py)
    points = plots.plottable(plevels, px, py)
    if points.empty:
        st.info("No load level has been measured yet; the plot appears with the first complete trial.")
        return
    front = advice.front_by_deployment(plevels, px, py)
    n_front = int(plevels["pareto"].sum())
    st.caption(f"{len(points)} trial × load-level points · the front: {n_front} points from {len(front)} distinct "
               "deployment(s), levels meeting every SLO · click a point to open its trial")
    names = dict(zip(trials_df["config"], trials_df["deployment"], strict=True)) if not trials_df.empty else {}
    short_names = dict(zip(trials_df["trial"].astype(int), trials_df["deployment"], strict=True)) \
        if not trials_df.empty else {}
    imported = data.external(url, name)
    shown_imported = plots.external_trace(imported, px, py)
    if shown_imported is not None:
        st.caption(f"◇ {len(shown_imported.x)} imported operating point(s) of this model and GPU kind (`advisor "
                   "import`): measured elsewhere, on their own deployments and loads; drawn beside the trials, "
                   "never on the front")
    ringed = (answer.trial, answer.concurrency) if answer is not None else None
    event = st.plotly_chart(plots.pareto_figure(plevels, px, py, info.slos, names, baseline_trials, imported,
                                                ringed),
                            key=K("pareto_chart"),
                            on_select="rerun", selection_mode="points", width="stretch")
    picked_points = (event.selection.points if event is not None and hasattr(event, "selection") else []) or []
    for p in picked_points[:3]:
        custom = p.get("customdata")
        if custom and isinstance(custom[0], (int, float)):  # a trial's level (an imported point names its batch)
            common.trial_link(name, int(custom[0]), f"Open trial {int(custom[0])} (c={int(custom[1])})")
    if front.empty:
        st.warning("No measured level meets every SLO yet, so there is no front to recommend.")
        return
    st.markdown(f"**The front by deployment: {len(front)}**")
    # a small static table in Markdown: the page's first paint then needs neither the data grid nor st.table's
    # Arrow code (a browser's second load drew the first chart ~0.1-0.2 s sooner than with st.table)
    shown = pd.DataFrame({"trial": front["trial"].astype(int).astype(str), "trials": front["trials"],
                          "levels on the front": front["levels"],
                          f"best {advice.short(px)}": front[px].map(advice.num),
                          f"its {advice.short(py)}": front[py].map(advice.num),
                          "GPUs": front["gpus"].map(lambda g: "–" if pd.isna(g) else str(int(g))),
                          "deployment": front["trial"].map(lambda t: short_names.get(int(t), ""))})
    st.markdown(tables.markdown_table(shown))


def curves() -> None:
    px, py = chosen_axes()
    plevels = levels_on(px, py)
    points = plots.plottable(plevels, px, py)
    if points.empty:
        st.info("No load level has been measured yet.")
        return
    front = advice.front_by_deployment(plevels, px, py)
    front_trials = list(dict.fromkeys([*(int(t) for t in front["trial"]), *sorted(base_first)]))[:8]
    chosen = st.multiselect("Highlight trials", sorted(points["trial"].unique().tolist()), default=front_trials,
                            key=K("curves_trials"),
                            help="Default: one trial per deployment on the Pareto front, and vLLM's defaults")
    st.caption(f"{plots.label(py)} against {plots.label(px)}, one line per trial through its load levels "
               "(concurrency c at both ends and in the hover).")
    st.plotly_chart(plots.curves_figure(plevels, px, py, chosen, baseline_trials), key=K("curves_chart"),
                    width="stretch")


# ------------------------------------------------------------------------------------ convergence, parameters
objective = info.objectives[0]


def convergence() -> None:
    hist = data.history(url, name, info.stamp)
    if hist.empty or not hist["value"].notna().any():
        st.info("No trial has a value yet.")
        return
    kinds = {int(t): "baseline" for t in baseline_trials}
    if not trials_df.empty:
        kinds.update({int(t): "repeat" for t, r in zip(trials_df["trial"], trials_df["repeats"], strict=True)
                      if not pd.isna(r) and int(t) not in kinds})
    mark = None
    if answer is not None:
        value = hist.loc[hist["trial"] == answer.trial, "value"]
        mark = (answer.trial, float(value.iloc[0])) if not value.empty and pd.notna(value.iloc[0]) else None
    st.caption(f"Each trial's {advice.short(objective)} (blue: meets the SLOs) — the search's trials as dots, "
               "vLLM's defaults as diamonds, repeats on fresh deploys as crosses — the best single run so far, "
               "and the answer ringed (ranked as `advisor best` ranks: by the mean of its runs, for the whole "
               "cluster unless the job says per used GPU — so it need not be the highest dot).")
    st.plotly_chart(plots.history_figure(hist, objective, kinds, mark), key=K("history_chart"), width="stretch")


@st.fragment
def parameters() -> None:
    """Importance and parallel coordinates. A fragment: turning importance on redraws this part only. For a big
    study importance waits for that toggle (``importance.at_once``), so the page's first paint does not."""
    complete = info.count("complete")
    show = st.toggle("Parameter importance", value=importance.at_once(complete), key="importance_on",
                     help="Optuna's get_param_importances (PED-ANOVA) over the measured trials; it loads every "
                          "trial from Optuna's storage, about 2 s per 1,000 trials (then cached)")
    imp = importance.Importance({})
    if show:
        imp = importance.importance(url, info.optuna_study_name, importance.bucket(complete)) \
            if info.optuna_study_name else importance.Importance({}, "this study has no Optuna study in the storage")
    left, right = st.columns([1, 2])
    with left:
        st.markdown(f"**Parameter importance** for {advice.short(objective)}")
        if not show:
            st.info(f"Turn on *Parameter importance* to compute it over the {complete} complete trials "
                    "(a few seconds for a study this size; the parallel coordinates then follow its order).")
        elif imp.values:
            st.plotly_chart(plots.importance_figure(imp.values), key="importance_chart", width="stretch")
            st.caption(f"Optuna's get_param_importances over the {imp.trials_used} measured trials.")
        else:
            st.info(imp.message[:1].upper() + imp.message[1:] + ".")
    with right:
        st.markdown(f"**Parallel coordinates**: the most important parameters of measured trials against "
                    f"{advice.short(objective)}" if imp.values
                    else f"**Parallel coordinates**: parameters of measured trials against {advice.short(objective)}")
        measured = trials_df[(trials_df["state"] == "complete") & trials_df["repeat_of"].isna()] \
            if not trials_df.empty else trials_df
        if objective in measured and len(measured) >= 2:
            p = params_df.set_index("trial").loc[measured["trial"]].reset_index()
            st.plotly_chart(plots.parcoords_figure(p, measured[objective].reset_index(drop=True), objective,
                                                   list(imp.values)), key="parcoords_chart", width="stretch")
        else:
            st.info("Parallel coordinates need at least two measured trials.")


def trials_table() -> None:
    if trials_df.empty:
        st.info("No trial yet.")
        return
    ops = advice.trial_points(levels, x, y).rename(columns={"concurrency": "at c", "meets_slo": "meets SLOs"})
    full = trials_df.drop(columns=[c for c in (x, y) if c in trials_df.columns])
    full = full.merge(ops, on="trial", how="left")
    full["meets SLOs"] = full["meets SLOs"].astype("boolean")
    # only a complete trial's levels judge it: an interrupted or failed one's partial levels are not ticked
    full.loc[full["state"] != "complete", "meets SLOs"] = pd.NA
    c1, c2, c3, c4 = st.columns([2, 3, 2, 2])
    all_states = sorted(full["state"].unique().tolist())
    states = c1.multiselect("State", all_states, key=K("trials_states"), placeholder="all states")
    text = c2.text_input("Deployment contains", key=K("trials_text"), placeholder="e.g. EPLB or TP8")
    sortable = ["trial", x, y, "gpus", "violation", "measure_s", "state"]
    sort = c3.selectbox("Sort by", [c for c in sortable if c in full.columns], key=K("trials_sort"),
                        format_func=lambda c: advice.short(c) if c in (x, y) else c, index=1)
    best_first = advice.higher(sort) or sort in ("gpus", "measure_s")  # a metric: highest first
    descending = c4.toggle("Descending", key=K(f"trials_desc_{sort}"), value=best_first)
    feasible_only = c4.checkbox("Meets the SLOs", key=K("trials_feasible"))
    gpu_values = full["gpus"].dropna()
    gpus = None
    if not gpu_values.empty and gpu_values.min() < gpu_values.max():
        lo, hi = int(gpu_values.min()), int(gpu_values.max())
        picked_gpus = st.slider("GPUs", lo, hi, (lo, hi), key=K("trials_gpus"))
        gpus = None if picked_gpus == (lo, hi) else picked_gpus  # the full range keeps trials without a config
    table = tables.filter_trials(full, states=states, text=text, feasible_only=feasible_only, gpus=gpus,
                               sort=sort, descending=descending)
    # phase timings wherever they were recorded: the simulated executor records none, while the simulated
    # executor on reserved GPUs records the real time it held them
    timings = [c for c in ("deploy_s", "measure_s", "teardown_s") if c in table and (table[c].fillna(0) > 0).any()]
    st.caption(f"{len(table)} of {len(full)} trials · {advice.short(x)} is each trial's best level meeting the "
               "SLOs (else its best level, *meets SLOs* unticked), with that level's concurrency and "
               f"{advice.short(y)} · select a row to open it"
               + (" · the performance model's numbers (simulated executor), not measurements" if info.simulated
                  else ""))
    table = table.assign(**{"same as": table["repeat_of"].astype("Int64")})  # a reused trial: no run of its own
    reused = ["same as"] if table["same as"].notna().any() else []
    cols = ["trial", "state", "by", "gpus", x, "at c", y, "meets SLOs", "deployment", *reused, "violation",
            *timings, "reason"]
    shown = table[[c for c in cols if c in table]]
    picked_rows = st.dataframe(shown, hide_index=True, width="stretch", key=K("trials_table"),
                               on_select="rerun", selection_mode="single-row",
                               column_config=common.number_columns(shown, [x, y, "violation", *timings]))
    rows = picked_rows.selection.rows if picked_rows is not None and hasattr(picked_rows, "selection") else []
    if rows:
        common.trial_link(name, int(table.iloc[rows[0]]["trial"]))
    numbers = table["trial"].tolist()
    if numbers:
        c1, c2 = st.columns([1, 3])
        n = c1.selectbox("Trial", numbers, key=K("open_trial_number"), label_visibility="collapsed")
        with c2:
            common.trial_link(name, int(n))


def failures() -> None:
    fails = data.failures(url, name, info.stamp)
    st.markdown(f"**Failed and invalid trials: {len(fails)}**")
    if fails.empty:
        st.caption("None so far.")
    else:
        kinds = fails.assign(kind=fails["kind"].fillna(fails["state"])).groupby(["state", "kind"]).size()
        st.caption(" · ".join(f"{n} {state} ({kind})" for (state, kind), n in kinds.items()))
        st.dataframe(fails[["trial", "state", "kind", "reason", "deployment"]], hide_index=True, width="stretch",
                     key=K("failures_table"))
        with_logs = fails[(fails["log tail"] != "")].head(10)
        for r in with_logs.to_dict("records"):
            with st.expander(f"trial {r['trial']}: {r['reason'][:100]}"):
                st.code("\n".join(str(r["log tail"]).splitlines()[-40:]), language="text")


# ---------------------------------------------------------------------------------------------- the rest, in tabs
# Only the open tab runs (lazy tabs, kept in the URL as ?tab=): the page's first paint is the recommendation
# and the convergence plot, not every table and figure of the study. Convergence opens first because it is the
# lightest tab with a plot: with the Pareto tab open (its axis pickers, a plot of every trial × level, the front's
# table) a browser draws the recommendation's first chart 0.2-0.25 s later (benchmarks/ui_render.py).
TABS = {"Convergence": convergence, "Pareto front": pareto, "Curves": curves, "Parameters": parameters,
        "Trials": trials_table, "Failures": failures}
for tab, draw in zip(st.tabs(list(TABS), key="tab", bind="query-params"), TABS.values(), strict=True):
    if tab.open:
        with tab:
            draw()

st.session_state["study_rendered_at"] = time.monotonic()
st.session_state["study_render_s"] = time.monotonic() - started
