"""Workload inputs ``vllm bench serve`` cannot generate itself, written as its ``custom`` dataset (JSONL).

``vllm bench serve --dataset-name custom`` reads one ``{"prompt": str, "output_tokens": int}`` per line
(``--custom-output-len -1`` keeps each line's own length; ``--skip-chat-template`` sends the text as is;
``--disable-shuffle`` keeps the file's order). Two workloads are turned into that shape here:

* **agentic** — multi-turn sessions whose context grows turn by turn: turn *k* of a session sends the
  shared system prefix, every earlier user message and assistant reply, and the new user message. Lines
  are written session group by session group (a group is as many sessions as the load level's
  concurrency), turn-major inside a group, so a turn is queued behind its predecessor the way an agent
  waits for the previous answer, and every turn can hit the prefix cache of the one before.
* **trace** — a user's JSONL: flat requests (``prompt`` + ``output_len``/``output_tokens``) or sessions
  (``turns``: a list of ``{prompt|user, output_len|output_tokens, response?}``), flattened the same way.

Everything is seeded (``Workload.seed``) and written once per (workload, level).
"""

from __future__ import annotations

import json
import math
import os
import random
import stat
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from search_spaces import Dataset, LengthDist, Workload

_FILLER = (
    "read the file then run the tests and fix the failing case in the module before you commit the change "
    "check the log for the error and update the config so the server starts with the new flag value "
    "the function returns a list of tokens per request and the caller sums them into the batch size"
).split()


class _Tok:
    """Token counting with the served model's tokenizer (so prompt lengths are in its tokens)."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        path = Path(tokenizer_dir) / "tokenizer.json"
        if path.is_file():
            from tokenizers import Tokenizer

            t = Tokenizer.from_file(str(path))
            self.encode = lambda s: t.encode(s, add_special_tokens=False).ids  # noqa: E731
            self.decode = lambda ids: t.decode(ids)  # noqa: E731
        else:  # a model folder with another tokenizer format
            from transformers import AutoTokenizer

            at = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            self.encode = lambda s: at.encode(s, add_special_tokens=False)  # noqa: E731
            self.decode = lambda ids: at.decode(ids)  # noqa: E731

    def text(self, rng: random.Random, n: int) -> str:
        """About ``n`` tokens of filler text."""
        if n <= 0:
            return ""
        words: list[str] = []
        ids: list[int] = []
        while len(ids) < n:
            words += [rng.choice(_FILLER) for _ in range(max(8, n))]
            ids = self.encode(" ".join(words))
        return self.decode(ids[:n])


@lru_cache(maxsize=4)
def _tok(tokenizer_dir: str) -> _Tok:
    return _Tok(tokenizer_dir)


def _length(rng: random.Random, d: LengthDist) -> int:
    lo = max(1, int(d.mean * (1 - d.range_ratio)))
    hi = max(lo, int(d.mean * (1 + d.range_ratio)))
    return rng.randint(lo, hi)


def _flatten_sessions(
    sessions: Sequence[Sequence[dict[str, Any]]], group: int, prefix: str = ""
) -> list[dict[str, Any]]:
    """Sessions (lists of turns ``{user, output_tokens, response}``) → custom-dataset lines, group by
    group, turn-major inside a group; each turn's prompt carries the whole conversation so far."""
    lines: list[dict[str, Any]] = []
    for g in range(0, len(sessions), max(1, group)):
        block = sessions[g:g + group]
        contexts = [prefix] * len(block)
        for k in range(max((len(s) for s in block), default=0)):
            for j, sess in enumerate(block):
                if k >= len(sess):
                    continue
                turn = sess[k]
                prompt = contexts[j] + f"\nUser: {turn['user']}\nAssistant:"
                lines.append({"prompt": prompt, "output_tokens": int(turn["output_tokens"])})
                contexts[j] = prompt + " " + turn.get("response", "")
    return lines


def agentic_lines(workload: Workload, concurrency: int, tokenizer_dir: str | Path) -> list[dict[str, Any]]:
    """The agentic workload's requests for one load level (``workload.num_prompts(concurrency)`` lines)."""
    tok = _tok(str(tokenizer_dir))
    rng = random.Random(f"agentic-{workload.seed}-{concurrency}")
    n = workload.num_prompts(concurrency)
    turns = workload.turns
    prefix = tok.text(rng, int(round(workload.prefix_reuse * workload.isl.mean)))
    sessions: list[list[dict[str, Any]]] = []
    for _ in range(math.ceil(n / turns)):
        sess = []
        for _k in range(turns):
            out = _length(rng, workload.osl)
            sess.append({"user": tok.text(rng, _length(rng, workload.isl)), "output_tokens": out,
                         "response": tok.text(rng, out)})
        sessions.append(sess)
    return _flatten_sessions(sessions, concurrency, prefix)[:n]


#: A trace's bounds: the file, one line (a prompt of ~10⁷ tokens fits), the tokens one request may ask for (the
#: bound of a job's ``osl``).
MAX_TRACE_BYTES = 1 << 30
MAX_TRACE_LINE_BYTES = 1 << 26
MAX_OUTPUT_TOKENS = 10_000_000


def trace_lines(trace_path: str | Path, concurrency: int) -> list[dict[str, Any]]:
    """A user's JSONL trace as custom-dataset lines (flat requests, or sessions flattened like agentic).

    Raises ``ValueError`` with one line naming the file (and line) of the first problem (``advisor validate``
    reads the trace through here, so a bad one is refused before any deployment): no regular file (``/dev/zero``),
    larger than ``MAX_TRACE_BYTES`` or a line longer than ``MAX_TRACE_LINE_BYTES`` (read in bounded pieces, never
    whole), binary or not UTF-8, not JSON, or a record without a non-empty text prompt and a whole output length
    of 1 to ``MAX_OUTPUT_TOKENS``."""
    flat: list[dict[str, Any]] = []
    sessions: list[list[dict[str, Any]]] = []
    with open(trace_path, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{trace_path}: not a regular file; a trace is a file of JSON lines")
        if st.st_size > MAX_TRACE_BYTES:
            raise ValueError(f"{trace_path}: {st.st_size:,} bytes; a trace may hold at most {MAX_TRACE_BYTES:,}")
        num = 0
        while raw := fh.readline(MAX_TRACE_LINE_BYTES + 1):
            num += 1
            if len(raw) > MAX_TRACE_LINE_BYTES:
                raise ValueError(f"{trace_path}:{num}: longer than {MAX_TRACE_LINE_BYTES:,} bytes")
            if b"\0" in raw:
                raise ValueError(f"{trace_path}:{num}: binary data (a NUL byte); a trace is a file of JSON lines")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{trace_path}:{num}: not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                                 f"{e.start})") from None
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except ValueError as e:
                raise ValueError(f"{trace_path}:{num}: not JSON ({e})") from None
            try:
                _trace_record(rec, flat, sessions)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ValueError(f"{trace_path}:{num}: {e if isinstance(e, _BadRecord) else _RECORD}") from None
    lines = flat + _flatten_sessions(sessions, concurrency)
    if not lines:
        raise ValueError(f"{trace_path}: no requests")
    return lines


class _BadRecord(ValueError):
    """A trace record's own one-line complaint."""


_RECORD = ("each line needs prompt and a whole output_len|output_tokens, or turns: a list of {prompt|user, "
           "output_len|output_tokens}")


def _trace_record(rec: Any, flat: list[dict[str, Any]], sessions: list[list[dict[str, Any]]]) -> None:
    if not isinstance(rec, dict):
        raise _BadRecord(f"a JSON object is needed (got {type(rec).__name__}); {_RECORD}")
    if "turns" in rec:
        if not isinstance(rec["turns"], list):
            raise _BadRecord(f"turns must be a list (got {type(rec['turns']).__name__})")
        sess = []
        for i, t in enumerate(rec["turns"]):
            if not isinstance(t, dict):
                raise _BadRecord(f"turns.{i}: a JSON object is needed (got {type(t).__name__})")
            key = "prompt" if "prompt" in t else "user"
            out = t.get("output_tokens", t.get("output_len"))
            if key not in t or out is None:
                raise _BadRecord(f"turns.{i}: needs prompt|user and output_len|output_tokens")
            sess.append({"user": _prompt(t[key], f"turns.{i}.{key}"), "output_tokens": _tokens(out),
                         "response": _text(t.get("response", ""), f"turns.{i}.response")})
        if not sess:
            raise _BadRecord("turns is empty")
        sessions.append(sess)
    else:
        out = rec.get("output_tokens", rec.get("output_len"))
        if "prompt" not in rec or out is None:
            raise _BadRecord("needs prompt and output_len|output_tokens (or turns)")
        flat.append({"prompt": _prompt(rec["prompt"], "prompt"), "output_tokens": _tokens(out)})


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _BadRecord(f"{field} must be text (a JSON string), got {json.dumps(value)[:40]}")
    return value


def _prompt(value: Any, field: str) -> str:
    """A prompt as vLLM's completions endpoint takes it: non-empty text (null, a number or a list fail the
    server's warm-up, minutes into a trial)."""
    if not _text(value, field).strip():
        raise _BadRecord(f"{field} is empty; a prompt needs text")
    return value


def _tokens(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise _BadRecord(f"output_len|output_tokens must be a whole number from 1 to {MAX_OUTPUT_TOKENS:,} "
                         f"(got {value!r:.40})")
    return value


def write_jsonl(lines: Sequence[dict[str, Any]], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    tmp.replace(p)
    return p


def custom_dataset(workload: Workload, concurrency: int, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the JSONL ``vllm bench serve --dataset-name custom`` reads for this level; its path."""
    out = Path(out_dir) / f"{workload.dataset.value}-c{concurrency}-s{workload.seed}.jsonl"
    if workload.dataset is Dataset.AGENTIC:
        lines = agentic_lines(workload, concurrency, tokenizer_dir)
    elif workload.dataset is Dataset.TRACE:
        assert workload.trace_path
        lines = trace_lines(workload.trace_path, concurrency)
    else:
        raise ValueError(f"dataset {workload.dataset.value!r} is generated by vllm bench itself")
    return write_jsonl(lines, out)
