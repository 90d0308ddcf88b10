"""Bad input ends with exit code 2 and one line naming the problem — no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import advisor, one_line

BAD = Path(__file__).parent / "bad_jobs"

#: file → words the one line must contain (the field, and what is allowed where it applies)
EXPECT = {
    "unknown_field.yaml": ["budgett", "allowed"],
    "unknown_nested_field.yaml": ["racks", "cluster"],
    "wrong_type.yaml": ["budget.trials"],
    "zero_nodes.yaml": ["cluster.nodes", "greater than or equal to 1"],
    "negative_gpus.yaml": ["cluster.gpus_per_node"],
    "ep_wider_than_cluster.yaml": ["space.", "wider than the cluster"],
    "unknown_preset.yaml": ["preset", "gb9000-rack", "allowed"],
    "unknown_gpu.yaml": ["cluster.gpu", "A100X", "allowed"],
    "unknown_model_preset.yaml": ["model", "llama-moe-9000", "allowed"],
    "unreadable.yaml": ["not valid YAML", "line"],
    "not_a_mapping.yaml": ["mapping"],
    "bad_slo_metric.yaml": ["slos.0", "p95_happiness", "allowed"],
    "bad_slo_op.yaml": ["slos.0.op"],
    "empty_load_levels.yaml": ["workload", "load_levels"],
    "model_folder_without_config.yaml": ["model", "config.json"],
    "bad_executor.yaml": ["executor.kind", "simulated"],
    "bad_name.yaml": ["name"],
    "missing_cluster.yaml": ["cluster", "Field required"],
    "tp_wider_than_node.yaml": ["space.mixed.tp_sizes"],
    "bad_objective_metric.yaml": ["objective", "p90_ttft_ms", "allowed"],
    "range_ratio_too_big.yaml": ["workload.isl.range_ratio"],
    "short_levels_too_short.yaml": ["workload.bracket_prompts_per_concurrency", "at least 2", "0 measures"],
    "bad_all2all.yaml": ["space.decode.all2all_backends", "carrier_pigeon"],
    "duplicate_choices.yaml": ["space.decode.max_num_seqs", "repeat"],
    "real_executor_without_weights.yaml": ["model.preset", "model.path"],
    "negative_guided_trials.yaml": ["sampler.guided_trials", "greater than or equal to 0"],
    "zipf_exponent_not_positive.yaml": ["workload.expert_routing", "exponent must be > 0"],
    "unknown_expert_routing.yaml": ["workload.expert_routing", "skewed", "allowed", "zipf"],
    # what the file is, before any field: bytes, emptiness, the document's shape (issue #15)
    "random_bytes.yaml": ["random_bytes.yaml", "not UTF-8", "0x9f at offset 11", "YAML"],
    "empty.yaml": ["empty.yaml", "empty", "name"],
    "only_comment.yaml": ["only_comment.yaml", "empty"],
    "scalar_document.yaml": ["mapping", "got str"],
    "control_character.yaml": ["not valid YAML", "#x0000"],
    # the model's config.json: the file, and the key or the JSON position
    "broken_model_json.yaml": ["model.path", "broken-json/config.json", "not valid JSON", "line 5, column 3"],
    "deepseek_config_without_experts.yaml": ["model.path", "deepseek-without-experts/config.json",
                                             "DeepSeek-style", "kv_lora_rank", "missing n_routed_experts",
                                             "num_experts_per_tok"],
    "model_config_not_an_object.yaml": ["list-config/config.json", "JSON object", "got list"],
    # sizes past their bound, refused when the job is read, before anything is enumerated (nodes: 10⁹ once ran
    # for minutes and took gigabytes; issue 32)
    "huge_nodes.yaml": ["cluster.nodes", "less than or equal to 4096", "1000000000"],
    "huge_gpus_per_node.yaml": ["cluster.gpus_per_node", "less than or equal to 128"],
    "huge_load_level.yaml": ["workload.load_levels.1", "less than or equal to 1000000"],
    "too_many_load_levels.yaml": ["workload.load_levels", "at most 64"],
    "huge_budget.yaml": ["budget.trials", "less than or equal to 1000000"],
    "huge_prompt.yaml": ["workload.isl.mean", "less than or equal to 10000000"],
    # workload inputs, read and checked when the job is read, not after the first deployment (issue 32)
    "malformed_trace.yaml": ["workload.trace_path", "malformed.jsonl:2", "not JSON"],
    "empty_trace.yaml": ["workload.trace_path", "empty.jsonl", "no requests"],
    "trace_output_len_not_a_number.yaml": ["workload.trace_path", "bad_output_len.jsonl:1", "whole number", "many"],
    "missing_trace.yaml": ["workload.trace_path", "missing.jsonl", "cannot read"],
    # a knob's list of choices: bounded in length and in value (a 20k-entry list was counted in quadratic time;
    # 1e28 reached launch.sh)
    "huge_max_num_seqs.yaml": ["space.decode.max_num_seqs", "2,000,000 is too large", "at most 1,048,576"],
    "float_max_num_seqs.yaml": ["space.decode.max_num_seqs.1", "1e+28"],
    "too_many_max_num_seqs.yaml": ["space.decode.max_num_seqs", "20,000 choices", "at most 256"],
    "huge_eplb_window.yaml": ["space.eplb.window_size", "too large", "at most 16,777,216"],
    # a trace's records as vLLM's endpoint takes them, and a file that is no trace, named with the line
    "trace_prompt_null.yaml": ["workload.trace_path", "prompt_null.jsonl:1", "prompt must be text", "null"],
    "trace_prompt_number.yaml": ["workload.trace_path", "prompt_number.jsonl:2", "prompt must be text", "123"],
    "trace_prompt_list.yaml": ["workload.trace_path", "prompt_list.jsonl:1", "prompt must be text"],
    "trace_prompt_empty.yaml": ["workload.trace_path", "prompt_empty.jsonl:1", "prompt is empty"],
    "trace_output_len_huge.yaml": ["workload.trace_path", "output_len_huge.jsonl:1", "from 1 to 10,000,000"],
    "trace_binary.yaml": ["workload.trace_path", "binary.jsonl:2", "binary data"],
    "trace_dev_zero.yaml": ["workload.trace_path", "/dev/zero", "not a regular file"],
    # a key given twice: YAML keeps the last silently, the job refuses it (issue 32)
    "duplicate_key.yaml": ["not valid YAML", "line 4", "'budget' is given twice", "first at line 3"],
    "duplicate_nested_key.yaml": ["not valid YAML", "line 4", "'mean' is given twice"],
    # a space none of whose candidates can run: the rules that removed them, counted
    "no_valid_candidate.yaml": ["space", "none of the 2 candidates is valid", "2 × memory-fit", "GiB of weights"],
}
#: Valid to load, bad only to validate (tune's own check of the space belongs to advisor/tune.py).
VALIDATE_ONLY = {"no_valid_candidate.yaml"}


def test_corpus_is_complete() -> None:
    assert sorted(EXPECT) == sorted(p.name for p in BAD.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(EXPECT))
@pytest.mark.parametrize("command", ["validate", "tune"])
def test_bad_job_file(name: str, command: str, tmp_path: Path) -> None:
    if command == "validate" and name == "real_executor_without_weights.yaml":
        pytest.skip("a valid job: only running it needs weights")
    if command == "tune" and name in VALIDATE_ONLY:
        pytest.skip("checked by validate")
    db = tmp_path / "study.db"
    args = [command, str(BAD / name)] + (["--storage", f"sqlite:///{db}"] if command == "tune" else [])
    line = one_line(advisor(*args, cwd=tmp_path))
    for word in EXPECT[name]:
        assert word in line, f"{word!r} not in {line!r}"
    assert not db.exists(), "a bad job wrote to the database"


def test_unreachable_ray_writes_nothing(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: ok\npreset: cpu-tiny-moe\n")
    dbfile = tmp_path / "x.db"
    one_line(advisor("tune", str(job), "--executor", "ray", "--ray-address", "127.0.0.1:1", "--storage",
                     f"sqlite:///{dbfile}", cwd=tmp_path))
    assert not dbfile.exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["tune", "JOB", "--trials", "0"], ["--trials"]),
        (["tune", "JOB", "--executor", "quantum"], ["--executor", "quantum"]),
        (["tune", "JOB", "--storage", "postgresql+psycopg://u:secret@127.0.0.1:1/none"], ["storage", "***"]),
        (["tune", "NOFILE"], ["cannot read"]),
        (["best", "no-such-study", "--storage", "sqlite:///DB"], ["no-such-study"]),
        (["export", "no-such-study", "--storage", "sqlite:///DB"], ["no-such-study"]),
        (["query", "drop_tables", "--storage", "sqlite:///DB"], ["drop_tables", "allowed"]),
        (["query", "trials", "colour=red", "--storage", "sqlite:///DB"], ["colour=red"]),
        (["query", "trials", "oops", "--storage", "sqlite:///DB"], ["oops"]),
        (["tune", "JOB", "--executor", "ray", "--ray-address", "127.0.0.1:1"], ["--ray-address", "127.0.0.1:1"]),
        (["tune", "JOB", "--executor", "ray", "--ray-address", "nowhere"], ["--ray-address", "HOST:PORT"]),
        (["cleanup", "no-such-study", "--storage", "sqlite:///DB"], ["no-such-study"]),
        (["query", "pareto", "ok", "x=p90_ttft_mz", "--storage", "sqlite:///DB"], ["p90_ttft_mz"]),
        # an output format that is not one is refused, not ignored (issue 32)
        (["studies", "--format", "xml", "--storage", "sqlite:///DB"], ["--format", "xml", "table", "csv", "json"]),
        (["trials", "ok", "--format", "xml", "--storage", "sqlite:///DB"], ["--format", "xml"]),
        (["query", "studies", "--format", "xml", "--storage", "sqlite:///DB"], ["--format", "xml"]),
        # a file that is no configuration is said to be none, without its content
        (["simulate", "JOB", "--config", "/etc/passwd"], ["/etc/passwd", "YAML mapping", "got str"]),
    ],
)
def test_bad_command_lines(args: list[str], words: list[str], tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: ok\npreset: cpu-tiny-moe\nexecutor: {kind: simulated}\n")
    dbfile = tmp_path / "x.db"
    args = [a.replace("JOB", str(job)).replace("NOFILE", str(tmp_path / "missing.yaml"))
            .replace("DB", str(dbfile)) for a in args]
    if "sqlite:///" + str(dbfile) in args and args[0] != "tune":
        dbfile.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "advisor", "tune", str(job), "--trials", "1", "--storage",
                        f"sqlite:///{dbfile}"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    line = one_line(advisor(*args, cwd=tmp_path))
    for w in words:
        assert w in line, f"{w!r} not in {line!r}"
    assert "secret" not in line and "root:" not in line


def test_a_jobs_model_path_replaces_its_presets_model() -> None:
    """``model: {path: …}`` on top of a preset naming a model preset uses the path (a job names one model; it
    once needed ``preset: null`` beside it), and a model preset on top of a preset's path uses the preset."""
    from advisor.job import job_from_dict

    folder = Path(__file__).parent / "data" / "kimi-k2-fp8"
    job = job_from_dict({"name": "p", "preset": "h200-dsv3", "model": {"path": str(folder)}})
    assert job.model.preset is None and job.model_profile().name == "kimi-k2-fp8"
    job = job_from_dict({"name": "p", "preset": "cpu-tiny-moe", "model": {"preset": "deepseek-v3"}})
    assert job.model.preset == "deepseek-v3" and job.model.path is None


def test_reading_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    dbfile = tmp_path / "none.db"
    line = one_line(advisor("studies", "--storage", f"sqlite:///{dbfile}", cwd=tmp_path))
    assert "no database" in line and not dbfile.exists()


def test_no_traceback_for_any_model_config_key_missing(tmp_path: Path) -> None:
    """Dropping any one required key of a DeepSeek-style config.json names that key and the file."""
    import json

    full = json.loads((BAD / "models" / "deepseek-without-experts" / "config.json").read_text())
    full["n_routed_experts"] = 256
    for key in ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "kv_lora_rank",
                "num_experts_per_tok", "moe_intermediate_size"):
        folder = tmp_path / key
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({k: v for k, v in full.items() if k != key}))
        from search_spaces import ModelProfile

        with pytest.raises(ValueError, match=rf"{key}/config.json: .*missing {key}"):
            ModelProfile.from_hf_config(folder)


def test_validate_show_prints_the_resolved_job(tmp_path: Path) -> None:
    """A nested override merges into the preset key by key, and --show makes that visible: the preset's
    isl.range_ratio stays, the derived max_model_len follows the merged lengths, the password is redacted."""
    import yaml

    job = tmp_path / "job.yaml"
    job.write_text("name: shown\npreset: cpu-tiny-moe\nworkload: {isl: {mean: 1024}}\n"
                   "storage: postgresql+psycopg://u:secret@127.0.0.1:1/db\n")
    plain = advisor("validate", str(job), cwd=tmp_path)
    assert plain.returncode == 0 and plain.stdout.startswith("ok ") and "storage:" not in plain.stdout
    p = advisor("validate", str(job), "--show", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "secret" not in p.stdout
    doc = yaml.safe_load(p.stdout.split("\nok ")[0])
    assert doc["workload"]["isl"] == {"mean": 1024, "range_ratio": 0.2}  # the preset's range_ratio kept
    assert doc["workload"]["osl"] == {"mean": 32, "range_ratio": 0.5}
    assert doc["budget"]["trials"] == 200 and doc["baseline"]["enabled"] is False  # defaults and preset
    assert doc["storage"] == "postgresql+psycopg://u:***@127.0.0.1:1/db"
    assert "workload.max_model_len = 1276 (isl.max 1228 + osl.max 48)" in p.stdout  # not the preset's 355
    assert "#   mode: aggregated, disaggregated" in p.stdout
    assert "#   mixed_max_num_seqs: 4, 16" in p.stdout
    assert "4 candidates, 4 valid" in p.stdout
    assert not list(tmp_path.glob("*.db"))


TRAVERSAL = "../../../../tmp/x/stolen"


def test_study_names_obey_the_job_name_rule_on_the_command_line(tmp_path: Path) -> None:
    """A study name is part of file names (the tuner's log, run folders): ``--study`` and every command taking a
    study refuse a name the job's ``name`` rule refuses, before anything is read, built or written."""
    job = tmp_path / "job.yaml"
    job.write_text("name: ok\npreset: cpu-tiny-moe\nexecutor: {kind: simulated}\n")
    dbfile = tmp_path / "x.db"
    line = one_line(advisor("tune", str(job), "--study", TRAVERSAL, "--storage", f"sqlite:///{dbfile}", cwd=tmp_path))
    assert "--study" in line and "not a study name" in line and "letters, digits" in line, line
    assert not dbfile.exists()
    subprocess.run([sys.executable, "-m", "advisor", "tune", str(job), "--trials", "1", "--storage",
                    f"sqlite:///{dbfile}"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for command in ("best", "export", "cleanup", "trials", "calibrate"):
        line = one_line(advisor(command, TRAVERSAL, "--storage", f"sqlite:///{dbfile}", cwd=tmp_path))
        assert "not a study name" in line, (command, line)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing written
    assert not Path("/tmp/x/stolen").exists()


def test_study_names_obey_the_job_name_rule_in_the_api_and_the_dashboard(tmp_path: Path) -> None:
    from advisor.errors import BadInput
    from advisor.job import job_from_dict
    from advisor.tune import tune
    from ui import jobs

    job = job_from_dict({"name": "ok", "preset": "cpu-tiny-moe", "executor": {"kind": "simulated"}})
    with pytest.raises(BadInput, match="not a study name"):
        tune(job, trials=1, storage=f"sqlite:///{tmp_path / 'x.db'}", study_name=TRAVERSAL)
    assert not (tmp_path / "x.db").exists()
    with pytest.raises(BadInput, match="not a study name"):
        jobs.start(tmp_path / "job.yaml", TRAVERSAL, f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "runs")
    # a study an older version stored under such a name: its "log" is never looked up outside the run folder
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_text("not the dashboard's to show")
    assert jobs.log_of("../outside/secret", tmp_path / "runs") is None
    assert not (tmp_path / "runs").exists()
