"""Issue 29's check on the GPU: does the profiled model predict real levels it never saw, before any trial is fitted?

Three steps, each a subcommand, run on the device machine after ``advisor profile`` stored the profile:

* ``predict STUDY_JOB --configs 1024x8192,128x4096 --out PRED.json --write-job GEN.yaml``: with the stored profile
  (and, for comparison, the GPU kind's defaults) predict each configuration's knee under the job's SLOs, choose
  fixed levels under the lowest knee (``--fractions`` of it), predict every configuration at those levels, and
  write the study job with those levels (``GEN.yaml``, run by ``advisor tune``: its baseline is the first
  configuration, its search space the others). Predictions are written before anything is measured.
* ``compare GEN.yaml PRED.json --out CHECK.json``: the study's measured fixed levels against the predictions
  (median |predicted / measured - 1| per metric, profile vs defaults) and each knee search's levels (where it
  started, how many levels until the bracket held a feasible and an infeasible level).
* ``heldout STUDY_JOB --out CHECK.json``: every level a study measured (any deployment, any knob), predicted
  with the stored profile and with the GPU kind's defaults — the profile is fitted before the study and never
  re-fitted by it, so each level is held out —, and each trial's phases (deploy, warm-up, measure), levels and
  full-length levels (issue 30: at most 4 per knee). ``--profile-from DB`` takes the profile from another
  database and ``--levels-from DB`` (with ``--study NAME``) the levels, so one day's profile is held to another
  day's study; ``--params NAME=FILE`` adds a parameter file as a further column (a refit, ``refit`` below);
  ``--reparse FOLDER`` parses every level again from its bench JSON (a change of what a level's numbers are).
* ``probes JOB --out CHECK.json``: the stored profile's own probe levels against what its fitted parameters and the
  defaults predict for each (where the fit misses, level by level).
* ``refit JOB --out PARAMS.json``: the stored profile's probe levels fitted again by the profile's own
  ``calibrate`` (the same parameters, start and ridge as ``advisor profile``), with the model as it is now —
  to see what a change of the model's formulas does to a profile without a GPU; the report (cross-validated by
  probe) beside the parameter file. ``--drop L1/decode/2048/c16,…`` leaves levels out of the fit (levels during
  which the server paused: ``research/stall_check.py``). ``--profile-from DB`` as for ``heldout``.
* ``stack JOB --depth D --loads 8,64 --out CHECK.json``: a reduced-depth stack of the job's model shape at a depth
  the profile did not deploy, predicted, then deployed (local executor) and measured at ``--loads``.
  ``--measured-from CHECK.json`` predicts an earlier check's measured levels again (with ``--params``, a refit)
  without deploying; ``--drop-loads`` leaves out its levels a server-wide pause distorted. ``--config SEQSxTOKENS``
  deploys other batch sizes than the profile's (vLLM's defaults for the GPU kind).

Runs where the project's dependencies and vLLM are installed (``research/gpu/profile_h200.sh``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from advisor.job import TuningJob, load_job  # noqa: E402
from advisor.profile import matching_profile, probe_job, resolve_params  # noqa: E402
from executors import place  # noqa: E402
from executors.measuring.bench_result import first_wave_left_out  # noqa: E402
from executors.measuring.loop import MeasurePlan  # noqa: E402
from executors.perf import PerfParams, default_params, predict  # noqa: E402
from executors.perf.burst import AS_SENT, STEADY, predict_as_sent  # noqa: E402
from executors.simulated.executor import predicted_knee  # noqa: E402
from search_spaces import ClusterSpec, DeploymentConfig, Measurement, Mode, Role, RoleConfig  # noqa: E402

METRICS = ("throughput_per_gpu", "p50_ttft_ms", "p50_tpot_ms", "p90_ttft_ms", "p90_tokens_per_s_per_user")


def config_of(text: str) -> DeploymentConfig:
    """``SEQSxTOKENS``: one aggregated instance on one GPU with these batch sizes."""
    seqs, tokens = (int(x) for x in text.lower().split("x"))
    role = RoleConfig(role=Role.MIXED, data_parallel_size=1, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    return DeploymentConfig(mode=Mode.AGGREGATED, decode=role)


def values(m: Measurement) -> dict[str, float | None]:
    return {k: getattr(m, k) for k in METRICS}


def view(as_sent: bool) -> str:
    """The level view a result was predicted in (``--as-sent``), as the results name it."""
    return AS_SENT if as_sent else STEADY


def levels_of(topo: Any, model: Any, wl: Any, params: PerfParams, loads: list[int], as_sent: bool = False,
              requests: list[int] | None = None, wave_out: list[bool] | None = None) -> list[Measurement]:
    """The model's levels at ``loads``: the steady closed loop, or (``--as-sent``) each level as the benchmark sent
    it (``executors.perf.burst``; ``requests`` per level, latencies without the first wave where ``wave_out``)."""
    if as_sent:
        return predict_as_sent(topo, model, wl, params, loads, requests, wave_out)
    return predict(topo, model, wl, params, loads)


def param_sets(job: TuningJob, database: db.Database, files: list[str] | None = None
               ) -> dict[str, tuple[PerfParams, str]]:
    """The stored profile's parameters, the GPU kind's defaults, and each ``NAME=FILE`` of ``files``."""
    prof = resolve_params(job, database)
    sets = {"profile": (prof.params, prof.source), "defaults": (default_params(job.cluster.gpu), "defaults")}
    if prof.profile_id is None:
        if not files:
            raise SystemExit(f"no stored profile matches {job.model_profile().name} on {job.cluster.gpu}: run advisor "
                             "profile, or name parameter files (--params)")
        del sets["profile"]  # another GPU kind's fits, given as files, against this kind's defaults
    for spec in files or ():
        name, _, path = spec.partition("=")
        if not name or not path:
            raise SystemExit(f"--params: give NAME=FILE (got {spec!r})")
        sets[name] = (PerfParams.load(path), f"parameter file {path}")
    return sets


def open_db(job: TuningJob, other: str | None) -> db.Database:
    """The job's database, or ``other`` (a SQLite file or a URL), read only."""
    if other is None:
        return db.connect(job.storage)
    return db.connect(other if "://" in other else f"sqlite:///{Path(other).resolve()}", read_only=True)


def predictions(job: TuningJob, sets: dict[str, tuple[PerfParams, str]], configs: list[DeploymentConfig],
                loads: list[int]) -> dict[str, Any]:
    model, out = job.model_profile(), {}
    for cfg in configs:
        topo = place(cfg, job.cluster)
        key = f"{cfg.decode.max_num_seqs}x{cfg.decode.max_num_batched_tokens}"
        out[key] = {name: {str(m.concurrency): values(m) for m in predict(topo, model, job.workload, params, loads)}
                    for name, (params, _) in sets.items()}
    return out


def cmd_predict(a: argparse.Namespace) -> None:
    job = load_job(a.job)
    database = db.connect(job.storage)
    sets = param_sets(job, database)
    configs = [config_of(c) for c in a.configs.split(",")]
    plan = MeasurePlan(tuple(job.slos))
    knees = {f"{c.decode.max_num_seqs}x{c.decode.max_num_batched_tokens}": {
        name: predicted_knee(place(c, job.cluster), job.model_profile(), job.workload, plan, params)
        for name, (params, _) in sets.items()} for c in configs}
    low = min(k["profile"] for k in knees.values() if k["profile"])
    loads = sorted({max(1, round(low * float(f))) for f in a.fractions.split(",")})
    doc = yaml.safe_load(Path(a.job).read_text())
    doc["name"] = a.study or doc["name"]
    doc["workload"]["load_levels"] = loads
    doc["baseline"] = {"enabled": True, "config": json.loads(configs[0].model_dump_json())}
    doc.setdefault("executor", {})["profile"] = "off"  # the profile exists; a missing one is an error above
    Path(a.write_job).write_text(yaml.safe_dump(doc, sort_keys=False))
    result = {"job": a.job, "study": doc["name"], "profile": sets["profile"][1], "knees": knees, "loads": loads,
              "predicted": predictions(job, sets, configs, loads)}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"knees": knees, "loads": loads}, indent=2))


def errors(pred: dict[str, dict[str, float | None]], meas: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """Median |predicted / measured - 1| per metric and over all of them."""
    per: dict[str, list[float]] = {k: [] for k in METRICS}
    for c, mv in meas.items():
        for k in METRICS:
            p, m = (pred.get(c) or {}).get(k), mv.get(k)
            if p and m:
                per[k].append(abs(p / m - 1))
    every = [x for v in per.values() for x in v]
    return {"median": statistics.median(every) if every else None, "n": len(every),
            **{k: statistics.median(v) if v else None for k, v in per.items()}}


def bracket_levels(levels: list[Measurement], slos: list[Any]) -> int | None:
    """Search levels, in the order they ran, until the bracket held a level meeting every SLO and one that did
    not. The database keeps a trial's levels by concurrency; vLLM's result JSON dates each run (to the second, and
    a level's levels are ten seconds or more apart), so that date orders them (a close call's second run follows
    its first at once)."""
    from executors.measuring.loop import feasible

    ok = bad = False
    dated = all(m.raw.get("date") for m in levels)
    ordered = sorted(levels, key=lambda m: str(m.raw["date"])) if dated else levels
    for i, m in enumerate(ordered, 1):
        if feasible(slos, m):
            ok = True
        else:
            bad = True
        if ok and bad:
            return i
    return None


def cmd_compare(a: argparse.Namespace) -> None:
    job = load_job(a.job)
    pred = json.loads(Path(a.pred).read_text())
    database = db.connect(job.storage)
    out: dict[str, Any] = {"profile": pred["profile"], "loads": pred["loads"], "configs": {}}
    pooled: dict[str, dict[str, Any]] = {"profile": {}, "defaults": {}}
    for t in db.queries.list_trials(database, pred["study"]):
        if t.config is None:
            continue
        key = f"{t.config.decode.max_num_seqs}x{t.config.decode.max_num_batched_tokens}"
        if key not in pred["predicted"]:
            continue
        ms = list(db.queries.get_trial(database, pred["study"], t.number).measurements)
        fixed = {str(m.concurrency): values(m) for m in ms if m.purpose == "fixed"}
        search = [m for m in ms if m.purpose in ("search", "knee")]
        entry = {"trial": t.number, "measured": fixed,
                 "errors": {name: errors(p, fixed) for name, p in pred["predicted"][key].items()},
                 "search_levels": [(m.concurrency, m.purpose, m.p90_ttft_ms, m.p90_tokens_per_s_per_user)
                                   for m in search],
                 "knee_predicted": pred["knees"][key]["profile"],
                 "levels_to_bracket": bracket_levels(search, list(job.slos))}
        out["configs"][f"{key}#{t.number}"] = entry
        for name, p in pred["predicted"][key].items():
            for c, mv in fixed.items():
                pooled[name][f"{key}#{t.number}@{c}"] = (p.get(c), mv)
    out["pooled"] = {name: errors({k: v[0] for k, v in d.items()}, {k: v[1] for k, v in d.items()})
                     for name, d in pooled.items()}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["pooled"], indent=2))


def reparsed(folder: str | None) -> Any:
    """``--reparse FOLDER``: a stored level → the same level parsed again from its bench JSON under ``FOLDER`` (the
    study's run folders, unpacked from its raw.tar.xz) with the parser as it is now, found by vLLM's date and the
    level's concurrency (a pooled close call: its second run's file, ``cN-2.json``, and ``cN.json`` beside it).
    A close call whose second run stalled and first did not is the first run alone: the level probe now runs such
    a second run once more before pooling (``LevelProbe._unstall``), and that third run was never made."""
    if not folder:
        return lambda m: m
    from executors.measuring.bench_result import parse_result, pool_results, stall_of

    files: dict[tuple[str, int], Path] = {}
    for path in Path(folder).glob("**/bench/c*.json"):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("date") and data.get("max_concurrency"):
            files[(str(data["date"]), int(data["max_concurrency"]))] = path

    def again(m: Measurement) -> Measurement:
        path = files.get((str(m.raw.get("date")), int(m.concurrency)))
        if path is None:
            return m
        data = json.loads(path.read_text())
        if m.raw.get("pooled_runs") == 2 and path.stem.endswith("-2"):
            first = json.loads(path.with_name(path.stem[:-2] + ".json").read_text())
            stalled = [bool((stall_of(d) or {}).get("stalled")) for d in (first, data)]
            data = first if stalled == [False, True] else pool_results(first, data)
        fresh = parse_result(data, concurrency=int(m.concurrency), gpus=m.gpus)
        raw = {**(m.raw or {}), **{k: fresh.raw[k] for k in ("first_wave",) if k in (fresh.raw or {})}}
        return m.model_copy(update={**{k: getattr(fresh, k) for k in METRICS}, "raw": raw})
    return again


def heldout(job: TuningJob, sets: dict[str, tuple[PerfParams, str]], database: db.Database, study: str,
            again: Any = lambda m: m, as_sent: bool = False) -> dict[str, Any]:
    """Every level ``study`` measured, predicted by each parameter set of ``sets`` (``again``: each level parsed
    anew, ``reparsed``), per trial and pooled — all levels, and those at or under each trial's measured knee."""
    label = sets["profile"][1] if "profile" in sets else None
    model, out, pooled = job.model_profile(), {"profile": label, "study": study, "trials": {},
                                               "levels": view(as_sent)}, {n: {} for n in sets}
    under: dict[str, dict[str, Any]] = {n: {} for n in sets}  # the levels at or under each trial's measured knee
    for t in db.queries.list_trials(database, study):
        trial = db.queries.get_trial(database, study, t.number)
        if trial is None or trial.config is None or not trial.measurements:
            continue
        ms = [again(m) for m in trial.measurements if m.completed]
        meas = {f"{m.concurrency:g}{'s' if 'short' in m.flags else ''}": values(m) for m in ms}
        topo = place(trial.config, job.cluster)
        loads = sorted({m.concurrency for m in ms})
        pred = {}
        by_load = {m.concurrency: m for m in ms}
        sent = [by_load[c].completed or job.workload.num_prompts(c) for c in loads]
        wave = [first_wave_left_out(by_load[c]) for c in loads]
        for name, (params, _) in sets.items():
            at = dict(zip(loads, levels_of(topo, model, job.workload, params, loads, as_sent, sent, wave)))
            pred[name] = {f"{m.concurrency:g}{'s' if 'short' in m.flags else ''}": values(at[m.concurrency])
                          for m in ms}
        search = [m for m in trial.measurements if m.purpose in ("search", "knee")]
        out["trials"][t.number] = {
            "state": str(trial.state), "baseline": trial.baseline, "repeat_of": trial.repeat_of,
            "config": trial.config_text, "objectives": trial.objectives,
            "phases_s": {"deploy": trial.deploy_s, "warmup": trial.warmup_s, "measure": trial.measure_s,
                         "teardown": trial.teardown_s},
            "levels": len(trial.measurements), "full_levels": sum("short" not in m.flags for m in trial.measurements),
            "levels_to_bracket": bracket_levels(search, list(job.slos)), "measured": meas,
            # vLLM's own timing of each level (queue, prefill, its TTFT, steps): where a TTFT miss lies
            "engine": {f"{m.concurrency:g}{'s' if 'short' in m.flags else ''}": m.raw.get("engine") for m in ms},
            "predicted": pred, "errors": {name: errors(p, meas) for name, p in pred.items()}}
        knee = max((m.concurrency for m in ms if m.purpose == "knee"), default=None)
        for name, p in pred.items():
            pooled[name].update({f"{t.number}@{c}": (p[c], mv) for c, mv in meas.items()})
            if knee is not None:
                under[name].update({f"{t.number}@{c}": (p[c], meas[c]) for m in ms if m.concurrency <= knee
                                    for c in [f"{m.concurrency:g}{'s' if 'short' in m.flags else ''}"]})
    out["pooled"] = {name: errors({k: v[0] for k, v in d.items()}, {k: v[1] for k, v in d.items()})
                     for name, d in pooled.items()}
    if any(under.values()):
        out["pooled_under_knee"] = {name: errors({k: v[0] for k, v in d.items()}, {k: v[1] for k, v in d.items()})
                                    for name, d in under.items()}
    return out


def cmd_heldout(a: argparse.Namespace) -> None:
    job = load_job(a.job)
    sets = param_sets(job, open_db(job, a.profile_from), a.params)
    out = heldout(job, sets, open_db(job, a.levels_from), a.study or job.name, reparsed(a.reparse), a.as_sent)
    Path(a.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    summary = {n: {k: v[k] for k in ("config", "phases_s", "levels", "full_levels", "levels_to_bracket")}
               for n, v in out["trials"].items()}
    print(json.dumps({"pooled": out["pooled"], "pooled_under_knee": out.get("pooled_under_knee"), "trials": summary},
                     indent=2, default=str))


def check_folder(job: TuningJob, depth: int) -> Path:
    """The job's model shape at ``depth`` layers, written once under the run folder for this script's checks."""
    from advisor.profile import source_config
    from executors.vllm.model_folder import at_depth, write_model_folder

    cfg, tok = source_config(job)
    return write_model_folder(at_depth(cfg, depth), job.resolve_path(job.executor.run_dir) / "check-models"
                              / f"{job.model_profile().shape_key}-L{depth}", tokenizer_from=tok)


def level_name(lv: dict[str, Any]) -> str:
    """A probe level as ``L1/decode/2048/c16``: depth, kind, prompt length, concurrency."""
    return f"L{lv['depth']}/{lv['kind']}/{lv['isl']}/c{lv['concurrency']}"


class ProbeLevels:
    """A stored profile's probe levels, each with the probe job it was measured as (the job's model shape at the
    level's depth on one GPU, the probe's workload) — what ``advisor profile`` fitted, rebuilt from the database."""

    def __init__(self, job: TuningJob, database: db.Database | None,
                 levels: list[dict[str, Any]] | None = None) -> None:
        """The stored profile's levels, or ``levels`` (a profile report's ``probes``) where given."""
        from advisor.profile import plan_profile

        self.profile = matching_profile(database, job) if database is not None else None
        if levels is None and self.profile is None:
            raise SystemExit(f"no stored profile matches {job.model_profile().name} on {job.cluster.gpu}")
        self.levels: list[dict[str, Any]] = levels if levels is not None else self.profile.probes  # type: ignore[union-attr]
        self.plan = plan_profile(job)
        self.probes = {(p.kind, p.isl, p.osl): p for p in self.plan.probes}
        self.folders = {d: check_folder(job, d) for d in {lv["depth"] for lv in self.levels}}
        self.one_gpu = ClusterSpec(gpu=job.cluster.gpu, nodes=1, gpus_per_node=1)
        self.job = job

    def level_job(self, lv: dict[str, Any], load: int | None = None) -> TuningJob:
        wl = self.probes[(lv["kind"], lv["isl"], lv["osl"])].workload(load)
        return probe_job(self.job, self.folders[lv["depth"]], wl, self.one_gpu)

    def samples(self, drop: frozenset[str] = frozenset()) -> list[Any]:
        """One fit sample per probe family and depth, as ``advisor.profile`` made them (single-GPU levels), less
        the levels named in ``drop`` (``level_name``: levels a server-wide pause distorted)."""
        from advisor.calibrate import Sample

        from advisor.profile import how_sent

        groups: dict[tuple[int, str, int, int], list[dict[str, Any]]] = {}
        for lv in self.levels:
            if lv.get("gpus", 1) != 1 or not lv["values"] or level_name(lv) in drop or lv.get("fitted") is False:
                continue  # named in ``drop``, or one advisor.profile left out of its fit (stalled twice)
            groups.setdefault((lv["depth"], lv["kind"], lv["isl"], lv["osl"]), []).append(lv)
        samples = []
        for i, group in enumerate(groups.values()):
            measured = {int(lv["concurrency"]): {k: float(v) for k, v in lv["values"].items()} for lv in group}
            requests, wave = how_sent(group)
            samples.append(Sample("profile", i, self.plan.config, self.level_job(group[0]), measured, requests, wave))
        return samples


def cmd_refit(a: argparse.Namespace) -> None:
    from advisor.profile import fit_probes

    job = load_job(a.job)
    levels = ProbeLevels(job, open_db(job, a.profile_from))
    drop = frozenset(a.drop.split(",")) if a.drop else frozenset()
    unknown = drop - {level_name(lv) for lv in levels.profile.probes}
    if unknown:
        raise SystemExit(f"--drop: no such probe level {', '.join(sorted(unknown))}")
    cal = fit_probes(levels.samples(drop), job.cluster.gpu, a.as_sent)
    cal.params.save(a.out)
    report = {"profile": levels.profile.label, "dropped": sorted(drop),
              "level_model": view(a.as_sent), **cal.to_dict()}
    Path(a.out).with_suffix(".report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("profile", "dropped", "fitted", "error_before", "error_after", "changes")},
                     indent=2))


def cmd_probes(a: argparse.Namespace) -> None:
    job = load_job(a.job)
    database = open_db(job, a.profile_from)
    sets = param_sets(job, database, a.params)
    levels = ProbeLevels(job, database)
    profile, plan = levels.profile, levels.plan
    rows = []
    for lv in profile.probes:
        pj = levels.level_job(lv, lv["concurrency"])
        wl = pj.workload
        topo = place(plan.config, pj.cluster)
        sent = [lv.get("completed") or wl.num_prompts(lv["concurrency"])]
        pred = {name: {k: getattr(levels_of(topo, pj.model_profile(), wl, params, [lv["concurrency"]], a.as_sent,
                                            sent)[0], k)
                       for k in lv["values"]} for name, (params, _) in sets.items()}
        rows.append({k: lv[k] for k in ("depth", "kind", "isl", "osl", "concurrency")}
                    | {"measured": lv["values"], "predicted": pred})
        print(f"L{lv['depth']} {lv['kind']:7} {lv['isl']:5}+{lv['osl']:<3} c={lv['concurrency']:<4} " + "  ".join(
            f"{k} {v:,.1f} (" + ", ".join(f"{n} {pred[n][k]:,.1f}" for n in pred) + ")"
            for k, v in lv["values"].items()))
    Path(a.out).write_text(json.dumps({"profile": profile.label, "levels": rows,
                                       "level_model": view(a.as_sent)}, indent=2) + "\n")


def stack_job(job: TuningJob, depth: int, loads: list[int]) -> TuningJob:
    """The ``stack`` check's job: the job's model shape at ``depth`` layers on one GPU, the job's lengths at
    ``loads`` (2 x c requests, at least 16, a warm-up of c)."""
    from search_spaces import Workload

    wl = Workload(isl=job.workload.isl, osl=job.workload.osl, load_levels=loads, knee_search=False,
                  prompts_per_concurrency=2.0, min_prompts=16, warmups_per_concurrency=1.0)
    return probe_job(job, check_folder(job, depth), wl, ClusterSpec(gpu=job.cluster.gpu, nodes=1, gpus_per_node=1))


def cmd_stack(a: argparse.Namespace) -> None:
    from advisor.executor_factory import make_executor
    from advisor.profile import plan_profile, with_probe_kv

    job = load_job(a.job)
    database = open_db(job, a.profile_from)
    sets = param_sets(job, database, a.params)
    # an earlier check (--measured-from) gives its own depth, loads and batch sizes unless they are named
    earlier = json.loads(Path(a.measured_from).read_text()) if a.measured_from else {}
    depth = a.depth or earlier.get("depth")
    if not depth:
        raise SystemExit("stack: give --depth (or --measured-from an earlier check)")
    loads = [int(x) for x in a.loads.split(",")] if a.loads else earlier.get("loads") or [8, 64]
    sjob = stack_job(job, depth, loads)
    wl = sjob.workload
    seqs_tokens = a.config or earlier.get("config")  # the profile's batch sizes unless told
    config = config_of(seqs_tokens) if seqs_tokens else plan_profile(job).config
    topo = place(config, sjob.cluster)
    sent = [wl.num_prompts(c) for c in loads]
    # as sent, each level's latencies without its first wave, as the bench parser reads the level (c >= 2); until
    # 6 Dec the first wave stayed in the prediction and out of the measurement
    wave_out = [True] * len(loads)
    pred = {name: {str(m.concurrency): values(m) for m in levels_of(topo, sjob.model_profile(), wl, params, loads,
                                                                      a.as_sent, sent, wave_out)}
            for name, (params, _) in sets.items()}
    if a.measured_from:  # predict again what an earlier check measured (another profile, a refit): no deploy
        meas, failure = {c: v for c, v in earlier["measured"].items() if c not in set(a.drop_loads.split(","))}, \
            earlier.get("failure")
    else:
        Path(a.out).write_text(json.dumps({"depth": depth, "loads": loads, "predicted": pred}, indent=2) + "\n")
        ex = make_executor(with_probe_kv(sjob, max(loads) * (job.workload.isl.mean + job.workload.osl.mean)))
        try:
            run = ex.evaluate(topo, wl, plan=MeasurePlan())
        finally:
            ex.close()
        meas, failure = {str(m.concurrency): values(m) for m in run.measurements}, run.reason
    result = {"depth": depth, "loads": loads,
              "config": f"{config.decode.max_num_seqs}x{config.decode.max_num_batched_tokens}",
              "profile": sets.get("profile", (None, None))[1],
              "level_model": view(a.as_sent), "predicted": pred, "measured": meas,
              "failure": failure, "errors": {name: errors(p, meas) for name, p in pred.items()}}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["errors"], indent=2))


def main() -> None:
    # `timeout` at the device call's limit sends SIGTERM: without this the stack check's vLLM server outlived
    # the script holding 39 GiB of the GPU (3 Dec); as KeyboardInterrupt, `finally: ex.close()` stops it
    from executors.processes.procs import terminate_as_interrupt

    terminate_as_interrupt()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("job")
    p.add_argument("--configs", required=True)
    p.add_argument("--fractions", default="0.25,0.5,0.8")
    p.add_argument("--study")
    p.add_argument("--out", required=True)
    p.add_argument("--write-job", required=True)
    c = sub.add_parser("compare")
    c.add_argument("job")
    c.add_argument("pred")
    c.add_argument("--out", required=True)
    h = sub.add_parser("heldout")
    h.add_argument("job")
    h.add_argument("--out", required=True)
    h.add_argument("--profile-from", help="the database holding the profile (default: the job's storage)")
    h.add_argument("--levels-from", help="the database holding the study's levels (default: the job's storage)")
    h.add_argument("--study", help="the study whose levels are predicted (default: the job's name)")
    h.add_argument("--params", action="append", metavar="NAME=FILE", help="a parameter file as a further column")
    h.add_argument("--reparse", metavar="FOLDER", help="the study's run folders: each level parsed again from its "
                   "bench JSON with the parser as it is now")
    r = sub.add_parser("refit")
    r.add_argument("job")
    r.add_argument("--out", required=True)
    r.add_argument("--profile-from", help="the database holding the profile (default: the job's storage)")
    r.add_argument("--drop", help="probe levels left out of the fit, e.g. L1/decode/2048/c16,L5/decode/2048/c256")
    q = sub.add_parser("probes")
    q.add_argument("job")
    q.add_argument("--out", required=True)
    q.add_argument("--profile-from", help="the database holding the profile (default: the job's storage)")
    q.add_argument("--params", action="append", metavar="NAME=FILE", help="a parameter file as a further column")
    s = sub.add_parser("stack")
    s.add_argument("job")
    s.add_argument("--depth", type=int, help="layers (default: --measured-from's)")
    s.add_argument("--loads", help="concurrencies, e.g. 8,64 (default: --measured-from's, else 8,64)")
    s.add_argument("--config", metavar="SEQSxTOKENS", help="batch sizes of the deployment (default: the profile's)")
    s.add_argument("--out", required=True)
    s.add_argument("--profile-from", help="the database holding the profile (default: the job's storage)")
    s.add_argument("--params", action="append", metavar="NAME=FILE", help="a parameter file as a further column")
    s.add_argument("--measured-from",
                   help="an earlier stack check's JSON: predict its measured levels again, no deploy")
    s.add_argument("--drop-loads", default="", help="with --measured-from: loads left out (a pause distorted them)")
    for cmd in (h, r, q, s):
        cmd.add_argument("--as-sent", action="store_true", help="levels predicted as the benchmark sent them "
                         "(executors.perf.burst) instead of the steady closed loop")
    a = ap.parse_args()
    {"predict": cmd_predict, "compare": cmd_compare, "heldout": cmd_heldout, "probes": cmd_probes,
     "refit": cmd_refit,
     "stack": cmd_stack}[a.cmd](a)


if __name__ == "__main__":
    main()
