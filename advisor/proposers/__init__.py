"""Where a study's next candidate comes from, besides Optuna's own sampler.

* ``valid_sampler`` — any Optuna sampler steered onto the valid space (no invalid candidate, no repeat);
* ``grid`` — the shuffled grid (``sampler.kind: grid``);
* ``guide`` — the performance model, re-fitted to the study's measured trials, proposing every other candidate;
  ``guide_turns`` gives it its turns inside a study, ``model_rank`` ranks candidates by what a trial would be told,
  ``shape_sample`` draws what it ranks on a space too large to rank whole;
* ``progress`` — an unmeasured valid candidate when the sampler stalls, so a study always moves or ends.

Each is imported from its own module (``advisor.proposers.guide``, …): this face re-exports nothing, so importing
one proposer does not load the others' dependencies (the model, calibration, Optuna samplers).
"""
