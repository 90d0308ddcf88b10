"""Ray Serve LLM export: the chosen trial as a ``ray.serve.llm`` application.

Two files of the same content: ``serve_config.yaml`` (for ``serve run`` / ``serve deploy``) and
``llm_app.py`` (``serve run llm_app:app``). Each role is one ``LLMConfig`` whose ``engine_kwargs`` are the
``{flag: value}`` mapping ``executors.vllm.render.serve_flags`` builds for the role's head node, each flag named
as vLLM names its engine argument (``render.engine_kwarg``: ``--max-num-seqs`` → ``max_num_seqs``; a flag
without a value → ``True``, a negated one such as ``--no-async-scheduling`` → ``async_scheduling: false``; JSON
values such as ``--kv-transfer-config`` stay dicts). Only the flags Ray Serve owns are left out — the served name
(it goes to ``model_loading_config`` with the model), the HTTP endpoint, and the data-parallel rank placement
(Ray Serve's DP server gives every rank its replica and sets rank, address and RPC port itself;
``data_parallel_size`` stays).

P/D → ``build_pd_openai_app`` (prefill and decode configs, ``kv_transfer_config`` on both); aggregated →
``build_dp_openai_app`` when the instance is data-parallel, else ``build_openai_app``. ``num_replicas`` is the
role's instance count (Ray Serve multiplies it by ``data_parallel_size`` for DP deployments).
"""

from __future__ import annotations

import pprint
from typing import TYPE_CHECKING, Any

import yaml

from advisor.executor_factory import platform_for
from executors import Endpoint, Instance, Platform, Topology
from executors.vllm.render import (
    DP_ADDRESS,
    DP_RPC_PORT,
    DP_SIZE_LOCAL,
    DP_START_RANK,
    HEADLESS,
    HOST,
    PORT,
    SERVED_MODEL_NAME,
    engine_kwarg,
    kwarg_name,
    serve_flags,
    uses_nixl,
)
from search_spaces import DeploymentConfig, Mode, Role

if TYPE_CHECKING:
    from advisor.exports import Evidence, ExportOptions
    from advisor.job import TuningJob

#: ``vllm serve`` flags Ray Serve sets itself (served name via model_loading_config, its own HTTP server, and
#: the DP rank layout its DPServer assigns per replica).
RAY_OWNED_FLAGS = (HOST, PORT, SERVED_MODEL_NAME, HEADLESS, DP_SIZE_LOCAL, DP_START_RANK, DP_ADDRESS, DP_RPC_PORT)
#: The same, as engine argument names.
RAY_OWNED = frozenset(kwarg_name(f) for f in RAY_OWNED_FLAGS)
#: Set by Ray Serve LLM's NixlConnector backend in each replica, when unset: the host to the replica's node IP
#: (``ray.util.get_node_ip_address()``), the port to a base (prefill 20000, decode 22000) + the replica's
#: offset. One value written here would be the same on every node: wrong across nodes.
RAY_SETS_NIXL = frozenset({"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"})
APP_NAME = "deploy-advisor"


def llm_config(job: TuningJob, cfg: DeploymentConfig, inst: Instance, model: str, platform: Platform) -> dict:
    """One role's ``LLMConfig`` (as a dict ``LLMConfig.model_validate`` reads)."""
    served = job.executor.served_model_name
    flags = serve_flags(inst, inst.head, cfg=cfg, platform=platform, head=Endpoint(host="127.0.0.1", port=8000),
                        served_model_name=served, max_model_len=job.workload.max_model_len)
    out: dict[str, Any] = {
        "model_loading_config": {"model_id": served or model, "model_source": model},
        "engine_kwargs": dict(engine_kwarg(f, v) for f, v in flags.items() if f not in RAY_OWNED_FLAGS),
        "deployment_config": {"num_replicas": inst.config.instances},
    }
    if platform.cpu_per_gpu_slot:
        out["accelerator_config"] = {"kind": "cpu"}
    else:
        out["accelerator_type"] = job.cluster.gpu
    # ${NAME} values stay references: Ray's workers expand them from their node's environment (os.path.expandvars
    # when the runtime env is applied). NIXL's host is Ray Serve's to set, per replica, to its node's IP.
    env = {k: v for k, v in platform.env.items() if not (k in RAY_SETS_NIXL and uses_nixl(cfg, platform))}
    if env:
        out["runtime_env"] = {"env_vars": env}
    return out


def application(job: TuningJob, topo: Topology, model: str) -> tuple[str, dict]:
    """(builder import path, builder arguments) of the whole deployment."""
    cfg = topo.config
    platform = platform_for(job)

    def conf(role: Role) -> dict:
        return llm_config(job, cfg, topo.of_role(role)[0], model, platform)

    if cfg.mode is Mode.DISAGGREGATED:
        return "ray.serve.llm:build_pd_openai_app", {"prefill_config": conf(Role.PREFILL),
                                                     "decode_config": conf(Role.DECODE)}
    mixed = conf(Role.MIXED)
    if cfg.decode.data_parallel_size > 1:
        return "ray.serve.llm:build_dp_openai_app", {"llm_config": mixed}
    return "ray.serve.llm:build_openai_app", {"llm_configs": [mixed]}


def _comment(text: str) -> str:
    return "".join(f"# {h}\n" if h else "#\n" for h in text.splitlines())


def render(job: TuningJob, topo: Topology, ev: Evidence, model: str, options: ExportOptions) -> dict[str, str]:
    """The ``ray-serve`` folder: ``serve_config.yaml`` and ``llm_app.py``."""
    cfg = topo.config
    import_path, args = application(job, topo, model)
    module, builder = import_path.split(":")
    usage = (f"{cfg.describe()}\n"
             "Ray Serve LLM (Ray 2.60): `serve run serve_config.yaml`, or `serve run llm_app:app` from this folder.\n"
             "HF_TOKEN, if the model needs one, is read from the environment of `serve run`; never written here.\n"
             "env_vars written ${NAME} are references, never values: Ray expands each on the node a replica runs\n"
             "on, from the environment that node's `ray start` had (unset: empty).")
    if uses_nixl(cfg, platform_for(job)):
        usage += ("\nNIXL's side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT) is left to Ray Serve LLM: it sets each "
                  "replica's\nto its own node's IP and a port of its own (experimental_configs "
                  "NIXL_SIDE_CHANNEL_PORT_BASE).")
    config = {"applications": [{"name": APP_NAME, "route_prefix": "/", "import_path": import_path, "args": args}]}
    yaml_text = _comment(f"{ev.header()}\n{usage}") + yaml.safe_dump(config, sort_keys=False, width=120)
    literal = pprint.pformat(args, indent=1, width=110, sort_dicts=False)
    py_text = (
        _comment(f"{ev.header()}\n{usage}")
        + f'"""Ray Serve LLM application of study {ev.study!r}, trial {ev.trial}."""\n\n'
        + f"from {module} import {builder}\n\n"
        + f"ARGS = {literal}\n\n"
        + f"app = {builder}(ARGS)\n"
    )
    return {"serve_config.yaml": yaml_text, "llm_app.py": py_text}
