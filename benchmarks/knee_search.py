"""Knee search accuracy: how close the adaptive knee search lands to the true knee, in how many levels.

A trial's number is its *knee*: the highest load at which every SLO holds. ``executors.measuring.loop.search_levels``
finds it by starting at the knee the calibrated performance model predicts, stepping up or down by widening
factors, then bisecting to ``workload.knee_tolerance`` within ``workload.max_levels`` levels. This script runs
that search on the simulated executor against a ground truth it does not know, per preset:

- **Candidates**: a seeded uniform sample of ``--n`` valid candidates (``search_spaces.check``) from the
  preset's exhaustive grid (``space.enumerate()``, reservoir-sampled so the whole grid is not kept), each
  placed with ``executors.place``.
- **Truth**: the performance model with perturbed parameters, ``perturbed(default_params(gpu), seed, spread)``
  for seeds ``0..S-1`` (scenario ``perturbed``: a machine the model does not know), and the default
  parameters themselves (scenario ``exact``: the prediction is right to its own 5% search tolerance, so the
  search should close in two or three levels).
- **Start and aim**: where the *default-parameter* model puts the knee, and its SLO metrics over loads
  (``simulated.predicted_plan``), whatever the truth — as a real trial starts from the model it has, not from
  the machine it does not know; the search scales that curve by its measured levels to aim its next level
  (``executors.measuring.knee_curve``; ``--no-curve``: widening steps and bisection only, the search before that).
- **Found knee**: ``search_levels`` with the truth as the probe and no fixed levels; ``knee_of`` gives the
  answer, ``len(levels)`` the levels it spent. No knee found counts as a 100% error when the truth has one.
- **True knee**: the largest integer concurrency in ``[1, max_load]`` whose truth prediction meets every SLO:
  powers of two, then integer bisection between the highest feasible one and the next. That assumes
  feasibility is monotone in load, so every ``--verify-every``-th candidate is also scanned linearly over all
  concurrencies; disagreements (and feasible sets with holes) are counted and reported.
- **Fixed levels** (for contrast: the method before the knee search): the highest of the preset's fixed
  ``load_levels`` meeting every SLO under the truth; its error against the true knee (none feasible: 100%).

The table's "start off ×" is how far the start is from the true knee, as a factor (median/p90 of
max(start/true, true/start)): the prediction error the search has to make up. A found knee is a measured level
meeting every SLO, so it is never above the true knee (unless feasibility is not monotone). "open" counts
runs that ended with the ``bracket-open`` flag (out of levels before the bracket closed to the tolerance).
"Within tolerance" is ``true/(1+tol) <= found <= true`` (tol = ``workload.knee_tolerance``). A run is one
candidate under one truth. Prints a Rich table per preset x scenario and writes the per-run rows (``candidate``
indexes ``sampling[preset].candidates``), the summary, the command line and the seconds taken to
``benchmarks/results/knee_search.json``.

What it does not show: the truth here is the model's own structure with other parameters, and noiseless —
a real machine can differ in structure (knees of another shape) and real levels are noisy (close calls are
re-measured, ``LevelProbe``), neither of which this reproduces. It says nothing about rate-mode workloads
(every preset here loads by concurrency) nor about what a level costs in wall time.

    python benchmarks/knee_search.py [--presets a,b] [--n 40] [--seeds 3] [--spread 2] [--verify-every 10]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.job import job_from_dict
from executors import place
from executors.measuring.loop import MeasurePlan, knee_of, search_levels
from executors.perf import MODEL_VERSION, PerfParams, default_params, predict_load
from executors.simulated.executor import predicted_plan
from executors.topology import Topology
from search_spaces import Measurement, check, slo_violation
from truths import perturbed  # benchmarks/truths.py (this folder is on the path)

PRESETS = ("gb300-rack-dsv3", "h200-dsv3", "h200-qwen3-235b")
RESULTS = Path(__file__).parent / "results" / "knee_search.json"


# ------------------------------------------------------------------------------------------- candidates
def sample_candidates(job, n: int, seed: int, max_enumerate: int) -> tuple[list, dict[str, Any]]:
    """``n`` valid candidates, uniform over the (first ``max_enumerate`` of the) grid: a reservoir of 25·n
    enumerated candidates, shuffled, then checked in order until ``n`` pass."""
    rng = random.Random(f"knee-cands-{seed}")
    k = max(25 * n, 200)
    reservoir: list = []
    seen = 0
    for _, cfg in job.space.enumerate():
        if max_enumerate and seen >= max_enumerate:
            break
        seen += 1
        if len(reservoir) < k:
            reservoir.append(cfg)
        else:
            j = rng.randrange(seen)
            if j < k:
                reservoir[j] = cfg
    rng.shuffle(reservoir)
    model, wl = job.model_profile(), job.workload
    valid, checked = [], 0
    for cfg in reservoir:
        checked += 1
        if not check(cfg, model, job.cluster, wl.max_model_len):
            valid.append(cfg)
            if len(valid) >= n:
                break
    return valid, {"enumerated": seen, "checked": checked, "valid_share": len(valid) / max(checked, 1)}


# ------------------------------------------------------------------------------------------- the truth
class Truth:
    """The truth's prediction per integer concurrency, cached (the true knee, the scan and the fixed levels
    share it; the search calls its own probe so its level count is its own)."""

    def __init__(self, topo: Topology, model, wl, params: PerfParams, slos) -> None:
        self.topo, self.model, self.wl, self.params, self.slos = topo, model, wl, params, list(slos)
        self.cache: dict[int, Measurement] = {}

    def at(self, c: int) -> Measurement:
        if c not in self.cache:
            self.cache[c] = predict_load(self.topo, self.model, self.wl, float(c), self.params)
        return self.cache[c]

    def ok(self, c: int) -> bool:
        return slo_violation(self.slos, self.at(c)) <= 0

    def probe(self) -> Callable[[float], Measurement]:
        return lambda load: predict_load(self.topo, self.model, self.wl, load, self.params)


def costed(t: Truth, wl, short: bool, log: list[tuple[bool, float]], noise: float,
           idx: int) -> Callable[[float], Measurement]:
    """The truth as a probe that logs what each level costs: (short?, seconds of load = prompts / request
    throughput). With ``noise`` > 0 each SLO metric is off by a seeded log-normal factor of sigma
    noise / sqrt(prompts) — a level of fewer prompts judges the SLOs less surely."""
    def probe(load: float) -> Measurement:
        m = t.probe()(load)
        n = wl.num_prompts(load, short=short)
        log.append((short, n / m.request_throughput if m.request_throughput else 0.0))
        if noise <= 0:
            return m
        rng = random.Random(f"noise-{idx}-{load:g}-{short}-{len(log)}")
        f = math.exp(rng.gauss(0.0, noise / math.sqrt(n)))
        upd = {s.metric: (getattr(m, s.metric) * f if s.op == "<=" else getattr(m, s.metric) / f)
               for s in t.slos if getattr(m, s.metric, None) is not None and s.metric != "error_rate"}
        return m.model_copy(update=upd)
    return probe


def true_knee(t: Truth, max_load: int) -> int | None:
    """Largest feasible concurrency, assuming feasibility is monotone: powers of two (and max_load), then
    bisection between the highest feasible point scanned and the next one up."""
    pts, p = [], 1
    while p < max_load:
        pts.append(p)
        p *= 2
    pts.append(max_load)
    feas = [c for c in pts if t.ok(c)]
    if not feas:
        return None
    lo = max(feas)
    if lo == max_load:
        return lo
    hi = pts[pts.index(lo) + 1]  # infeasible: lo is the highest feasible point scanned
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if t.ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def scan_knee(t: Truth, max_load: int) -> tuple[int | None, bool]:
    """Linear scan over every concurrency: (largest feasible, whether the feasible set has holes below it)."""
    feas = [c for c in range(1, max_load + 1) if t.ok(c)]
    if not feas:
        return None, False
    top = feas[-1]
    return top, len(feas) != top  # a prefix [1, top] has exactly `top` members


def rel(found: float | None, true: int | None) -> float | None:
    if true is None or found is None:
        return None
    return (found - true) / true


def within(found: float | None, true: int | None, tol: float) -> bool | None:
    if true is None:
        return None
    return found is not None and true / (1 + tol) <= found <= true


# ------------------------------------------------------------------------------------------- one run
def run_one(job, cfg, idx: int, topo: Topology, plan: MeasurePlan, scenario: str, seed: int | None,
            params: PerfParams, verify: bool, noise: float = 0.0) -> dict[str, Any]:
    model, wl = job.model_profile(), job.workload
    start = plan.start
    wl0 = wl.model_copy(update={"load_levels": []})
    tol, max_load = wl.knee_tolerance, int(wl.max_load)
    t = Truth(topo, model, wl0, params, job.slos)

    costs: list[tuple[bool, float]] = []
    levels = search_levels(costed(t, wl0, False, costs, noise, idx), wl0, plan)
    knee = knee_of(levels)
    short_costs: list[tuple[bool, float]] = []
    short_levels = search_levels(costed(t, wl0, False, short_costs, noise, idx), wl0,
                                 plan,
                                 short=costed(t, wl0, True, short_costs, noise, idx))
    sk = knee_of(short_levels)
    s_found = float(sk.concurrency) if sk is not None else None
    found = float(knee.concurrency) if knee is not None else None
    flags = sorted({f for m in levels for f in m.flags})
    trajectory = [[m.load, slo_violation(list(job.slos), m) <= 0] for m in levels]

    tk = true_knee(t, max_load)
    row: dict[str, Any] = {
        "preset": None, "scenario": scenario, "seed": seed, "candidate": idx,
        "gpus": cfg.total_gpus,
        "start": start, "true_knee": tk, "found_knee": found, "rel_error": rel(found, tk),
        "within_tol": within(found, tk, tol), "levels_used": len(levels), "flags": flags,
        "trajectory": trajectory, "level_s": sum(c for _, c in costs),
        "short_found_knee": s_found, "short_rel_error": rel(s_found, tk), "short_within_tol": within(s_found, tk, tol),
        "short_full_levels": sum(not short for short, _ in short_costs),
        "short_short_levels": sum(short for short, _ in short_costs), "short_level_s": sum(c for _, c in short_costs),
    }
    fixed_ok = [c for c in sorted(wl.load_levels) if t.ok(int(c))]
    fb = float(max(fixed_ok)) if fixed_ok else None
    row |= {"fixed_best": fb, "fixed_rel_error": rel(fb, tk), "fixed_within_tol": within(fb, tk, tol)}
    if verify:
        sk, holes = scan_knee(t, max_load)
        row |= {"scan_knee": sk, "scan_agrees": sk == tk, "scan_holes": holes}
    return row


# ------------------------------------------------------------------------------------------- summary
def _abs_errs(rows: list[dict], key: str, found_key: str) -> list[float]:
    """|relative error| over runs whose truth has a knee; no answer counts as 100%."""
    return [abs(r[key]) if r[found_key] is not None else 1.0 for r in rows if r["true_knee"] is not None]


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(rows: list[dict]) -> dict[str, Any]:
    with_knee = [r for r in rows if r["true_knee"] is not None]
    err = _abs_errs(rows, "rel_error", "found_knee")
    ferr = _abs_errs(rows, "fixed_rel_error", "fixed_best")
    lv = [r["levels_used"] for r in rows]
    ver = [r for r in rows if "scan_knee" in r]
    off = [max(r["start"] / r["true_knee"], r["true_knee"] / r["start"]) for r in with_knee if r["start"]]
    return {
        "runs": len(rows),
        "candidates": len({r["candidate"] for r in rows}),
        "with_knee": len(with_knee),
        "knee_share": len(with_knee) / len(rows) if rows else None,
        "within_tol": sum(bool(r["within_tol"]) for r in with_knee),
        "within_tol_share": sum(bool(r["within_tol"]) for r in with_knee) / len(with_knee) if with_knee else None,
        "abs_err_median": statistics.median(err) if err else None,
        "abs_err_p90": _pct(err, 0.9),
        "abs_err_max": max(err) if err else None,
        "levels_median": statistics.median(lv) if lv else None,
        "levels_max": max(lv) if lv else None,
        "level_s_median": statistics.median(r["level_s"] for r in rows) if rows else None,
        "short_within_tol_share": (sum(bool(r["short_within_tol"]) for r in with_knee) / len(with_knee)
                                   if with_knee else None),
        "short_abs_err_median": statistics.median(_abs_errs(rows, "short_rel_error", "short_found_knee"))
        if with_knee else None,
        "short_full_levels_median": statistics.median(r["short_full_levels"] for r in rows) if rows else None,
        "short_full_levels_max": max(r["short_full_levels"] for r in rows) if rows else None,
        "short_short_levels_median": statistics.median(r["short_short_levels"] for r in rows) if rows else None,
        "short_level_s_median": statistics.median(r["short_level_s"] for r in rows) if rows else None,
        "short_above_true": sum(r["short_found_knee"] is not None and r["true_knee"] is not None
                                and r["short_found_knee"] > r["true_knee"] for r in rows),
        "missed_knee": sum(r["found_knee"] is None for r in with_knee),
        "found_above_true": sum(r["found_knee"] is not None and r["true_knee"] is not None
                                and r["found_knee"] > r["true_knee"] for r in rows),
        "agree_no_knee": sum(r["found_knee"] is None for r in rows if r["true_knee"] is None),
        "flags": dict(Counter(f for r in rows for f in r["flags"])),
        "fixed_within_tol_share": (sum(bool(r["fixed_within_tol"]) for r in with_knee) / len(with_knee)
                                   if with_knee else None),
        "fixed_abs_err_median": statistics.median(ferr) if ferr else None,
        "fixed_abs_err_p90": _pct(ferr, 0.9),
        "fixed_none_feasible": sum(r["fixed_best"] is None for r in with_knee),
        "start_off_median": statistics.median(off) if off else None,
        "start_off_p90": _pct(off, 0.9),
        "no_start": sum(r["start"] is None for r in rows),
        "verified": len(ver),
        "scan_disagreements": sum(not r["scan_agrees"] for r in ver),
        "scan_holes": sum(r["scan_holes"] for r in ver),
    }


def _f(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def print_table(summaries: list[dict], title: str) -> None:
    cols = ("preset", "truth", "runs", "start off ×", "knee", "in tol", "|err| med", "|err| p90", "levels med/max",
            "open", "fixed in tol", "fixed |err| med", "fixed |err| p90", "fixed none", "verified (≠ / holes)")
    cells = [[s["preset"], s["scenario"], f"{s['runs']} ({s['candidates']}c)",
              f"{_f(s['start_off_median'], '.2f')}/{_f(s['start_off_p90'], '.2f')}", _f(s["knee_share"], ".0%"),
              _f(s["within_tol_share"], ".0%"), _f(s["abs_err_median"], ".1%"), _f(s["abs_err_p90"], ".1%"),
              f"{_f(s['levels_median'], 'g')}/{_f(s['levels_max'], 'g')}", str(s["flags"].get("bracket-open", 0)),
              _f(s["fixed_within_tol_share"], ".0%"), _f(s["fixed_abs_err_median"], ".1%"),
              _f(s["fixed_abs_err_p90"], ".1%"), str(s["fixed_none_feasible"]),
              f"{s['verified']} ({s['scan_disagreements']} / {s['scan_holes']})"] for s in summaries]
    cols2 = ("preset", "truth", "full levels med/max: before", "after (+ short med)", "in tol: before", "after",
             "|err| med: before", "after", "above true: after", "level-seconds med: before", "after", "after / before")
    cells2 = [[s["preset"], s["scenario"], f"{_f(s['levels_median'], 'g')}/{_f(s['levels_max'], 'g')}",
               f"{_f(s['short_full_levels_median'], 'g')}/{_f(s['short_full_levels_max'], 'g')} "
               f"(+{_f(s['short_short_levels_median'], 'g')})",
               _f(s["within_tol_share"], ".0%"), _f(s["short_within_tol_share"], ".0%"),
               _f(s["abs_err_median"], ".1%"), _f(s["short_abs_err_median"], ".1%"), str(s["short_above_true"]),
               _f(s["level_s_median"], ".0f"), _f(s["short_level_s_median"], ".0f"),
               _f(s["short_level_s_median"] / s["level_s_median"] if s["level_s_median"] else None, ".2f")]
              for s in summaries]
    _table(title, cols, cells)
    _table("short bracketing levels (Workload.bracket_prompts_per_concurrency): before = every level full length",
           cols2, cells2)


def _table(title: str, cols: tuple[str, ...], cells: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for c in cols:
            table.add_column(c, justify="left" if c in ("preset", "truth") else "right")
        for row in cells:
            table.add_row(*row)
        Console(width=220).print(table)
    except ImportError:  # plain fallback
        print(title)
        print(" | ".join(cols))
        for row in cells:
            print(" | ".join(row))


# ------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--n", type=int, default=40, help="valid candidates per preset")
    ap.add_argument("--seeds", type=int, default=3, help="perturbed truths per candidate (seeds 0..S-1)")
    ap.add_argument("--spread", type=float, default=2.0, help="perturbation factor range [1/S, S]")
    ap.add_argument("--sample-seed", type=int, default=0, help="seed of the candidate sample")
    ap.add_argument("--verify-every", type=int, default=10,
                    help="linear-scan the true knee of every k-th candidate (0: never)")
    ap.add_argument("--max-enumerate", type=int, default=0,
                    help="sample from the first this many candidates of the grid (0: the whole grid)")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="SLO metrics off by a log-normal factor of sigma NOISE/sqrt(prompts) per level (0: exact)")
    ap.add_argument("--no-curve", action="store_true",
                    help="widening steps only: the plan without the model's curve (the search before its aim)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    t_all = time.time()
    rows: list[dict] = []
    summaries: list[dict] = []
    sampling: dict[str, Any] = {}
    for name in a.presets.split(","):
        t0 = time.time()
        job = job_from_dict({"name": "k", "preset": name})
        model, gpu = job.model_profile(), job.cluster.gpu
        base = default_params(gpu)
        cands, info = sample_candidates(job, a.n, a.sample_seed, a.max_enumerate)
        sampling[name] = {**info, "sampled": len(cands), "seconds": round(time.time() - t0, 2),
                          "candidates": [c.model_dump(mode="json", exclude_defaults=True) for c in cands]}
        truths: list[tuple[str, int | None, PerfParams]] = [("exact", None, base)]
        truths += [("perturbed", s, perturbed(base, s, a.spread)) for s in range(a.seeds)]
        prow: list[dict] = []
        for i, cfg in enumerate(cands):
            topo = place(cfg, job.cluster)
            plan = predicted_plan(topo, model, job.workload, job.slos, base)
            if a.no_curve:
                plan = MeasurePlan(plan.slos, plan.start)
            verify = a.verify_every > 0 and i % a.verify_every == 0
            for scenario, seed, params in truths:
                prow.append(run_one(job, cfg, i, topo, plan, scenario, seed, params, verify, a.noise))
        for r in prow:
            r["preset"] = name
        rows += prow
        for scenario in ("exact", "perturbed"):
            sub = [r for r in prow if r["scenario"] == scenario]
            summaries.append({"preset": name, "scenario": scenario, **summarize(sub)})
        print(f"{name}: {len(cands)} candidates, {len(prow)} runs ({time.time() - t0:.1f} s)", file=sys.stderr,
              flush=True)
    seconds = time.time() - t_all
    print_table(summaries, f"knee search vs true knee (simulated, {MODEL_VERSION}; truth = perturbed x{a.spread:g} "
                           f"params, seeds 0..{a.seeds - 1}, or exact; start = default-param prediction)")
    print(f"{seconds:.1f} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "model_version": MODEL_VERSION,
        "seconds": round(seconds, 1),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sampling": sampling,
        "summary": summaries,
        "rows": rows,
    }, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
