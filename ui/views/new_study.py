"""New study: from a preset or an uploaded job file — only when the dashboard was started with
``--allow-new-studies`` (read-only otherwise, and this page says how to change that).

The study runs as ``python -m advisor tune JOB.yaml --storage URL`` in a process group of its own
(``ui.jobs``); its progress shows on the Study page like any other study's.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import streamlit as st

from advisor import api
from advisor.errors import BadInput
from advisor.job import ExecutorKind, ObjectiveMode
from ui import common, jobs
from ui.settings import settings

s = settings()
st.title("New study")

if not s.allow_new_studies:
    st.info("This dashboard is read-only: it shows studies but does not start them.", icon=":material/lock:")
    st.markdown("To start studies from here, restart it with `--allow-new-studies`:")
    st.code(f"advisor dashboard --storage {s.storage_for_display} --allow-new-studies", language="bash")
    st.markdown("Or start one from a terminal:")
    st.code(common.tune_command(s), language="bash")
    st.stop()

st.caption(f"Studies run headless (`python -m advisor tune JOB.yaml --storage …`) and write to "
           f"`{s.storage_for_display}`; job files and logs go to `{s.run_dir}`.")
source = st.radio("Start from", ["a preset", "a job file"], horizontal=True, key="new_source")


def launch(job_file: Path, study: str, trials: int | None = None) -> None:
    try:
        tp = jobs.start(job_file, study, s.storage, s.run_dir, trials=trials)
    except BadInput as e:
        st.error(str(e))
        return
    st.success(f"Started tuning {study!r} (process group {tp.pgid}). It appears on the Studies page within seconds.")
    st.code(tp.command, language="bash")
    st.page_link(common.STUDY_PAGE, label=f"Follow {study}", icon=":material/insights:", query_params={"study": study})


if source == "a preset":
    presets = dict((n, d) for n, d in api.preset_rows())
    with st.form("new_study_form"):
        preset = st.selectbox("Preset", list(presets), key="new_preset",
                              format_func=lambda n: f"{n} — {presets[n]}" if presets[n] else n)
        study = st.text_input("Study name", key="new_name", placeholder="default: PRESET-YYYYMMDD-HHMM")
        c1, c2, c3 = st.columns(3)
        trials = c1.number_input("Trials", min_value=1, max_value=100_000, value=50, step=10, key="new_trials")
        mode = c2.selectbox("Objective", [m.value for m in ObjectiveMode], index=1, key="new_mode",
                            help="pareto: throughput/GPU × tokens/s/user; max_under_slo: best throughput/GPU")
        executor = c3.selectbox("Executor", [k.value for k in ExecutorKind], key="new_executor",
                                help="simulated: the performance model (seconds); local/ray: real vLLM deployments")
        submitted = st.form_submit_button("Start the study", type="primary", icon=":material/play_arrow:",
                                          key="new_submit")
    if submitted:
        study_name = study.strip() or f"{preset}-{datetime.now().strftime('%Y%m%d-%H%M')}"
        try:
            job = jobs.job_from_preset(study_name, preset, int(trials), mode, executor)
            path = jobs.write_job(job, s.run_dir)
        except BadInput as e:
            st.error(str(e))
        else:
            launch(path, job.name)
else:
    upload = st.file_uploader("Job file (YAML, as for `advisor tune`)", type=["yaml", "yml"], key="new_upload")
    st.caption("Relative paths in the file (a model's config.json, a trace) are taken from "
               f"`{s.run_dir / 'uploads'}`; prefer absolute paths.")
    override = st.number_input("Trials (0: the job's budget)", min_value=0, max_value=100_000, value=0,
                               key="new_upload_trials")
    if upload is not None and st.button("Start the study", type="primary", key="new_upload_start",
                                        icon=":material/play_arrow:"):
        try:
            path, job = jobs.save_upload(upload.getvalue(), upload.name, s.run_dir)
        except BadInput as e:
            st.error(str(e))
        else:
            launch(path, job.name, trials=int(override) or None)

started = jobs.registry()
if started:
    st.subheader("Started from this dashboard")
    for study_name, tp in sorted(started.items(), key=lambda kv: kv[1].started_at, reverse=True):
        c1, c2 = st.columns([3, 1])
        c1.markdown(f"**{study_name}** — {tp.status()} · started {tp.started_at:%H:%M:%S} UTC · log `{tp.log}`")
        with c2:
            st.page_link(common.STUDY_PAGE, label="Open", icon=":material/insights:",
                         query_params={"study": study_name})
