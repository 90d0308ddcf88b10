"""The knee search's aim (executors/measuring/knee_curve.py, ``_Search._aim``): the model's curve scaled by
measured levels.

The deployments here are closed-form stand-ins whose knee is known exactly (TTFT growing with load, tok/s/user
falling with it); the model's curve is the same shape off by a factor, of another shape, or of the wrong
direction — what a model that does not know the machine gives. The search must find the knee in fewer levels
when the curve is informative and keep every guarantee when it is not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from advisor.job import job_from_dict
from executors import place
from executors.measuring.knee_curve import PredictedCurve
from executors.measuring.loop import MeasurePlan, knee_of, search_levels
from executors.perf import default_params, predict_load
from executors.simulated.executor import predicted_plan
from search_spaces import SLO, Measurement, Workload, slo_violation

TTFT = SLO(metric="p90_ttft_ms", op="<=", value=2000.0)
TPU = SLO(metric="p90_tokens_per_s_per_user", op=">=", value=30.0)
WL = Workload(load_levels=[], max_levels=6, knee_tolerance=0.15, max_load=4096)

Shape = Callable[[float], dict[str, float]]


def deployment(ttft: Callable[[float], float], tpu: Callable[[float], float] | None = None) -> Shape:
    return lambda c: {"p90_ttft_ms": ttft(c), **({"p90_tokens_per_s_per_user": tpu(c)} if tpu else {})}


def probe(shape: Shape, seen: list[float]):
    def run(load: float) -> Measurement:
        seen.append(load)
        return Measurement(concurrency=int(load), source="simulated", gpus=1, num_requests=100, completed=100,
                           throughput_per_gpu=10.0 * load, error_rate=0.0, **shape(load))
    return run


def curve(shape: Shape, max_load: float = 4096, points: int = 64) -> PredictedCurve:
    loads = sorted({float(max(1, round(max_load ** (i / (points - 1))))) for i in range(points)})
    rows = [shape(c) for c in loads]
    return PredictedCurve(tuple(loads), tuple((k, tuple(r[k] for r in rows)) for k in rows[0]))


def true_knee(shape: Shape, slos: tuple[SLO, ...], top: int = 4096) -> int:
    ok = [c for c in range(1, top + 1)
          if all(s.excess(shape(float(c)).get(s.metric)) <= 0 for s in slos)]
    assert ok == list(range(1, len(ok) + 1))  # monotone: the knee is one number
    return ok[-1]


def model_knee(shape: Shape, slos: tuple[SLO, ...]) -> float:
    return float(true_knee(shape, slos))


def search(truth: Shape, model: Shape | None, slos: tuple[SLO, ...], start: float | None = None,
           wl: Workload = WL) -> tuple[list[Measurement], list[float]]:
    seen: list[float] = []
    start = start if start is not None else (model_knee(model, slos) if model else None)
    plan = MeasurePlan(slos, start, curve(model) if model else None)
    return search_levels(probe(truth, seen), wl, plan), seen


def check_guarantees(levels: list[Measurement], seen: list[float], slos: tuple[SLO, ...], knee: int) -> Measurement:
    """The knee is a measured level meeting every SLO, never above the true knee nor any failing level."""
    k = knee_of(levels)
    assert k is not None and k.concurrency in seen and slo_violation(list(slos), k) <= 0
    assert k.concurrency <= knee
    assert all(k.concurrency < m.concurrency for m in levels if slo_violation(list(slos), m) > 0)
    assert len(seen) == len(set(seen)) and len(seen) <= WL.max_levels
    return k


SHAPES: dict[str, Callable[[float], Shape]] = {  # each a family: f scales the load the deployment saturates at
    "linear": lambda f: deployment(lambda c: 300.0 + 20.0 * c / f),
    "steep": lambda f: deployment(lambda c: 200.0 + 1800.0 * (c / (300.0 * f)) ** 4),
    "two SLOs": lambda f: deployment(lambda c: 150.0 + 0.3 * c / f + 1e-4 * (c / f) ** 2,
                                     lambda c: 90.0 / (1.0 + c / (60.0 * f))),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("off", [0.5, 2.0, 3.0])
def test_a_model_off_by_a_factor_brackets_in_three_levels(shape: str, off: float) -> None:
    """The model's curve has the machine's shape but saturates ``off`` × later (or earlier): scaled by the first
    measured level, it puts the next level at the knee (usually on its other side: a margin of (1 + tol)^½), and the
    bracket closes within four levels — where widening steps from the same start take more."""
    slos = (TTFT, TPU) if shape == "two SLOs" else (TTFT,)
    truth, model = SHAPES[shape](1.0), SHAPES[shape](off)
    knee = true_knee(truth, slos)
    levels, seen = search(truth, model, slos)
    k = check_guarantees(levels, seen, slos, knee)
    assert k.concurrency >= knee / 1.15 and not k.flags
    met = [slo_violation(list(slos), m) <= 0 for m in levels]
    assert len(set(met[:3])) == 2, seen  # bracketed within three levels ...
    assert len(seen) <= 4, seen  # ... and closed within four
    _, before = search(truth, None, slos, start=model_knee(model, slos))
    assert len(seen) < len(before)  # the widening steps from the same start took more


@pytest.mark.parametrize("shape", SHAPES)
def test_a_right_model_still_takes_two_levels(shape: str) -> None:
    slos = (TTFT, TPU) if shape == "two SLOs" else (TTFT,)
    truth = SHAPES[shape](1.0)
    levels, seen = search(truth, truth, slos)
    assert len(seen) == 2 and knee_of(levels).concurrency == true_knee(truth, slos)


@pytest.mark.parametrize("start", [30.0, 200.0, 900.0])
def test_a_model_of_the_wrong_direction_falls_back_to_widening_steps(start: float) -> None:
    """A model whose TTFT falls with load disagrees with every measured level: no aim, the widening steps and
    bisection of before — the same levels as without a curve."""
    truth = SHAPES["linear"](1.0)
    wrong = deployment(lambda c: 1e6 / c)
    levels, seen = search(truth, wrong, (TTFT,), start=start)
    check_guarantees(levels, seen, (TTFT,), true_knee(truth, (TTFT,)))
    _, plain = search(truth, None, (TTFT,), start=start)
    assert seen == plain


def test_a_model_that_says_nothing_falls_back_to_widening_steps() -> None:
    """No prediction of the SLO's metric, or a non-monotone one: the search steps as before."""
    truth = SHAPES["linear"](1.0)
    _, plain = search(truth, None, (TTFT,), start=200.0)
    silent = PredictedCurve((1.0, 4096.0), (("p90_ttft_ms", (None, None)),))
    seen: list[float] = []
    search_levels(probe(truth, seen), WL, MeasurePlan((TTFT,), 200.0, silent))
    assert seen == plain
    bumpy = deployment(lambda c: 300.0 + 20.0 * c * (1.0 + 0.9 * math.sin(c / 7.0)))  # feasible loads with holes
    _, seen2 = search(truth, bumpy, (TTFT,), start=200.0)
    assert seen2 == plain


def test_known_levels_and_max_levels_hold_with_the_aim() -> None:
    """Known levels still bracket for free and do not count; the aim never measures a known load again; a
    search out of levels still answers with a measured level meeting the SLOs, flagged."""
    truth, model = SHAPES["steep"](1.0), SHAPES["steep"](3.0)
    knee = true_knee(truth, (TTFT,))
    known = [probe(truth, [])(c) for c in (8.0, 64.0, 1024.0)]
    seen: list[float] = []
    levels = search_levels(probe(truth, seen), WL, MeasurePlan((TTFT,), None, curve(model)), known=known)
    k = knee_of(levels)
    assert k is not None and knee / 1.15 <= k.concurrency <= knee
    assert not set(seen) & {8.0, 64.0, 1024.0} and len(seen) <= 3
    few = WL.model_copy(update={"max_levels": 2})
    levels, seen = search(SHAPES["linear"](1.0), SHAPES["linear"](0.05), (TTFT,), wl=few)
    assert len(seen) <= 2
    k = knee_of(levels)
    assert k is None or (k.concurrency <= true_knee(SHAPES["linear"](1.0), (TTFT,)) and k.concurrency in seen)


def test_short_levels_aim_too_and_the_knee_is_full_length() -> None:
    truth, model = SHAPES["two SLOs"](1.0), SHAPES["two SLOs"](2.5)
    slos = (TTFT, TPU)
    knee = true_knee(truth, slos)
    shorts = []
    for aim in (curve(model), None):
        full_seen: list[float] = []
        short_seen: list[float] = []
        levels = search_levels(probe(truth, full_seen), WL, MeasurePlan(slos, model_knee(model, slos), aim),
                               short=probe(truth, short_seen))
        k = knee_of(levels)
        assert k is not None and knee / 1.15 <= k.concurrency <= knee and "short" not in k.flags
        assert len(full_seen) == 2
        shorts.append(len(short_seen))
    assert shorts[0] < shorts[1]  # the aim spends fewer short levels than the widening steps


def test_rate_loads_aim_on_a_rate_curve() -> None:
    def at(rate: float) -> Measurement:  # the knee at 4 req/s; the model puts it at 8
        return Measurement(concurrency=64, request_rate=rate, source="simulated", gpus=1, num_requests=50,
                           completed=50, p90_ttft_ms=200.0 + 1800.0 * (rate / 4.0) ** 4)
    loads = tuple(sorted({float(f"{0.05 * (50 / 0.05) ** (i / 63):.3g}") for i in range(64)}))
    model = PredictedCurve(loads, (("p90_ttft_ms", tuple(200.0 + 1800.0 * (r / 8.0) ** 4 for r in loads)),))
    seen: list[float] = []

    def run(rate: float) -> Measurement:
        seen.append(rate)
        return at(rate)
    wl = Workload(load_levels=[], load_by="rate", max_load=50, max_levels=6)
    levels = search_levels(run, wl, MeasurePlan((TTFT,), 8.0, model))
    k = knee_of(levels)
    assert k is not None and 4.0 / 1.15 <= k.request_rate <= 4.0 and len(seen) <= 3


def test_the_plan_carries_the_models_curve() -> None:
    """``predicted_plan`` — where trials get their plan — carries the model's knee and its curve, and the model
    searched with its own plan closes in two levels, as it did from its knee alone."""
    job = job_from_dict({"name": "k", "preset": "h200-dsv3"})
    model, cfg = job.model_profile(), next(c for _, c in job.space.enumerate())
    topo = place(cfg, job.cluster)
    params = default_params(job.cluster.gpu)
    plan = predicted_plan(topo, model, job.workload, job.slos, params)
    assert plan.start and plan.curve is not None
    assert list(plan.curve.loads) == sorted(set(plan.curve.loads)) and plan.curve.loads[-1] == job.workload.max_load
    assert {n for n, _ in plan.curve.metrics} == {s.metric for s in job.slos if s.metric != "error_rate"}
    wl = job.workload.model_copy(update={"load_levels": []})
    levels = search_levels(lambda c: predict_load(topo, model, wl, c, params), wl, plan)
    assert len(levels) == 2 and knee_of(levels) is not None


def test_trials_are_aimed_by_a_model_measured_on_the_machine(tmp_path) -> None:
    """A trial's plan carries the curve when the model's parameters rest on a measurement of the machine (here a
    parameter file, as ``advisor calibrate`` writes); from the unmeasured defaults it does not, and the search
    takes the widening steps (``advisor.tune._aims``: why). The same first model pick under the same unknown
    machine, so the two trials' levels are the aimed and the stepped search's."""
    import db
    from advisor.tune import tune
    from benchmarks.truths import perturbed
    from db import queries
    from executors.simulated.executor import SimulatedExecutor, simulate_levels
    from search_spaces import TrialState

    params = default_params("H200")
    (tmp_path / "params.json").write_text(params.model_dump_json())
    loads = {}
    for name, executor in (("measured", {"kind": "simulated", "perf_params": str(tmp_path / "params.json")}),
                           ("defaults", {"kind": "simulated"})):
        job = job_from_dict({"name": name, "preset": "h200-qwen3-235b", "sampler": {"seed": 2},
                             "budget": {"trials": 1}, "executor": executor})
        truth = SimulatedExecutor(job.model_profile(), perturbed(params, 0, 2.0))
        url = f"sqlite:///{tmp_path / name}.db"
        tune(job, storage=url, executor=truth)
        database = db.connect(url)
        try:
            (trial,) = queries.list_trials(database, name, states=[TrialState.COMPLETE])
            loads[name] = [lv.measurement.concurrency for lv in queries.measurements(database, name)]
        finally:
            database.close()
        topo = place(trial.config, job.cluster)
        plan = predicted_plan(topo, job.model_profile(), job.workload, job.slos, params)
        aimed, stepped = (sorted(m.concurrency for m in simulate_levels(topo, truth.model, job.workload, p, truth.params))
                          for p in (plan, MeasurePlan(plan.slos, plan.start)))
        assert aimed != stepped  # this pick is one where the aim changes the levels
        assert sorted(loads[name]) == (aimed if name == "measured" else stepped)


def test_a_blown_up_ttft_scale_does_not_jump_past_the_widening() -> None:
    """The model's TTFT nearly flat over loads and far too low (a floor of 400 ms where the machine shows 2.6 s):
    the measured / predicted factor is huge, and the scaled curve met the bound only at a very low load — after
    78 and 62 failed, the search went to 13 (real study r4, trial 3: 78, 71, then 12; the knee was 54). From the
    second move on an aim goes at most the larger of twice the last move and the stepped widening step."""
    pts = [(12.0, 450.0), (46.0, 1506.0), (54.0, 1598.0), (62.0, 2300.0), (71.0, 2450.0), (78.0, 2600.0)]

    def ttft(c: float) -> float:  # log-log between the points, the end segments' slopes held beyond them
        i = min(max(next((j for j, (x, _) in enumerate(pts) if x >= c), len(pts) - 1), 1), len(pts) - 1)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 * (y1 / y0) ** (math.log(c / x0) / math.log(x1 / x0))
    truth, model = deployment(ttft), deployment(lambda c: 400.0 + 100.0 * (c / 78.0) ** 2)
    levels, seen = search(truth, model, (TTFT,), start=78.0)
    k = check_guarantees(levels, seen, (TTFT,), true_knee(truth, (TTFT,)))
    first, second, third = seen[:3]
    bound = max((1.0 + WL.knee_tolerance) ** 2, (first / second) ** 2)
    assert third >= second / bound - 1, seen  # not below what the widening would try
    assert len(seen) <= 4 and k.concurrency >= true_knee(truth, (TTFT,)) / 1.15


@pytest.mark.parametrize(("floor", "power", "most"), [(1700.0, 2.0, 5), (1800.0, 1.0, 6)])
def test_aims_stalling_on_one_side_double_their_move(floor: float, power: float, most: int) -> None:
    """The machine's TTFT sits on a floor near the bound (``floor`` ms, the bound reached at 31) where the model's
    rises from 200 ms to it at 74: scaled by each failed level, the model's curve falls faster below it than the
    machine does, so every aim lands just above the knee — the same-side stall of real study r4, trial 5 (74, 50,
    45, 38, 34, 31). From the third failed level a move not under half the one before is doubled: the floor of
    1,700 ms (quadratic) closes at the knee in 5 levels (74, 51, 41, 31, 36; 6 without the doubling), the floor of
    1,800 ms (linear) in 6 (74, 60, 51, 39, 36, 31; without it, 74, 60, 51, 45, 40, 36 found no level meeting
    the SLO)."""
    truth = deployment(lambda c: floor + (2000.0 - floor) * (c / 31.0) ** power)
    model = deployment(lambda c: 200.0 + 1800.0 * (c / 74.0) ** power)
    knee = true_knee(truth, (TTFT,))
    assert knee == 31 and model_knee(model, (TTFT,)) == 74
    levels, seen = search(truth, model, (TTFT,))
    k = check_guarantees(levels, seen, (TTFT,), knee)
    assert len(seen) <= most, seen
    assert k.concurrency >= knee / 1.15 and not k.flags, seen
    moves = [math.log(a / b) for a, b in zip(seen, seen[1:])]
    assert moves[2] >= moves[1], seen  # the fourth level: the stalled aim's move (not under half the last), doubled

