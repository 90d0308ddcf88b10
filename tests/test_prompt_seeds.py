"""Random prompts that share no first KV block across one deployment's levels (executors/measuring/prompt_seeds.py), on
the tiny CI model's tokenizer (2,048 ids, byte-level BPE). That the reproduction names the first blocks vLLM's own
sampler sends is checked by benchmarks/prompt_collisions.py (every prompt of its cases); that the server then
reads ≤ 1% prefix-cache hits per level, by tests/test_knee_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from executors.measuring import prompt_seeds
from executors.measuring.loop import LevelProbe, LevelRunner, MeasurePlan
from executors.vllm.tiny_model import make_tiny_moe
from search_spaces import Dataset, Workload
from tests.shared_runs import PROBE_JOB

WORKLOAD = Workload.model_validate(PROBE_JOB["workload"])  # the knee study's: ISL 256, 16-24 prompts a level
LOADS = [1, 8, 4, 2, 3, 5, 6, 7]  # a knee search's levels, the warm-up at the first


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return str(make_tiny_moe(tmp_path_factory.mktemp("tiny")))


def _probe(tokenizer: str | None, workload: Workload = WORKLOAD, records: dict | None = None) -> LevelProbe:
    def never(_spec):
        raise AssertionError("no level is run here")

    runner = LevelRunner(never, lambda: None, [], tokenizer=tokenizer)
    return LevelProbe(runner, workload, MeasurePlan(()), gpus=1, disaggregated=False, records=records)


def _first_blocks(starts: prompt_seeds.PromptStarts, workload: Workload, specs) -> list[tuple[int, ...]]:
    return [starts.key(s) for spec in specs for s in starts.starts(workload, spec.seed, spec.num_prompts)]


def test_a_deployments_levels_send_no_first_block_twice(tokenizer: str) -> None:
    probe = _probe(tokenizer)
    specs = [probe._spec(LOADS[0], warmup=True)] + [probe._spec(x) for x in LOADS]
    specs += [probe._spec(4, attempt=1), probe._spec(6, short=True)]
    reader = prompt_seeds.PromptStarts.load(tokenizer)
    assert reader is not None
    picked = _first_blocks(reader, WORKLOAD, specs)
    assert len(set(picked)) == len(picked) == sum(s.num_prompts for s in specs)
    assert len({s.seed for s in specs}) == len(specs)
    # the levels' own seeds (what vllm bench was given before) do repeat first blocks on this tokenizer
    own = [prompt_seeds.dataclasses.replace(s, seed=WORKLOAD.level_seed(x)) for s, x in zip(specs[1:9], LOADS)]
    theirs = _first_blocks(reader, WORKLOAD, own)
    assert len(set(theirs)) < len(theirs)


def test_measure_calls_on_one_deployment_share_its_record(tokenizer: str) -> None:
    """A profile measures each probe level in a ``measure`` call of its own, each a new ``LevelProbe``: the
    deployment's record (``Deployment.prompt_starts``) keeps the later calls off the earlier calls' first blocks.
    Seeds as a profile's probes of one deployment draw them: each probe its own workload seed, each level its load."""
    reader = prompt_seeds.PromptStarts.load(tokenizer)
    assert reader is not None
    calls = [(WORKLOAD.model_copy(update={"seed": seed}), load) for seed in range(1, 4) for load in (1, 8, 4)]

    def first_blocks(records: dict | None) -> list[tuple[int, ...]]:
        blocks: list[tuple[int, ...]] = []
        for wl, load in calls:
            probe = _probe(tokenizer, wl, records)
            specs = [probe._spec(load, warmup=True), probe._spec(load)]
            blocks += _first_blocks(reader, wl, specs)
        return blocks

    shared = first_blocks({})
    assert len(set(shared)) == len(shared)  # the deployment's record: no first block sent twice
    alone = first_blocks(None)
    assert len(set(alone)) < len(alone)  # a record per call: later calls repeat earlier calls' prompts


def test_workloads_that_reuse_prompts_and_unreadable_tokenizers_keep_the_levels_seeds(tokenizer: str,
                                                                                     tmp_path: Path) -> None:
    prefix = WORKLOAD.model_copy(update={"dataset": Dataset.PREFIX, "prefix_reuse": 0.5})
    same = WORKLOAD.model_copy(update={"fresh_prompts": False})
    for probe, wl in ((_probe(tokenizer, prefix), prefix), (_probe(tokenizer, same), same),
                      (_probe(str(tmp_path)), WORKLOAD), (_probe(None), WORKLOAD)):
        assert probe.starts is None
        assert probe._spec(8).seed == wl.level_seed(8)
