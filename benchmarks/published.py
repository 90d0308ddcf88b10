"""The performance model held to published measurements of real multi-GPU deployments.

Every row of a published table (default: ``../shared/published/visible.csv``; any CSV of that shape, e.g. rows kept
back to check the model) is predicted at its layout, workload and concurrency — as sent, wave by wave, where its
lengths are fixed and its request count known (``OperatingPoint.as_sent``), else as a steady state — and compared
metric by metric:

* **reference** — the shipped reference calibration (``executors/perf/reference_params.json``,
  ``executor.perf_params: reference``) for the GPU kinds it covers, the priors elsewhere;
* **priors** — the documented defaults before any calibration (``prior_params``);
* **leave one family out** (vLLM rows of the file, where it holds two or more families) — the reference fit
  (``advisor.reference_fit``) run on the file's vLLM rows of every other model family, starting from the priors,
  then used to predict the family left out;
* **all families** — the same fit on every vLLM row, in sample;
* **what carries** (two families: the fit without one is the fit on the other alone) — the family left out predicted
  with the fit without it, each parameter in turn given the value the family's own fit gives it, then the swaps
  together in order of gain: which shared parameters the family left out disagrees on.

Summary per view: the median |predicted / measured − 1| of each published metric (throughput per GPU, median and
P90 TTFT and TPOT) by family, GPU and mode, over vLLM rows; within each group of layouts of one (model, GPU,
workload, concurrency, mode) whether the predicted order of throughput per GPU is the measured one (Spearman's ρ
where a group has 3+ layouts, agreement of the pair where 2); SGLang and TRT-LLM rows as a band — the spread of
measured / predicted per engine —, never as vLLM's truth. A row the model cannot describe (an unknown model or
GPU, a layout its rules refuse, a prefill-only or decode-only measurement) has ``predicted: null`` and the reason.

    python benchmarks/published.py                          # the visible set → benchmarks/results/published.json
    python benchmarks/published.py ROWS.csv --out F.json    # any table of this shape
    python benchmarks/published.py --write-reference        # also refit and write the shipped reference calibration
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script

from advisor.operating_point import (  # noqa: E402
    Jobs,
    OperatingPoint,
    Skipped,
    columns_of,
    read_published_csv,
)
from advisor.reference_fit import (  # noqa: E402
    REFERENCE_PATH,
    ReferenceFit,
    fit_reference,
    params_for,
    write_reference,
)
from executors import place  # noqa: E402
from executors.perf import MODEL_VERSION, PerfParams, default_params, predict  # noqa: E402
from executors.perf.burst import predict_as_sent  # noqa: E402
from executors.perf.params import prior_params, reference_params  # noqa: E402
from search_spaces import check  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_ROWS = ROOT.parent / "shared" / "published" / "visible.csv"
#: The metrics scored, by the table's column names.
SCORED = ("tput_per_gpu", "output_tput_per_gpu", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms")
#: What a group of layouts is compared on.
ORDER_METRIC = "tput_per_gpu"
#: The metrics the what-carries diagnostic reports.
CARRY_METRICS = ("tput_per_gpu", "median_ttft_ms", "median_tpot_ms")


def predict_point(point: OperatingPoint, jobs: Jobs, params_of: Callable[[str], PerfParams]
                  ) -> tuple[dict[str, float] | None, str | None]:
    """(the predicted columns, None) or (None, the reason the model cannot describe the point)."""
    job = jobs(point)
    if isinstance(job, str):
        return None, job
    assert point.config is not None
    model = job.model_profile()
    broken = check(point.config, model, job.cluster, job.workload.max_model_len)
    if broken:
        return None, "the model's rules refuse the layout: " + "; ".join(map(str, broken))
    topo = place(point.config, job.cluster)
    params = params_of(job.cluster.gpu)
    if point.as_sent:
        m = predict_as_sent(topo, model, job.workload, params, [point.concurrency], [point.requests or 1], [False])[0]
    else:
        m = predict(topo, model, job.workload, params, [point.concurrency])[0]
    return columns_of(point, m), None


def rel_err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas <= 0 or not math.isfinite(pred):
        return None
    return abs(pred / meas - 1.0)


def _median(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's ρ of two equal-length sequences (average ranks for ties)."""
    def ranks(xs: Sequence[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else 0.0


def score(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The summary of one view (``key``: the rows' field holding that view's predictions)."""
    vllm = [r for r in rows if r["is_vllm"] and r.get(key)]
    out: dict[str, Any] = {"rows_predicted": len(vllm)}
    out["median_abs_error"] = {m: _median(rel_err(r[key].get(m), r["measured"].get(m)) for r in vllm)
                               for m in SCORED}
    for by in ("family", "gpu", "mode"):
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in vllm:
            groups[r[by]].append(r)
        out[f"by_{by}"] = {g: {"rows": len(rs), **{m: _median(rel_err(r[key].get(m), r["measured"].get(m))
                                                            for r in rs) for m in SCORED}}
                           for g, rs in sorted(groups.items())}
    out["order"] = layout_order(vllm, key)
    band: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if not r["is_vllm"] and r.get(key):
            p, v = r[key].get(ORDER_METRIC), r["measured"].get(ORDER_METRIC)
            if p and v:
                band[r["engine"].split()[0].lower()].append(v / p)
    out["other_engines_measured_over_predicted"] = {
        e: {"rows": len(xs), "p10": _q(xs, 0.1), "median": _q(xs, 0.5), "p90": _q(xs, 0.9)}
        for e, xs in sorted(band.items())}
    return out


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def layout_order(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Within each (model, GPU, ISL, OSL, concurrency, mode) group of two or more layouts: is the measured order of
    throughput per GPU the predicted one?"""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["measured"].get(ORDER_METRIC) and r[key].get(ORDER_METRIC):
            groups[(r["family"], r["gpu"], r["isl"], r["osl"], r["concurrency"], r["mode"])].append(r)
    detail = []
    for g, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        layouts = {r["layout_short"] for r in rs}
        if len(layouts) < 2:
            continue
        meas = [r["measured"][ORDER_METRIC] for r in rs]
        pred = [r[key][ORDER_METRIC] for r in rs]
        detail.append({"group": list(g), "layouts": [r["layout_short"] for r in rs], "measured": meas,
                       "predicted": pred, "spearman": spearman(meas, pred) if len(rs) >= 3 else None,
                       "pair_agrees": ((meas[0] > meas[1]) == (pred[0] > pred[1])) if len(rs) == 2 else None})
    three = [d["spearman"] for d in detail if d["spearman"] is not None]
    pairs = [d["pair_agrees"] for d in detail if d["pair_agrees"] is not None]
    return {"groups_3plus": len(three), "median_spearman": _median(three),
            "min_spearman": min(three) if three else None,
            "groups_of_2": len(pairs), "pairs_in_order": sum(pairs), "detail": detail}


def swapped(left_out: ReferenceFit, own: ReferenceFit, names: Iterable[str]) -> Callable[[str], PerfParams]:
    """The parameters of the fit ``left_out`` with ``names`` at the values of the fit ``own`` (over each GPU kind's
    priors, as ``params_for``; the CPU slot keeps its own priors)."""
    vals = {n: getattr(left_out.params, n) for n in left_out.fitted} | {n: getattr(own.params, n) for n in names}

    def of(kind: str) -> PerfParams:
        base = prior_params(kind)
        if kind == "CPU" or not vals:
            return base
        return PerfParams.from_vector(list(vals.values()), base=base, names=list(vals))
    return of


def family_errors(points: Sequence[OperatingPoint], jobs: Jobs, params_of: Callable[[str], PerfParams]
                  ) -> dict[str, float | None]:
    """Median |predicted / measured − 1| of ``CARRY_METRICS`` over ``points``."""
    errs: dict[str, list[float]] = {m: [] for m in CARRY_METRICS}
    for p in points:
        pred, _ = predict_point(p, jobs, params_of)
        if pred is None:
            continue
        for m in CARRY_METRICS:
            e = rel_err(pred.get(m), p.measured.get(m))
            if e is not None:
                errs[m].append(e)
    return {m: _median(v) for m, v in errs.items()}


def what_carries(family: str, points: Sequence[OperatingPoint], left_out: ReferenceFit, own: ReferenceFit,
                 jobs: Jobs) -> dict[str, Any]:
    """``family``'s rows (``points``) predicted by the fit without it (``left_out``), then with each parameter its
    own fit (``own``) moved swapped in alone, then swapped in together in order of the gain alone: a parameter
    whose swap removes most of the error is one the two families disagree on, not one the model lacks."""
    base = family_errors(points, jobs, params_for(left_out))
    single = {n: {"left_out": getattr(left_out.params, n), "own": getattr(own.params, n),
                  **family_errors(points, jobs, swapped(left_out, own, [n]))} for n in own.fitted}
    order = sorted(single, key=lambda n: single[n][ORDER_METRIC] if single[n][ORDER_METRIC] is not None else math.inf)
    together = [{"swapped": order[:i], **family_errors(points, jobs, swapped(left_out, own, order[:i]))}
                for i in range(2, len(order) + 1)]
    return {"rows": len(points), "left_out_fit": base, "one_at_a_time": single, "together": together}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="?", type=Path, default=DEFAULT_ROWS, help="a CSV of published operating points")
    ap.add_argument("--out", type=Path, default=RESULTS / "published.json")
    ap.add_argument("--no-lofo", action="store_true", help="skip the leave-one-family-out and all-family fits")
    ap.add_argument("--write-reference", action="store_true",
                    help=f"fit the reference calibration on the file's vLLM rows and write {REFERENCE_PATH.name}")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    read = read_published_csv(args.rows)
    points = [p for p in read if isinstance(p, OperatingPoint)]
    skipped = [p for p in read if isinstance(p, Skipped)]
    jobs = Jobs()
    views: dict[str, Callable[[str], PerfParams]] = {"reference": lambda k: reference_params(k) or prior_params(k),
                                                     "priors": default_params}
    families = sorted({p.family for p in points if p.is_vllm})
    fits: dict[str, Any] = {}
    carries: dict[str, Any] = {}
    if not args.no_lofo:
        vllm = [p for p in points if p.is_vllm]
        fits["all"] = fit_reference(vllm, jobs=jobs)
        views["all_families"] = params_for(fits["all"])
        if len(families) >= 2:
            for fam in families:
                fits[f"without:{fam}"] = fit_reference([p for p in vllm if p.family != fam], jobs=jobs)
        if args.write_reference:
            write_reference(fits["all"], args.rows)
        if len(families) == 2:  # the fit without one family is the fit on the other alone
            for fam, other in (families, families[::-1]):
                carries[fam] = what_carries(fam, [p for p in vllm if p.family == fam], fits[f"without:{fam}"],
                                            fits[f"without:{other}"], jobs)

    rows: list[dict[str, Any]] = []
    for p in points:
        row: dict[str, Any] = {
            "source": p.source, "engine": p.engine, "model": p.model, "family": p.family, "gpu": p.gpu,
            "mode": p.mode, "layout": p.layout, "layout_short": p.config.short() if p.config else p.layout,
            "isl": p.isl, "osl": p.osl, "concurrency": p.concurrency, "is_vllm": p.is_vllm,
            "measured": p.measured}
        for view, params_of in views.items():
            pred, why = predict_point(p, jobs, params_of)
            key = "predicted" if view == "reference" else f"predicted_{view}"
            row[key] = pred
            if why is not None:
                row["reason"] = why
        if p.is_vllm and f"without:{p.family}" in fits:
            pred, _ = predict_point(p, jobs, params_for(fits[f"without:{p.family}"]))
            row["predicted_lofo"] = pred
        rows.append(row)

    summary: dict[str, Any] = {"model_version": MODEL_VERSION, "rows_file": str(args.rows), "rows": len(read),
                               "skipped_unreadable": len(skipped), "vllm_rows": sum(p.is_vllm for p in points),
                               "families_vllm": families, "seconds": None}
    for view in ("predicted", "predicted_priors", "predicted_all_families", "predicted_lofo"):
        if any(r.get(view) for r in rows):
            summary[view.removeprefix("predicted_") if view != "predicted" else "reference"] = score(rows, view)
    summary["fits"] = {k: v.summary() for k, v in fits.items()}
    if carries:
        summary["what_carries"] = carries
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {"summary": summary, "rows": rows,
           "skipped": [{"line": s.line, "source": s.source, "reason": s.reason} for s in skipped]}
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(table(summary))
    if carries:
        print(carries_table(carries))
    print(f"wrote {args.out} ({len(rows)} rows, {summary['seconds']} s)")
    return 0


def table(summary: dict[str, Any]) -> str:
    """The summary as the Markdown table docs/benchmarks.md shows."""
    lines = ["| view | vLLM rows | tok/s/GPU | median TTFT | P90 TTFT | median TPOT | P90 TPOT | layout order "
             "(3+: median ρ; pairs in order) |", "|---|---|---|---|---|---|---|---|"]
    for view in ("reference", "priors", "all_families", "lofo"):
        s = summary.get(view)
        if not s:
            continue
        e = s["median_abs_error"]
        o = s["order"]
        cell = lambda m: f"{e[m]:.0%}" if e.get(m) is not None else "–"  # noqa: E731
        rho = f"{o['median_spearman']:.2f} ({o['groups_3plus']})" if o["median_spearman"] is not None else "–"
        lines.append(f"| {view} | {s['rows_predicted']} | {cell('tput_per_gpu')} | {cell('median_ttft_ms')} | "
                     f"{cell('p90_ttft_ms')} | {cell('median_tpot_ms')} | {cell('p90_tpot_ms')} | "
                     f"{rho}; {o['pairs_in_order']}/{o['groups_of_2']} |")
    return "\n".join(lines)


def carries_table(carries: dict[str, Any]) -> str:
    """The what-carries diagnostic as a Markdown table: median |error| of the family left out, fitted without it and
    with its own value of each parameter swapped in."""
    def cells(e: dict[str, Any]) -> str:
        return " | ".join(f"{e[m]:.0%}" if e.get(m) is not None else "–" for m in CARRY_METRICS)

    lines = ["| family left out | swapped in from its own fit | tok/s/GPU | median TTFT | median TPOT |",
             "|---|---|---|---|---|"]
    for fam, c in carries.items():
        lines.append(f"| {fam} | nothing | {cells(c['left_out_fit'])} |")
        for n, e in c["one_at_a_time"].items():
            lines.append(f"| {fam} | {n} {e['left_out']:.3g} → {e['own']:.3g} | {cells(e)} |")
        for e in c["together"]:
            lines.append(f"| {fam} | {' + '.join(e['swapped'])} | {cells(e)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
