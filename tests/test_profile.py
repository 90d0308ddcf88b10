"""The hardware profile's parts that need no vLLM: which parameters a study starts from, what a profile deploys
(real widths at reduced depth, a tokenizer whose random prompts round-trip), and bad input. The real profile is
tests/test_profile_real.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import db
from advisor.errors import BadInput
from advisor.job import job_from_dict, load_job
from advisor.profile import PROBE_MEMORY_SHARE, default_depths, plan_profile, prefill_loads, resolve_params
from executors.perf import default_params
from executors.perf.burst import AS_SENT, STEADY
from executors.perf.params import reference_params
from executors.vllm.model_folder import at_depth, hf_config, word_tokenizer, write_model_folder
from search_spaces import ModelProfile, model_preset


def _store(database: db.Database, model: ModelProfile, gpu: str, version: str, mfu: float,
           report: dict | None = None) -> db.HardwareProfile:
    params = default_params(gpu).model_copy(update={"mfu_decode": mfu}).model_dump()
    return database.add_profile(gpu=gpu, gpu_count=1, engine_version=version, shape_key=model.shape_key,
                                model_name=model.name, shape=model.shape, params=params, report=report or {},
                                probes=[])


def test_a_study_starts_from_the_file_then_the_matching_profile_then_unmeasured_defaults(tmp_path):
    database = db.connect(f"sqlite:///{tmp_path / 'r.db'}")
    job = job_from_dict({"name": "j", "preset": "h200-qwen3-235b"})
    assert resolve_params(job, database).source == "defaults for H200, unmeasured"
    ref = job_from_dict({"name": "r", "preset": "h200-qwen3-235b", "executor": {"perf_params": "reference"}})
    chosen = resolve_params(ref, database)
    assert chosen.params == reference_params("H200") != default_params("H200")
    assert chosen.source.startswith("reference calibration for H200")
    assert "qwen3-moe-235b never validated" in chosen.source  # the reference was not fitted on this family
    gb300 = job_from_dict({"name": "g", "preset": "gb300-rack-dsv3", "executor": {"perf_params": "reference"}})
    with pytest.raises(BadInput, match="no reference calibration for GB300"):  # no published vLLM rows on GB300
        resolve_params(gb300, database)
    other = _store(database, model_preset("deepseek-v3"), "H200", "vllm 0.26.0", 0.11)  # another shape
    b200 = _store(database, job.model_profile(), "B200", "vllm 0.26.0", 0.12)  # another GPU kind
    assert resolve_params(job, database).profile_id is None and other.id and b200.id
    old = _store(database, job.model_profile(), "H200", "vllm 0.25.0", 0.13)
    new = _store(database, job.model_profile(), "H200", "vllm 0.26.0", 0.14)
    got = resolve_params(job, database)  # a simulated study: the newest of this shape and kind
    assert (got.profile_id, got.params.mfu_decode, got.source) == (new.id, 0.14, new.label)
    assert resolve_params(job, database, "vllm 0.25.0").profile_id == old.id  # a real study: its vLLM's
    assert resolve_params(job, database, "vllm 0.27.0").profile_id is None  # none measured with it
    path = tmp_path / "p.json"
    default_params("H200").model_copy(update={"mfu_decode": 0.2}).save(path)
    filed = job_from_dict({"name": "j", "preset": "h200-qwen3-235b", "executor": {"perf_params": str(path)}})
    assert resolve_params(filed, database).params.mfu_decode == 0.2  # a file the job names wins
    database.close()


def test_a_profile_fitted_as_sent_says_so_and_older_ones_are_steady(tmp_path):
    """The view a profile's parameters were fitted in travels with them (``ModelParams.view``): a trial predicts its
    levels in it. Profiles stored before the fit as sent, the defaults and a parameter file are steady."""
    database = db.connect(f"sqlite:///{tmp_path / 'r.db'}")
    job = job_from_dict({"name": "j", "preset": "h200-qwen3-235b"})
    assert resolve_params(job, database).view == STEADY
    _store(database, job.model_profile(), "H200", "vllm 0.26.0", 0.13)
    assert resolve_params(job, database).view == STEADY
    _store(database, job.model_profile(), "H200", "vllm 0.26.0", 0.14, {"level_model": AS_SENT})
    got = resolve_params(job, database)
    assert (got.params.mfu_decode, got.view) == (0.14, AS_SENT)
    database.close()


def test_a_trial_predicts_in_the_view_its_parameters_were_fitted_in():
    """``advisor.tune._view``: as sent for a real executor on a profile fitted so, steady for the simulated executor
    (its levels are the steady state), for levels that start steady, and once the guide has re-fitted on the
    study's own levels."""
    from types import SimpleNamespace as NS

    from advisor.tune import _view

    real, sim = NS(simulated=False), NS(simulated=True)
    as_sent, steady = NS(view=AS_SENT), NS(view=STEADY)
    fresh, refitted = NS(samples=[]), NS(samples=["a trial"])
    burst, paced = (NS(workload=NS(level_start=k)) for k in ("burst", "steady"))
    assert _view(NS(job=burst, executor=real, guide=None, model=as_sent)) == AS_SENT
    assert _view(NS(job=burst, executor=real, guide=fresh, model=as_sent)) == AS_SENT
    assert _view(NS(job=burst, executor=real, guide=refitted, model=as_sent)) == STEADY
    assert _view(NS(job=burst, executor=sim, guide=None, model=as_sent)) == STEADY
    assert _view(NS(job=burst, executor=real, guide=None, model=steady)) == STEADY
    # levels whose first requests are spread out hold the steady state: predicted so, whatever the fit's view
    assert _view(NS(job=paced, executor=real, guide=None, model=as_sent)) == STEADY


def test_the_profiles_probe_levels_start_as_a_burst_whatever_the_job_says():
    """The profile is fitted as sent (c requests at once): its probe levels are sent that way even in a study whose
    own levels start steady."""
    from advisor.profile import Probe

    assert Probe("decode", 128, 64, (1, 4)).workload().level_start == "burst"


def test_shape_key_ignores_depth_and_name_only():
    m = model_preset("deepseek-v3")
    assert m.model_copy(update={"num_layers": 4, "num_dense_layers": 1, "name": "x"}).shape_key == m.shape_key
    assert m.model_copy(update={"n_routed_experts": 384}).shape_key != m.shape_key
    assert m.model_copy(update={"weight_bytes": 2.0}).shape_key != m.shape_key


@pytest.mark.parametrize("preset", ["deepseek-v3", "qwen3-moe-235b", "tiny-moe"])
def test_reduced_depth_folders_keep_every_width(preset):
    full = model_preset(preset)
    cfg = hf_config(full)
    for layers in (1, 3):
        deep = ModelProfile.from_hf_dict(at_depth(cfg, layers), name="x")
        assert deep.shape == full.shape and deep.num_layers == layers
        assert deep.num_dense_layers == (min(full.num_dense_layers, 1) if layers > 1 else 0)
    if full.weight_bytes == 1.0:
        assert cfg["quantization_config"]["weight_block_size"] == [128, 128]


def test_generated_tokenizer_round_trips_random_prompts(tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(word_tokenizer(129280))
    assert tok.get_vocab_size() == 129280
    ids = [(777 + i) % 129280 for i in range(3, 4000)]  # vllm bench's random prompts: consecutive ids from an offset
    assert tok.encode(tok.decode(ids)).ids == ids
    cfg = at_depth(hf_config(model_preset("deepseek-v3")), 2)
    folder = write_model_folder(cfg, tmp_path / "m")
    stamp = (folder / ".model-folder.json").stat().st_mtime_ns
    assert write_model_folder(cfg, tmp_path / "m") == folder  # idempotent: nothing rewritten
    assert (folder / ".model-folder.json").stat().st_mtime_ns == stamp
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2


def test_plan_fits_the_gpu_and_the_model_length():
    qwen = job_from_dict({"name": "j", "preset": "h200-qwen3-235b", "executor": {"kind": "local"}})
    plan = plan_profile(qwen)
    shallow, deep = plan.depths
    assert 1 <= shallow < deep <= qwen.model_profile().num_layers and shallow == deep // 4
    weights = deep * 3 * 4096 * 1536 * 128 * 2  # routed experts alone, BF16
    assert weights < PROBE_MEMORY_SHARE * 141 * 2**30
    # as deep as the GPU holds, the probes' KV cache counted: more layers without it, the whole model where it fits
    assert default_depths(qwen.model_profile(), "H200")[1] > deep
    assert default_depths(model_preset("tiny-moe"), "H200", kv_tokens=10**6) == (1, 2)
    assert {p.kind for p in plan.probes} == {"prefill", "decode"} and plan.levels == 2 * 9
    # prefill: one prompt at a time, and as many as fill one step of vLLM's default budget (8,192 tokens on an H200)
    assert {p.isl: p.loads for p in plan.probes if p.kind == "prefill"} == {512: (1, 16), 2048: (1, 4), 8192: (1,)}
    seeds = {p.workload().seed for p in plan.probes}
    assert len(seeds) == len(plan.probes)  # no two probes of a deployment share prompts


def test_prefill_probes_fill_one_step_where_the_budget_holds_two_prompts_or_more():
    assert prefill_loads(512, 8192, 1024) == (1, 16)  # 16 x 512 = the whole budget
    assert prefill_loads(3000, 8192, 1024) == (1, 2)  # two fit, a third would not
    assert prefill_loads(8192, 8192, 1024) == (1,)  # one prompt is the step already
    assert prefill_loads(16384, 8192, 1024) == (1,)  # chunked over two steps: still one at a time
    assert prefill_loads(64, 2048, 16) == (1, 16)  # no more than max-num-seqs sequences in a step
    # on vLLM's CPU build one prompt at a time unless asked (research/prefill_probes.py asks)
    cpu = job_from_dict({"name": "j", "preset": "cpu-tiny-moe", "executor": {"kind": "local"}})
    assert {p.loads for p in plan_profile(cpu).probes if p.kind == "prefill"} == {(1,)}
    assert {p.isl: p.loads for p in plan_profile(cpu, step_filling=True).probes if p.kind == "prefill"} == {
        64: (1, 32), 256: (1, 8)}


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    def run(doc: dict, *args: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "j.yaml").write_text(yaml.safe_dump(doc))
        return subprocess.run([sys.executable, "-m", "advisor", "profile", "j.yaml", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    store = f"sqlite:///{tmp_path / 'r.db'}"
    local = {"name": "p", "preset": "cpu-tiny-moe", "executor": {"kind": "local"}, "storage": store}
    cases = [({"name": "p", "preset": "cpu-tiny-moe", "storage": store}, (), "executor.kind"),
             (local, ("--depths", "a,b"), "--depths"), (local, ("--depths", "1"), "--depths"),
             (local, ("--depths", "0,9"), "--depths")]
    for doc, args, field in cases:
        r = run(doc, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and field in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "r.db").exists()


def test_profile_off_in_yaml_means_off(tmp_path):
    (tmp_path / "j.yaml").write_text("name: j\npreset: cpu-tiny-moe\nexecutor: {kind: local, profile: off}\n")
    assert load_job(tmp_path / "j.yaml").executor.profile == "off"
    (tmp_path / "j.yaml").write_text("name: j\npreset: cpu-tiny-moe\nexecutor: {kind: local, profile: on}\n")
    assert load_job(tmp_path / "j.yaml").executor.profile == "auto"


def test_probe_deployments_reserve_the_kv_they_need_on_gpus_only():
    from advisor.profile import MIN_KV_GIB, with_probe_kv
    from tests.vllm_parser import parse_serve_args

    gpu = job_from_dict({"name": "j", "preset": "h200-qwen3-235b", "executor": {"kind": "local"}})
    sized = with_probe_kv(gpu, 256 * 2112).executor.extra_serve_args
    assert sized[-2] == "--kv-cache-memory-bytes"
    need = 256 * 2112 * gpu.model_profile().kv_bytes_per_token  # c=256 decode probes of 2,048 + 64 tokens
    assert int(sized[-1]) == int(max(MIN_KV_GIB * 2**30, 2 * need))
    assert parse_serve_args(["m", *sized]).kv_cache_memory_bytes == int(sized[-1])  # vLLM's own parser takes it
    mine = gpu.model_copy(update={"executor": gpu.executor.model_copy(
        update={"extra_serve_args": ["--gpu-memory-utilization=0.8"]})})
    assert with_probe_kv(mine, 10**6).executor.extra_serve_args == ["--gpu-memory-utilization=0.8"]
    cpu = job_from_dict({"name": "j", "preset": "cpu-tiny-moe", "executor": {"kind": "local"}})
    assert with_probe_kv(cpu, 10**6) == cpu  # the CPU build sizes its KV by VLLM_CPU_KVCACHE_SPACE


def test_a_deployment_that_dies_ends_the_profile_in_one_line_and_stores_nothing(tmp_path):
    """A real local executor whose engine exits at once (the GPU run's CUDA out-of-memory ended in a traceback)."""
    doc = {"name": "p", "preset": "cpu-tiny-moe", "storage": f"sqlite:///{tmp_path / 'r.db'}",
           "executor": {"kind": "local", "engine_cmd": [sys.executable, "-c", "import sys; sys.exit(7)"],
                        "run_dir": str(tmp_path / "runs"), "timeouts": {"health_s": 60}}}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "advisor", "profile", "j.yaml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "profile stopped at L" in r.stderr and "deploying" in r.stderr and "nothing stored" in r.stderr
    assert db.connect(doc["storage"]).profiles() == []


def _checkpoint(job, depth: int, plan) -> Path:
    """Write what an unfinished profile would have left after measuring ``depth`` (values of the tiny model's
    order on the CPU build), where a rerun of the same profile looks for it."""
    from advisor.profile import checkpoint_path, source_config
    from executors.vllm.serving import engine_version

    model = job.model_profile()
    folder = job.resolve_path(job.executor.run_dir) / "profile-models" / f"{model.shape_key}-L{depth}"
    path = checkpoint_path(job, folder, plan.config, 1, plan.probes, depth, engine_version())
    assert source_config(job)  # the job's model resolves, as the profile needs it to
    measured = [{str(c): {"throughput_per_gpu": 40.0 * c / depth, "p50_ttft_ms": 30.0 * depth * p.isl / 64,
                          "p50_tpot_ms": 20.0 * depth} for c in p.loads} for p in plan.probes]
    levels = [{"depth": depth, "gpus": 1, "kind": p.kind, "isl": p.isl, "osl": p.osl, "concurrency": c,
               "values": measured[i][str(c)]} for i, p in enumerate(plan.probes) for c in p.loads]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"measured": measured, "levels": levels, "deploy_s": 61.0, "measure_s": 9.0}))
    return path


def test_an_unfinished_profile_resumes_after_the_depths_it_measured(tmp_path):
    """A wide model's profile is two ~5-minute cold starts on a fresh H200; one stopped after its first depth must
    not pay for it again. The engine here exits at once, so a depth is measured only if a checkpoint has it."""
    doc = {"name": "p", "preset": "cpu-tiny-moe", "storage": f"sqlite:///{tmp_path / 'r.db'}",
           "executor": {"kind": "local", "engine_cmd": [sys.executable, "-c", "import sys; sys.exit(7)"],
                        "run_dir": str(tmp_path / "runs"), "timeouts": {"health_s": 60}}}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(doc))
    def checkpoint(depth: int) -> Path:  # in a fresh process, as the profile's own (no state of earlier tests)
        code = (f"from advisor.job import load_job; from advisor.profile import plan_profile; "
                f"from tests.test_profile import _checkpoint; job = load_job('j.yaml'); "
                f"print(_checkpoint(job, {depth}, plan_profile(job, [1, 2])))")
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
        assert r.returncode == 0, r.stderr
        return Path(r.stdout.strip().splitlines()[-1])

    plan = plan_profile(load_job(tmp_path / "j.yaml"), [1, 2])
    first = checkpoint(1)

    def profile() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "advisor", "profile", "j.yaml", "--depths", "1,2"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)

    r = profile()  # depth 1 from its checkpoint, depth 2 deployed: the engine dies
    assert r.returncode == 3, r.stderr
    assert "profile stopped at L2, deploying" in r.stderr and "1 deployment(s) measured before are kept" in r.stderr
    assert first.exists() and db.connect(doc["storage"]).profiles() == []

    second = checkpoint(2)
    r = profile()  # both depths measured before: nothing is deployed, the profile is fitted and stored
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed: 2 deployment(s)" in r.stdout
    (stored,) = db.connect(doc["storage"]).profiles()
    assert stored.report["resumed_from"] == [first.name, second.name] and stored.report["deploy_s"] == [61.0, 61.0]
    assert len(stored.probes) == 2 * sum(len(p.loads) for p in plan.probes)
    assert not first.exists() and not second.exists()  # a finished profile leaves no checkpoint to resume


def test_a_checkpoint_is_named_by_what_shaped_its_measurements(tmp_path):
    """Another vLLM build or other serve arguments measure other kernels: their checkpoint is another file."""
    from advisor.profile import checkpoint_path

    job = job_from_dict({"name": "p", "preset": "cpu-tiny-moe", "executor": {"kind": "local",
                                                                            "run_dir": str(tmp_path)}})
    plan = plan_profile(job)
    args = (tmp_path / "f", plan.config, 1, plan.probes, plan.depths[0])
    base = checkpoint_path(job, *args, "0.26.0")
    assert checkpoint_path(job, *args, "0.26.0") == base
    assert checkpoint_path(job, *args, "0.27.0") != base
    other = job.model_copy(update={"executor": job.executor.model_copy(update={"extra_serve_args": ["--block-size",
                                                                                                   "32"]})})
    assert checkpoint_path(other, *args, "0.26.0") != base
    assert checkpoint_path(job, tmp_path / "f", plan.config, 1, plan.probes, plan.depths[1], "0.26.0") != base


def test_profile_report_names_the_parameters_the_fit_left_at_a_bound():
    from advisor.calibrate import Calibration
    from advisor.profile import at_bounds

    p = default_params("H100").model_copy(update={"hbm_eff": 0.2, "mfu_prefill": 0.95, "attn_eff_prefill": 0.3})
    cal = Calibration(studies=[], gpu="H100", params=p, fitted=["hbm_eff", "mfu_prefill", "attn_eff_prefill"],
                      frozen=[], trials=[], folds=0)
    assert at_bounds(cal) == {"hbm_eff": "low", "mfu_prefill": "high"}  # attn_eff_prefill is inside its range
    held = Calibration(studies=[], gpu="H100", params=p, fitted=[], frozen=["hbm_eff"], trials=[], folds=0)
    assert at_bounds(held) == {}  # a parameter not fitted is where its default put it, not a bound the fit hit
