"""What optuna-dashboard says of a study's answer: a study note naming the deployment ``advisor best`` names.

optuna-dashboard's *best trial* is Optuna's (``storage.get_best_trial``: the single run with the best value; with
two objectives, its "Best Trials" are the Pareto front of single runs). That is the answer wherever Optuna's model
can express it — one objective, every deployment measured once, ranked per used GPU. It cannot express the rest of
the answer's rule (``advisor.answer``): the mean of a deployment's runs on fresh deploys, vLLM's defaults kept
unless a searched deployment beats every run of theirs, the copies of a deployment that fit the whole cluster, the
SLOs as a hard filter on two objectives. So the tuner writes the answer where optuna-dashboard shows free text on
the study's page — its study note (Markdown, kept in the study's system attributes under the keys
optuna-dashboard's ``save_note`` uses) — naming the answer's trial, saying whether Optuna's best is the same
trial, and, where it is not, why.
"""

from __future__ import annotations

import math

import optuna

import db
from advisor.answer import Answer, best_text, operating_points, study_answer
from advisor.job import TuningJob
from advisor.verdict import Verdict, verdict
from db import queries

#: optuna-dashboard's note keys (``optuna_dashboard/_note.py``): a version, and the body in chunks.
NOTE_VER_KEY = "dashboard:note_ver"
NOTE_STR_PREFIX = "dashboard:note_str:"
NOTE_CHUNK = 2045


def optuna_best(study: optuna.Study) -> list[int]:
    """The trial numbers optuna-dashboard shows as the best: one trial for one objective, the Pareto front of
    single runs for two (empty before any complete trial)."""
    try:
        if len(study.directions) == 1:
            return [study.best_trial.number]
        return sorted(t.number for t in study.best_trials)
    except ValueError:
        return []


def note_text(answer: Answer, said: Verdict, best_text: str, optuna: list[int]) -> str:
    """The note's Markdown: the answer, whether Optuna's best is it, and the sentences ``advisor best`` prints."""
    lines = [f"**deploy-advisor's answer (`advisor best`): trial {answer.trial}** — {best_text}", ""]
    if len(optuna) == 1 and optuna[0] == answer.trial:
        lines.append(f"Optuna's best trial is the same trial ({answer.trial}).")
    else:
        theirs = (f"Optuna's best trial here is trial {optuna[0]}" if len(optuna) == 1 else
                  f"Optuna's Best Trials here are the Pareto front of single runs ({len(optuna)} trials"
                  + (", the answer among them)" if answer.trial in optuna else ", the answer not among them)"))
        lines.append(f"{theirs}. Optuna ranks single runs by their values; the answer is ranked by the mean of "
                     "each deployment's runs on fresh deploys, keeps vLLM's defaults unless a searched deployment "
                     "beats every run of theirs, counts the copies of a deployment that fit the whole cluster "
                     "(unless `objective.per: used_gpu`) and requires every SLO — none of which Optuna's model "
                     "of a study expresses, so its best can name another trial.")
    lines += ["", *(f"- {line}" for line in said.lines())]
    return "\n".join(lines)


def save_note(study: optuna.Study, body: str) -> None:
    """``body`` as the study's optuna-dashboard note: the version raised by one, the body in chunks, chunks of a
    longer earlier note emptied."""
    storage = study._storage  # noqa: SLF001 — Optuna's public Study keeps its storage private
    sid = study._study_id  # noqa: SLF001
    attrs = storage.get_study_system_attrs(sid)
    storage.set_study_system_attr(sid, NOTE_VER_KEY, int(attrs.get(NOTE_VER_KEY, 0)) + 1)
    chunks = [body[i * NOTE_CHUNK:(i + 1) * NOTE_CHUNK] for i in range(max(1, math.ceil(len(body) / NOTE_CHUNK)))]
    for i, chunk in enumerate(chunks):
        storage.set_study_system_attr(sid, f"{NOTE_STR_PREFIX}{i}", chunk)
    old = [k for k in attrs if k.startswith(NOTE_STR_PREFIX)]
    for i in range(len(chunks), len(old)):
        storage.set_study_system_attr(sid, f"{NOTE_STR_PREFIX}{i}", "")


def read_note(study: optuna.Study) -> str:
    """The study's optuna-dashboard note ("" when it has none)."""
    attrs = study._storage.get_study_system_attrs(study._study_id)  # noqa: SLF001 — no public reader in Optuna 5
    chunks = {k: v for k, v in attrs.items() if k.startswith(NOTE_STR_PREFIX)}
    return "".join(chunks.get(f"{NOTE_STR_PREFIX}{i}", "") for i in range(len(chunks)))


def write_answer_note(database: db.Database, name: str, job: TuningJob, study: optuna.Study) -> str | None:
    """Write the study's answer as its optuna-dashboard note (nothing while it has no answer); the note."""
    answer = study_answer(database, name, job)
    row = queries.get_study(database, name)
    if answer is None or row is None:
        return None
    said = verdict(job, queries.list_trials(database, name), operating_points(database, name, job))
    body = note_text(answer, said, best_text(row.best, row.best_objective, row.best_runs) or "", optuna_best(study))
    save_note(study, body)
    return body
