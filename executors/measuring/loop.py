"""The one measurement loop of every executor: what a trial's number means.

A trial answers "how much can this deployment serve while every SLO holds?". On one running deployment:

1. **Warm-up.** Before the first measured level, one discarded run at that level's load (its own prompts),
   so cold kernels and allocator growth are not measured as the deployment. Its requests' lifetime paces the
   first steady level (``workload.level_start: steady``, ``bench.steady_rate``); each level's paces the next.
2. **Knee search** (``workload.knee_search`` and at least one SLO besides the error rate): start at the
   predicted knee (``MeasurePlan.start``, from the calibrated performance model), step up while every SLO
   holds and down while one fails — each step wider than the last (factors (1 + tol), (1 + tol)², (1 + tol)⁴,
   …: a good prediction brackets in two levels, a poor one still in a few) — then bisect (geometric mean)
   until the bracket's high end is within ``knee_tolerance`` of its low end, at most ``max_levels`` levels.
   With the model's curve in the plan (``MeasurePlan.curve``), each step and bisection is instead aimed where
   that curve, scaled by the levels measured so far, crosses the SLO bounds (``_Search._aim``,
   ``executors.measuring.knee_curve``); the widening steps and bisection remain where the curve says nothing.
   The knee is the highest *measured* level meeting every SLO — never an interpolation.
3. **Fixed levels** (``workload.load_levels``) measured after, where the search did not already measure them.
4. **Close calls.** A level whose 95% interval of an SLO's metric straddles the bound is measured once more
   (fresh prompts) and the two runs are pooled before deciding (real executors; the model has no noise).
5. **Stalls.** A level during which no token reached the client for a long pause while requests were in flight
   (``bench_result.stall_of``: a just-in-time kernel compile) is measured once more and the run without the
   pause kept (``LevelProbe._unstall``), before the close-call check.

``search_levels`` is the algorithm over any ``probe(load) -> Measurement``; the simulated executor's probe is
the performance model, the real executors' is ``LevelProbe`` (``vllm bench serve`` + ``/metrics``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from executors.base import DeploymentFailed, FailureKind, Timings
from executors.measuring import bench, metrics, prompt_seeds
from executors.measuring.knee_curve import PredictedCurve
from executors.processes.procs import interrupt_of
from search_spaces import PREFIX_REUSE_LIMIT, SLO, Dataset, Measurement, Workload, slo_violation

log = logging.getLogger(__name__)

#: The smallest request rate (req/s) the knee search measures.
MIN_RATE = 0.05

Probe = Callable[[float], Measurement]

#: The farthest (as a factor) an aimed step goes *up* from the highest level meeting the SLOs before a bracket
#: exists: a level costs prompts in proportion to its load, and a curve scaled where the model's own curve is
#: flat can put the knee far too high. Down, the first aim goes as far as the curve says (lower levels are
#: cheaper); later moves are held to the widening (``_Search.widen``).
AIM_REACH = 8.0
# Before a bracket, from the third level on one side: an aim whose move is at least this share of the move before
# it is stalling, not converging (a secant's moves shrink faster), and its move is doubled (``_Search.widen``).
STALL = 0.5


@dataclass(frozen=True)
class MeasurePlan:
    """What the loop needs beyond the workload: the SLOs a level must meet and where the knee is predicted."""

    slos: tuple[SLO, ...] = ()
    start: float | None = None
    #: the model's SLO metrics over loads (``executors.simulated.executor.predicted_plan``): where the search aims its
    #: next level once it has measured one (``knee_curve``); None: widening steps only
    curve: PredictedCurve | None = None
    #: ``time.monotonic()`` after which no level starts (the tuner's ``--wall-time``): the search stops with
    #: ``WallTimeReached`` and its levels, as a SIGTERM stops it; None: no limit
    deadline: float | None = None

    @property
    def searchable(self) -> bool:
        """A knee needs a bound that load can break: any SLO but the error rate (which more load rarely moves)."""
        return any(s.metric != "error_rate" for s in self.slos)


class WallTimeReached(KeyboardInterrupt):
    """The wall time ran out between two levels of a trial. A KeyboardInterrupt, so that it takes SIGTERM's path
    through every executor (the levels measured so far kept, teardown run, the trial marked interrupted); the tuner
    then ends as at a budget (``advisor.tune``), printing its summary and succeeding. Raised before a level starts,
    never inside one, nor in teardown or recording: a limit ends a trial within one level's time."""


def feasible(slos: tuple[SLO, ...] | list[SLO], m: Measurement) -> bool:
    return slo_violation(list(slos), m) <= 0


# ------------------------------------------------------------------------------------------- the algorithm
class _Search:
    def __init__(self, probe: Probe, workload: Workload, plan: MeasurePlan,
                 judge: Callable[[Any], bool] | None = None, short: Probe | None = None) -> None:
        self.probe, self.wl, self.plan, self.short = probe, workload, plan, short
        self.brief: set[float] = set()  # loads whose level is a short (bracketing) run
        self.judge = judge or (lambda m: feasible(plan.slos, m))  # does a level meet every SLO?
        self.integer = workload.load_by == "concurrency"
        self.low = 1.0 if self.integer else MIN_RATE
        self.levels: dict[float, Measurement] = {}
        self._aimed: float | None = None  # the bracket's log width when ``_aim`` last chose a load inside one
        self._slow = 0  # aims inside the bracket in a row that did not halve it (in log load)

    def snap(self, x: float) -> float:
        x = min(max(x, self.low), self.wl.max_load)
        return float(max(1, round(x))) if self.integer else float(f"{x:.3g}")

    def measure(self, load: float, purpose: str) -> Measurement:
        if load not in self.levels:
            self.keep(load, self.run(load), purpose)
        return self.levels[load]

    def run(self, load: float, short: bool = False) -> Measurement:
        """One level from the probe (the short one for a bracketing level), unless the plan's deadline passed."""
        if self.plan.deadline is not None and time.monotonic() >= self.plan.deadline:
            raise WallTimeReached(f"stopped before the level at {load:g}")
        return self.short(load) if short and self.short else self.probe(load)

    def keep(self, load: float, m: Measurement, purpose: str, short: bool = False) -> None:
        if short:
            self.brief.add(load)
            m = m.model_copy(update={"flags": [*m.flags, "short"]})
        elif load in self.brief:  # the full-length run of a load bracketed short: the short run's verdict stays
            self.brief.discard(load)
            m.raw["short_run"] = {"completed": self.levels[load].completed, "met_slos": self.judge(self.levels[load])}
        self.levels[load] = m if m.purpose == purpose else m.model_copy(update={"purpose": purpose})

    def default_start(self) -> float:
        fixed = sorted(self.wl.load_levels)
        if fixed:
            return float(fixed[len(fixed) // 2])
        return 16.0 if self.integer else 1.0

    def within(self, lo: float) -> float:
        """The highest load whose bracket with ``lo`` is closed: ``lo × (1 + tol)``, rounded as loads are (an
        integer load one request above ``lo`` always closes it)."""
        top = lo * (1.0 + self.wl.knee_tolerance) * (1.0 + 1e-9)
        return max(float(round(top)), lo + 1.0) if self.integer else top

    def step(self, x: float, k: int, up: bool) -> float:
        """The k-th step away from the start: factor (1 + tol)^(2^k), at least one unit on an integer load."""
        f = (1.0 + self.wl.knee_tolerance) ** (2 ** k)
        y = self.snap(x * f if up else x / f)
        if y == x and self.integer:
            y = self.snap(x + 1 if up else x - 1)
        return y

    def knee(self, known: list[Measurement] | None = None) -> None:
        """Search the knee. ``known`` levels (already measured, e.g. the model's fixed levels) bracket it for
        free: the search starts between them and they do not count against ``max_levels``."""
        steps = self.knee_steps(known)
        ask = next(steps, None)
        first = True
        while ask is not None:
            load, short = ask
            m = self.run(load, short)
            if first and m.source == "measured":  # where a real search began, and why (the model, or the fixed levels)
                m.raw["knee_start"] = "model" if self.plan.start and not known else "default"
            first = False
            self.keep(load, m, "search", short)
            ask = next(steps, None)

    def knee_steps(self, known: list[Measurement] | None = None) -> Iterator[tuple[float, bool]]:
        """``knee`` as a generator: it yields each (load, short) it needs measured and goes on once the caller
        has ``keep``-ed that load's measurement (``search_many`` runs many searches in lockstep this way).

        With a ``short`` probe, the levels that step and bisect towards the knee are short runs; once the
        bracket closes, its low end (the knee) and then its high end are measured at full length. A full run
        that contradicts its short one means short runs misjudge this deployment: the search goes on at full
        length, bracketing on full-length verdicts only. The knee is always a full-length level."""
        ok = self.judge
        brief = self.short is not None
        lo: float | None = None
        hi: float | None = None
        judged = [(m, ok(m)) for m in known or []]
        for m, met in judged:
            self.levels.setdefault(m.load, m)
            if met:
                lo = m.load if lo is None else max(lo, m.load)
        for m, met in judged:
            if not met and (lo is None or m.load > lo):
                hi = m.load if hi is None else min(hi, m.load)
        k_up = k_down = 0
        closed = lo is not None and hi is not None and hi <= self.within(lo)
        x: float | None = None
        if lo is None and hi is None:
            x = self.snap(self.plan.start if self.plan.start else self.default_start())
        elif not closed:
            x, k_up, k_down = self._next(lo, hi, None, 0, 0)
        full = 0  # full-length levels measured: at most max_levels, and short ones at most as many again
        for _ in range(0 if closed or x is None else self.wl.max_levels * (2 if brief else 1)):
            assert x is not None
            if x not in self.levels or (not brief and x in self.brief):
                if not brief and full >= self.wl.max_levels:
                    break
                full += not brief
                yield x, brief
            m = self.levels[x]
            if ok(m):
                lo = x if lo is None else max(lo, x)
            else:
                hi = x if hi is None else min(hi, x)
            at_top = lo is not None and hi is None and lo >= self.wl.max_load
            if (lo is not None and hi is not None and lo < hi and hi <= self.within(lo)) or at_top:
                end = next((e for e in (lo, hi) if e is not None and e in self.brief), None)
                if end is None or full >= self.wl.max_levels:
                    closed = not at_top
                    break
                full += 1
                yield end, False  # the bracket's end, at full length
                x = end
                if ok(self.levels[end]) == (end == lo):
                    continue  # confirmed: the loop checks the other end
                # The full run contradicts the short one: short runs misjudge this deployment. The rest of the
                # search runs at full length, bracketing on full-length verdicts only.
                brief = False
                fulls = {v: ok(self.levels[v]) for v in self.levels if v not in self.brief}
                lo = max((v for v, met in fulls.items() if met), default=None)
                hi = min((v for v, met in fulls.items() if not met and (lo is None or v > lo)), default=None)
                if lo is not None and hi is not None and hi <= self.within(lo):
                    closed = True
                    break
            nxt, k_up, k_down = self._next(lo, hi, x, k_up, k_down)
            if nxt is None or (nxt in self.levels and (brief or nxt not in self.brief)):
                break  # at a bound, or noise sent the search back: it ends there
            x = nxt
        if lo is not None and lo in self.brief:  # out of levels before the knee was confirmed at full length
            if full < self.wl.max_levels:
                yield lo, False
            if lo in self.brief or not ok(self.levels[lo]):  # the highest full-length level meeting the SLOs
                fulls = [v for v in self.levels if v not in self.brief and ok(self.levels[v])]
                lo = max(fulls) if fulls else None
            closed = False
        if lo is None:
            lowest = min(self.levels)
            self._flag(lowest, "no-level-meets-slo")
            return
        self.levels[lo] = self.levels[lo].model_copy(update={"purpose": "knee"})
        if lo >= self.wl.max_load:
            self._flag(lo, "knee-at-max-load")
        elif not closed:
            self._flag(lo, "bracket-open")

    def _next(self, lo: float | None, hi: float | None, x: float | None, k_up: int,
              k_down: int) -> tuple[float | None, int, int]:
        """The next load to measure, and the step counters: where the model's curve scaled by the measured
        levels puts the knee (``_aim``), else bisect a bracket, else step away from the last load (``x``, or the
        bracket's one end) — None at a bound or with nothing to go from."""
        aim = self._aim(lo, hi)
        if aim is not None:
            return aim, k_up, k_down
        if lo is not None and hi is not None and lo < hi:
            mid = self.snap(math.sqrt(lo * hi))
            if self.integer and mid in (lo, hi):
                mid = lo + 1
            return mid, k_up, k_down
        if lo is None and hi is not None:  # nothing meets the SLOs yet: go down
            base = x if x is not None else hi
            if base <= self.low:
                return None, k_up, k_down
            return self.step(base, k_down, up=False), k_up, k_down + 1
        if lo is not None:  # everything met so far: go up
            base = x if x is not None else lo
            if base >= self.wl.max_load:
                return None, k_up, k_down
            return self.step(base, k_up, up=True), k_up + 1, k_down
        return None, k_up, k_down

    def _aim(self, lo: float | None, hi: float | None) -> float | None:
        """The next load from the plan's curve scaled by every level measured (``PredictedCurve.knee``: the knee
        estimate ``k``), chosen so that the level likely lands on the side that brackets or closes:

        - everything failed so far (``hi`` the lowest load): ``k / (1 + tol)^½``, expected to meet the SLOs (the
          margin is half the tolerance: the estimate is as often above the knee as below it, and a level within
          (1 + tol)^½ either side of the knee closes the bracket with the next);
        - everything met (``lo`` the highest): ``within(lo)`` (the step that closes the bracket) when ``k`` is
          below it, else ``k × (1 + tol)^½``, expected to fail, at most ``AIM_REACH × lo``;
        - either of these two held to the stepped search's widening (``widen``: no farther than it from the
          second move), and doubled where the aims stall on one side (``widen``: from the third level, a move
          not under half the one before);
        - a bracket: the load that closes it with the verdict the estimate expects (``within(lo)`` when
          ``k`` is that close to ``lo``, the lowest load whose ``within`` reaches ``hi`` when ``k`` is that
          close to ``hi``), else ``k / (1 + tol)^½``; two aimed steps in a row that did not halve the bracket
          (in log load) are followed by a bisection, so a poor curve cannot keep the bracket open for long.

        None (the widening steps and bisection of before) with no curve, no estimate, an estimate on the wrong
        side of what was measured (the model's direction disagrees with the levels), or a load already measured."""
        curve = self.plan.curve
        if curve is None or (lo is None and hi is None):
            return None
        bracket = lo is not None and hi is not None
        if bracket and self._aimed is not None:
            was, self._aimed = self._aimed, None
            self._slow = self._slow + 1 if math.log(hi / lo) > 0.5 * was else 0  # type: ignore[operator]
            if self._slow >= 2:
                self._slow = 0
                return None  # two aims in a row did not halve the bracket: bisect once
        k = curve.knee(self.plan.slos, list(self.levels.values()))
        if k is None:
            return None
        tol = self.wl.knee_tolerance
        if lo is None:
            assert hi is not None
            if k >= hi or hi <= self.low:
                return None
            y = self.widen(False, k / math.sqrt(1.0 + tol))
        elif hi is None:
            if k <= lo or lo >= self.wl.max_load:
                return None
            up = self.within(lo)
            y = self.widen(True, up, stall=False) if k <= up else self.widen(True, k * math.sqrt(1.0 + tol))
        else:
            up, down = self.within(lo), self.closes(lo, hi)
            if up >= down:  # any load between them closes the bracket either way
                y = self.snap(math.sqrt(up * down)) if self.integer else down
            elif k <= up:
                y = up
            elif k >= down:
                y = down
            else:
                y = self.no_worse_than_bisection(lo, hi, self.snap(k / math.sqrt(1.0 + tol)))
            if not lo < y < hi:
                return None
            self._aimed = math.log(hi / lo)
        if y in self.levels or (lo is not None and y <= lo) or (hi is not None and y >= hi):
            return None
        return y

    def widen(self, up: bool, y: float, stall: bool = True) -> float:
        """The aim ``y`` before a bracket exists, bounded by the stepped search's widening. ``side``: the levels
        measured so far, all on one side of the knee (all met: ``up``; all failed), nearest the knee last; a move
        is the log ratio from the nearest of them, and the stepped search's n-th move is (1 + tol)^(2^n).

        - The first move goes where the curve says (up: at most ``AIM_REACH``; down: any distance, lower levels
          are cheaper).
        - From the second on, a move is at most the larger of twice the last move and the stepped search's
          widening step: a curve whose scale factor is blown up cannot jump past what the widening steps would
          try (a real ~30B H200 trial: the model's P90 TTFT 70–94% low, the measured / predicted factor put
          the knee at 12 after 78 and 71 failed; the knee was 54, and the jump cost two levels).
        - From the third level on one side (two aims in a row landed where the start did), a move not under
          half the move before it is doubled (Illinois-style; ``stall``: not the step that closes a bracket). The
          re-scaled aims of a curve off in shape keep putting the knee just past the last level and stall there,
          a level per ~10% (a real ~30B H200 trial: 74, 50, 45, 38, 34, 31; with the doubling 74, 50, 45, 33,
          30), while aims that
          converge shrink their moves faster than halving (558, 107, 72, 65 on the perturbed truths of
          ``benchmarks/knee_search.py``), so the doubling leaves them alone. Deeper aims from the second level
          cost levels there (docs/measurement.md, "Knee search").
        - Nothing else bounds a move from below: forcing at least the widening step from the third move cost the
          perturbed runs levels in 29 of 360 runs and saved one (1,233 → 1,260 levels): where the re-scaled
          aims converge, a forced step overshoots."""
        side = sorted(self.levels) if up else sorted(self.levels, reverse=True)
        base = side[-1]
        d = abs(math.log(max(y, self.low) / base))
        if stall and len(side) >= 3 and d >= STALL * abs(math.log(side[-1] / side[-2])):
            d *= 2.0  # the aims stall on one side: double the move (still held to the widening below)
        if len(side) >= 2:
            last = abs(math.log(side[-1] / side[-2]))
            step = 2 ** (len(side) - 1) * math.log(1.0 + self.wl.knee_tolerance)
            d = min(d, max(2.0 * last, step))
        if up:
            d = min(d, math.log(AIM_REACH))
        return self.snap(base * math.exp(d) if up else base / math.exp(d))

    def no_worse_than_bisection(self, lo: float, hi: float, y: float) -> float:
        """``y`` moved, where it must be, so that a bracket bisection closes in two more levels is closed in two
        whatever the next verdict: into [hi / (1 + tol)², lo × (1 + tol)²]. Inside such a bracket the aim may
        guess where the knee is, but not at the cost of a level; a wider bracket (after a long widening step) keeps
        the aim as it is, since there the estimate saves more levels than the worst case costs.

        Replayed on a real ~30B H200 study re-judged without its first wave (``research/knee_replay.py``): trial 1
        measured 70 (failed) and 42 (met), and the aim then went 51, 59 and 64, five levels to close [59, 64] where
        bisection of [42, 70] needs two more; held to the window (53–55), it closes in four (trial 7 too: 5 → 4).
        On the 480 runs of ``benchmarks/knee_search.py`` it changes 6 searches and no level count. Applied to every
        bracket (the window for n levels (1 + tol)^(2^(n−1))) it cost those runs 24 levels."""
        width = math.log(hi / lo) / math.log(1.0 + self.wl.knee_tolerance)
        if width <= 2.0 or width > 4.0:
            return y  # one more level can close it; or the bracket is wide, where the estimate is worth more
        r = (1.0 + self.wl.knee_tolerance) ** 2  # either side of y must close with one more level
        low, high = hi / r, lo * r
        if self.integer:
            low, high = float(math.ceil(low)), float(math.floor(high))
        return min(max(y, low), high) if low <= high else y

    def closes(self, lo: float, hi: float) -> float:
        """The lowest load above ``lo`` whose bracket with ``hi`` is closed (``within(y) >= hi``), loads rounded as
        loads are."""
        y = max(self.snap(hi / (1.0 + self.wl.knee_tolerance)), self.snap(lo))
        while self.within(y) < hi and y < hi:
            y = self.snap(y + 1.0) if self.integer else self.snap(y * 1.01)
        while self.integer and y - 1 > lo and self.within(y - 1) >= hi:
            y -= 1
        return y

    def _flag(self, load: float, flag: str) -> None:
        m = self.levels[load]
        self.levels[load] = m.model_copy(update={"flags": [*m.flags, flag]})


def search_levels(probe: Probe, workload: Workload, plan: MeasurePlan, known: list[Measurement] | None = None,
                  short: Probe | None = None) -> list[Measurement]:
    """The knee search (when the workload asks and an SLO can be broken by load), then the fixed levels not
    yet measured; measured levels in the order they were measured (``known`` ones first). ``short``: a cheaper
    probe for the levels that only bracket the knee (``_Search.knee_steps``). A failure from ``probe`` — or a
    stop (Ctrl-C, SIGTERM) in the middle of a level — propagates with the levels measured so far as
    ``.measurements`` (a crash or a stop at the fourth level keeps three)."""
    s = _Search(probe, workload, plan, short=short)
    try:
        if workload.knee_search and plan.searchable:
            s.knee(known)
        for load in workload.load_levels:
            s.measure(s.snap(float(load)) if workload.load_by == "rate" else float(load), "fixed")
    except (DeploymentFailed, KeyboardInterrupt) as e:
        e.measurements = list(s.levels.values())  # type: ignore[union-attr]
        raise
    except Exception as e:  # a stop inside a pydantic dump is a stop too (``interrupt_of``)
        if (stop := interrupt_of(e)) is None:
            raise
        stop.measurements = list(s.levels.values())  # type: ignore[attr-defined]
        raise stop from None
    return list(s.levels.values())


def search_many(probe: Callable[[list[tuple[int, float]]], list[Any]], workload: Workload, plan: MeasurePlan,
                known: Sequence[list[Any]], judge: Callable[[Any], bool] | None = None) -> list[list[Any]]:
    """``search_levels`` for many deployments at once, in lockstep: ``probe`` gets every (deployment index, load)
    the searches need next and answers them together, which lets the model answer as arrays
    (``executors.perf.levels.Batch``). Deployment ``i``'s levels are exactly ``search_levels(probe_i, workload, plan,
    known[i])``'s (``test_perf_batch``). ``judge`` (default: ``feasible`` under the plan's SLOs) says whether a level
    meets every SLO; the batch model's lazy levels answer it from their table."""
    searches = [_Search(_not_probed, workload, plan, judge) for _ in known]
    pending: dict[int, tuple[Iterator[float], float]] = {}
    if workload.knee_search and plan.searchable:
        for i, (s, k) in enumerate(zip(searches, known, strict=True)):
            steps = s.knee_steps(k)
            ask = next(steps, None)
            if ask is not None:
                pending[i] = (steps, ask[0])
    while pending:  # no short probe here: every ask is full length
        asked = [(i, load) for i, (_, load) in pending.items()]
        for (i, load), m in zip(asked, probe(asked), strict=True):
            searches[i].keep(load, m, "search")
            steps = pending[i][0]
            nxt = next(steps, None)
            if nxt is None:
                del pending[i]
            else:
                pending[i] = (steps, nxt[0])
    for raw_load in workload.load_levels:  # the fixed levels the searches did not measure, as search_levels does
        asked = []
        for i, s in enumerate(searches):
            load = s.snap(float(raw_load)) if workload.load_by == "rate" else float(raw_load)
            if load not in s.levels:
                asked.append((i, load))
        for (i, load), m in zip(asked, probe(asked) if asked else [], strict=True):
            searches[i].keep(load, m, "fixed")
    return [list(s.levels.values()) for s in searches]


def _not_probed(_load: float) -> Measurement:
    raise AssertionError("search_many measures through its own probe")


def knee_of(measurements: list[Measurement]) -> Measurement | None:
    """The level the knee search answered with (``purpose == "knee"``), if any."""
    return next((m for m in measurements if m.purpose == "knee"), None)


# ------------------------------------------------------------------------------------- real deployments
@dataclass
class ServerView:
    """What the measure loop needs of one running instance: its role, API URL and (local) log path."""

    name: str
    role: str
    url: str
    log_path: str | None = None


@dataclass
class LevelRunner:
    """The executor-specific parts of measuring: running one bench run, and checking the servers live.

    ``run_level(spec) -> (saved JSON, wall seconds)`` raises ``bench.BenchFailed``;
    ``check_alive()`` raises ``DeploymentFailed(CRASH)`` when a server of the deployment has died;
    ``eplb(marks)`` reads EPLB balancedness logged since ``marks()`` (``None``: not available);
    ``tokenizer`` is the folder the load generator tokenizes with (``prompt_seeds`` picks random prompts' seeds
    from it; ``None``: levels keep their own seeds).
    """

    run_level: Callable[[bench.LevelSpec], tuple[dict[str, Any], float]]
    check_alive: Callable[[], None]
    servers: list[ServerView]
    marks: Callable[[], dict[str, int]] = lambda: {}
    eplb: Callable[[dict[str, int]], float | None] = lambda _m: None
    tokenizer: str | None = None


@dataclass
class _Run:
    data: dict[str, Any]
    deltas: list[metrics.InstanceDelta] | None  # None: a scrape failed, the counters are unknown
    eplb: float | None
    wall_s: float


@dataclass
class LevelProbe:
    """``probe(load)`` for a running deployment: warm-up first, bench + counters, intervals, close calls."""

    runner: LevelRunner
    workload: Workload
    plan: MeasurePlan
    gpus: int
    disaggregated: bool
    timings: Timings = field(default_factory=Timings)
    warm: bool = False
    requests_per_s: float | None = None  # the last run's, to size the next level (``min_level_s``)
    # (concurrency, mean request lifetime in s) of every closed-loop run so far: what paces a steady level
    lifetimes: list[tuple[float, float]] = field(default_factory=list)
    expert_routing: str | None = None  # what the servers route with (``ExpertRouting`` text), stored per level
    # the first KV blocks this deployment's random prompts have sent (``prompt_seeds``), across its levels
    starts: prompt_seeds.PromptStarts | None = None
    # the deployment's records by tokenizer folder (``Deployment.prompt_starts``), kept across ``measure`` calls
    records: dict[str, prompt_seeds.PromptStarts | None] | None = None

    def __post_init__(self) -> None:
        if self.starts is None and self.workload.dataset is Dataset.RANDOM and self.workload.fresh_prompts:
            tok = self.runner.tokenizer
            records = self.records if self.records is not None and tok else {}
            if tok not in records:
                records[tok] = prompt_seeds.PromptStarts.load(tok)
            self.starts = records[tok]

    def _spec(self, load: float, **kw: Any) -> bench.LevelSpec:
        """The level's run, its seed one whose random prompts are new to the deployment."""
        spec = bench.LevelSpec.for_load(self.workload, load, lifetimes=self.lifetimes, **kw)
        return prompt_seeds.fresh_spec(self.starts, self.workload, spec)

    def __call__(self, load: float, short: bool = False) -> Measurement:
        if not self.warm:
            self._warm_up(load)
        spec = self._spec(load, requests_per_s=self.requests_per_s, short=short)
        run = self._run(spec)
        m = self._measurement(spec, run)
        attempt, kept_flags, kept_raw = 1, list[str](), dict[str, Any]()
        if "stalled" in m.flags:
            spec, run, m, kept_raw = self._unstall(load, short, spec, run, m)
            attempt, kept_flags = 2, ["stall-remeasured"]
        close = [s for s in self.plan.slos if s.close_call(m)]
        if close:
            log.info("%s: %s inside the interval; measuring the level again", m.label(), ", ".join(map(str, close)))
            spec2 = self._spec(load, attempt=attempt, requests_per_s=self.requests_per_s, short=short)
            again = self._run(spec2)
            m2 = self._measurement(spec2, again)
            if "stalled" in m2.flags:  # the second run measured a pause too: it is run again before it is pooled
                _, again, _, note = self._unstall(load, short, spec2, again, m2, attempt=attempt + 1,
                                                  key="close_call_stall_remeasured")
                kept_flags = ["stall-remeasured"]
                kept_raw.update(note)
            pooled = _Run(bench.pool_results(run.data, again.data),
                          _sum_deltas(run.deltas, again.deltas), _min(run.eplb, again.eplb), run.wall_s + again.wall_s)
            m = self._measurement(spec, pooled, extra_flags=["remeasured"])
            m.raw["close_call"] = [str(s) for s in close]
        if kept_flags:
            m = m.model_copy(update={"flags": [*m.flags, *kept_flags], "raw": {**m.raw, **kept_raw}})
        if m.request_throughput:
            self.requests_per_s = m.request_throughput
        return m

    def _unstall(self, load: float, short: bool, spec: bench.LevelSpec, run: _Run, m: Measurement, attempt: int = 1,
                 key: str = "stall_remeasured") -> tuple[bench.LevelSpec, _Run, Measurement, dict[str, Any]]:
        """A level whose server stalled (``bench_result.stall_of``: a just-in-time kernel compile) measured the
        pause, not the deployment (H200: P50 TTFT 6.6 s at c=16 beside 276 ms at c=64). It is measured
        once more, fresh prompts — the compile has happened by then — and the run with the shorter pause is kept
        (flag ``stalled`` stays on it when both stalled); the other run's pause goes to ``raw.stall_remeasured``.
        On every platform: a pause on vLLM's CPU build distorts a level as much, and costs CI nothing there (the
        66 CPU levels of a CI run paused at most 0.72 s, 16.6× their reference at most).

        The same holds for a close call's second run (its note under ``key`` = ``close_call_stall_remeasured``):
        on a ~30B H200 study two of them paused 1.2 and 1.7 s, and pooled as they were they read P90
        tok/s/user 27.7 beside 31.2 in the clean first run of c = 93 (the pooled level failed the 30 bound the
        clean run met), and 23.9 beside 28.5 at c = 99, whose pooled miss sent the knee search's next aim down to
        39 for a knee at 87."""
        first = m.raw.get("longest_pause_s") or 0.0
        log.info("%s: the server stalled %.1f s during the level; measuring it again", m.label(), first)
        spec2 = self._spec(load, attempt=attempt, requests_per_s=self.requests_per_s, short=short)
        run2 = self._run(spec2)
        m2 = self._measurement(spec2, run2)
        second = m2.raw.get("longest_pause_s") or 0.0
        rerun = "stalled" not in m2.flags or second < first
        dropped, dropped_run = (m, run) if rerun else (m2, run2)
        note = {"first_pause_s": first, "rerun_pause_s": second, "kept": "rerun" if rerun else "first",
                "dropped": {"seed": (spec if rerun else spec2).seed, "p50_ttft_ms": dropped.p50_ttft_ms,
                            "whole_run_p50_ttft_ms": dropped.raw.get("p50_ttft_ms"),
                            "pause_reference_s": dropped.raw.get("pause_reference_s"),
                            "bench_wall_s": dropped_run.wall_s}}
        if "stalled" in m2.flags:
            log.warning("%s: the server stalled again (%.1f s); the run with the shorter pause is kept, flagged "
                        "stalled", m.label(), second)
        return (spec2, run2, m2, {key: note}) if rerun else (spec, run, m, {key: note})

    def short(self, load: float) -> Measurement:
        """A level that only brackets the knee: fewer prompts (``Workload.bracket_prompts_per_concurrency``)."""
        return self(load, short=True)

    def _warm_up(self, load: float) -> None:
        self.warm = True
        spec = self._spec(load, warmup=True)
        if spec.num_prompts <= 0:
            return
        t0 = time.monotonic()
        self.runner.check_alive()
        try:
            data, _ = self.runner.run_level(spec)
        except bench.BenchFailed as e:
            self.runner.check_alive()
            raise _bench_failure(f"warm-up at {spec.name}", e) from None
        finally:
            self.timings.warmup_s += time.monotonic() - t0
        self._learn(spec, data)  # the first level's pace and length come from its warm-up

    def _learn(self, spec: bench.LevelSpec, data: dict[str, Any]) -> None:
        """What a closed-loop run says of the next levels: its requests' lifetime (``bench.steady_rate``) and,
        until a level has said it, its request rate (``Workload.min_level_s``)."""
        if spec.request_rate is not None:
            return
        life = bench.mean_lifetime_s(data)
        if life is not None:
            self.lifetimes.append((float(spec.concurrency), life))
        rps = data.get("request_throughput")
        if self.requests_per_s is None and isinstance(rps, (int, float)) and rps > 0:
            self.requests_per_s = float(rps)

    def _run(self, spec: bench.LevelSpec) -> _Run:
        r = self.runner
        r.check_alive()
        before = {s.name: metrics.scrape(s.url) for s in r.servers}
        marks = r.marks()
        try:
            data, wall = r.run_level(spec)
        except bench.BenchFailed as e:
            r.check_alive()  # a server that died explains the failed benchmark better
            raise _bench_failure(spec.name, e) from None
        r.check_alive()
        self._learn(spec, data)
        after = {s.name: metrics.scrape(s.url) for s in r.servers}
        known = all(before[s.name] is not None and after[s.name] is not None for s in r.servers)
        deltas = [metrics.InstanceDelta(s.name, s.role, metrics.delta(before[s.name], after[s.name]))
                  for s in r.servers] if known else None
        return _Run(data, deltas, r.eplb(marks), wall)

    def _measurement(self, spec: bench.LevelSpec, run: _Run, extra_flags: list[str] | None = None) -> Measurement:
        m = bench.parse_result(run.data, concurrency=spec.concurrency, gpus=self.gpus,
                               request_rate=spec.request_rate)
        flags = [*m.flags, *(extra_flags or [])]
        raw = dict(m.raw)
        if run.deltas is None:
            stats: dict[str, Any] = {"dp_imbalance": None, "prefix_cache_hit_rate": None,
                                     "kv_transfer_tokens": None, "preemptions": None}
            flags.append("counters-unknown")
        else:
            stats = metrics.level_stats(run.deltas, disaggregated=self.disaggregated)
            raw["metrics"] = metrics.per_instance_summary(run.deltas)
            engine = metrics.engine_times(i.delta for i in run.deltas)
            if engine is not None:
                raw["engine"] = engine
            hit = stats.get("prefix_cache_hit_rate")
            if hit is not None and hit > PREFIX_REUSE_LIMIT and not self.workload.reuses_prefixes:
                flags.append("prefix-cache-reuse")
        stats["eplb_balancedness"] = run.eplb
        stats["expert_routing"] = self.expert_routing
        raw["bench_wall_s"] = run.wall_s
        raw["seed"] = spec.seed
        if spec.pace_rps is not None:
            raw["pace_rps"] = spec.pace_rps
        return m.model_copy(update={**stats, "flags": flags, "raw": raw})


def _bench_failure(where: str, e: bench.BenchFailed) -> DeploymentFailed:
    """The level's failure: the environment's when the client failed for its environment (retried, never the
    configuration's failure nor a trial of the budget), else the benchmark's."""
    kind = FailureKind.ENVIRONMENT if e.environment else FailureKind.BENCHMARK
    return DeploymentFailed(kind, f"{where}: {e.reason}", e.tail)


def _sum_deltas(a: list[metrics.InstanceDelta] | None,
                b: list[metrics.InstanceDelta] | None) -> list[metrics.InstanceDelta] | None:
    if a is None or b is None:
        return None
    out = []
    for x, y in zip(a, b, strict=True):
        d = dict(x.delta)
        for k, v in y.delta.items():
            d[k] = d.get(k, 0.0) + v
        out.append(metrics.InstanceDelta(x.name, x.role, d))
    return out


def _min(a: float | None, b: float | None) -> float | None:
    vals = [v for v in (a, b) if v is not None]
    return min(vals) if vals else None


def measure_deployment(runner: LevelRunner, workload: Workload, plan: MeasurePlan, *, gpus: int,
                       disaggregated: bool, timings: Timings, expert_routing: str | None = None,
                       short_levels: bool = True,
                       prompt_starts: dict[str, prompt_seeds.PromptStarts | None] | None = None) -> list[Measurement]:
    """Warm-up, knee search and fixed levels on one running deployment; ``timings`` gets the warm-up and
    measuring seconds. A failure raises ``DeploymentFailed`` carrying the levels measured before it.
    ``expert_routing``: what the executor started the servers with, stored with every level. ``short_levels``:
    bracket the knee with short levels (``Workload.bracket_prompts_per_concurrency``) — off on vLLM's CPU
    build, where a level's seconds go to starting the client and the tiny model's steps, not to its requests.
    ``prompt_starts``: the deployment's record of the random prompts it was sent (``Deployment.prompt_starts``),
    so that this call's seeds avoid the earlier calls' prompts too."""
    t0, warm0 = time.monotonic(), timings.warmup_s
    probe = LevelProbe(runner, workload, plan, gpus, disaggregated, timings, expert_routing=expert_routing,
                       records=prompt_starts)
    try:
        short = short_levels and workload.bracket_prompts_per_concurrency > 0
        return search_levels(probe, workload, plan, short=probe.short if short else None)
    finally:  # both add up over calls on one deployment (a second workload measured on the same servers)
        timings.measure_s += time.monotonic() - t0 - (timings.warmup_s - warm0)
