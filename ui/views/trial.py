"""Trial: one deployment — its configuration, where it ran, what each load level measured, per-rank
imbalance, where the time went, the log tail, and its ready-to-run exports."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from advisor.exports import FORMATS
from ui import advice, common, data, downloads, trial_plots
from ui.settings import settings

#: Load-level metrics shown first in the measurements table.
KEY_METRICS = ["throughput_per_gpu", "p90_tokens_per_s_per_user", "p90_ttft_ms", "p90_tpot_ms", "p90_itl_ms",
               "p90_e2el_ms", "request_throughput", "completed", "failed", "dp_imbalance", "eplb_balancedness",
               "prefix_cache_hit_rate", "kv_transfer_tokens", "preemptions", "achieved_concurrency"]

s = settings()
infos = common.load_studies(s)
info = common.pick_study(infos)
url, name = s.storage, info.name
trials_df, params_df = data.trials(url, name, info.stamp)
if trials_df.empty:
    st.title("Trial")
    st.info(f"Study {name!r} has no trial yet.")
    st.stop()
numbers = [int(n) for n in trials_df["trial"].tolist()]
number = common.pick_trial(numbers, info.best_trial)
t = data.trial(url, name, number, info.stamp)
if t is None:
    st.error(f"Study {name!r} has no trial {number}.")
    st.stop()
row = trials_df[trials_df["trial"] == number].iloc[0]

st.title(f"Trial {number} of {common.md(name)}")
st.markdown(f"**{t.state.value}** · {advice.plural(t.gpus, 'GPU') if t.gpus else '? GPUs'} · "
            f"{t.config_text or 'no configuration recorded'}")
nav = st.columns(4)
with nav[0]:
    st.page_link(common.STUDY_PAGE, label=f"Back to {name}", icon=":material/arrow_back:", query_params={"study": name})
k = numbers.index(number)
if k > 0:
    with nav[1]:
        common.trial_link(name, numbers[k - 1], f"Previous: trial {numbers[k - 1]}")
if k + 1 < len(numbers):
    with nav[2]:
        common.trial_link(name, numbers[k + 1], f"Next: trial {numbers[k + 1]}")
with nav[3]:
    others = [n for n in ([info.best_trial] if info.best_trial is not None else []) if n != number]
    st.page_link(common.COMPARE_PAGE, label="Compare with the best" if others else "Compare",
                 icon=":material/compare_arrows:",
                 query_params={"study": name, "trials": ",".join(map(str, [number, *others]))})

if pd.notna(row.get("repeat_of")):
    st.info(f"Same configuration as trial {int(row['repeat_of'])}; its measurements stand (not run again).")
    common.trial_link(name, int(row["repeat_of"]))
if t.reason and pd.isna(row.get("repeat_of")):
    (st.error if t.state.value in ("failed", "interrupted") else st.warning)(
        f"{t.failure_kind or t.state.value}: {t.reason}")

# ---------------------------------------------------------------------------------------------- configuration
left, right = st.columns(2)
with left:
    st.subheader("Configuration")
    if t.config is not None:
        for role in t.config.roles:
            st.markdown(f"- **{role.role.value}**: {role.describe()}")
        extras = [f"router policy {t.config.router_policy}"]
        if t.config.kv_connector:
            extras.append(f"KV connector {t.config.kv_connector}")
        if t.config.speculative_mtp_tokens:
            extras.append(f"MTP {t.config.speculative_mtp_tokens} tokens")
        st.caption(" · ".join(extras))
slos = data.study_slos(url, name)
x, y = info.x_metric, info.y_metric
with right:
    st.subheader("Operating point")
    ok = [m for m in t.measurements if m.completed and all(sl.met(m) for sl in slos)
          and getattr(m, x, None) is not None]
    sign = 1 if advice.higher(x) else -1
    if ok:
        top = max(ok, key=lambda m: sign * getattr(m, x))
        st.markdown(f"**{advice.value_text(x, getattr(top, x))} @ c={top.concurrency}, "
                    f"{advice.value_text(y, getattr(top, y, None))}**")
        st.caption(f"The level with the most {advice.short(x)} among the {len(ok)} of {len(t.measurements)} measured "
                   "levels that meet every SLO (the numbers are from that one level).")
    elif t.measurements:
        st.markdown("No measured level meets every SLO.")
    else:
        st.caption("No load level was measured.")
    for line in advice.routing_lines(m.expert_routing for m in t.measurements):
        st.caption(f"{line}: {advice.ROUTING_NOTE}")
    with st.expander("Search parameters (as Optuna proposed them)"):
        st.json(t.params, expanded=True)

st.subheader("Topology")
if t.topology:
    policy = t.config.router_policy if t.config else "?"
    st.plotly_chart(trial_plots.topology_figure(t.topology, f"router ({policy})"), key="topology_chart",
                    width="stretch")
else:
    st.info("Not placed on the cluster: " + ("the candidate broke a validity rule." if t.state.value == "invalid"
                                             else "no topology was recorded for this trial."))

# ---------------------------------------------------------------------------------------------- measurements
def _with_interval(m: object, k: str) -> str:
    """``25,028 (24,900–25,150)`` where the level carries a bootstrap 95 % interval for the metric."""
    v = getattr(m, k, None)
    iv = (getattr(m, "intervals", None) or {}).get(k)
    text = common.fmt(v)
    if iv and len(iv) == 2 and v is not None:
        text += f" ({advice.num(iv[0])}–{advice.num(iv[1])})"
    return text


st.subheader("Measurements per load level")
levels = list(t.measurements)
if not levels:
    st.info("No load level was measured.")
else:
    table = pd.DataFrame({f"c={m.concurrency}": {
        **{f"meets {advice.slo_text(sl)}": {True: "✓ yes", False: "✗ no", None: "–"}[mark]
           for sl, mark in zip(slos, advice.level_marks(m, slos).values(), strict=True)},
        **{advice.short(k) if advice.has_unit(k) else k.replace("_", " "):
           _with_interval(m, k) for k in KEY_METRICS}} for m in levels})
    # the whole width and every row: a level's SLO marks and metrics are read down its column, none cut off
    st.dataframe(table, width="stretch", key="levels_table", height=38 + 35 * len(table))
    st.plotly_chart(trial_plots.levels_figure(levels, slos), key="levels_chart", width="stretch")
    st.caption("Each column is one load level (concurrency c); ✓/✗ rows say which SLO it meets; numbers in "
               "parentheses are bootstrap 95 % intervals over requests, where the benchmark measured them.")
    with st.expander("Every metric"):
        every = pd.DataFrame([m.model_dump(exclude={"raw"}) for m in levels])
        floats = [c for c in every.columns if every[c].dtype.kind == "f"]
        st.dataframe(every, hide_index=True, width="stretch", key="every_metric",
                     column_config={c: st.column_config.NumberColumn(advice.short(c), format="%,.2f")
                                    for c in floats})
    st.subheader("Per-rank imbalance")
    imb = trial_plots.imbalance_figure(levels)
    if imb is None:
        st.caption("No per-rank load was measured for this trial.")
    else:
        st.plotly_chart(imb, key="imbalance_chart", width="stretch")
        st.caption("Tokens per DP rank where the executor scraped vLLM's counters; otherwise max/mean load factors "
                   "(1.0 = even).")

# ---------------------------------------------------------------------------------------------- timings and log
st.subheader("Timings")
if t.timings and sum(v or 0 for v in t.timings.values()) < 0.01:
    st.caption("No phase timings: the simulated executor predicts the levels without deploying anything.")
elif t.timings:
    cols = st.columns(len(t.timings) + 1)
    for col, (key, value) in zip(cols, t.timings.items(), strict=False):
        col.metric(key.removesuffix("_s").replace("warmup", "warm-up"), f"{value:,.1f} s")
    cols[-1].metric("started", t.started_at.strftime("%H:%M:%S"), help=f"{t.started_at:%Y-%m-%d %H:%M:%S %Z}")
    if sum(t.timings.values()) >= 0.01:  # the simulated executor takes no time: nothing to draw
        st.plotly_chart(trial_plots.timings_figure(t.timings), key="timings_chart", width="stretch")
else:
    st.caption("No phase timings were recorded.")
if t.log_tail:
    with st.expander("Log tail", expanded=t.state.value == "failed"):
        st.code("\n".join(t.log_tail.splitlines()[-200:]), language="text")


# ---------------------------------------------------------------------------------------------- exports
st.subheader("Export")
if t.state.value == "complete" and t.config is not None:
    downloads.buttons(url, name, number, formats=FORMATS)
    st.caption(f"The same files as `advisor export {name} --trial {number} --format FORMAT` (folders come zipped).")
    if t.exports:
        st.dataframe(pd.DataFrame([{"format": e.format, "path": e.path, "sha256": e.sha256[:16] + "…",
                                    "created": e.created_at} for e in t.exports]), hide_index=True, width="stretch")
else:
    st.caption(f"Only complete trials can be exported; this one is {t.state.value}.")
