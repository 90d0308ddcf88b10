"""A serving knob is declared once (``search_spaces/knobs.py``) and everything else follows from the entry: the
space, the study's parameter, the rendering vLLM's parser reads, the stored trial and the dashboard's tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from search_spaces import (
    KNOBS,
    ClusterSpec,
    DeploymentConfig,
    Mode,
    Role,
    RoleConfig,
    SearchSpace,
    check,
    kv_capacity_tokens,
    load_preset,
    model_preset,
    preset_names,
)

REPO = Path(__file__).resolve().parents[1]

#: Run in a fresh interpreter: one ``Knob`` entry is added to the table before anything is built from it, then
#: a study searches it and every consumer is asked about it.
ONE_ENTRY = r'''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("search_spaces.knobs", "search_spaces/knobs.py")
knobs = importlib.util.module_from_spec(spec)
sys.modules["search_spaces.knobs"] = knobs
spec.loader.exec_module(knobs)
knobs.KNOBS += (knobs.Knob(
    name="stream_interval", default=1, kind=int, label="stream interval",
    help="Tokens per streamed chunk.", ge=1, omit_default=True, roles=frozenset({"mixed"}),
    cell=lambda v, c: f"si{v}" if v != 1 else None, words=lambda v, c: f"stream interval {v}" if v != 1 else None),)

import db
from advisor.job import job_from_dict
from advisor.tune import tune
from db import queries
from executors import cpu_platform, place, serve_args
from executors.vllm.render import Endpoint
from tests.vllm_parser import parse_serve_args
from ui import data

url = sys.argv[1]
space = {"modes": ["aggregated"], "mixed": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [4],
                                            "max_num_batched_tokens": [2048], "stream_interval": [1, 4]}}
job = job_from_dict({"name": "k", "preset": "cpu-tiny-moe", "sampler": {"seed": 3}, "budget": {"trials": 4},
                     "space": space})
tune(job, storage=url)
database = db.connect(url)
trials = [t for t in queries.list_trials(database, "k") if t.config is not None]
database.close()
out = {"params": [t.params for t in trials], "stored": [t.config.decode.stream_interval for t in trials]}
t4 = next(t for t in trials if t.config.decode.stream_interval == 4)
inst = place(t4.config, job.cluster).instances[0]
args = serve_args(inst, inst.shards[0], cfg=t4.config, model="m", platform=cpu_platform(kv_storage_path="/tmp/x"),
                  head=Endpoint(host="127.0.0.1", port=8100))
out["args"] = args
out["parsed"] = parse_serve_args(args).stream_interval
out["described"] = t4.config.describe()
table, params = data.trials(url, "k", ())
out["deployment"] = sorted(table["deployment"])
out["param_columns"] = sorted(params.columns)
print(json.dumps(out))
'''


def test_a_knob_added_in_one_place_reaches_space_rendering_database_and_dashboard(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_TARGET_DEVICE": "cpu"}
    p = subprocess.run([sys.executable, "-c", ONE_ENTRY, url], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # the space: the study's parameter {role}_{param}, both choices searched
    assert {pm["mixed_stream_interval"] for pm in out["params"]} == {1, 4}
    # the database: the stored configuration holds the value the parameter chose
    assert out["stored"] == [pm["mixed_stream_interval"] for pm in out["params"]]
    # the rendering, read by vLLM's own parser
    assert out["args"][out["args"].index("--stream-interval") + 1] == "4" and out["parsed"] == 4
    assert "stream interval 4" in out["described"]
    # the dashboard's trial table and parameter table
    assert any(d.endswith(" si4") for d in out["deployment"]) and "mixed_stream_interval" in out["param_columns"]


@pytest.mark.parametrize("name", preset_names())
def test_a_space_that_names_no_newer_knob_asks_for_none(name: str) -> None:
    """The knobs added after the table existed enter a study only where its space names them: a preset's
    candidates have none of their parameters, and their stored text is what it was before (no key of theirs)."""
    newer = [k for k in KNOBS if not k.stored]
    assert newer
    space = SearchSpace.model_validate(load_preset(name)["space"])
    for n, (params, cfg) in enumerate(space.enumerate()):
        assert not {p for p in params for k in newer if p.endswith(f"_{k.param}")}, params
        stored = json.loads(cfg.model_dump_json())
        assert not {k.name for k in newer} & {f for r in ("prefill", "decode") if stored[r] for f in stored[r]}
        if n == 200:
            break
    assert not {k.space for k in newer} & {f for r in ("mixed", "prefill", "decode")
                                           for f in space.model_dump()[r]}


def test_a_knob_outside_its_roles_is_refused() -> None:
    with pytest.raises(ValueError, match="decode.kv_cache_dtype: KV-cache dtype applies to the mixed role only"):
        SearchSpace.model_validate({"decode": {"kv_cache_dtype": ["auto", "fp8"]}})


def test_fp8_kv_cache_holds_twice_the_tokens_on_gpus_with_gqa_only() -> None:
    """The model term of ``--kv-cache-dtype fp8``: a bf16 model's KV at one byte per element, so the KV the rest of
    the memory holds doubles; refused on the CPU build and with MLA attention."""
    model, h200 = model_preset("qwen3-moe-235b"), ClusterSpec(gpu="H200", gpus_per_node=8)
    assert model.kv_bytes == 2.0
    base = RoleConfig(role=Role.MIXED, data_parallel_size=8, enable_expert_parallel=True)
    fp8 = base.model_copy(update={"kv_cache_dtype": "fp8"})
    assert kv_capacity_tokens(fp8, model, h200) == pytest.approx(2 * kv_capacity_tokens(base, model, h200))
    assert not check(DeploymentConfig(mode=Mode.AGGREGATED, decode=fp8), model, h200, 4096)
    cpu = ClusterSpec(gpu="CPU", gpus_per_node=2)
    tiny = RoleConfig(role=Role.MIXED, kv_cache_dtype="fp8")
    rules = {v.rule for v in check(DeploymentConfig(mode=Mode.AGGREGATED, decode=tiny), model_preset("tiny-moe"),
                                   cpu, 512)}
    assert "kv-cache-dtype-gpu-only" in rules
    mla = {v.rule for v in check(DeploymentConfig(mode=Mode.AGGREGATED, decode=fp8), model_preset("deepseek-v3"),
                                 h200, 4096)}
    assert "kv-cache-dtype-mla" in mla
