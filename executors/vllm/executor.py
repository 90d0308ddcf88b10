"""What the executors that run real vLLM servers share: the local one (``executors.local``) and the Ray one
(``executors.ray.executor``).

Both take the same settings, give each deployment its own folder (and KV shared-storage folder), render a
server's command line the same way, run the same measurement loop (``executors.measuring.loop``; each says only how it
runs one level, ``_levels``) and keep their resource record on disk after teardown when they can. Written once here, so
a change to any of these reaches both executors; only where the processes run (subprocesses here, Ray actors there)
differs.
"""

from __future__ import annotations

import time
import uuid
from abc import abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from executors.base import Deployment, Executor
from executors.measuring.loop import LevelRunner, MeasurePlan, measure_deployment
from executors.topology import Instance, NodeShard, Topology
from executors.vllm.platform import Platform
from executors.vllm.render import Endpoint, serve_args, serve_command
from executors.vllm.serving import cache_key, check_routing, deployment_platform, engine_version
from search_spaces import Measurement, Mode, Workload
from search_spaces.workload import ExpertRouting

#: A deployment's id (and its run folder's name) starts with the time it began, in this format
#: (``benchmarks/deploy_phases.py`` reads a deploy's start from it).
DEPLOYMENT_TIME = "%Y%m%d-%H%M%S"


class VllmExecutor(Executor):
    """An executor whose deployments are real ``vllm serve`` processes behind ``vllm-router``."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        platform: Platform,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        run_dir: str | Path,
        health_timeout_s: float = 180,
        bench_timeout_s: float = 600,
        teardown_timeout_s: float = 30,
        router_timeout_s: float = 60,
        host: str = "127.0.0.1",
        extra_serve_args: Sequence[str] = (),
        expert_routing: ExpertRouting | str = "real",
        eplb_log_balancedness: bool = False,
    ) -> None:
        self.model_path = Path(model_path).resolve()
        self.platform = platform
        self.served_model_name = served_model_name or self.model_path.name
        self.max_model_len = max_model_len
        self.run_dir = Path(run_dir).resolve()
        self.health_timeout_s = health_timeout_s
        self.bench_timeout_s = bench_timeout_s
        self.teardown_timeout_s = teardown_timeout_s
        self.router_timeout_s = router_timeout_s
        self.host = host
        self.extra_serve_args = list(extra_serve_args)
        # the workload's asks of every server (workload.expert_routing, workload.eplb_log_balancedness)
        self.expert_routing = ExpertRouting.model_validate(expert_routing)
        self.eplb_log_balancedness = eplb_log_balancedness
        self.engine_version = engine_version()
        self._cache_key = cache_key(self.model_path, self.engine_version, platform)

    def _deployment_dirs(self) -> tuple[str, Path, Path, Platform]:
        """A new deployment's id, its folder (created), its KV shared-storage folder and the platform that
        points the KV connector there."""
        dep_id = f"{time.strftime(DEPLOYMENT_TIME)}-{uuid.uuid4().hex[:6]}"
        ddir = self.run_dir / dep_id
        ddir.mkdir(parents=True, exist_ok=True)
        kv_dir = Path(self.platform.kv_connector_extra.get("shared_storage_path", str(ddir))) / dep_id
        return dep_id, ddir, kv_dir, deployment_platform(self.platform, kv_dir)

    def _serve_command(self, inst: Instance, shard: NodeShard, head: Endpoint, platform: Platform,
                       topology: Topology) -> list[str]:
        """The full ``vllm serve`` command line of one node shard of ``inst`` (``executors.vllm.render``)."""
        args = serve_args(inst, shard, cfg=topology.config, model=str(self.model_path), platform=platform,
                          head=head, served_model_name=self.served_model_name, max_model_len=self.max_model_len,
                          extra=self.extra_serve_args, log_balancedness=self.eplb_log_balancedness)
        return serve_command(platform, args)

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        """The one measurement loop (``executors.measuring.loop``) on the running deployment; ``_levels`` runs its
        levels."""
        assert deployment.url, "deploy() did not finish"
        check_routing(workload, self.expert_routing)
        with self._levels(deployment, workload, deployment.handle.dir / "bench") as runner:
            return measure_deployment(runner, workload, plan or MeasurePlan(), gpus=deployment.topology.gpus,
                                      disaggregated=deployment.topology.config.mode is Mode.DISAGGREGATED,
                                      timings=deployment.timings, expert_routing=str(self.expert_routing),
                                      short_levels=not self.platform.cpu_per_gpu_slot,
                                      prompt_starts=deployment.prompt_starts)

    @abstractmethod
    def _levels(self, deployment: Deployment, workload: Workload, bdir: Path) -> AbstractContextManager[LevelRunner]:
        """How this executor runs ``workload``'s load levels on ``deployment`` (files under ``bdir``), for as long
        as the ``with`` lasts: a ``LevelRunner``, and whatever must be released after the last level."""

    def _save_after_teardown(self, deployment: Deployment) -> None:
        """The final resource record; a run folder that is gone (removed by the user) is no error here."""
        try:
            self._save(deployment)
        except OSError:
            pass
