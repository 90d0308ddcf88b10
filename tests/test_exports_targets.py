"""The ``k8s`` and ``ray-serve`` exports, checked by the code of the systems they are for.

(a) Kubernetes: Services and the router Deployment load into the official ``kubernetes`` client's models
    (``V1Service``, ``V1Deployment``) and serialize back unchanged (a misspelt field would be dropped);
    each LeaderWorkerSet validates against the LWS v1 CRD's openAPIV3Schema (``tests/data/lws_crd_v1.yaml``,
    a hand-written reduction: see its header) under strict field validation, and its pod templates load into
    ``V1PodTemplateSpec``.
(b) Every pod's command runs: the kubelet's ``$(VAR)`` expansion (re-implemented here from Kubernetes'
    expansion rules) with the variables the LWS controller injects, then ``/bin/sh -c`` with a stand-in
    ``vllm`` that records its argv — which vLLM's own ``vllm serve`` parser then reads. The data-parallel start
    rank and address of every node are computed here from ``LWS_WORKER_INDEX`` × ranks per node and from the
    leader's DNS name, not by the topology code. A pod of a group of the wrong size refuses to start.
(c) The router's arguments parse with vllm-router's own parser and point at the leaders of the role groups.
(d) Ray Serve: the config validates as a Serve deploy schema; the application is built by ``ray.serve.llm``
    (both from the YAML's import path and args and from ``llm_app.py``) — built, never run — and its
    deployments have the replicas and gangs the roles ask for; the engine kwargs are exactly the non-default
    values vLLM's parser reads from the same rendered ``vllm serve`` arguments, less what Ray Serve owns.
(e) The ``vllm``/``json`` formats' argument lists parse too; no format inlines HF_TOKEN. The ``launch.sh`` of a
    P/D deployment across two nodes (NixlConnector), run by bash on each node with stand-ins for the engine
    and router, gives each server its own node's address as NIXL side-channel host and the router the
    nodes' addresses; every ``vllm serve`` it starts parses with vLLM's parser.
(g) The model: a job whose model is a folder on this machine exports only with ``--model`` (the CLI refuses
    with one line and exit 2); with it, every format names that model.
(f) ``@pytest.mark.vllm``: the tiny CPU configuration's LeaderWorkerSet command, run by hand here with local
    values, brings the role up and answers a completion.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CPU build of vLLM (CI) needs it before import

import copy
import dataclasses
import functools
import json
import re
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from advisor.errors import BadInput
from advisor.executor_factory import platform_for
from advisor.exports.k8s_objects import API_PORT, GPU_RESOURCE, RDMA_RESOURCE
from advisor.exports.ray_serve import RAY_OWNED
from advisor.exports import (
    FOLDER_MARK,
    FORMATS,
    Evidence,
    ExportOptions,
    files_sha256,
    render_export,
    write_export,
)
from advisor.job import TuningJob, job_from_dict
from executors import Topology, cpu_platform, place
from executors.vllm.render import uses_nixl
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import (
    All2AllBackend,
    DeploymentConfig,
    EPLBConfig,
    Mode,
    Role,
    RoleConfig,
    check,
)
from tests.vllm_parser import parse_serve_args

CRD = Path(__file__).parent / "data" / "lws_crd_v1.yaml"
NAMESPACE = "inference"
HF_SENTINEL = "hf_SENTINEL_must_never_be_written_0123456789"
IMAGE = "registry.example.com/vllm/vllm-openai:v0.33.0"
TINY_ID = "example-org/tiny-qwen3-moe"


# ------------------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    name: str
    job: TuningJob
    cfg: DeploymentConfig
    model: str | None = None  # --model (the tiny model's hub-like id: its weights are generated, not a path here)

    @property
    def topo(self) -> Topology:
        """``cfg`` placed on the job's cluster, as a trial would store it (an export renders the stored one)."""
        return place(self.cfg, self.job.cluster)


def _role(role: Role, **kw: Any) -> RoleConfig:
    return RoleConfig(role=role, **kw)


@functools.cache
def cases() -> dict[str, Case]:
    gb300 = job_from_dict({"name": "gb300-pd", "preset": "gb300-rack-dsv3"})
    h200 = job_from_dict({"name": "h200-dep16", "preset": "h200-qwen3-235b"})
    h200_tcp = job_from_dict({"name": "h200-no-rdma", "preset": "h200-qwen3-235b",
                              "cluster": {"gpu": "H200", "nodes": 2, "gpus_per_node": 8, "rdma": False}})
    cpu = job_from_dict({"name": "cpu-tiny", "preset": "cpu-tiny-moe"})
    # two one-GPU nodes: prefill on one, decode on the other, KV over NIXL between hosts
    pd2 = job_from_dict({"name": "h200-pd-2x1", "model": {"preset": "tiny-moe"},
                         "cluster": {"gpu": "H200", "nodes": 2, "gpus_per_node": 1},
                         "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000}],
                         "space": {r: {"dp_sizes": [1], "tp_sizes": [1]} for r in ("mixed", "prefill", "decode")}})
    one_gpu = job_from_dict({"name": "h200-one-gpu", "model": {"preset": "tiny-moe"},
                             "cluster": {"gpu": "H200", "nodes": 1, "gpus_per_node": 1},
                             "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000}]})
    dep16 = DeploymentConfig(mode=Mode.AGGREGATED, decode=_role(
        Role.MIXED, data_parallel_size=16, enable_expert_parallel=True, max_num_seqs=128,
        max_num_batched_tokens=8192, all2all_backend=All2AllBackend.DEEPEP_LOW_LATENCY,
        eplb=EPLBConfig(enabled=True, num_redundant_experts=16)))
    out = [
        # the seed report's shape: prefill 2 × DEP8 (2 trays each), decode Wide-EP32 with EPLB (8 trays)
        Case("gb300-pd", gb300, DeploymentConfig(
            mode=Mode.DISAGGREGATED,
            prefill=_role(Role.PREFILL, instances=2, data_parallel_size=8, enable_expert_parallel=True,
                          max_num_seqs=256, max_num_batched_tokens=16384,
                          all2all_backend=All2AllBackend.DEEPEP_HIGH_THROUGHPUT, enable_dbo=True),
            decode=_role(Role.DECODE, data_parallel_size=32, enable_expert_parallel=True, max_num_seqs=128,
                         max_num_batched_tokens=8192, all2all_backend=All2AllBackend.DEEPEP_LOW_LATENCY,
                         enable_dbo=True, eplb=EPLBConfig(enabled=True, num_redundant_experts=32)))),
        # one 16-GPU DEP instance over both H200 nodes
        Case("h200-dep16", h200, dep16),
        Case("h200-no-rdma", h200_tcp, dep16),
        # the tiny CPU configurations: groups of one pod
        Case("cpu-agg", cpu, DeploymentConfig(mode=Mode.AGGREGATED, decode=_role(
            Role.MIXED, max_num_seqs=4, max_num_batched_tokens=512))),
        Case("cpu-pd", cpu, DeploymentConfig(
            mode=Mode.DISAGGREGATED, prefill=_role(Role.PREFILL, max_num_seqs=16, max_num_batched_tokens=512),
            decode=_role(Role.DECODE, max_num_seqs=4, max_num_batched_tokens=512))),
        Case("h200-pd-2x1", pd2, DeploymentConfig(
            mode=Mode.DISAGGREGATED, prefill=_role(Role.PREFILL, max_num_seqs=64, max_num_batched_tokens=4096),
            decode=_role(Role.DECODE, max_num_seqs=128, max_num_batched_tokens=512)), model=TINY_ID),
        # one GPU with the one-GPU knobs away from their defaults (a negated boolean among them)
        Case("h200-one-gpu-knobs", one_gpu, DeploymentConfig(mode=Mode.AGGREGATED, decode=_role(
            Role.MIXED, max_num_seqs=64, async_scheduling=False, performance_mode="throughput",
            long_prefill_token_threshold=1024, kv_cache_dtype="fp8")), model=TINY_ID),
    ]
    for c in out:
        broken = check(c.cfg, c.job.model_profile(), c.job.cluster, c.job.workload.max_model_len)
        assert not broken, f"{c.name}: the test's configuration is invalid: {broken}"
    return {c.name: c for c in out}


CASE_NAMES = ["gb300-pd", "h200-dep16", "h200-no-rdma", "cpu-agg", "cpu-pd", "h200-pd-2x1", "h200-one-gpu-knobs"]
MULTI_NODE = ["gb300-pd", "h200-dep16", "h200-no-rdma"]


def evidence(case: Case) -> Evidence:
    """The performance model's prediction for the case: the numbers an export carries."""
    ex = SimulatedExecutor(case.job.model_profile(), default_params(case.job.cluster.gpu))
    run = ex.evaluate(place(case.cfg, case.job.cluster), case.job.workload)
    return Evidence(case.job.name, 7, "simulated", ex.engine_version, case.job.cluster.describe(),
                    list(run.measurements))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """case name → the folder ``write_export`` wrote every format into (with HF_TOKEN set in the environment)."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            case = cases()[name]
            out = tmp_path_factory.mktemp(name)
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("HF_TOKEN", HF_SENTINEL)
                for fmt in FORMATS:
                    write_export(case.job, case.topo, evidence(case), fmt, out, model=case.model,
                                 options=ExportOptions(image=IMAGE))
            done[name] = out
        return done[name]

    return get


def yaml_docs(folder: Path) -> dict[str, dict]:
    docs = {}
    for f in sorted(folder.glob("*.yaml")):
        loaded = list(yaml.safe_load_all(f.read_text()))
        assert len(loaded) == 1, f"{f.name}: one object a file"
        docs[f.name] = loaded[0]
    return docs


def of_kind(folder: Path, kind: str) -> list[dict]:
    return [d for d in yaml_docs(folder).values() if d["kind"] == kind]


def lws_of(folder: Path, role: Role) -> dict:
    (doc,) = [d for d in of_kind(folder, "LeaderWorkerSet")
              if d["metadata"]["labels"]["app.kubernetes.io/component"] == role.value]
    return doc


# ------------------------------------------------------------- what the cluster arithmetic says
@dataclass(frozen=True)
class Shape:
    nodes: int  # pods per group
    local: int  # DP ranks per node
    slots: int  # GPUs per pod


def expected_shape(role: RoleConfig, gpus_per_node: int) -> Shape:
    gpus = role.tensor_parallel_size * role.data_parallel_size
    if gpus <= gpus_per_node:
        return Shape(1, role.data_parallel_size, gpus)
    assert gpus % gpus_per_node == 0 and gpus_per_node % role.tensor_parallel_size == 0
    return Shape(gpus // gpus_per_node, gpus_per_node // role.tensor_parallel_size, gpus_per_node)


# ------------------------------------------------------------------------------- (a) Kubernetes
@functools.cache
def _api():
    from kubernetes.client import ApiClient

    return ApiClient()


def load_k8s(doc: dict, type_name: str) -> Any:
    """The official client's model of ``doc``; serializing it back must give ``doc`` (nothing unknown dropped)."""
    api = _api()
    obj = api._ApiClient__deserialize(copy.deepcopy(doc), type_name)  # what the client does with a response body
    assert api.sanitize_for_serialization(obj) == doc, f"{type_name} does not round-trip: fields unknown to it"
    return obj


@functools.cache
def lws_validator():
    import jsonschema

    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "LeaderWorkerSet" and crd["spec"]["group"] == "leaderworkerset.x-k8s.io"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def strict(schema: dict) -> dict:
    """kubectl's default server-side field validation (Strict): an unknown field is an error, except under
    ``x-kubernetes-preserve-unknown-fields``."""
    if isinstance(schema, dict):
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        for v in schema.values():
            if isinstance(v, dict):
                strict(v)
            elif isinstance(v, list):
                for x in v:
                    strict(x)
    return schema


@pytest.mark.parametrize("name", CASE_NAMES)
def test_k8s_objects_load_with_their_own_schemas(name: str, exported) -> None:
    folder = exported(name) / "k8s"
    case = cases()[name]
    docs = yaml_docs(folder)
    kinds = sorted(d["kind"] for d in docs.values())
    n_roles = len(case.cfg.roles)
    assert kinds == sorted(["LeaderWorkerSet"] * n_roles + ["Service"] * (n_roles + 1) + ["Deployment"])
    assert (folder / "README.md").is_file() and (folder / FOLDER_MARK).is_file()
    for fname, doc in docs.items():
        if doc["kind"] == "Service":
            svc = load_k8s(doc, "V1Service")
            assert svc.api_version == "v1" and svc.spec.ports, fname
        elif doc["kind"] == "Deployment":
            dep = load_k8s(doc, "V1Deployment")
            assert dep.api_version == "apps/v1", fname
            sel = dep.spec.selector.match_labels
            assert sel.items() <= dep.spec.template.metadata.labels.items(), f"{fname}: selector misses its pods"
        else:
            assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1", fname
            errors = sorted(lws_validator().iter_errors(doc), key=str)
            assert not errors, f"{fname}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
            tmpl = doc["spec"]["leaderWorkerTemplate"]
            for key in ("leaderTemplate", "workerTemplate"):
                if key in tmpl:
                    pod = load_k8s(tmpl[key], "V1PodTemplateSpec")
                    assert pod.spec.containers[0].image == IMAGE, f"{fname}: {key} ignores the image option"


def test_the_lws_schema_check_has_teeth() -> None:
    """A schema that let everything through would prove nothing: broken LeaderWorkerSets must fail it."""
    good = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "x"},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {
                "spec": {"containers": [{"name": "c", "image": "i"}]}}}, "startupPolicy": "LeaderCreated"}}
    assert not list(lws_validator().iter_errors(good))
    breakages = [
        ("spec", "leaderWorkerTemplate", "size", "2"),  # type
        ("spec", "startupPolicy", "Eager"),  # enum
        ("spec", "leaderWorkerTemplate", "restartPolicy", "Always"),  # enum
        ("spec", "networkConfig", {"subdomain": "Shared"}),  # unknown field, required field missing
        ("spec", "leaderWorkerTemplate", "workerTemplate", {"spec": {}}),  # no containers
        ("spec", "rolloutStrategy", {"type": "Recreate"}),  # enum
        ("spec", "leaderWorkerTemplate", "sizee", 2),  # unknown field (strict validation)
    ]
    for *path, value in breakages:
        bad = copy.deepcopy(good)
        node = bad
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        assert list(lws_validator().iter_errors(bad)), f"the schema accepts {path}={value!r}"
    bad = copy.deepcopy(good)
    del bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert list(lws_validator().iter_errors(bad)), "the schema accepts a LeaderWorkerSet without workerTemplate"


@pytest.mark.parametrize("name", CASE_NAMES)
def test_lws_groups_are_the_placement(name: str, exported) -> None:
    """replicas = instances, group size = nodes per instance, GPUs per pod = GPUs of a node shard; RDMA only
    where the cluster has it and the instance spans nodes; HF_TOKEN by reference only."""
    case = cases()[name]
    folder = exported(name) / "k8s"
    cluster = case.job.cluster
    for role in case.cfg.roles:
        doc = lws_of(folder, role.role)
        shape = expected_shape(role, cluster.gpus_per_node)
        spec = doc["spec"]
        tmpl = spec["leaderWorkerTemplate"]
        assert spec["replicas"] == role.instances, name
        assert tmpl["size"] == shape.nodes, name
        assert spec["startupPolicy"] == "LeaderCreated"  # the leader is not ready before its workers join
        assert ("leaderTemplate" in tmpl) == (shape.nodes > 1), name
        for key in ("leaderTemplate", "workerTemplate"):
            if key not in tmpl:
                continue
            (c,) = tmpl[key]["spec"]["containers"]
            res = c["resources"]
            assert res["requests"] == res["limits"], name
            if cluster.gpu == "CPU":
                assert res["limits"]["cpu"] == str(shape.slots) and GPU_RESOURCE not in res["limits"]
            else:
                assert res["limits"][GPU_RESOURCE] == str(shape.slots), f"{name}/{role.role}: GPUs per pod"
            want_rdma = cluster.rdma and shape.nodes > 1
            assert (RDMA_RESOURCE in res["limits"]) == want_rdma, f"{name}/{role.role}: RDMA request"
            env = {e["name"]: e for e in c["env"]}
            assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": "hf-token", "key": "token", "optional": True}}}
            assert {e["name"] for e in c["env"] if "value" in e} == set(cpu_platform().env if cluster.gpu == "CPU"
                                                                        else {}), name
            # NIXL across pods: each advertises its own IP (vLLM's default, localhost, reaches nobody)
            pod_ip = {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            nixl = uses_nixl(case.cfg, platform_for(case.job))
            assert (env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") == pod_ip) == nixl, f"{name}/{role.role}"
        notes = doc["metadata"]["annotations"]
        assert notes["deploy-advisor/study"] == case.job.name and notes["deploy-advisor/trial"] == "7"
        assert notes["deploy-advisor/source"] == "simulated"
        assert json.loads(notes["deploy-advisor/measurements"]), "the predicted numbers are missing"
    readme = (folder / "README.md").read_text()
    assert "kubectl apply" in readme and "LeaderWorkerSet controller" in readme and "trial 7" in readme


@pytest.mark.parametrize("name", CASE_NAMES)
def test_no_format_inlines_the_hf_token(name: str, exported) -> None:
    out = exported(name)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in out.iterdir()} >= {"launch.sh", "deployment.json", "k8s", "ray-serve"}
    for p in written:
        assert HF_SENTINEL not in p.read_text(), f"{p} holds the HF token"


# --------------------------------------------------------------------- (b) every pod's command
def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command/args (third_party/forked/golang/expansion): ``$(NAME)`` of a
    defined variable → its value, undefined → left as written, ``$$`` → ``$``; anything else untouched."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else f"$({name})")
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_kubelet_expansion_stand_in() -> None:
    env = {"A": "x", "LWS_WORKER_INDEX": "3"}
    assert kubelet_expand("$(A) '$(A)' $(B) $$(A) $((LWS_WORKER_INDEX * 4)) $HOME $", env) == \
        "x 'x' $(B) $(A) $((LWS_WORKER_INDEX * 4)) $HOME $"


def test_k8s_environment_references_come_from_the_secret() -> None:
    """``${NAME}`` in a job's environment is read at run time: in a pod, from the Secret; inside a value, through
    the kubelet's ``$(NAME)`` after NAME is defined; a literal ``$(`` survives the kubelet."""
    from advisor.exports.k8s_objects import env_entries

    def ref(key: str) -> dict:
        return {"secretKeyRef": {"name": "s", "key": key, "optional": False}}

    entries = env_entries({"A": "x$(y)", "HF_HOME": "${SCRATCH}/hf", "TOK": "${HF_TOKEN}"}, "s")
    assert entries == [{"name": "A", "value": "x$$(y)"}, {"name": "SCRATCH", "valueFrom": ref("SCRATCH")},
                       {"name": "HF_HOME", "value": "$(SCRATCH)/hf"}, {"name": "TOK", "valueFrom": ref("token")}]
    from_secret = {"SCRATCH": "/scratch"}
    assert kubelet_expand(entries[2]["value"], from_secret) == "/scratch/hf"
    assert kubelet_expand(entries[0]["value"], from_secret) == "x$(y)"


def write_fake_vllm(bin_dir: Path) -> Path:
    """A ``vllm`` in ``bin_dir`` that writes its arguments (NUL-separated) to $ARGV_OUT and exits."""
    exe = bin_dir / "vllm"
    exe.write_text('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$ARGV_OUT"\n')
    exe.chmod(0o755)
    return bin_dir


@pytest.fixture(scope="module")
def fake_vllm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_vllm(tmp_path_factory.mktemp("fakebin"))


def run_pod(container: dict, lws_env: dict[str, str], fake_bin: Path, tmp: Path) -> tuple[int, str, list[str] | None]:
    """Run a container's command as the kubelet would: ``$(VAR)`` expansion, then exec; returns
    (exit code, stderr, the argv ``vllm`` got or None)."""
    env = {**lws_env, **{e["name"]: e["value"] for e in container["env"] if "value" in e}}
    argv = [kubelet_expand(a, env) for a in container["command"]]
    assert argv[:2] == ["/bin/sh", "-c"]
    out = tmp / "argv"
    out.unlink(missing_ok=True)
    p = subprocess.run(argv, env={**env, "PATH": f"{fake_bin}:/usr/bin:/bin", "ARGV_OUT": str(out)},
                       capture_output=True, text=True, timeout=30, check=False)
    got = out.read_bytes().decode().split("\0")[:-1] if out.exists() else None
    return p.returncode, p.stderr, got


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_pod_runs_vllm_with_its_data_parallel_rank(name: str, exported, fake_vllm: Path, tmp_path: Path) -> None:
    case = cases()[name]
    folder = exported(name) / "k8s"
    pd = case.cfg.mode is Mode.DISAGGREGATED
    checked = 0
    for role in case.cfg.roles:
        doc = lws_of(folder, role.role)
        lws = doc["metadata"]["name"]
        shape = expected_shape(role, case.job.cluster.gpus_per_node)
        tmpl = doc["spec"]["leaderWorkerTemplate"]
        leader_c = (tmpl.get("leaderTemplate") or tmpl["workerTemplate"])["spec"]["containers"][0]
        worker_c = tmpl["workerTemplate"]["spec"]["containers"][0]
        for group in range(doc["spec"]["replicas"]):
            address = f"{lws}-{group}.{lws}.{NAMESPACE}"  # what the LWS controller injects
            for index in range(tmpl["size"]):
                c = leader_c if index == 0 else worker_c
                lws_env = {"LWS_LEADER_ADDRESS": address, "LWS_GROUP_SIZE": str(tmpl["size"]),
                           "LWS_WORKER_INDEX": str(index)}
                rc, err, argv = run_pod(c, lws_env, fake_vllm, tmp_path)
                context = f"{name}: {lws} group {group} pod {index}"
                assert rc == 0 and argv, f"{context}: rc {rc}: {err}"
                assert argv[0] == "serve", context
                ns = parse_serve_args(argv[1:])  # vLLM's own parser and post-parse validation
                start = index * shape.local  # LWS_WORKER_INDEX × ranks per node, nothing else
                got = (ns.data_parallel_size, ns.data_parallel_size_local, ns.data_parallel_start_rank,
                       ns.data_parallel_address, ns.headless)
                if shape.nodes > 1:
                    want = (role.data_parallel_size, shape.local, start if index else None, address, index > 0)
                    assert ns.data_parallel_rpc_port is not None, context
                else:
                    want = (role.data_parallel_size, None, None, None, False)
                assert got == want, f"{context}:\n{shlex.join(argv)}"
                assert (ns.tensor_parallel_size, ns.max_num_seqs, ns.max_num_batched_tokens, ns.enable_eplb,
                        ns.enable_expert_parallel) == (role.tensor_parallel_size, role.max_num_seqs,
                                                       role.max_num_batched_tokens, role.eplb.enabled,
                                                       role.enable_expert_parallel), context
                if role.eplb.enabled:
                    assert ns.eplb_config.num_redundant_experts == role.eplb.num_redundant_experts, context
                assert (ns.kv_transfer_config is not None) == pd, context
                if index == 0:
                    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                    assert (ns.host, ns.port) == ("0.0.0.0", ports["http"]), context
                else:
                    assert "--port" not in argv and "ports" not in c, context
                checked += 1
            # a group of the wrong size: every pod refuses before vLLM starts
            for c in {id(leader_c): leader_c, id(worker_c): worker_c}.values():
                rc, err, argv = run_pod(c, {"LWS_LEADER_ADDRESS": address, "LWS_GROUP_SIZE": str(tmpl["size"] + 1),
                                            "LWS_WORKER_INDEX": "1"}, fake_vllm, tmp_path)
                assert rc == 1 and argv is None and "LWS_GROUP_SIZE" in err, f"{name}: {lws}: {rc} {err}"
    want_pods = sum(r.instances * expected_shape(r, case.job.cluster.gpus_per_node).nodes for r in case.cfg.roles)
    assert checked == want_pods


# ------------------------------------------------------------------------------- (c) the router
@pytest.mark.parametrize("name", CASE_NAMES)
def test_router_points_at_the_role_leaders(name: str, exported) -> None:
    from vllm_router.launch_router import parse_router_args

    case = cases()[name]
    folder = exported(name) / "k8s"
    (dep,) = of_kind(folder, "Deployment")
    (router,) = dep["spec"]["template"]["spec"]["containers"]
    assert router["command"][0] == "vllm-router"
    ra = parse_router_args(router["command"][1:])  # vllm-router's own parser

    def leaders(role: Role) -> list[str]:
        doc = lws_of(folder, role)
        lws = doc["metadata"]["name"]
        return [f"http://{lws}-{g}.{lws}:{API_PORT}" for g in range(doc["spec"]["replicas"])]

    if case.cfg.mode is Mode.DISAGGREGATED:
        assert ra.vllm_pd_disaggregation
        assert [u for u, _ in ra.prefill_urls] == leaders(Role.PREFILL)
        assert ra.decode_urls == leaders(Role.DECODE)
        urls = leaders(Role.PREFILL) + leaders(Role.DECODE)
    else:
        assert not ra.vllm_pd_disaggregation and ra.worker_urls == leaders(Role.MIXED)
        urls = leaders(Role.MIXED)
    assert ra.policy == case.cfg.router_policy
    (wait,) = dep["spec"]["template"]["spec"]["initContainers"]
    assert wait["command"][3:] == [f"{u}/health" for u in urls]
    # the router's Service reaches the router's port; each role's Service selects that role's leaders
    services = {d["metadata"]["name"]: d for d in of_kind(folder, "Service")}
    router_svc = services[dep["metadata"]["name"]]
    assert router_svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in router_svc["spec"]["ports"]} <= {p["name"] for p in router["ports"]}
    for role in case.cfg.roles:
        lws = lws_of(folder, role.role)
        svc = services[f"{lws['metadata']['name']}-api"]
        # the labels the LWS controller gives a group's leader pod
        leader_labels = {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
                         "leaderworkerset.sigs.k8s.io/worker-index": "0"}
        assert svc["spec"]["selector"] == leader_labels
        tmpl = lws["spec"]["leaderWorkerTemplate"]
        leader_c = (tmpl.get("leaderTemplate") or tmpl["workerTemplate"])["spec"]["containers"][0]
        assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in leader_c["ports"]}


# ------------------------------------------------------------------------------- (d) Ray Serve
def serve_config(name: str, exported) -> dict:
    return yaml.safe_load((exported(name) / "ray-serve" / "serve_config.yaml").read_text())


def llm_configs(app_args: dict) -> dict[Role, dict]:
    if "prefill_config" in app_args:
        return {Role.PREFILL: app_args["prefill_config"], Role.DECODE: app_args["decode_config"]}
    if "llm_config" in app_args:
        return {Role.MIXED: app_args["llm_config"]}
    (one,) = app_args["llm_configs"]
    return {Role.MIXED: one}


def head_args(name: str, exported, role: Role) -> list[str]:
    """The head node's ``vllm serve`` arguments of the role's first instance, from the json export."""
    doc = json.loads((exported(name) / "deployment.json").read_text())
    cmd = next(c for c in doc["commands"] if c["role"] == role.value)
    argv = cmd["argv"]
    return argv[argv.index("serve") + 1:]


def _same(parsed: Any, ours: Any) -> bool:
    if isinstance(ours, dict):
        return all(_same(parsed[k] if isinstance(parsed, dict) else getattr(parsed, k), v) for k, v in ours.items())
    return parsed == ours or getattr(parsed, "value", object()) == ours


@pytest.mark.parametrize("name", CASE_NAMES)
def test_ray_engine_kwargs_are_the_rendered_vllm_arguments(name: str, exported) -> None:
    """The engine kwargs are what vLLM's parser reads off the rendered ``vllm serve`` arguments (values that
    differ from its defaults), less what Ray Serve sets itself — and every one is an AsyncEngineArgs field."""
    case = cases()[name]
    (app,) = serve_config(name, exported)["applications"]
    confs = llm_configs(app["args"])
    assert set(confs) == {r.role for r in case.cfg.roles}
    for role, conf in confs.items():
        args = head_args(name, exported, role)
        ns = parse_serve_args(args)
        ns0 = parse_serve_args(args[:1])  # the defaults, as the same parser gives them
        changed = {k for k, v in vars(ns).items() if k not in ("model_tag", "model") and vars(ns0).get(k) != v}
        kwargs = conf["engine_kwargs"]
        assert set(kwargs) == changed - RAY_OWNED, f"{name}/{role}: {sorted(set(kwargs) ^ (changed - RAY_OWNED))}"
        for k, v in kwargs.items():
            assert _same(getattr(ns, k), v), f"{name}/{role}: {k}: vLLM reads {getattr(ns, k)!r}, export has {v!r}"
        from vllm.engine.arg_utils import AsyncEngineArgs

        fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        assert set(kwargs) <= fields, f"{name}/{role}: not engine arguments: {sorted(set(kwargs) - fields)}"
        assert conf["model_loading_config"]["model_source"] == args[0]
        assert conf["deployment_config"]["num_replicas"] == next(r for r in case.cfg.roles if r.role is role).instances
        if case.cfg.mode is Mode.DISAGGREGATED:
            assert kwargs["kv_transfer_config"]["kv_connector"] == (case.cfg.kv_connector or
                                                                    ("ExampleConnector" if case.job.cluster.gpu == "CPU"
                                                                     else "NixlConnector"))


@pytest.fixture(scope="module")
def ray_runtime():
    """A bare local Ray runtime: ``ray.serve.llm``'s builders read the driver's runtime env from it. Serve itself
    is never started and nothing is deployed."""
    import ray

    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize("name", CASE_NAMES)
def test_ray_serve_llm_builds_the_application(name: str, exported, ray_runtime) -> None:
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve._private.build_app import build_app
    from ray.serve.deployment import Application
    from ray.serve.schema import ServeDeploySchema
    from ray._common.utils import import_attr

    case = cases()[name]
    folder = exported(name) / "ray-serve"
    config = serve_config(name, exported)
    ServeDeploySchema.model_validate(config)  # what `serve deploy` checks
    (spec,) = config["applications"]
    if case.cfg.mode is Mode.DISAGGREGATED:
        want_builder = "build_pd_openai_app"
    else:
        want_builder = "build_dp_openai_app" if case.cfg.decode.data_parallel_size > 1 else "build_openai_app"
    assert spec["import_path"] == f"ray.serve.llm:{want_builder}"
    from_yaml = call_user_app_builder_with_args_if_necessary(import_attr(spec["import_path"]), spec["args"])
    from_py = runpy.run_path(str(folder / "llm_app.py"))["app"]
    for app in (from_yaml, from_py):
        assert isinstance(app, Application)
        built = build_app(app, name=spec["name"])  # the graph `serve run` would deploy, not deployed
        deployments = {d.name: d for d in built.deployments}
        servers = [n for n in deployments if n != built.ingress_deployment_name]
        assert len(servers) == len(case.cfg.roles), f"{name}: {sorted(deployments)}"
        for role in case.cfg.roles:
            prefix = {Role.PREFILL: "Prefill:", Role.DECODE: "Decode:", Role.MIXED: ""}[role.role]
            (d,) = [deployments[n] for n in servers if n.startswith(prefix)]
            assert d.num_replicas == role.instances * role.data_parallel_size, f"{name}: {d.name}"
            gang = d._deployment_config.gang_scheduling_config
            if role.data_parallel_size > 1:
                assert gang is not None and gang.gang_size == role.data_parallel_size, f"{name}: {d.name}"
            else:
                assert gang is None, f"{name}: {d.name}"
        assert built.ingress_deployment_name in deployments


# ------------------------------------------------------------------------ (e) the other formats
@pytest.mark.parametrize("name", CASE_NAMES)
def test_launch_script_and_json_argument_lists_parse(name: str, exported) -> None:
    out = exported(name)
    doc = json.loads((out / "deployment.json").read_text())
    for c in doc["commands"]:
        argv = c["argv"]
        parse_serve_args(argv[argv.index("serve") + 1:])
    lines = [ln for ln in (out / "launch.sh").read_text().splitlines() if " serve " in ln and not ln.startswith("#")]
    assert len(lines) == len(doc["commands"])
    for ln in lines:
        argv = shlex.split(ln.split(" > ")[0])
        parse_serve_args(argv[argv.index("serve") + 1:])


NODE_IPS = ["10.77.0.1", "10.77.0.2"]


def test_cross_node_pd_launch_script_runs_on_each_node(exported, tmp_path: Path) -> None:
    """The exported script of prefill on node 0 and decode on node 1 (NixlConnector), run as ``launch.sh 0``
    and ``launch.sh 1`` with NODE0_IP/NODE1_IP set: each server gets its own node's address as NIXL's
    side-channel host (the prefill side advertises it to decode), the router both nodes' URLs, expanded."""
    from vllm_router.launch_router import parse_router_args

    from tests.test_render import run_launch_script

    case = cases()["h200-pd-2x1"]
    script = (exported("h200-pd-2x1") / "launch.sh").read_text()
    started = run_launch_script(script, tmp_path, nodes=2, node_ips=NODE_IPS, servers=2)
    servers = [p for p in started if p.name == "vllm"]
    assert sorted(p.node for p in servers) == [0, 1]
    role_on = {i.head.node: i.role for i in place(case.cfg, case.job.cluster).instances}
    assert role_on == {0: Role.PREFILL, 1: Role.DECODE}
    urls = {}
    for p in servers:
        assert p.argv[0] == "serve"
        ns = parse_serve_args(p.argv[1:])  # vLLM's own parser, with its post-parse validation
        assert ns.model_tag == TINY_ID and ns.kv_transfer_config.kv_connector == "NixlConnector"
        assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == NODE_IPS[p.node]
        urls[role_on[p.node]] = f"http://{NODE_IPS[p.node]}:{ns.port}"
    assert set(urls) == {Role.PREFILL, Role.DECODE}
    assert len({p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for p in servers}) == 2  # distinct ranges, whatever the node
    (router,) = [p for p in started if p.name == "vllm-router"]
    ra = parse_router_args(router.argv)
    assert router.node == 0 and ra.vllm_pd_disaggregation and ra.policy == case.cfg.router_policy
    assert [u for u, _ in ra.prefill_urls] == [urls[Role.PREFILL]] and ra.decode_urls == [urls[Role.DECODE]]


def test_folder_exports_replace_their_own_folder_only(tmp_path: Path) -> None:
    case = cases()["cpu-agg"]
    ev = evidence(case)
    path, sha = write_export(case.job, case.topo, ev, "k8s", tmp_path)
    files = {str(p.relative_to(path)): p.read_text() for p in path.rglob("*") if p.name != FOLDER_MARK}
    assert sha == files_sha256(files) and len(sha) == 64
    (path / "stale.yaml").write_text("kind: Stale\n")
    path2, _ = write_export(case.job, case.topo, ev, "k8s", tmp_path, options=ExportOptions(name="renamed"))
    assert path2 == path and not (path / "stale.yaml").exists()  # a re-export leaves no stale object behind
    assert "renamed-mixed" in (path / "mixed-leaderworkerset.yaml").read_text()
    foreign = tmp_path / "other"
    (foreign / "ray-serve").mkdir(parents=True)
    (foreign / "ray-serve" / "mine.txt").write_text("keep")
    with pytest.raises(BadInput, match="not written by `advisor export`"):
        write_export(case.job, case.topo, ev, "ray-serve", foreign)
    assert (foreign / "ray-serve" / "mine.txt").read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


# ------------------------------------------------------------------------------------- (g) the model
def _local_model_job(tmp_path: Path) -> tuple[TuningJob, Path]:
    from executors.vllm.tiny_model import make_tiny_moe

    folder = make_tiny_moe(tmp_path / "my-model")
    job = job_from_dict({"name": "local-model", "preset": "cpu-tiny-moe",
                         "model": {"preset": None, "path": str(folder)}, "budget": {"trials": 2}})
    return job, folder


def test_a_local_model_folder_is_exported_only_with_model(tmp_path: Path) -> None:
    """A folder on the tuner's machine names nothing on the cluster's hosts: no format writes it unless asked."""
    case = cases()["cpu-pd"]
    job, folder = _local_model_job(tmp_path)
    for fmt in FORMATS:
        with pytest.raises(BadInput, match=r"^--model: the job's model.path .* pass --model"):
            write_export(job, case.topo, evidence(case), fmt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    for fmt in FORMATS:
        written, _ = write_export(job, case.topo, evidence(case), fmt, tmp_path / "out", model=TINY_ID)
        files = [written] if written.is_file() else [f for f in written.rglob("*") if f.is_file()]
        text = "".join(f.read_text() for f in files)
        assert TINY_ID in text and str(folder) not in text, fmt


def test_cli_asks_for_model_in_one_line_and_takes_a_path_when_given(tmp_path: Path) -> None:
    from advisor.tune import tune

    job, folder = _local_model_job(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    tune(job, storage=url)
    out = tmp_path / "out"

    def export(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "advisor", "export", job.name, "--out", str(out),
                               "--storage", url, *args], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)

    p = export("--format", "all")
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert "--model" in line and "model.path" in line and str(folder) in line, line
    assert not out.exists()
    # a single-node launch script may serve the local folder: the user said so
    p = export("--format", "vllm", "--model", str(folder))
    assert p.returncode == 0, p.stderr
    serve = [ln for ln in (out / "launch.sh").read_text().splitlines() if " serve " in ln and not ln.startswith("#")]
    assert serve and all(shlex.split(ln)[shlex.split(ln).index("serve") + 1] == str(folder) for ln in serve)
    p = export("--format", "k8s", "--model", TINY_ID)
    assert p.returncode == 0, p.stderr
    text = "".join(f.read_text() for f in (out / "k8s").glob("*.yaml"))
    assert f"exec vllm serve {TINY_ID}" in text and str(folder) not in text


# ------------------------------------------------------------------------------ (f) real vLLM
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


@pytest.mark.vllm
def test_cpu_tiny_lws_command_serves_a_completion(tmp_path: Path) -> None:
    """The tiny CPU configuration's LeaderWorkerSet, its ``vllm serve`` line run by hand here: the pod's
    command with the LWS variables and the container's env, the model path and a free port put in for local
    values, ``vllm`` being this machine's engine command (``cpu_platform().engine_cmd``)."""
    from executors.vllm.tiny_model import make_tiny_moe

    case = cases()["cpu-agg"]
    model_dir = make_tiny_moe(tmp_path / "tiny-moe")
    files = render_export(case.job, case.topo, evidence(case), "k8s", model=str(model_dir))
    lws = yaml.safe_load(files["mixed-leaderworkerset.yaml"])
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 1 and lws["spec"]["replicas"] == 1 and "leaderTemplate" not in tmpl
    (c,) = tmpl["workerTemplate"]["spec"]["containers"]
    port = _free_port()
    env = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0",
           **{e["name"]: e["value"] for e in c["env"] if "value" in e}}
    argv = [kubelet_expand(a, env) for a in c["command"]]
    script = argv[2]
    pod_port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert re.search(rf"--port {pod_port}\b", script) and shlex.quote(str(model_dir)) in script
    script = re.sub(rf"--port {pod_port}\b", f"--port {port}", script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    engine = cpu_platform().engine_cmd  # this machine's `vllm`
    (bin_dir / "vllm").write_text(f'#!/bin/sh\nexec {shlex.join(engine)} "$@"\n')
    (bin_dir / "vllm").chmod(0o755)
    run_env = {**os.environ, **cpu_platform().env, **env, "VLLM_CPU_OMP_THREADS_BIND": "0",
               "VLLM_CACHE_ROOT": str(tmp_path / "cache"), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    run_env.pop("HF_TOKEN", None)
    log = (tmp_path / "vllm.log").open("wb")
    proc = subprocess.Popen([*argv[:2], script], env=run_env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{(tmp_path / 'vllm.log').read_text()[-4000:]}")
            try:
                _get(f"{base}/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"no /health in 240 s:\n{(tmp_path / 'vllm.log').read_text()[-4000:]}")
                time.sleep(2)
        (model_id,) = [m["id"] for m in json.loads(_get(f"{base}/v1/models"))["data"]]
        req = urllib.request.Request(f"{base}/v1/completions", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": model_id, "prompt": "the model serves",
                                                      "max_tokens": 8, "ignore_eos": True}).encode())
        with urllib.request.urlopen(req, timeout=120) as r:
            body = json.loads(r.read())
        assert body["choices"] and body["usage"]["completion_tokens"] == 8, body
    finally:
        _stop_group(proc)
        log.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the process group we started (its id is the shell's pid), by id: TERM, then KILL; return once no
    process of it is left (vLLM's engine process outlives the API server by a moment)."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap our own child, or the group never looks empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
