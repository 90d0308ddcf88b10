"""Each vLLM flag once: every preset's best deployment, rendered to every export format, carries each flag with
the value of the one ``{flag: value}`` mapping ``executors.vllm.render.serve_flags`` builds for that node shard.

The best deployment is the performance model's best (``advisor.proposers.model_rank.predicted_outcome``, default
parameters) among the valid candidates of the preset's space: all of them when there are few, else a seeded sample — the
guide's own search takes tens of seconds on the large spaces. A variant adds the JSON-valued flags no preset's
best sets (``--speculative-config``, a named KV connector).

Each export is read as its consumer reads it: ``launch.sh``'s ``vllm serve`` lines split as the shell splits them,
``deployment.json``'s argv and flags, every Kubernetes pod's command run by ``sh`` (after the kubelet's
``$(VAR)`` expansion) with a stand-in ``vllm`` that records its argv, and Ray Serve's engine kwargs from both
``serve_config.yaml`` and ``llm_app.py``. Values are compared, not just presence; a flag an export adds or drops
fails too, and ``test_a_wrong_value_is_caught`` shows the check fails on one changed value.
"""

from __future__ import annotations

import ast
import json
import random
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from advisor.exports.k8s_objects import API_PORT, k8s_platform, lws_name
from advisor.executor_factory import platform_for
from advisor.exports import FORMATS, Evidence, ExportOptions, render_export
from advisor.proposers.model_rank import predicted_outcome
from advisor.job import TuningJob, job_from_dict
from executors import Endpoint, place
from executors.vllm.render import DEFAULT_DP_RPC_PORT, Flags, launch_plan, serve_flags
from executors.simulated.executor import default_params
from search_spaces import All2AllBackend, DeploymentConfig, EPLBConfig, Mode, Role, RoleConfig
from search_spaces.deployment import flags_of
from tests.test_exports_targets import run_pod, write_fake_vllm

PRESETS = sorted(p.stem for p in (Path(__file__).parents[1] / "search_spaces" / "presets").glob("*.yaml"))
MODEL = "example-org/flag-model"
ALL_VALID_UP_TO, SAMPLE = 64, 24
#: The flags Ray Serve sets itself, by the name vLLM gives the engine argument (written here, not imported).
RAY_SETS = {"host", "port", "served_model_name", "headless", "data_parallel_size_local", "data_parallel_start_rank",
            "data_parallel_address", "data_parallel_rpc_port"}


def best_deployment(job: TuningJob) -> DeploymentConfig:
    """The model's best valid candidate (feasible first, then the objective; else the least SLO violation)."""
    valid = job.valid_space()
    assert valid is not None, job.name
    if valid.valid <= ALL_VALID_UP_TO:
        drawn = list(valid.iter_valid())
    else:
        rng = random.Random(17)
        drawn = [valid.sample(rng, set()) for _ in range(SAMPLE)]
    cands = {c.key(): c for c in (job.space.build(lambda n, ch, p=p: p[n] if p.get(n) in ch else ch[0])
                                  for p in drawn if p is not None)}
    params = default_params(job.cluster.gpu)
    scored = [(predicted_outcome(job, c, params), c) for c in cands.values()]
    _, best = max(scored, key=lambda t: (t[0].feasible, t[0].values[0] if t[0].feasible else -t[0].violation))
    return best


def cases() -> dict[str, tuple[TuningJob, DeploymentConfig]]:
    out = {}
    for preset in PRESETS:
        job = job_from_dict({"name": f"flags-{preset}", "preset": preset})
        out[preset] = (job, best_deployment(job))
    job, cfg = out["h200-dsv3"]
    out["h200-dsv3+mtp"] = (job, cfg.model_copy(update={"speculative_mtp_tokens": 2, "kv_connector": "NixlConnector"}))
    return out


CASES = cases()


def rendered(job: TuningJob, cfg: DeploymentConfig) -> dict[str, Any]:
    ev = Evidence(job.name, 1, "simulated", "model", job.cluster.describe(), [])
    topo = place(cfg, job.cluster)
    return {fmt: render_export(job, topo, ev, fmt, model=MODEL, options=ExportOptions()) for fmt in FORMATS}


# ------------------------------------------------------------------------------------ reading values
def read_flags(args: list[str]) -> dict[str, str | None]:
    """``--flag value`` / ``--flag`` words → {flag: its text, or None for a flag alone}; a flag twice fails."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--") and flag not in out, f"{flag!r} in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[flag], i = args[i + 1], i + 2
        else:
            out[flag], i = None, i + 1
    return out


def same(value: Any, written: Any, *, text: bool) -> bool:
    """Is ``written`` (an argv word when ``text``, else a parsed value) the mapping's ``value``?"""
    if value is True:
        return written is None if text else written is True
    if isinstance(value, dict):
        return (json.loads(written) if text else written) == value
    return written == (str(value) if text else value)


def check_argv(where: str, expected: Flags, args: list[str]) -> None:
    """``args`` (after ``serve``) are the model and exactly the mapping's flags, each with its value."""
    assert args[0] == MODEL, where
    got = read_flags(args[1:])
    assert list(got) == list(expected), f"{where}: flags {list(got)} != mapping {list(expected)}"
    for flag, value in expected.items():
        assert same(value, got[flag], text=True), f"{where}: {flag} {got[flag]!r}, mapping {value!r}"


def check_candidate(where: str, cfg: DeploymentConfig, role: Role, flags: Flags) -> None:
    """The mapping holds the candidate's own fields' flags, as declared."""
    cand = flags_of(next(r for r in cfg.roles if r.role is role)) | flags_of(cfg)
    assert cand.items() <= flags.items(), f"{where}: {cand} not in {flags}"


# ------------------------------------------------------------------------------------ per format
def check_launch_script(job: TuningJob, cfg: DeploymentConfig, script: str) -> int:
    plan = launch_plan(place(cfg, job.cluster), model=MODEL, platform=platform_for(job),
                       served_model_name=job.executor.served_model_name, max_model_len=job.workload.max_model_len)
    want = {f"{c.instance.name}-node{c.shard.node}.log": c for c in plan.commands}
    seen = set()
    for line in script.splitlines():
        if "$VLLM serve " not in line or line.startswith("#"):
            continue
        words = shlex.split(line)  # as bash splits it ($VLLM and ${NODEn_IP} kept as written)
        cut = words.index(">")
        log, args = words[cut + 1], words[words.index("$VLLM") + 2:cut]
        c = want[log]
        check_argv(f"launch.sh {log}", c.flags, args)
        check_candidate(f"launch.sh {log}", cfg, c.instance.role, c.flags)
        seen.add(log)
    assert seen == set(want), "launch.sh: a shard without its line"
    return len(seen)


def check_json(job: TuningJob, cfg: DeploymentConfig, text: str) -> int:
    doc = json.loads(text)
    plan = launch_plan(place(cfg, job.cluster), model=MODEL, platform=platform_for(job),
                       served_model_name=job.executor.served_model_name, max_model_len=job.workload.max_model_len)
    assert len(doc["commands"]) == len(plan.commands)
    for entry, c in zip(doc["commands"], plan.commands, strict=True):
        where = f"deployment.json {entry['instance']} node {entry['node']}"
        assert (entry["instance"], entry["node"]) == (c.instance.name, c.shard.node), where
        assert entry["flags"] == c.flags, where  # the mapping itself, written out
        argv = entry["argv"]
        check_argv(where, c.flags, argv[argv.index("serve") + 1:])
        check_candidate(where, cfg, c.instance.role, c.flags)
    return len(plan.commands)


def check_k8s(job: TuningJob, cfg: DeploymentConfig, files: dict[str, str], fake_bin: Path, tmp: Path) -> int:
    """Every pod of every group, run: its argv against ``serve_flags`` of the shard it is (the group's instance,
    the pod's node), with the leader's address the LWS controller gives."""
    topo, platform = place(cfg, job.cluster), k8s_platform(job)
    pods = 0
    for r in cfg.roles:
        doc = yaml.safe_load(files[f"{r.role.value}-leaderworkerset.yaml"])
        name = doc["metadata"]["name"]
        prefix = name.removesuffix(f"-{r.role.value}")
        assert name == lws_name(prefix, r.role)
        tmpl = doc["spec"]["leaderWorkerTemplate"]
        leader_c = (tmpl.get("leaderTemplate") or tmpl["workerTemplate"])["spec"]["containers"][0]
        worker_c = tmpl["workerTemplate"]["spec"]["containers"][0]
        for group, inst in enumerate(topo.of_role(r.role)):
            address = f"{name}-{group}.{name}"
            head = Endpoint(host=address, port=API_PORT, dp_rpc_port=DEFAULT_DP_RPC_PORT, bind_host="0.0.0.0")
            for index, shard in enumerate(inst.shards):
                env = {"LWS_LEADER_ADDRESS": address, "LWS_GROUP_SIZE": str(tmpl["size"]),
                       "LWS_WORKER_INDEX": str(index)}
                rc, err, argv = run_pod(leader_c if shard.is_head else worker_c, env, fake_bin, tmp)
                where = f"k8s {name} group {group} pod {env['LWS_WORKER_INDEX']}"
                assert rc == 0 and argv and argv[0] == "serve", f"{where}: {rc} {err}"
                flags = serve_flags(inst, shard, cfg=cfg, platform=platform, head=head,
                                    served_model_name=job.executor.served_model_name,
                                    max_model_len=job.workload.max_model_len)
                check_argv(where, flags, argv[1:])
                check_candidate(where, cfg, r.role, flags)
                pods += 1
    return pods


def ray_args(files: dict[str, str]) -> list[dict]:
    """The builder arguments, from the YAML and from ``llm_app.py``'s ``ARGS`` literal."""
    (app,) = yaml.safe_load(files["serve_config.yaml"])["applications"]
    py = files["llm_app.py"]
    literal = py[py.index("ARGS = ") + len("ARGS = "):py.index("\n\napp = ")]
    return [app["args"], ast.literal_eval(literal)]


def check_ray_serve(job: TuningJob, cfg: DeploymentConfig, files: dict[str, str]) -> int:
    """Each role's engine kwargs are its head shard's mapping, each flag by vLLM's argument name, less what Ray
    Serve sets itself; the served name goes to ``model_loading_config``."""
    topo, platform, n = place(cfg, job.cluster), platform_for(job), 0
    for args in ray_args(files):
        confs = ({Role.PREFILL: args["prefill_config"], Role.DECODE: args["decode_config"]} if "prefill_config" in args
                 else {Role.MIXED: args.get("llm_config") or args["llm_configs"][0]})
        assert set(confs) == {r.role for r in cfg.roles}
        for role, conf in confs.items():
            inst = topo.of_role(role)[0]
            flags = serve_flags(inst, inst.head, cfg=cfg, platform=platform, head=Endpoint("127.0.0.1", 8000),
                                served_model_name=job.executor.served_model_name,
                                max_model_len=job.workload.max_model_len)
            by_name = {f.removeprefix("--").replace("-", "_"): v for f, v in flags.items()}
            kwargs = conf["engine_kwargs"]
            assert set(kwargs) == set(by_name) - RAY_SETS, f"ray-serve {role}: {sorted(set(kwargs) ^ set(by_name))}"
            for k, v in kwargs.items():
                assert same(by_name[k], v, text=False), f"ray-serve {role}: {k} {v!r}, mapping {by_name[k]!r}"
            assert conf["model_loading_config"] == {"model_id": by_name.get("served_model_name", MODEL),
                                                    "model_source": MODEL}
            check_candidate(f"ray-serve {role}", cfg, role, flags)
            n += 1
    return n


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_vllm(tmp_path_factory.mktemp("fakebin"))


# ------------------------------------------------------------------------------------ tests
def test_every_format_is_checked() -> None:
    assert set(FORMATS) == {"vllm", "json", "k8s", "ray-serve"}, "a new export format: teach this test to read it"
    assert set(PRESETS) >= {"cpu-tiny-moe", "gb300-rack-dsv3", "h200-dsv3", "h200-qwen3-235b"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_export_carries_the_mapping(name: str, fake_bin: Path, tmp_path: Path) -> None:
    job, cfg = CASES[name]
    out = rendered(job, cfg)
    shards = sum(len(i.shards) for i in place(cfg, job.cluster).instances)
    assert check_launch_script(job, cfg, out["vllm"]) == shards
    assert check_json(job, cfg, out["json"]) == shards
    assert check_k8s(job, cfg, out["k8s"], fake_bin, tmp_path) == shards
    assert check_ray_serve(job, cfg, out["ray-serve"]) == 2 * len(cfg.roles)  # YAML and llm_app.py


def test_the_cases_cover_every_kind_of_flag() -> None:
    """Between them the cases write every declared flag of the candidate, JSON-valued ones included."""
    written: set[str] = set()
    for job, cfg in CASES.values():
        plan = launch_plan(place(cfg, job.cluster), model=MODEL, platform=platform_for(job))
        written |= {f for c in plan.commands for f in c.flags}
    for flag in ("--eplb-config", "--enable-eplb", "--kv-transfer-config", "--speculative-config",
                 "--enable-expert-parallel", "--data-parallel-size", "--all2all-backend", "--max-num-seqs"):
        assert flag in written, flag


def test_flags_are_written_only_when_they_say() -> None:
    """``omit_default``, ``requires`` and JSON ``value`` as declared: a plain role writes only its batch sizes;
    each knob switched on adds its flag with the value vLLM reads."""
    plain = RoleConfig(role=Role.MIXED)
    assert flags_of(plain) == {"--max-num-seqs": 256, "--max-num-batched-tokens": 8192}
    assert flags_of(plain.model_copy(update={"all2all_backend": All2AllBackend.DEEPEP_LOW_LATENCY})) == \
        flags_of(plain)  # the backend only with expert parallelism
    ep = RoleConfig(role=Role.DECODE, data_parallel_size=4, enable_expert_parallel=True, enable_dbo=True,
                    all2all_backend=All2AllBackend.DEEPEP_LOW_LATENCY,
                    eplb=EPLBConfig(enabled=True, num_redundant_experts=8, window_size=10, step_interval=20))
    assert flags_of(ep) == {
        "--data-parallel-size": 4, "--enable-expert-parallel": True, "--max-num-seqs": 256,
        "--max-num-batched-tokens": 8192, "--all2all-backend": "deepep_low_latency", "--enable-dbo": True,
        "--enable-eplb": True,
        "--eplb-config": {"window_size": 10, "step_interval": 20, "num_redundant_experts": 8}}
    agg = DeploymentConfig(mode=Mode.AGGREGATED, decode=plain)
    assert flags_of(agg) == {}
    assert flags_of(agg.model_copy(update={"speculative_mtp_tokens": 3})) == {
        "--speculative-config": {"method": "mtp", "num_speculative_tokens": 3}}


def test_a_wrong_value_is_caught(fake_bin: Path, tmp_path: Path) -> None:
    """One value changed in an export's text, or one flag dropped, fails the check."""
    job, cfg = CASES["h200-dsv3+mtp"]
    out = rendered(job, cfg)
    seqs = f"--max-num-seqs {cfg.decode.max_num_seqs}"
    assert seqs in out["vllm"]
    with pytest.raises(AssertionError, match="--max-num-seqs"):
        check_launch_script(job, cfg, out["vllm"].replace(seqs, f"--max-num-seqs {cfg.decode.max_num_seqs + 1}"))
    spec = '"num_speculative_tokens":2'
    assert spec in out["json"].replace(" ", "") and spec in out["vllm"]
    with pytest.raises(AssertionError, match="--speculative-config"):
        check_launch_script(job, cfg, out["vllm"].replace(spec, '"num_speculative_tokens":3'))
    doc = json.loads(out["json"])
    doc["commands"][0]["flags"].pop("--speculative-config")
    with pytest.raises(AssertionError):
        check_json(job, cfg, json.dumps(doc))
    ray = dict(out["ray-serve"])
    ray["serve_config.yaml"] = ray["serve_config.yaml"].replace("num_speculative_tokens: 2", "num_speculative_tokens: 3")
    with pytest.raises(AssertionError, match="speculative_config"):
        check_ray_serve(job, cfg, ray)
    k8s = dict(out["k8s"])
    k8s["decode-leaderworkerset.yaml"] = k8s["decode-leaderworkerset.yaml"].replace(
        seqs, f"--max-num-seqs {cfg.decode.max_num_seqs + 1}")
    with pytest.raises(AssertionError, match="--max-num-seqs"):
        check_k8s(job, cfg, k8s, fake_bin, tmp_path)
