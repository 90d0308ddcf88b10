"""The valid candidates of a search space on one model and cluster, found role by role.

A candidate breaks the rules of its roles plus those of the whole deployment (GPUs fit, placement), and the
latter depend only on each role's footprint (instances × GPUs per instance). So each role's choices are
built and checked once, and a disaggregated candidate is a pair of role rows whose footprints fit together:
a space of millions of candidates costs thousands of checks, and questions about it ("is there a valid,
unmeasured candidate with these parameters?") are answered with bitsets, in microseconds.

That is what lets the sampler see the valid space (``advisor.proposers.valid_sampler``): every parameter it proposes
is steered to a choice that still has a valid, unmeasured completion, so an invalid candidate or a repeat
never costs a trial, and the study knows when every valid candidate has been measured.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from search_spaces.cluster import ClusterSpec
from search_spaces.deployment import DeploymentConfig, Mode, Role, RoleConfig
from search_spaces.model_profile import ModelProfile
from search_spaces.rules import deployment_violations, role_violations
from search_spaces.space import SearchSpace

Params = dict[str, Any]
#: Past this many choices of one role, the space is not enumerated (the sampler then checks each proposal).
ROLE_LIMIT = 200_000


class SpaceTooLarge(ValueError):
    pass


def _cell(name: str, value: Any) -> tuple[str, str]:
    return name, json.dumps(value)  # True and 1 are different choices


def params_key(params: Params) -> str:
    """A candidate's identity by its parameters (``build`` is one-to-one, so it is the configuration's)."""
    return json.dumps(params, sort_keys=True, default=str)


@dataclass
class _Rows:
    """One role's choices: parameters, violated rules, footprint; bitsets by (name, value) and footprint."""

    params: list[Params] = field(default_factory=list)
    configs: list[RoleConfig] = field(default_factory=list)  # each row built (frozen: candidates share them)
    rules: list[frozenset[str]] = field(default_factory=list)
    footprints: list[tuple[int, int]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)  # params_key → row
    cells: dict[tuple[str, str], int] = field(default_factory=dict)
    by_footprint: dict[tuple[int, int], int] = field(default_factory=dict)
    valid: int = 0  # rows breaking no role rule
    reasons: dict[str, str] = field(default_factory=dict)

    def add(self, params: Params, role: RoleConfig, violations: list[Any]) -> None:
        i = len(self.params)
        bit = 1 << i
        self.params.append(params)
        self.configs.append(role)
        self.rules.append(frozenset(v.rule for v in violations))
        fp = (role.instances, role.gpus_per_instance)
        self.footprints.append(fp)
        self.index[params_key(params)] = i
        for name, value in params.items():
            c = _cell(name, value)
            self.cells[c] = self.cells.get(c, 0) | bit
        self.by_footprint[fp] = self.by_footprint.get(fp, 0) | bit
        if not violations:
            self.valid |= bit
        for v in violations:
            self.reasons.setdefault(v.rule, v.reason)

    def matching(self, prefix: Params) -> int:
        """Rows whose parameters include every (name, value) of ``prefix`` (names of this role only)."""
        bits = self.valid
        for name, value in prefix.items():
            bits &= self.cells.get(_cell(name, value), 0)
            if not bits:
                break
        return bits


def _bits(x: int) -> Iterator[int]:
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


class ValidSpace:
    """The valid candidates of ``space`` on ``model`` and ``cluster``; ``taken`` sets are of ``params_key``s."""

    def __init__(self, space: SearchSpace, model: ModelProfile, cluster: ClusterSpec, max_model_len: int,
                 role_limit: int = ROLE_LIMIT) -> None:
        self.space = space
        self.cluster = cluster
        self.roles: dict[Role, _Rows] = {}
        needed = ([Role.MIXED] if Mode.AGGREGATED in space.modes else []) + \
            ([Role.PREFILL, Role.DECODE] if Mode.DISAGGREGATED in space.modes else [])
        for role in needed:
            rows = self.roles[role] = _Rows()
            for params, cfg in space.role_rows(role):
                if len(rows.params) >= role_limit:
                    raise SpaceTooLarge(f"{role.value}: more than {role_limit:,} choices")
                rows.add(params, cfg, role_violations(cfg, model, cluster, max_model_len))
        self._fit: dict[tuple[tuple[int, int], ...], frozenset[str]] = {}
        self._fit_reasons: dict[str, str] = {}
        self._where: dict[str, tuple[Role, int, int] | None] = {}
        self.candidates, self.valid, self.broken = self._count()
        self.reasons = {**self._fit_reasons}
        for rows in self.roles.values():
            for rule, reason in rows.reasons.items():
                self.reasons.setdefault(rule, reason)

    # ------------------------------------------------------------------------------------ structure
    def fits(self, *footprints: tuple[int, int]) -> frozenset[str]:
        """The deployment-wide rules a combination of role footprints breaks (cached)."""
        got = self._fit.get(footprints)
        if got is None:
            violations = deployment_violations(list(footprints), self.cluster)
            for v in violations:
                self._fit_reasons.setdefault(v.rule, v.reason)
            got = self._fit[footprints] = frozenset(v.rule for v in violations)
        return got

    def _groups(self, rows: _Rows, bits: int | None = None) -> Counter[tuple[frozenset[str], tuple[int, int]]]:
        pick = range(len(rows.params)) if bits is None else _bits(bits)
        return Counter((rows.rules[i], rows.footprints[i]) for i in pick)

    def _count(self) -> tuple[int, int, Counter[str]]:
        """Candidates, valid ones, and per rule how many candidates break it (once per candidate)."""
        total = valid = 0
        broken: Counter[str] = Counter()

        def tally(n: int, rules: frozenset[str]) -> None:
            nonlocal total, valid
            total += n
            if rules:
                broken.update({r: n for r in rules})
            else:
                valid += n

        if Role.MIXED in self.roles:
            for (rules, fp), n in self._groups(self.roles[Role.MIXED]).items():
                tally(n, rules | self.fits(fp))
        if Role.PREFILL in self.roles:
            pre, dec = self._groups(self.roles[Role.PREFILL]), self._groups(self.roles[Role.DECODE])
            for ((rp, fp), n), ((rd, fd), m) in product(pre.items(), dec.items()):
                tally(n * m, rp | rd | self.fits(fp, fd))
        return total, valid, broken

    # ------------------------------------------------------------------------------------ questions
    @staticmethod
    def _split(prefix: Params) -> tuple[str | None, Params, Params, Params]:
        mode = prefix.get("mode")
        part: dict[str, Params] = {"mixed": {}, "prefill": {}, "decode": {}}
        for name, value in prefix.items():
            if name != "mode":
                part[name.split("_", 1)[0]][name] = value
        return mode, part["mixed"], part["prefill"], part["decode"]

    def _pairs(self, pre_bits: int, dec_bits: int) -> Iterator[tuple[int, int, int]]:
        """(prefill footprint bits, decode footprint bits, count) of the footprint pairs that fit."""
        pre, dec = self.roles[Role.PREFILL], self.roles[Role.DECODE]
        for fp, fbits in pre.by_footprint.items():
            p = pre_bits & fbits
            if not p:
                continue
            for fd, dbits in dec.by_footprint.items():
                d = dec_bits & dbits
                if d and not self.fits(fp, fd):
                    yield p, d, p.bit_count() * d.bit_count()

    def count(self, prefix: Params | None = None, taken: Iterable[str] = ()) -> int:
        """Valid candidates whose parameters include ``prefix``, less those in ``taken``."""
        prefix = prefix or {}
        mode, mixed, pre, dec = self._split(prefix)
        n = 0
        taken_rows = [self._located(k) for k in taken]
        if Role.MIXED in self.roles and mode in (None, Mode.AGGREGATED.value) and not pre and not dec:
            rows = self.roles[Role.MIXED]
            bits = self._agg_bits(rows.matching(mixed))
            n += bits.bit_count()
            n -= sum(1 for t in taken_rows if t and t[0] == Role.MIXED and bits >> t[1] & 1)
        if Role.PREFILL in self.roles and mode in (None, Mode.DISAGGREGATED.value) and not mixed:
            pb, db = self.roles[Role.PREFILL].matching(pre), self.roles[Role.DECODE].matching(dec)
            n += sum(c for _, _, c in self._pairs(pb, db))
            n -= sum(1 for t in taken_rows if t and t[0] == Role.PREFILL and pb >> t[1] & 1 and db >> t[2] & 1
                     and not self.fits(self.roles[Role.PREFILL].footprints[t[1]],
                                       self.roles[Role.DECODE].footprints[t[2]]))
        return n

    def _agg_bits(self, bits: int) -> int:
        rows = self.roles[Role.MIXED]
        for fp, fbits in rows.by_footprint.items():
            if self.fits(fp):
                bits &= ~fbits
        return bits

    def _located(self, key: str) -> tuple[Role, int, int] | None:
        if key not in self._where:
            self._where[key] = self.locate(key)
        return self._where[key]

    def locate(self, key: str) -> tuple[Role, int, int] | None:
        """(role, row, decode row) of a candidate's ``params_key``; None if not in this space."""
        params = json.loads(key)
        mode, mixed, pre, dec = self._split(params)
        if mode == Mode.AGGREGATED.value and Role.MIXED in self.roles:
            i = self.roles[Role.MIXED].index.get(params_key(mixed))
            return None if i is None else (Role.MIXED, i, -1)
        if mode == Mode.DISAGGREGATED.value and Role.PREFILL in self.roles:
            i = self.roles[Role.PREFILL].index.get(params_key(pre))
            j = self.roles[Role.DECODE].index.get(params_key(dec))
            return None if i is None or j is None else (Role.PREFILL, i, j)
        return None

    def feasible(self, prefix: Params, taken: set[str]) -> bool:
        """Is there a valid candidate with ``prefix`` that is not in ``taken``?"""
        return self.count(prefix, taken) > 0

    def sample(self, rng: random.Random, taken: set[str], tries: int = 64) -> Params | None:
        """A uniformly random valid candidate not in ``taken`` (the mode first, uniformly among those left)."""
        modes = [m for m in (Mode.AGGREGATED.value, Mode.DISAGGREGATED.value) if self.feasible({"mode": m}, taken)]
        if not modes:
            return None
        mode = rng.choice(modes)
        for _ in range(tries):
            params = self._draw(mode, rng)
            if params_key(params) not in taken:
                return params
        left = [p for p in self.iter_valid(mode) if params_key(p) not in taken]  # nearly all taken: list them
        return rng.choice(left) if left else None

    def _draw(self, mode: str, rng: random.Random) -> Params:
        if mode == Mode.AGGREGATED.value:
            rows = self.roles[Role.MIXED]
            bits = list(_bits(self._agg_bits(rows.valid)))
            return {"mode": mode, **rows.params[rng.choice(bits)]}
        pre, dec = self.roles[Role.PREFILL], self.roles[Role.DECODE]
        pairs = list(self._pairs(pre.valid, dec.valid))
        p, d, _ = rng.choices(pairs, weights=[c for _, _, c in pairs])[0]
        return {"mode": mode, **pre.params[rng.choice(list(_bits(p)))], **dec.params[rng.choice(list(_bits(d)))]}

    def iter_valid(self, mode: str | None = None) -> Iterator[Params]:
        """Every valid candidate's parameters (in ``build``'s order of parameters)."""
        for m, i, j in self._valid_rows(mode):
            yield self._params_at(m, i, j)

    def iter_valid_configs(self) -> Iterator[tuple[Params, DeploymentConfig]]:
        """``iter_valid`` with each candidate, assembled from its role rows as built once (``space.build`` gives
        an equal candidate from the parameters, at ten times the cost: it builds and checks each role again)."""
        for m, i, j in self._valid_rows():
            yield self._params_at(m, i, j), self._config_at(m, i, j)

    def valid_shapes(self, row_key: Callable[[Params], tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """``(mode, *row_key(row) of each of its role rows)`` of every valid candidate, in ``iter_valid``'s order,
        with ``row_key`` called once per role row: a key of each of 91,008 candidates without building their
        parameters."""
        keys = {role: [row_key(p) for p in rows.params] for role, rows in self.roles.items()}
        agg, dis = Mode.AGGREGATED.value, Mode.DISAGGREGATED.value
        return [(m, *keys[Role.MIXED][i]) if m == agg else (dis, *keys[Role.PREFILL][i], *keys[Role.DECODE][j])
                for m, i, j in self._valid_rows()]

    def valid_at(self, indices: Iterable[int]) -> list[Params]:
        """The parameters of the valid candidates at ``indices`` of ``iter_valid``'s order, in that order."""
        want = sorted(set(indices))
        out: list[Params] = []
        for n, (m, i, j) in enumerate(self._valid_rows()):
            if len(out) == len(want):
                break
            if n == want[len(out)]:
                out.append(self._params_at(m, i, j))
        return out

    def _params_at(self, mode: str, i: int, j: int) -> Params:
        if mode == Mode.AGGREGATED.value:
            return {"mode": mode, **self.roles[Role.MIXED].params[i]}
        return {"mode": mode, **self.roles[Role.PREFILL].params[i], **self.roles[Role.DECODE].params[j]}

    def _config_at(self, mode: str, i: int, j: int) -> DeploymentConfig:
        if mode == Mode.AGGREGATED.value:
            return self.space.assemble(Mode.AGGREGATED, self.roles[Role.MIXED].configs[i])
        return self.space.assemble(Mode.DISAGGREGATED, self.roles[Role.PREFILL].configs[i],
                                   self.roles[Role.DECODE].configs[j])

    def _valid_rows(self, mode: str | None = None) -> Iterator[tuple[str, int, int]]:
        """(mode, row, decode row or -1) of every valid candidate, in ``iter_valid``'s order."""
        if Role.MIXED in self.roles and mode in (None, Mode.AGGREGATED.value):
            rows = self.roles[Role.MIXED]
            for i in _bits(self._agg_bits(rows.valid)):
                yield Mode.AGGREGATED.value, i, -1
        if Role.PREFILL in self.roles and mode in (None, Mode.DISAGGREGATED.value):
            pre, dec = self.roles[Role.PREFILL], self.roles[Role.DECODE]
            for p, d, _ in self._pairs(pre.valid, dec.valid):
                ds = list(_bits(d))
                for i in _bits(p):
                    for j in ds:
                        yield Mode.DISAGGREGATED.value, i, j
