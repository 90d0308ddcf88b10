"""Exploration (6 Dec): is the H100 Qwen3-235B-width profile's c = 256 excess the API server's streaming bound
(``frontend_per_token_s``, which bounds a step instead of adding to it) rather than ``cpu_per_seq_s``?

The profile's fit never moves ``frontend_per_token_s``: ``advisor.calibrate.sensitive`` nudges each term by 5% of
its range (1.5e-6 -> 6.5e-6 s a token), which leaves the bound below every probe's step, so the term is frozen.
Here the same as-sent fit of profile #2's probes starts with the bound where it can bind (2e-5 and 4e-5 s a token).

    python research/results/h100-qwen3-checks-r2/explore-front/front.py DA-GPU/results.db

(the database from ``research/results/h100-qwen3-profile/raw.tar.xz``; ~1 minute)."""
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "research/gpu")]
import db  # noqa: E402
import profile_check as pc  # noqa: E402
from advisor.calibrate import Problem, fit, sensitive  # noqa: E402
from advisor.cli import load_job  # noqa: E402
from advisor.profile import STEP_PARAMS  # noqa: E402
from executors.perf.params import default_params  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    doc = yaml.safe_load((ROOT / "research/gpu/h200-profile-qwen3-235b.yaml").read_text())
    doc["cluster"]["gpu"] = "H100"
    doc["storage"] = f"sqlite:///{tmp}/none.db"
    doc["executor"]["run_dir"] = f"{tmp}/runs"
    (Path(tmp) / "job.yaml").write_text(yaml.safe_dump(doc))
    job = load_job(Path(tmp) / "job.yaml")
    levels = pc.ProbeLevels(job, db.connect(f"sqlite:///{Path(sys.argv[1]).resolve()}", read_only=True))
    problem = Problem(levels.samples(), True)
    theta0 = default_params("H100")
    for name, front in (("default-start", None), ("front-2e-5", 2e-5), ("front-4e-5", 4e-5)):
        start = theta0 if front is None else theta0.model_copy(update={"frontend_per_token_s": front})
        names = sensitive(problem, start, list(STEP_PARAMS))
        p = fit(problem, start, names)
        cost = sum(v * v for _, v in problem.log_ratios(p))
        print(f"{name}: {len(names)} terms fitted (frontend_per_token_s among them: {'frontend_per_token_s' in names}), "
              f"sum of squared log ratios {cost:.4f}; cpu_per_seq_s {p.cpu_per_seq_s:.3g}, "
              f"frontend_per_token_s {p.frontend_per_token_s:.3g}, cpu_step_s {p.cpu_step_s:.3g}, "
              f"mfu_decode {p.mfu_decode:.3g}")
        p.save(HERE / f"fit-{name}.json")
