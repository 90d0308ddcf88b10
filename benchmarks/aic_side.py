"""aiconfigurator's half of ``benchmarks/model_vs_aic.py``; runs in aiconfigurator's own venv (``.venv-aic``).

It imports nothing of this project (aiconfigurator pins its own numpy, pandas and pydantic), so the two tools
never share an interpreter: ``model_vs_aic.py`` writes a request (JSON), runs this file with the venv's Python,
and reads the answer (JSON). Per problem it asks aiconfigurator 0.12's Python API for

* its best aggregated and disaggregated deployments (``cli_default``, the ``aiconfigurator cli default``
  search, top 1 each), then re-estimates each (``cli_estimate``) for its per-operation breakdown;
* for every deployment the request lists (ours, already in aiconfigurator's terms): the estimate at the
  operating point given (``cli_estimate``) and the best the deployment does under the problem's SLO in
  aiconfigurator's view — the largest per-rank decode batch meeting TTFT and TPOT (bisection; both grow
  with the batch), disaggregated also with one prompt per prefill step, which is how ``cli default`` itself
  ranks a parallel layout.

    .venv-aic/bin/python benchmarks/aic_side.py REQUEST.json ANSWER.json
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if k.startswith("_"):
            continue
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out


def _estimate(problem: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    from aiconfigurator.cli.api import cli_estimate

    r = cli_estimate(problem["aic_model"], problem["system"], backend_name=problem["backend"],
                     isl=problem["isl"], osl=problem["osl"], **kwargs)
    return {"kwargs": kwargs, "row": _jsonable(r.get()), "per_ops": r.per_ops_data,
            "moe_comm_fallbacks": [str(f) for f in r.moe_comm_fallbacks]}


def _meets(problem: dict[str, Any], row: dict[str, Any]) -> bool:
    return row["ttft"] <= problem["ttft_ms"] and row["tpot"] <= problem["tpot_ms"]


def _best_batch(problem: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The estimate at the largest per-rank decode batch (1…512) meeting the SLO; None when even batch 1 misses.
    Disaggregated: also with one prompt per prefill step (a smaller prefill batch only shortens TTFT), the better
    of the two."""
    key = "decode_batch_size" if kwargs.get("mode") == "disagg" else "batch_size"
    variants = [kwargs]
    if kwargs.get("mode") == "disagg" and kwargs.get("prefill_batch_size", 1) > 1:
        variants.append({**kwargs, "prefill_batch_size": 1})
    found = []
    for kw in variants:
        lo, hi, best = 1, 512, None
        while lo <= hi:
            mid = (lo + hi) // 2
            try:
                e = _estimate(problem, {**kw, key: mid})
            except Exception as exc:  # noqa: BLE001 - aiconfigurator refuses a batch (OOM, no data): too large
                e = {"error": f"{type(exc).__name__}: {exc}"}
            if "row" in e and _meets(problem, e["row"]):
                best, lo = e, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            found.append(best)
    return max(found, key=lambda e: e["row"]["tokens/s/gpu"], default=None)


def _own_pick_kwargs(mode: str, row: dict[str, Any]) -> dict[str, Any]:
    """``cli_estimate``'s arguments for one row of ``cli_default``'s best configs (one replica of it)."""
    if mode == "agg":
        return {"mode": "agg", "batch_size": int(row["bs"]), "ctx_tokens": int(row["ctx_tokens"]),
                "tp_size": int(row["tp"]), "attention_dp_size": int(row["dp"]),
                "moe_tp_size": int(row["moe_tp"]), "moe_ep_size": int(row["moe_ep"])}
    kw: dict[str, Any] = {"mode": "disagg"}
    for side, name in (("p", "prefill"), ("d", "decode")):
        kw |= {f"{name}_tp_size": int(row[f"({side})tp"]), f"{name}_attention_dp_size": int(row[f"({side})dp"]),
               f"{name}_moe_tp_size": int(row[f"({side})moe_tp"]), f"{name}_moe_ep_size": int(row[f"({side})moe_ep"]),
               f"{name}_batch_size": int(row[f"({side})bs"]), f"{name}_num_workers": int(row[f"({side})workers"])}
    return kw


def _problem(problem: dict[str, Any]) -> dict[str, Any]:
    from aiconfigurator.cli.api import cli_default

    t0 = time.time()
    res = cli_default(model_path=problem["aic_model"], total_gpus=problem["total_gpus"], system=problem["system"],
                      backend=problem["backend"], isl=problem["isl"], osl=problem["osl"],
                      ttft=float(problem["ttft_ms"]), tpot=float(problem["tpot_ms"]), top_n=1)
    picks = {}
    for mode, df in res.best_configs.items():
        if df is None or df.empty:
            continue
        row = _jsonable(df.iloc[0].to_dict())
        picks[mode] = {"row": row, "estimate": _estimate(problem, _own_pick_kwargs(mode, row))}
    ours = {}
    for name, kwargs in problem.get("deployments", {}).items():
        try:
            ours[name] = {"at_point": _estimate(problem, kwargs), "best_under_slo": _best_batch(problem, kwargs)}
        except Exception as exc:  # noqa: BLE001 - one deployment aiconfigurator cannot price is reported, not fatal
            ours[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return {"picks": picks, "deployments": ours, "seconds": round(time.time() - t0, 1)}


def main(argv: list[str]) -> int:
    logging.disable(logging.WARNING)  # aiconfigurator logs its database fallbacks per query; the answer keeps them
    import aiconfigurator

    req = json.loads(open(argv[1]).read())
    answer = {"version": aiconfigurator.__version__,
              "problems": {name: _problem(p) for name, p in req["problems"].items()}}
    with open(argv[2], "w") as f:
        json.dump(answer, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
