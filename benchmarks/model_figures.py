"""Every number the performance-model doc and the README quote from the model, computed from the model.

The doc (``docs/performance-model.md``) and the README hold marked blocks::

    <!-- figures:NAME -->…<!-- /figures -->

This script computes each block's text from the code — the parameter table from ``PerfParams``' fields, the
per-GPU overrides, the module constants with the comments that source them, and the seed report's lessons
as the model reproduces them — and writes the blocks in place. ``tests/test_model_docs.py`` recomputes them
and fails when a number in a file differs from the model's by more than 1% (or the words around it differ).

    python benchmarks/model_figures.py          # rewrite the blocks
    python benchmarks/model_figures.py --check  # exit 1, naming the blocks, where a file disagrees
"""

from __future__ import annotations

import argparse
import ast
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: benchmarks.seed_scenario, as the tests import it

from benchmarks.seed_scenario import (  # noqa: E402
    AGENTIC,
    DSV3_FP4,
    GB300,
    SEED_DEP2,
    SEED_DEP4,
    SEED_DP_LOSS,
    A,
    decode,
    pd,
    prefill,
)
from executors import place  # noqa: E402
from executors.perf import (  # noqa: E402
    PerfParams,
    decode_step_time,
    decode_throughput_per_gpu,
    default_params,
    expected_max_z,
    predict,
    prefill_throughput_per_gpu,
)
from executors.perf import deployments, derived, levels, measurement, params, step  # noqa: E402
from executors.perf.params import _GPU_OVERRIDES  # noqa: E402
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig  # noqa: E402

DOC = ROOT / "docs" / "performance-model.md"
README = ROOT / "README.md"
MODULES = [params, derived, step, deployments, levels, measurement]
BLOCK = re.compile(r"<!-- figures:([\w-]+) -->(.*?)<!-- /figures -->", re.S)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
TOLERANCE = 0.01


# ---------------------------------------------------------------------------------- formatting
def k(x: float) -> str:
    """Thousands of tokens/s as the doc writes them: 39.1K."""
    return f"{x / 1000:.1f}K"


def pct(x: float, sign: bool = False) -> str:
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def seconds(v: float) -> str:
    """A time with its unit: 25 µs, 0.4 ms, 3 ms, 0.5 s."""
    if v == 0:
        return "0"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if v >= f:
            return f"{v / f:.4g} {unit}"
    return f"{v / 1e-6:.4g} µs"


def value(name: str, v: float) -> str:
    return seconds(v) if name.endswith("_s") else f"{v:g}"


# ---------------------------------------------------------------------------------- parameters and constants
def params_table() -> str:
    rows = ["| parameter | default | bounds | meaning and source of the default (the field's description) |",
            "|---|---|---|---|"]
    for (name, field), (lo, hi) in zip(PerfParams.model_fields.items(), PerfParams.bounds(), strict=True):
        desc = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {value(name, field.default)} | [{value(name, lo)}, {value(name, hi)}] | {desc} |")
    return "\n".join(rows)


def overrides_table() -> str:
    names = sorted({n for o in _GPU_OVERRIDES.values() for n in o}, key=list(PerfParams.model_fields).index)
    rows = ["| GPU kind | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for gpu, o in _GPU_OVERRIDES.items():
        rows.append(f"| {gpu} | " + " | ".join(value(n, o[n]) if n in o else "–" for n in names) + " |")
    return "\n".join(rows)


def constants() -> list[tuple[str, str, Any, str]]:
    """(name, module, value, its ``#:`` comment) of every module-level constant of the model's parts: names in
    capitals (caches apart), read with the comment lines just above their assignment."""
    out = []
    for mod in MODULES:
        path = Path(mod.__file__ or "")
        lines = path.read_text().splitlines()
        for node in ast.parse(path.read_text()).body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for tg in node.targets for t in (tg.elts if isinstance(tg, ast.Tuple) else [tg])]
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            names = [n for n in names if re.fullmatch(r"_?[A-Z][A-Z0-9_]*", n) and not n.endswith("CACHE")]
            if not names:
                continue
            i, doc = node.lineno - 2, []
            while i >= 0 and re.match(r"_?[A-Z][A-Z0-9_]*\b", lines[i]):  # one comment over consecutive constants
                i -= 1
            while i >= 0 and lines[i].startswith("#:"):
                doc.insert(0, lines[i][2:].strip())
                i -= 1
            for n in names:
                out.append((n, mod.__name__.replace(".", "/"), getattr(mod, n), " ".join(doc)))
    return out


def shown(v: Any) -> str:
    if isinstance(v, Path):  # a file of the package: where it is in the tree, not on this machine
        return f"`{v.resolve().relative_to(ROOT)}`" if v.resolve().is_relative_to(ROOT) else f"`{v.name}`"
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (set, frozenset)):
        return ", ".join(sorted(f"`{x.value}`" for x in v))
    if isinstance(v, list):
        return f"the {len(v)} fields of `PerfParams`, in the table's order"
    if isinstance(v, dict):
        return "the table above"
    return f"{v}"


def constants_table() -> str:
    rows = ["| constant | module | value | meaning and source |", "|---|---|---|---|"]
    for name, mod, v, doc in constants():
        rows.append(f"| `{name}` | `{mod}.py` | {shown(v)} | {doc} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------- the seed's lessons
def seed_prefill() -> tuple[str, float]:
    dep2 = prefill_throughput_per_gpu(prefill(2, 4), DSV3_FP4, GB300, AGENTIC, concurrency=256)
    dep4 = prefill_throughput_per_gpu(prefill(4, 2), DSV3_FP4, GB300, AGENTIC, concurrency=256)
    t2, t4 = dep2["input_tokens_per_s_per_gpu"], dep4["input_tokens_per_s_per_gpu"]

    def loss(dp: int, inst: int, real: float) -> float:
        ideal = prefill_throughput_per_gpu(prefill(dp, inst), DSV3_FP4, GB300, AGENTIC, concurrency=256,
                                           imbalance=False)["input_tokens_per_s_per_gpu"]
        return 1 - real / ideal

    l2, l4 = loss(2, 4, t2), loss(4, 2, t4)
    level = t2 / SEED_DEP2
    text = (f"At concurrency 256 on 8 GPUs, 4 × DEP2 gives {k(t2)} input tok/s/GPU vs {k(t4)} for 2 × DEP4 "
            f"(ratio {t2 / t4:.2f}; seed {k(SEED_DEP2)} vs {k(SEED_DEP4)}, ratio {SEED_DEP2 / SEED_DEP4:.2f}). "
            f"DP imbalance costs DEP4 {pct(l4)} (seed: {pct(SEED_DP_LOSS)} from replay) and DEP2 {pct(l2)}; the "
            f"rest is all-to-all (3/4 vs 1/2 of tokens leave the GPU) and expert imbalance over 4 vs 2 GPUs. The "
            f"absolute level is {level:.2f} × the seed's for DEP2 ({t4 / SEED_DEP4:.2f} × for DEP4), with NVFP4 "
            f"weights computed at the GB300's FP4 rate: the seed's model (a \"Flash\" variant) and kernels differ.")
    return text, level


def seed_eplb() -> str:
    parts, imb = [], {}
    for batch in (256, 128, 64):
        row = []
        for ep in (16, 32, 48):
            off = decode_throughput_per_gpu(decode(ep), DSV3_FP4, GB300, AGENTIC, batch=batch)
            on = decode_throughput_per_gpu(decode(ep, eplb=32), DSV3_FP4, GB300, AGENTIC, batch=batch)
            o, n = off["output_tokens_per_s_per_gpu"], on["output_tokens_per_s_per_gpu"]
            row.append((ep, o, n, n / o - 1))
            if batch == 256:
                imb[ep] = (off["expert_imbalance"], on["expert_imbalance"])
        parts.append(row)
    at256 = ", ".join(f"EP{ep} {o:,.0f} → {n:,.0f} ({pct(g, True)})" for ep, o, n, g in parts[0])
    at128 = ", ".join(pct(g, True) for *_, g in parts[1])
    at64 = ", ".join(pct(g, True) for *_, g in parts[2])
    return (f"Decode output tok/s/GPU at 256 sequences per rank, EPLB off → on (32 redundant experts): {at256}; "
            f"at 128 per rank {at128}; at 64 per rank {at64} (EP16, EP32, EP48). Without EPLB per-GPU throughput "
            f"falls as EP widens (expert imbalance {imb[16][0]:.2f} → {imb[48][0]:.2f}, EP16 → EP48); with it, it "
            f"stays nearly flat ({imb[16][1]:.2f} → {imb[48][1]:.2f}). At small batches (memory-bound), redundant "
            f"experts cost weight bandwidth and EPLB at EP16 gains least — a prediction worth checking on "
            f"hardware.")


def seed_cpu() -> str:
    st = decode_step_time(decode(48, eplb=32), DSV3_FP4, GB300, AGENTIC, batch=256)
    slow = decode_step_time(decode(48, eplb=32), DSV3_FP4, GB300, AGENTIC, PerfParams(frontend_per_token_s=10e-6),
                            batch=256)
    tokens = 48 * 256
    per_tok = PerfParams().frontend_per_token_s
    gpu = st.total if st.total > st.frontend else math.nan
    return (f"The API server's per-step load grows with the instance's total batch; EP48 with 256 sequences per "
            f"rank streams {tokens:,} tokens per step ({1e3 * st.frontend:.1f} ms at the default "
            f"{seconds(per_tok)}/token) against a GPU step of {1e3 * gpu:.1f} ms; at 10 µs/token the API server "
            f"is the bottleneck (a {1e3 * slow.total:.1f} ms step).")


def seed_pd() -> str:
    mixed = RoleConfig(role=Role.MIXED, data_parallel_size=16, enable_expert_parallel=True, max_num_seqs=128,
                       all2all_backend=A.DEEPEP_LOW_LATENCY)
    agg = DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed)
    dis = pd(prefill(2, 4), decode(8, max_num_seqs=128))
    p = default_params("GB300")
    ma = predict(place(agg, GB300), DSV3_FP4, AGENTIC, p)
    md = predict(place(dis, GB300), DSV3_FP4, AGENTIC, p)
    stall = " → ".join(f"{m.raw['stall_share']:.2f}" for m in ma)
    users = ", ".join(f"{a.p90_tokens_per_s_per_user:.1f} vs {d.p90_tokens_per_s_per_user:.1f}"
                      for a, d in zip(ma, md))
    levels = "/".join(str(c) for c in AGENTIC.load_levels)
    slo = 40.0
    split = [c for c, a, d in zip(AGENTIC.load_levels, ma, md)
             if a.p90_tokens_per_s_per_user < slo <= d.p90_tokens_per_s_per_user]
    verdict = (f"at concurrency {', '.join(map(str, split))} aggregated misses a {slo:.0f} tok/s/user SLO that P/D "
               f"meets" if split else f"at no level does P/D meet a {slo:.0f} tok/s/user SLO that aggregated misses")
    return (f"With 8K prompts, lockstep DP makes most aggregated steps wait for some rank's prefill chunk "
            f"(stall share {stall} at concurrency {levels}, one DEP16 instance), so P90 tok/s/user of aggregated "
            f"DEP16 vs P/D (4 × DEP2 prefill, EP8 decode) is {users}: {verdict}.")


def z_values() -> str:
    return ", ".join(f"z({n})={expected_max_z(n):.2f}" for n in (2, 4, 16, 48))


def blocks() -> dict[str, str]:
    """Every marked block's text, by name."""
    prefill_text, level = seed_prefill()
    return {
        "z": z_values(),
        "params": params_table(),
        "overrides": overrides_table(),
        "constants": constants_table(),
        "seed-prefill": prefill_text,
        "seed-eplb": seed_eplb(),
        "seed-cpu": seed_cpu(),
        "seed-pd": seed_pd(),
        "readme-seed-level": f"about {level:.2f}×",
    }


# ---------------------------------------------------------------------------------- files
def _wrap(text: str) -> str:
    return f"\n{text}\n" if "\n" in text or text.startswith("|") else text


def rewrite(text: str, computed: dict[str, str]) -> str:
    return BLOCK.sub(lambda m: f"<!-- figures:{m[1]} -->{_wrap(computed[m[1]])}<!-- /figures -->", text)


def disagreements(text: str, computed: dict[str, str]) -> list[str]:
    """Why each block of ``text`` disagrees with the model: its words differ, or a number by more than 1%."""
    out = []
    for m in BLOCK.finditer(text):
        name, got = m[1], m[2].strip()
        want = computed.get(name)
        if want is None:
            out.append(f"{name}: no such figure")
            continue
        if NUMBER.sub("#", got) != NUMBER.sub("#", want.strip()):
            out.append(f"{name}: the words differ from the script's (regenerate: python benchmarks/model_figures.py)")
            continue
        for a, b in zip(NUMBER.findall(got), NUMBER.findall(want), strict=True):
            x, y = float(a.replace(",", "")), float(b.replace(",", ""))
            if abs(x - y) > TOLERANCE * max(abs(x), abs(y)):
                out.append(f"{name}: the file says {a}, the model gives {b}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 where a file disagrees")
    a = ap.parse_args()
    computed = blocks()
    bad = []
    for path in (DOC, README):
        text = path.read_text()
        found = {m[1] for m in BLOCK.finditer(text)}
        if a.check:
            bad += [f"{path.relative_to(ROOT)}: {d}" for d in disagreements(text, computed)]
        elif found:
            path.write_text(rewrite(text, computed))
            print(f"{path.relative_to(ROOT)}: {len(found)} block(s) rewritten: {', '.join(sorted(found))}")
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    if a.check:
        print(f"every figure in {DOC.relative_to(ROOT)} and {README.name} agrees with the model")


if __name__ == "__main__":
    main()
