"""A job's workload input files (a trace), read and checked when the job is read — by ``advisor validate`` and
before ``advisor tune`` deploys anything — rather than found bad by the first trial's benchmark, minutes later,
and told to the sampler as an infeasible configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.errors import BadInput
from executors.measuring.datasets import trace_lines
from search_spaces import Dataset

if TYPE_CHECKING:  # the job calls this while it loads
    from advisor.job import TuningJob


def with_checked_inputs(job: TuningJob, source: str) -> TuningJob:
    """The job with its workload's input files read and checked now (``advisor validate``, and before ``tune``
    deploys anything), not at the first trial's benchmark: a trace is anchored at the job file's folder and
    every record read; BadInput in one line naming the file and line of the first bad one."""
    wl = job.workload
    if wl.dataset is not Dataset.TRACE or not wl.trace_path:
        return job
    path = job.resolve_path(wl.trace_path)
    try:
        trace_lines(path, 1)
    except OSError as e:
        raise BadInput(f"{source}: workload.trace_path: cannot read {path} ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        why = " ".join(str(e).split())
        raise BadInput(f"{source}: workload.trace_path: {why}") from None
    return job.model_copy(update={"workload": wl.model_copy(update={"trace_path": str(path)})})
