"""What a job's space holds before anything runs: the candidates, how many pass every validity rule, and which
rules remove the others — ``advisor validate``'s report, the warnings at the start of ``advisor tune``, and the
one line (exit 2) for a space with nothing valid to run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from advisor.errors import BadInput
from advisor.job import TuningJob
from search_spaces import check


@dataclass(frozen=True)
class SpaceReport:
    """What a job's search space holds on its model and cluster: the dimensions and their choices, the
    candidates, how many pass every validity rule, and per rule how many it removes (with one reason)."""

    candidates: int
    valid: int
    truncated: bool
    derived: bool = False  # the job named no space (what the user can change is then not the space they wrote)
    dims: dict[str, list[Any]] = field(default_factory=dict)
    broken: dict[str, int] = field(default_factory=dict)
    example: dict[str, str] = field(default_factory=dict)

    def rules_line(self, top: int | None = None) -> str:
        """The rules by how many candidates each removes: ``2 × memory-fit (mixed: 45.3 GiB …)``."""
        ranked = sorted(self.broken.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return "; ".join(f"{n:,} × {rule} ({self.example[rule]})" for rule, n in ranked)

    def warnings(self, budget: int) -> list[str]:
        """What a user should know before a study starts: a space mostly invalid (the share the rules leave
        and the rules that remove the most), or fewer valid candidates than the budget (the study ends when
        each is measured once)."""
        out: list[str] = []
        if self.valid and self.candidates and self.valid / self.candidates < LOW_VALID_SHARE:
            out.append(f"only {self.valid:,} of {self.candidates:,} candidates ({self.valid / self.candidates:.1%}) "
                       f"are valid; the rules removing the most: {self.rules_line(top=2)}. The sampler is steered "
                       "to valid candidates, so this costs no trials; " + (
                           "the space was derived from the model and the cluster: a space: in the job replaces it "
                           "(advisor validate --show prints the derived one)" if self.derived
                           else "narrow the space to say what you mean"))
        if 0 < self.valid < budget:
            out.append(f"the space holds {self.valid:,} valid candidate{'s' if self.valid != 1 else ''}, fewer "
                       f"than the budget of {budget:,} trials: the study ends when each is measured once")
        return out


#: Below this share of valid candidates, ``advisor validate`` and ``advisor tune`` warn.
LOW_VALID_SHARE = 0.05


def space_report(job: TuningJob, limit: int = 250_000) -> SpaceReport:
    """The job's candidates, how many are valid and what removes the others; writes nothing. Counted role by
    role (``ValidSpace``); a space too large for that is enumerated up to ``limit`` candidates."""
    vs = job.valid_space()
    if vs is not None:
        dims: dict[str, list[Any]] = {"mode": [m.value for m in job.space.modes]}
        seen: set[tuple[str, type, Any]] = set()  # a set beside the lists: counting stays linear in the choices
        for rows in vs.roles.values():
            for params in rows.params:
                for k, v in params.items():
                    if (k, type(v), v) not in seen:
                        seen.add((k, type(v), v))
                        dims.setdefault(k, []).append(v)
        return SpaceReport(vs.candidates, vs.valid, False, job.space_derived, dims, dict(vs.broken),
                           {r: vs.reasons[r] for r in vs.broken})
    model, wl = job.model_profile(), job.workload
    dims = {}
    known: set[tuple[str, type, Any]] = set()
    broken: Counter[str] = Counter()
    example: dict[str, str] = {}
    n = valid = 0
    for params, cfg in job.space.enumerate():
        n += 1
        for k, v in params.items():
            if (k, type(v), v) not in known:
                known.add((k, type(v), v))
                dims.setdefault(k, []).append(v)
        violations = check(cfg, model, job.cluster, wl.max_model_len)
        if not violations:
            valid += 1
        broken.update({v.rule for v in violations})  # a rule counts once per candidate (not per role)
        for v in violations:
            example.setdefault(v.rule, v.reason)
        if n >= limit:
            break
    return SpaceReport(n, valid, n >= limit, job.space_derived, dims, dict(broken), example)


def require_valid_candidates(job: TuningJob, source: str = "job") -> SpaceReport:
    """The space report; BadInput with one line naming the rules when no candidate may run."""
    rep = space_report(job)
    if rep.valid == 0:
        of = (f"none of the first {rep.candidates:,} candidates is" if rep.truncated else
              "the only candidate is not" if rep.candidates == 1 else f"none of the {rep.candidates:,} candidates is")
        seqs = f"shorter sequences (workload isl + osl: max_model_len {job.workload.max_model_len})"
        if job.space_derived:  # the user wrote no space: say what they can change
            hint = (f"no instance of up to {job.cluster.total_gpus} GPUs holds the model: give the cluster more "
                    f"GPUs (cluster.nodes) or more memory (cluster.gpu), lighter weights (model.weight_bytes) or "
                    f"{seqs}")
        elif "memory-fit" in rep.broken:
            hint = f"give space.mixed/prefill/decode wider instances (dp_sizes, tp_sizes) or {seqs}"
        else:
            hint = "change space.* so that some candidate passes these rules"
        raise BadInput(f"{source}: space: {of} valid on {job.cluster.describe()}: "
                       f"{rep.rules_line()}; {hint}")
    return rep
