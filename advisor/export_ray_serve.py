"""Ray Serve LLM export: the chosen trial as a ``ray.serve.llm`` application.

Two files of the same content: ``serve_config.yaml`` (for ``serve run`` / ``serve deploy``) and
``llm_app.py`` (``serve run llm_app:app``). Each role is one ``LLMConfig`` whose ``engine_kwargs`` are the
``vllm serve`` arguments that ``executors.render.serve_args`` renders for the role's head node, turned into
keyword arguments the way vLLM names them (``--max-num-seqs 256`` → ``max_num_seqs: 256``; a flag without a
value → ``True``; JSON values such as ``--kv-transfer-config`` → dicts). Nothing about a flag is written
here twice: only the arguments Ray Serve owns are left out — the model and its served name (they go to
``model_loading_config``), the HTTP endpoint, and the data-parallel rank placement (Ray Serve's DP server
gives every rank its replica and sets rank, address and RPC port itself; ``data_parallel_size`` stays).

P/D → ``build_pd_openai_app`` (prefill and decode configs, ``kv_transfer_config`` on both); aggregated →
``build_dp_openai_app`` when the instance is data-parallel, else ``build_openai_app``. ``num_replicas`` is the
role's instance count (Ray Serve multiplies it by ``data_parallel_size`` for DP deployments).
"""

from __future__ import annotations

import json
import pprint
import re
from typing import TYPE_CHECKING, Any

import yaml

from advisor.executor_factory import platform_for
from executors import Endpoint, Instance, Platform, place, serve_args
from executors.render import uses_nixl
from search_spaces import DeploymentConfig, Mode, Role

if TYPE_CHECKING:
    from advisor.exports import Evidence, ExportOptions
    from advisor.job import TuningJob

#: ``vllm serve`` arguments Ray Serve sets itself (model/served name via model_loading_config, its own HTTP
#: server, and the DP rank layout its DPServer assigns per replica).
RAY_OWNED = frozenset({
    "host", "port", "served_model_name", "headless", "data_parallel_size_local", "data_parallel_start_rank",
    "data_parallel_address", "data_parallel_rpc_port", "data_parallel_rank",
})
#: Set by Ray Serve LLM's NixlConnector backend in each replica, when unset: the host to the replica's node IP
#: (``ray.util.get_node_ip_address()``), the port to a base (prefill 20000, decode 22000) + the replica's
#: offset. One value written here would be the same on every node: wrong across nodes.
RAY_SETS_NIXL = frozenset({"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"})
APP_NAME = "deploy-advisor"
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?\d+\.\d*(e-?\d+)?$")


def _value(text: str) -> Any:
    if text[:1] in "{[":
        return json.loads(text)
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def engine_kwargs(args: list[str]) -> tuple[str, dict[str, Any]]:
    """``vllm serve`` arguments → (model, keyword arguments by vLLM's names), Ray-owned ones included."""
    if not args or args[0].startswith("-"):
        raise ValueError(f"a `vllm serve` argument list starts with the model: {args[:3]}")
    model, kwargs, i = args[0], {}, 1
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--"):
            raise ValueError(f"{flag!r} follows no flag in {args}")
        key = flag[2:].replace("-", "_")
        if key in kwargs:
            raise ValueError(f"{flag} given twice")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            kwargs[key], i = _value(args[i + 1]), i + 2
        else:
            kwargs[key], i = True, i + 1
    return model, kwargs


def llm_config(job: TuningJob, cfg: DeploymentConfig, inst: Instance, model: str, platform: Platform) -> dict:
    """One role's ``LLMConfig`` (as a dict ``LLMConfig.model_validate`` reads)."""
    args = serve_args(inst, inst.head, cfg=cfg, model=model, platform=platform,
                      head=Endpoint(host="127.0.0.1", port=8000), served_model_name=job.executor.served_model_name,
                      max_model_len=job.workload.max_model_len)
    source, kwargs = engine_kwargs(args)
    served = kwargs.get("served_model_name")
    out: dict[str, Any] = {
        "model_loading_config": {"model_id": served if isinstance(served, str) else source, "model_source": source},
        "engine_kwargs": {k: v for k, v in kwargs.items() if k not in RAY_OWNED},
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


def application(job: TuningJob, cfg: DeploymentConfig, model: str) -> tuple[str, dict]:
    """(builder import path, builder arguments) of the whole deployment."""
    topo = place(cfg, job.cluster)
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


def render(job: TuningJob, cfg: DeploymentConfig, ev: Evidence, model: str, options: ExportOptions) -> dict[str, str]:
    """The ``ray-serve`` folder: ``serve_config.yaml`` and ``llm_app.py``."""
    import_path, args = application(job, cfg, model)
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
