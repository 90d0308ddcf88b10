"""The simulated executor: the performance model (``executors.perf``) behind the Executor contract.

Nothing is launched: ``deploy`` returns a Deployment without processes, ``measure`` predicts one
Measurement per load level (``source="simulated"``), ``teardown`` has nothing to stop. It is the
reference implementation of the contract, the executor of what-if studies on clusters we do not have,
and the prior that ranks candidates before real trials.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executors.base import Deployment, Executor
from executors.measuring.knee_curve import PredictedCurve
from executors.measuring.loop import MIN_RATE, MeasurePlan, knee_of, search_levels, search_many
from executors.perf import (
    MODEL_VERSION,
    Batch,
    PerfParams,
    collector_paused,
    default_params,
    predict,
    predict_load,
    same_lengths,
)
from executors.perf.burst import predict_as_sent
from executors.topology import Topology
from search_spaces import SLO, Measurement, ModelProfile, Workload

__all__ = ["SimulatedExecutor", "default_params"]


class SimulatedExecutor(Executor):
    kind = "simulated"
    engine_version = MODEL_VERSION
    simulated = True

    def __init__(self, model: ModelProfile, params: PerfParams | None = None, params_source: str | None = None) -> None:
        self.model = model
        self.params = params  # None: the defaults of the cluster's GPU kind, chosen at deploy time
        #: What the parameters rest on (a hardware profile, a parameter file, the defaults): every prediction
        #: carries it in ``raw["params"]``.
        self.params_source = params_source or ("given parameters" if params is not None else None)

    def params_for(self, topology: Topology) -> PerfParams:
        return self.params or default_params(topology.cluster.gpu)

    def deploy(self, topology: Topology) -> Deployment:
        return Deployment(topology=topology, url=None, resources={}, handle=self.params_for(topology))

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        params = deployment.handle
        if not isinstance(params, PerfParams):
            params = self.params_for(deployment.topology)
        levels = simulate_levels(deployment.topology, self.model, workload, plan or MeasurePlan(), params)
        source = self.params_source or f"defaults for {deployment.topology.cluster.gpu}, unmeasured"
        for m in levels:
            m.raw["params"] = source
        return levels

    def teardown(self, deployment: Deployment) -> None:
        return None


def simulate_levels(topology: Topology, model: ModelProfile, workload: Workload, plan: MeasurePlan,
                    params: PerfParams) -> list[Measurement]:
    """The measure loop of ``executors.measuring.loop`` with the performance model as the probe."""
    return search_levels(lambda load: predict_load(topology, model, workload, load, params), workload, plan)


def model_levels(topology: Topology, model: ModelProfile, workload: Workload, plan: MeasurePlan,
                 params: PerfParams, *, tolerance: float = 0.05, max_levels: int = 16,
                 as_sent: bool = False) -> list[Measurement]:
    """The model's own answer for a candidate, as a trial would get it: its fixed levels, then a knee search
    (to ``tolerance``, at most ``max_levels``) that starts at ``plan.start`` or, without one, inside the bracket
    the fixed levels already give (they cost nothing more and do not count against ``max_levels``), which keeps
    the search short and its answer close — a ranking of thousands of candidates runs this. ``as_sent``: each
    concurrency level predicted as the benchmark will send it (``levels_as_sent``), for one real trial."""
    fixed: list[Measurement] = []
    if workload.load_levels and workload.load_by == "concurrency":
        fixed = (levels_as_sent(topology, model, workload, params, workload.load_levels) if as_sent
                 else predict(topology, model, workload, params))
    if not (plan.searchable and workload.knee_search):
        return fixed or simulate_levels(topology, model, workload, plan, params)
    wl = _search_only(workload, tolerance, max_levels)
    if as_sent and wl.load_by == "concurrency":
        level = lambda load: levels_as_sent(topology, model, wl, params, [load])[0]  # noqa: E731
    else:
        level = lambda load: predict_load(topology, model, wl, load, params)  # noqa: E731
    if plan.start or not fixed:
        return fixed + search_levels(level, wl, plan)
    return search_levels(level, wl, plan, known=fixed)


def levels_as_sent(topology: Topology, model: ModelProfile, workload: Workload, params: PerfParams,
                   loads: Sequence[float]) -> list[Measurement]:
    """Concurrency levels as ``vllm bench serve`` sends them (``executors.perf.burst``): the workload's requests
    per level, the first wave left out of the latencies as the bench parser leaves it out. What a real trial's
    levels are, where the steady closed loop (``predict``) is what the guide ranks thousands of candidates by."""
    cs = [max(1, int(c)) for c in loads]
    return predict_as_sent(topology, model, workload, params, cs, None, [True] * len(cs))


def model_levels_many(topologies: Sequence[Topology], model: ModelProfile, workload: Workload, plan: MeasurePlan,
                      params: PerfParams, *, tolerance: float = 0.05, max_levels: int = 16,
                      lazy: bool = False) -> list[list[Any]]:
    """``model_levels`` of each of ``topologies``, the same levels, with the model answering every deployment's
    next level at once as arrays (``executors.perf.levels.Batch``; its searches run in lockstep). Where the lockstep
    search does not reach (a rate workload, no fixed levels, a predicted start, no knee to search) each deployment
    takes ``model_levels``. ``lazy``: the batch's levels are ``perf.measurement.LazyLevel``s, each built as its
    Measurement only when asked (a ranking keeps one level per candidate)."""
    if not (workload.load_levels and workload.load_by == "concurrency" and plan.searchable
            and workload.knee_search and not plan.start and topologies):
        return [model_levels(t, model, workload, plan, params, tolerance=tolerance, max_levels=max_levels)
                for t in topologies]
    with collector_paused():
        batch = Batch(topologies, model, workload, params)
        loads = [float(c) for c in workload.load_levels]
        fixed = batch.predict([(i, c) for i in range(len(topologies)) for c in loads], lazy=lazy)
        known = [fixed[i * len(loads):(i + 1) * len(loads)] for i in range(len(topologies))]
        wl = _search_only(workload, tolerance, max_levels)
        # the searches' levels are made as such; fixed levels left after them (none: ``wl`` has none) would be copied
        judge = (lambda lv: lv.meets(plan.slos)) if lazy else None
        return search_many(lambda asked: batch.predict(asked, wl, "search", lazy), wl, plan, known, judge)


_SEARCH_ONLY: dict[tuple[int, float, int], tuple[Workload, Workload]] = {}


def _search_only(wl: Workload, tolerance: float, max_levels: int) -> Workload:
    """``wl`` without fixed levels and with the given search bounds; one copy per workload object (the model's
    derived-quantity cache is keyed by identity)."""
    key = (id(wl), tolerance, max_levels)
    hit = _SEARCH_ONLY.get(key)
    if hit is None or hit[0] is not wl:
        if len(_SEARCH_ONLY) > 64:
            _SEARCH_ONLY.clear()
        hit = _SEARCH_ONLY[key] = (wl, wl.model_copy(update={"load_levels": [], "knee_search": True,
                                                             "knee_tolerance": tolerance, "max_levels": max_levels}))
        same_lengths(hit[1], wl)
    return hit[1]


def predicted_curve(topology: Topology, model: ModelProfile, workload: Workload, slos: Sequence[SLO],
                    params: PerfParams, points: int = 64, as_sent: bool = False) -> PredictedCurve | None:
    """The model's SLO metrics of ``topology`` over ``points`` loads spaced geometrically from the lowest to
    ``workload.max_load`` (concurrencies: one array evaluation, or ``as_sent`` one simulated level each — 2 s for
    the ~30B shape's 52 loads up to 1,024 on this project's 2-core machine; rates: one prediction each): what the
    knee search scales by its measured levels to aim (``executors.measuring.knee_curve``). None without an SLO load can
    break."""
    names = sorted({s.metric for s in slos if s.metric != "error_rate"})
    if not names:
        return None
    top = float(workload.max_load)
    if workload.load_by == "concurrency":
        loads = sorted({float(max(1, round(top ** (i / (points - 1))))) for i in range(points)})
        levels = (levels_as_sent(topology, model, workload, params, loads) if as_sent
                  else predict(topology, model, workload, params, [int(c) for c in loads]))
    else:
        loads = sorted({float(f"{MIN_RATE * (top / MIN_RATE) ** (i / (points - 1)):.3g}") for i in range(points)})
        levels = [predict_load(topology, model, workload, r, params) for r in loads]
    return PredictedCurve(tuple(loads), tuple((n, tuple(getattr(m, n, None) for m in levels)) for n in names))


def predicted_plan(topology: Topology, model: ModelProfile, workload: Workload, slos: Sequence[SLO],
                   params: PerfParams, levels: list[Measurement] | None = None, as_sent: bool = False) -> MeasurePlan:
    """A measure plan for ``topology`` with the model's curve: its SLOs, the model's knee where the search starts
    and the curve it aims by (``predicted_curve``). ``benchmarks/knee_search.py`` searches with it; trials do where
    the model is measured (``advisor.tune._aims`` says why not always). ``levels``: the model's own, when made;
    ``as_sent``: levels predicted as the benchmark will send them (``levels_as_sent``)."""
    plan = MeasurePlan(tuple(slos))
    if not plan.searchable:
        return plan
    if levels is None:
        levels = model_levels(topology, model, workload, plan, params, as_sent=as_sent)
    knee = knee_of(levels)
    return MeasurePlan(plan.slos, knee.load if knee is not None else None,
                       predicted_curve(topology, model, workload, slos, params, as_sent=as_sent))


def predicted_knee(topology: Topology, model: ModelProfile, workload: Workload, plan: MeasurePlan,
                   params: PerfParams, as_sent: bool = False) -> float | None:
    """Where the model puts the knee of ``topology`` under ``plan``'s SLOs (to 5%): where a real knee search
    starts (``as_sent``: its levels predicted as sent). None when no load meets the SLOs in the model or the plan
    has no SLO that load can break."""
    if not plan.searchable:
        return None
    knee = knee_of(model_levels(topology, model, workload, plan, params, as_sent=as_sent))
    return knee.load if knee is not None else None
