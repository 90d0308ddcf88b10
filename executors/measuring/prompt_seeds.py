"""Seeds whose random prompts share no KV block with each other nor with the deployment's earlier levels.

``vllm bench serve``'s ``random`` dataset (vLLM 0.32, ``RandomDataset.sample``) draws, from
``numpy.random.default_rng(--seed)``, every request's input length, then output length, then an offset in
``[0, vocab_size)``; request ``i``'s prompt is the run of allowed (non-special) token ids starting at
``(offset_i + i) mod len(allowed)``, decoded to text and re-encoded. Two requests whose runs start at the same
id send the same text — their whole prompts, not only a first block, are then prefix-cache hits — and on a
byte-level BPE runs that start among the byte tokens decode to the same U+FFFD characters from different starts.
With a few thousand ids, a level of tens of requests, and the prefix cache kept across the levels of one
deployment, that reads 3-12% prefix-cache hits on a workload that reuses nothing.

So the seed of each ``random`` level is chosen here: the level's own seed (``Workload.level_seed``) when its
prompts' first blocks — the first ``BLOCK_TOKENS`` tokens of each start's re-encoded text — are new to the
deployment, else the first of seeds derived from it that are, within ``MAX_TRIES`` (then the one with the fewest
repeated blocks). A prompt whose first block is new shares no block with any earlier prompt (the prefix cache's
blocks are chained from the first one), so the level reads no prefix-cache hits.
``benchmarks/prompt_collisions.py`` checks the reproduction against vLLM's own sampler and counts shared first
blocks before and after.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from search_spaces import Dataset, Workload

if TYPE_CHECKING:
    from executors.measuring.bench import LevelSpec

log = logging.getLogger(__name__)

#: The smallest KV block vLLM uses (GPU default, the CPU build's MLA kernel): prompts whose first this many
#: tokens differ share no block of any larger size either.
BLOCK_TOKENS = 16
#: Tokens decoded past the block so that the block's re-encoding does not depend on where the run was cut.
_MARGIN = 16
#: Seeds tried per level: a few thousand ids hold ~sqrt(ids) requests without a repeat at the first try.
MAX_TRIES = 256


def derived_seed(seed: int, k: int) -> int:
    """The ``k``-th alternative to a level's seed (``k = 0``: the seed itself), in ``vllm bench``'s range."""
    if k == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/fresh/{k}".encode()).digest()[:4], "big") % (2**31 - 1)


class PromptStarts:
    """One deployment's record of the first blocks its random prompts have sent, and the seed picker.

    Built from the tokenizer ``vllm bench serve`` is given (a local folder); ``load`` returns None where it
    cannot be read here, and levels then keep their own seeds."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.allowed = np.array(sorted(set(range(self.vocab_size)) - set(tokenizer.all_special_ids)))
        self.num_special = int(tokenizer.num_special_tokens_to_add())
        self.used: set[tuple[int, ...]] = set()
        self._keys: dict[int, tuple[int, ...]] = {}

    @classmethod
    def load(cls, path: str | None) -> PromptStarts | None:
        if not path or not (Path(path) / "tokenizer_config.json").is_file():
            return None
        try:
            from transformers import AutoTokenizer

            return cls(AutoTokenizer.from_pretrained(path, local_files_only=True))
        except Exception as e:  # an unreadable tokenizer costs only the seed choice, never the level
            log.warning("random prompts keep their seeds: tokenizer %s not readable here (%s)", path, e)
            return None

    def key(self, start: int) -> tuple[int, ...]:
        """The first block of the prompt whose run starts at allowed index ``start``, as the server reads it."""
        k = self._keys.get(start)
        if k is None:
            ids = self.allowed[(start + np.arange(BLOCK_TOKENS + _MARGIN)) % len(self.allowed)].tolist()
            text = self.tok.decode(ids)
            k = tuple(self.tok.encode(text, add_special_tokens=False)[:BLOCK_TOKENS])
            self._keys[start] = k
        return k

    def starts(self, workload: Workload, seed: int, n: int) -> list[int]:
        """Where each of the ``n`` prompts of ``vllm bench serve --seed SEED`` starts (``get_sampling_params``)."""
        isl, osl = workload.isl, workload.osl
        real = max(0, int(isl.mean) - self.num_special)
        in_lo, in_hi = math.floor(real * (1 - isl.range_ratio)), math.ceil(real * (1 + isl.range_ratio))
        out_lo = max(math.floor(osl.mean * (1 - osl.range_ratio)), 1)
        out_hi = max(math.ceil(osl.mean * (1 + osl.range_ratio)), 1)
        rng = np.random.default_rng(seed)
        rng.integers(in_lo, in_hi + 1, size=n)
        rng.integers(out_lo, out_hi + 1, size=n)
        offsets = rng.integers(0, self.vocab_size, size=n)
        return [int((o + i) % len(self.allowed)) for i, o in enumerate(offsets)]

    def repeats(self, workload: Workload, seed: int, n: int) -> tuple[int, list[tuple[int, ...]]]:
        """How many of the level's prompts would send a first block already sent; the level's blocks."""
        seen = set(self.used)
        keys = [self.key(s) for s in self.starts(workload, seed, n)]
        clash = 0
        for k in keys:
            clash += k in seen
            seen.add(k)
        return clash, keys

    def pick(self, workload: Workload, seed: int, n: int) -> int:
        """The seed for a level of ``n`` prompts (see the module docstring); its first blocks are then used."""
        best: tuple[int, int, list[tuple[int, ...]]] | None = None
        for k in range(MAX_TRIES):
            s = derived_seed(seed, k)
            clash, keys = self.repeats(workload, s, n)
            if best is None or clash < best[0]:
                best = (clash, s, keys)
            if clash == 0:
                break
        assert best is not None
        if best[0]:
            log.warning("%d of %d random prompts repeat a first KV block already sent on this deployment (best "
                        "of %d seeds): %d distinct first blocks for this tokenizer", best[0], n, MAX_TRIES,
                        len(self.allowed))
        self.used.update(best[2])
        return best[1]


def fresh_spec(starts: PromptStarts | None, workload: Workload, spec: LevelSpec) -> LevelSpec:
    """``spec`` with a seed whose prompts are new to the deployment — for vLLM's
    ``random`` dataset with ``fresh_prompts`` on; any other level is returned as it is."""
    if starts is None or workload.dataset is not Dataset.RANDOM or not workload.fresh_prompts or not spec.num_prompts:
        return spec
    return dataclasses.replace(spec, seed=starts.pick(workload, spec.seed, spec.num_prompts))
