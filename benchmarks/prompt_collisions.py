"""Prefix-cache hits that vLLM's random prompts cause by themselves, with the levels' own seeds and with the seeds
``executors.measuring.prompt_seeds`` picks — offline, with vLLM's own sampler (``RandomDataset.sample``) and tokenizer.

For each case (a generated tokenizer, a workload, the loads of one deployment's levels in order, the warm-up first)
it samples every level's prompts exactly as ``vllm bench serve --dataset-name random --seed S`` does, tokenizes
them as the server does, and replays them through a prefix cache of ``--block`` tokens kept across the
deployment's levels (vLLM keeps it: nothing resets it between levels): a request hits the leading full blocks of
its prompt (all but its last token) already cached. Per level it reports the hit share of prompt tokens and how
many prompts repeat an earlier first block — "before": ``Workload.level_seed`` as is; "after":
``PromptStarts.pick``. It also checks that ``PromptStarts.key`` (the reproduction) names each prompt's real
first block. Writes ``benchmarks/results/prompt_collisions.json``.

What it does not show: the server's own counters (``tests/test_knee_real.py`` reads those on a real deployment),
nor eviction — a prefix cache smaller than the deployment's prompts forgets some, and then hits fewer.

    python benchmarks/prompt_collisions.py [--block 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executors.measuring import bench  # noqa: E402
from executors.measuring.prompt_seeds import BLOCK_TOKENS, PromptStarts, fresh_spec  # noqa: E402
from executors.vllm import model_folder  # noqa: E402
from executors.vllm.tiny_model import make_tiny_moe  # noqa: E402
from search_spaces import Dataset, LengthDist, Workload  # noqa: E402
from tests.shared_runs import PROBE_JOB  # noqa: E402

CI_WORKLOAD = Workload.model_validate(PROBE_JOB["workload"])
GPU_WORKLOAD = Workload(dataset=Dataset.RANDOM, isl=LengthDist(mean=2048), osl=LengthDist(mean=256))
GPU_LOADS = [64, 128, 96, 80, 112, 72]


def _word_folder(vocab: int, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in model_folder._tokenizer_files(vocab, 0).items():
        (out / name).write_text(text)
    return out


def _sample(tokenizer: Any, workload: Workload, spec: bench.LevelSpec) -> list[tuple[list[int], tuple[int, ...]]]:
    """The level's prompts as ``vllm bench serve`` sends them: tokenized as the server does, and the first block
    of the text's own tokens (no special tokens added: what ``PromptStarts.key`` names)."""
    from vllm.benchmarks.datasets import RandomDataset

    reqs = RandomDataset(random_seed=spec.seed).sample(
        tokenizer=tokenizer, num_requests=spec.num_prompts, input_len=workload.isl.mean,
        output_len=workload.osl.mean,
        range_ratio={"input": workload.isl.range_ratio, "output": workload.osl.range_ratio})
    return [(tokenizer.encode(r.prompt), tuple(tokenizer.encode(r.prompt, add_special_tokens=False)[:BLOCK_TOKENS]))
            for r in reqs]


def _deployment(tokenizer: Any, workload: Workload, loads: list[float], block: int, pick: bool) -> list[dict]:
    starts = PromptStarts(tokenizer)
    cache: set[int] = set()
    firsts: set[tuple[int, ...]] = set()
    rows, key_ok, key_n = [], 0, 0
    specs = [bench.LevelSpec.for_load(workload, loads[0], warmup=True)]
    specs += [bench.LevelSpec.for_load(workload, x) for x in loads]
    for spec in specs:
        if pick:
            spec = fresh_spec(starts, workload, spec)
        prompts = _sample(tokenizer, workload, spec)
        predicted = [starts.key(s) for s in starts.starts(workload, spec.seed, spec.num_prompts)]
        hit = total = repeats = 0
        for (toks, plain), key in zip(prompts, predicted, strict=True):
            key_ok += plain == key
            key_n += 1
            first = tuple(toks[:BLOCK_TOKENS])
            repeats += first in firsts
            firsts.add(first)
            usable = (len(toks) - 1) // block
            chain, h = [], 0
            for b in range(len(toks) // block):  # vLLM's block hashes: each names its whole prefix
                h = hash((h, tuple(toks[b * block:(b + 1) * block])))
                chain.append(h)
            n = 0
            while n < usable and chain[n] in cache:
                n += 1
            hit += n * block
            total += len(toks)
            cache.update(chain)
        rows.append({"level": spec.name, "seed": spec.seed, "prompts": spec.num_prompts,
                     "hit_rate": round(hit / total, 4), "repeated_first_blocks": repeats})
    rows.append({"key_matches": key_ok, "prompts": key_n})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=BLOCK_TOKENS, help="KV block size in tokens (CPU build: 128)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/prompt_collisions.json"))
    args = ap.parse_args()
    from vllm.tokenizers import get_tokenizer

    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="prompt-collisions-"))
    cases = [
        ("tiny CI model (byte-level BPE, 2,048 ids), the knee study's workload", make_tiny_moe(tmp / "tiny"),
         CI_WORKLOAD, [1, 8, 4, 2, 3, 5]),
        ("generated word-level tokenizer, 8,192 ids (issue 30's profile folders), ISL 2048 / OSL 256",
         _word_folder(8192, tmp / "w8192"), GPU_WORKLOAD, GPU_LOADS),
        ("generated word-level tokenizer, 129,280 ids (DeepSeek-V3's vocabulary), ISL 2048 / OSL 256",
         _word_folder(129_280, tmp / "w129280"), GPU_WORKLOAD, GPU_LOADS),
    ]
    out: dict[str, Any] = {"argv": sys.argv, "block": args.block, "cases": []}
    for name, folder, workload, loads in cases:
        tok = get_tokenizer(str(folder))
        case = {"case": name, "loads": loads}
        for label, pick in (("before", False), ("after", True)):
            rows = _deployment(tok, workload, loads, args.block, pick)
            case[label] = rows
            print(f"{name} — {label}", flush=True)
            for r in rows:
                print("   ", r, flush=True)
        out["cases"].append(case)
    out["seconds"] = round(time.monotonic() - t0, 1)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} in {out['seconds']} s")


if __name__ == "__main__":
    main()
