"""A fingerprint of the performance model's outputs: every number it gives for many candidates, hashed.

For refactoring the model without changing it: run before and after, the hashes must be equal (bit-identical
floats, compared through ``repr``). Covers every preset's valid candidates (up to ``--n`` each, seeded), at
default and at seeded perturbed parameters (plus one set with the per-request costs switched on), through
``predict`` (every load level), ``predict_load`` at a request rate, and the public step/throughput functions.

``--against FILE`` evaluates a second copy of the model written as one file (a revision from before the model
was split into parts) in the same process, on the same inputs, and counts the numbers that differ — robust to
fields the rest of the tree adds to ``Measurement`` meanwhile (a field only one side has is counted apart). The
model is now the package ``executors/perf/``: compare two revisions by running this script in a checkout of each
(``--dump`` both and diff, or compare the printed hashes).

    python benchmarks/model_fingerprint.py [--n 150] [--dump out.json] [--against old_model.py]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
from types import ModuleType
from typing import Any

from truths import perturbed

import executors.perf as current
from executors import place
from search_spaces import ClusterSpec, SearchSpace, Workload, check, load_preset, model_preset, preset_names


def _num(v: Any) -> Any:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dict):
        return {k: _num(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_num(x) for x in v]
    return v if isinstance(v, (int, str, bool, type(None))) else repr(v)


def fingerprint(n: int, api: ModuleType = current, seed: int = 0) -> dict[str, Any]:
    """Every number ``api`` (a module with the façade's functions) gives for the candidates."""
    out: dict[str, Any] = {}
    for name in preset_names():
        d = load_preset(name)
        overrides = {k: v for k, v in d["model"].items() if k != "preset"}
        model = model_preset(d["model"]["preset"]).model_copy(update=overrides)
        cluster = ClusterSpec(**d["cluster"])
        workload = Workload(**d["workload"])
        agentic = workload.model_copy(update={"dataset": "agentic", "turns": 3})
        space = SearchSpace.model_validate(d["space"])
        base = api.default_params(cluster.gpu)
        params = [base, perturbed(base, 1), perturbed(base, 2, 3.0),
                  base.model_copy(update={"request_latency_s": 0.02, "frontend_per_request_s": 0.004})]
        cfgs = [cfg for _, cfg in space.enumerate()]
        random.Random(seed).shuffle(cfgs)
        valid = [c for c in cfgs if not check(c, model, cluster, workload.max_model_len)][:n]
        rows = []
        for i, cfg in enumerate(valid):
            topo = place(cfg, cluster)
            p = params[i % len(params)]
            wl = agentic if i % 5 == 4 else workload
            row: dict[str, Any] = {"predict": [m.model_dump() for m in api.predict(topo, model, wl, p)]}
            if i % 7 == 0:
                by_rate = wl.model_copy(update={"load_by": "rate"})
                row["rate"] = api.predict_load(topo, model, by_rate, 3.0, p).model_dump()
            role = cfg.decode
            row["decode_step"] = api.decode_step_time(role, model, cluster, wl, p, batch=17.0, mtp_tokens=1)._asdict()
            row["decode_tput"] = api.decode_throughput_per_gpu(role, model, cluster, wl, p, batch=64.0)
            pf = cfg.prefill or cfg.decode
            row["prefill_step"] = api.prefill_step_time(pf, model, cluster, wl, p, requests_per_rank=3.0)._asdict()
            row["prefill_tput"] = api.prefill_throughput_per_gpu(pf, model, cluster, wl, p, concurrency=256)
            row["prefill_tput_bal"] = api.prefill_throughput_per_gpu(pf, model, cluster, wl, p, imbalance=False)
            rows.append(_num(row))
        out[name] = rows
    return out


def compare(a: Any, b: Any) -> tuple[int, int, int]:
    """(equal leaves, differing leaves, keys only one side has) of two fingerprints."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [0, 0, len(set(a) ^ set(b))]
        for k in set(a) & set(b):
            out = [x + y for x, y in zip(out, compare(a[k], b[k]))]
        return out[0], out[1], out[2]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = [0, 0, 0]
        for x, y in zip(a, b):
            out = [u + v for u, v in zip(out, compare(x, y))]
        return out[0], out[1], out[2]
    return (1, 0, 0) if a == b else (0, 1, 0)


def load_module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("executors._perf_model_against", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=150, help="candidates per preset")
    ap.add_argument("--dump", help="write the full fingerprint (JSON) here")
    ap.add_argument("--against", help="another copy of the model (one .py file) to compare with, number by number")
    a = ap.parse_args()
    fp = fingerprint(a.n)
    text = json.dumps(fp, sort_keys=True)
    if a.dump:
        with open(a.dump, "w") as f:
            f.write(text)
    counts = {k: len(v) for k, v in fp.items()}
    print(f"{hashlib.sha256(text.encode()).hexdigest()}  candidates per preset: {counts}")
    if a.against:
        same, differ, one_side = compare(fp, fingerprint(a.n, load_module(a.against)))
        print(f"against {a.against}: {same} numbers equal, {differ} differ, {one_side} fields on one side only")
        raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
