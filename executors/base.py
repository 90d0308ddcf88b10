"""The executor contract: deploy → measure every load level on the same deployment → teardown.

Lifecycle (``evaluate`` runs it)::

    deploy(topology) ──ok──▶ measure(deployment, workload, plan) ──▶ teardown(deployment)
         │ raises DeploymentFailed            │ raises DeploymentFailed      ▲ always, also on
         └──────────────────────────────────────────────────────────────────┘ error, timeout, Ctrl-C

A failure never escapes ``evaluate``: it becomes a ``RunResult`` with ``failure`` set, so one bad trial
cannot stop a study. Every executor (simulated, local, ray) passes the same conformance tests.
"""

from __future__ import annotations

import json
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from executors.processes.procs import interrupt_of
from executors.topology import Topology
from search_spaces import ClusterSpec, Measurement, Workload

if TYPE_CHECKING:
    from executors.measuring.loop import MeasurePlan


class FailureKind(StrEnum):
    """Why a deployment produced no (or not all) measurements; told to the sampler as infeasible — except
    ``ENVIRONMENT``, which says nothing about the configuration (retried once, then told as FAIL)."""

    START = "start"  # vLLM refused its flags or died while starting
    OOM = "oom"
    HEALTH_TIMEOUT = "health_timeout"
    CRASH = "crash"  # died while serving
    BENCHMARK = "benchmark"  # the load generator failed or timed out
    PLATFORM = "platform"  # the executor cannot run this candidate here (e.g. EPLB on CPU)
    INTERNAL = "internal"  # the executor itself raised: a bug or an environment problem, kept with its trace
    INTERRUPTED = "interrupted"  # Ctrl-C or a killed tuner
    ENVIRONMENT = "environment"  # the cluster, not the configuration: placement timeout, a port taken, a node lost


class PreflightFailed(Exception):
    """The cluster an executor reaches cannot run the job at all (checked before the first trial): one line."""


class DeploymentFailed(Exception):
    def __init__(self, kind: FailureKind, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.log_tail = log_tail


@dataclass
class Timings:
    deploy_s: float = 0.0
    warmup_s: float = 0.0
    measure_s: float = 0.0
    teardown_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.deploy_s + self.warmup_s + self.measure_s + self.teardown_s


@dataclass
class Deployment:
    """A running deployment: its entry URL and whatever the executor needs to stop it."""

    topology: Topology
    url: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)  # pgids, placement groups, ports, log paths
    timings: Timings = field(default_factory=Timings)
    handle: Any = None
    #: The first KV blocks of the random prompts sent to it, by tokenizer folder (``executors.measuring.prompt_seeds``),
    #: kept across ``measure`` calls: a profile measures each probe level in a call of its own, and with a record per
    #: call its later levels repeat the earlier ones' prompts (tiny CPU model: one or two 128-token blocks a
    #: level, 2.1-3.1% prefix-cache hits, once a profile measures 6 levels per deployment).
    prompt_starts: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    measurements: list[Measurement]
    timings: Timings
    failure: FailureKind | None = None
    reason: str | None = None
    log_tail: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None


class Executor(ABC):
    """Three verbs; ``evaluate`` composes them with teardown guaranteed."""

    kind: str = "abstract"
    engine_version: str = "unknown"
    #: Its numbers are the performance model's, not measured on hardware (even where it reserves real GPUs):
    #: no run-to-run spread, no baseline, exports say "simulated". Ask this, never ``kind``.
    simulated: ClassVar[bool] = False
    #: Set by ``evaluate`` for one trial: told the resources each time a process or reservation is added.
    _listener: Callable[[dict[str, Any]], None] | None = None

    def _save(self, dep: Deployment) -> None:
        """Record what now runs, as it starts — beside the logs and with the tuner (which stores it in the
        database), so a tuner killed in the middle of ``deploy`` still leaves a record to clean up from."""
        run_dir = dep.resources.get("run_dir")
        if run_dir:
            path = Path(run_dir) / "resources.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(dep.resources, indent=2, default=str))
            tmp.replace(path)
        if self._listener is not None:
            self._listener(json.loads(json.dumps(dep.resources, default=str)))

    @abstractmethod
    def deploy(self, topology: Topology) -> Deployment: ...

    @abstractmethod
    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        """Every level of ``executors.measuring.loop``'s loop (warm-up, knee search against ``plan``'s SLOs, fixed
        levels) on the running deployment."""

    @abstractmethod
    def teardown(self, deployment: Deployment) -> None: ...

    def close(self) -> None:
        """Release what the executor holds across trials (a Ray connection, say)."""

    def preflight(self, cluster: ClusterSpec) -> list[str]:
        """Check, before the first trial, that the machines this executor reaches can run ``cluster``'s job;
        raise ``PreflightFailed`` (one line) when not. Returns what was checked, for the user."""
        return []

    def evaluate(
        self,
        topology: Topology,
        workload: Workload,
        on_started: Callable[[dict[str, Any]], None] | None = None,
        plan: MeasurePlan | None = None,
        on_measured: Callable[[list[Measurement]], None] | None = None,
    ) -> RunResult:
        """Deploy, measure, tear down. ``on_started`` receives the resources each time they grow (every
        process, port and reservation as it starts) and once more after teardown. ``on_measured`` receives the
        levels measured (all of them, or those before a failure or a stop) before teardown starts: a tuner
        killed while tearing down has stored them already."""

        def measured(levels: list[Measurement]) -> None:
            if on_measured is not None and levels:
                try:
                    on_measured(list(levels))
                except Exception as e:  # noqa: BLE001 — the levels are recorded again when the trial is recorded
                    if (stop := interrupt_of(e)) is not None:
                        raise stop from None

        def stopped(e: KeyboardInterrupt) -> KeyboardInterrupt:
            # a stop (Ctrl-C, SIGTERM, a wall-clock limit) still ends the study, but what was measured before it is
            # the trial's: ``e.run`` carries those levels (their timings complete once teardown below has run)
            timings = deployment.timings if deployment else Timings(deploy_s=time.monotonic() - t0)
            res = deployment.resources if deployment else {}
            e.run = RunResult(list(getattr(e, "measurements", []) or []), timings,  # type: ignore[attr-defined]
                              FailureKind.INTERRUPTED, "interrupted", resources=res)
            measured(e.run.measurements)  # type: ignore[attr-defined]
            return e

        deployment: Deployment | None = None
        t0 = time.monotonic()
        self._listener = on_started
        try:
            deployment = self.deploy(topology)
            if on_started is not None:
                on_started(deployment.resources)
            measurements = self.measure(deployment, workload, plan)
            measured(measurements)
            return RunResult(measurements, deployment.timings, resources=deployment.resources)
        except DeploymentFailed as e:
            timings = deployment.timings if deployment else Timings(deploy_s=time.monotonic() - t0)
            res = deployment.resources if deployment else {}
            # levels measured before the failure stand (a crash at the third level keeps the first two)
            kept = list(getattr(e, "measurements", []) or [])
            if e.kind is not FailureKind.ENVIRONMENT:  # an environment failure is deployed again in the same trial
                measured(kept)
            return RunResult(kept, timings, e.kind, e.reason, e.log_tail, res)
        except KeyboardInterrupt as e:
            raise stopped(e) from None
        except Exception as e:  # noqa: BLE001 — as Optuna does: an error in one trial is that trial's FAIL
            if (stop := interrupt_of(e)) is not None:  # a stop that landed inside a pydantic dump
                raise stopped(stop) from None
            timings = deployment.timings if deployment else Timings(deploy_s=time.monotonic() - t0)
            res = deployment.resources if deployment else {}
            trace = "".join(traceback.format_exception(e))[-4000:]
            return RunResult([], timings, FailureKind.INTERNAL, f"{type(e).__name__}: {e}", trace, res)
        finally:
            if deployment is not None:
                t1 = time.monotonic()
                try:
                    self.teardown(deployment)
                finally:
                    deployment.timings.teardown_s = time.monotonic() - t1
                    if on_started is not None:  # the final record says what teardown stopped
                        on_started(json.loads(json.dumps(deployment.resources, default=str)))
            self._listener = None
