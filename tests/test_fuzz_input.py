"""Any input, one line (issue #15, item 6): property-based fuzzing of everything `advisor` reads.

Job files, model ``config.json`` files (``model.path``), performance-parameter files (``executor.perf_params``),
configuration files (``advisor simulate --config``) and command lines — binary, huge, deeply nested, wrongly
typed, self-referencing YAML (anchors and aliases, "billion laughs") — end with exit 0, or with exit 2 and
exactly one line on stderr: never a traceback, never another exit code.

Hypothesis generates the inputs; ``derandomize=True`` makes every run (CI's too) try the same ones, and
``database=None`` keeps no example database in the tree. The real command line runs in-process —
``advisor.cli.main``, what the ``advisor`` console script calls, with ``sys.argv`` set and stdout/stderr
captured — because a subprocess per input (~1.5 s of imports) would make 1,000 inputs take half an hour; an
exception escaping ``main`` is what a process would print as a traceback, and fails the property.

``EXAMPLES`` sets how many inputs each test generates; together they are ≥ 1,000 (``test_enough_inputs``
counts the inputs the CLI was actually run on). Structured jobs stay on the small ``cpu-tiny-moe`` space (or
pin a small space on bigger presets) so that a valid job's ``validate`` takes milliseconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from advisor import cli
from advisor.job import job_from_dict

#: Inputs per test: their sum is the number of generated inputs a run checks (≥ 1,000, test_enough_inputs).
EXAMPLES = {
    "raw_bytes": 200,
    "yamlish_text": 250,
    "job_documents": 500,
    "alias_bombs": 80,
    "deep_nesting": 40,
    "model_configs": 200,
    "perf_params": 150,
    "simulate_configs": 80,
    "command_lines": 150,
}


def fuzz(test: str) -> settings:
    """Reproducible (derandomize), no example database in the tree, no deadline (a 2-core CI machine)."""
    return settings(max_examples=EXAMPLES[test], deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


BASE_JOB: dict[str, Any] = {"name": "fuzz", "preset": "cpu-tiny-moe", "executor": {"kind": "simulated"}}
#: The bases structured documents start from: each valid, each a small space (validate takes milliseconds).
BASES: list[dict[str, Any]] = [
    BASE_JOB,
    {"name": "fuzz-dsv3", "preset": "h200-dsv3", "executor": {"kind": "simulated"},
     "space": {"modes": ["aggregated"], "mixed": {"instances": [1], "dp_sizes": [8], "tp_sizes": [1],
                                                  "max_num_seqs": [64], "max_num_batched_tokens": [4096]}}},
    {"name": "fuzz.no-preset", "model": {"preset": "tiny-moe"},
     "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 2},
     "workload": {"isl": {"mean": 256}, "osl": {"mean": 32}, "load_levels": [1, 4], "knee_search": False},
     "space": {"modes": ["aggregated"], "mixed": {"max_num_seqs": [4], "max_num_batched_tokens": [2048]}}},
]

RAN: dict[str, int] = {}  # test → inputs the CLI ran on


# ----------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def advisor(*args: str, count: str) -> Outcome:
    """``advisor ARGS`` in this process, as the console script runs it; an exception escaping ``main`` is
    printed as the interpreter would (a traceback, exit 1)."""
    RAN[count] = RAN.get(count, 0) + 1
    log = os.environ.get("FUZZ_LOG")  # FUZZ_LOG=/tmp/fuzz.log: each outcome's first line, and in .last the
    if log:  # input being run (what a hang or a killed run was on)
        with open(log + ".last", "w") as f:
            f.write(repr(args) + "\n" + "".join(Path(a).read_text(errors="replace")[:20000] + "\n----\n"
                                               for a in args if a.endswith((".yaml", ".json")) and Path(a).is_file()))
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["advisor", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code: Any = 0
            except SystemExit as e:
                code = e.code
            except KeyboardInterrupt:
                raise
            except BaseException:  # what `advisor` would die of
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
    code = 0 if code is None else code if isinstance(code, int) else 1
    if log:
        with open(log, "a") as f:
            f.write(f"{count}\t{code}\t{(err.getvalue().strip() or out.getvalue().strip()).splitlines()[:1]}\n")
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_exit_0_or_one_line(o: Outcome, what: Any = "") -> Outcome:
    shown = f"\ninput: {what!r}"[:4000] if what != "" else ""
    assert "Traceback" not in o.out + o.err, f"a traceback{shown}\n{o}"
    assert o.code in (0, 2), f"exit {o.code}, not 0 or 2{shown}\n{o}"
    if o.code == 2:
        lines = [ln for ln in o.err.splitlines() if ln.strip()]
        assert len(lines) == 1, f"{len(lines)} lines on stderr, not one{shown}\n{o}"
        assert lines[0].startswith("error: ") and len(lines[0]) > len("error: ") + 5, f"{lines[0]!r}{shown}"
    return o


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder to write inputs into, also the working directory (nothing lands in the checkout)."""
    d = tmp_path_factory.mktemp("fuzz")
    old = Path.cwd()
    os.chdir(d)
    yield d
    os.chdir(old)


def validate(path: Path, text: str | bytes, count: str) -> Outcome:
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return assert_exit_0_or_one_line(advisor("validate", str(path), count=count), text)


def dump(doc: Any) -> str:
    """A document as YAML, in block or flow style (both what users write)."""
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=None, width=100)


# ---------------------------------------------------------------------------------------- the values
#: Integers a field may not expect: zero, negatives, past 32/64 bits, past a float's range.
NASTY_INTS = [0, -1, 1, 2, 3, 7, 8, 255, 1025, 2**31, -2**31 - 1, 2**53 + 1, 2**63, 2**64 + 1, 10**30, -10**30,
              10**308, 10**400]
NASTY_STRINGS = ["", " ", "1", "-1", "0x10", "1e400", "nan", "NaN", "inf", "-inf", "yes", "no", "null", "~",
                 "aggregated", "disaggregated", "H200", "CPU", "tpe", "grid", "<=", ">=", "p90_ttft_ms", "error_rate",
                 "throughput_per_gpu", "simulated", "ray", "local", "cpu-tiny-moe", "tiny-moe", "deepseek-v3",
                 "../../etc/passwd", "/dev/zero", "/", "a\nb", "tab\there", "\x00", "\u2028", "é", "🙂",
                 "${HOME}", "${NO_SUCH_VARIABLE_X}", "sqlite:///", "sqlite:///bad.yaml", "bad.yaml", ".",
                 "postgresql+psycopg://u:p@127.0.0.1:1/x", "x" * 5000]
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-10, max_value=5000), st.sampled_from(NASTY_INTS), st.integers(),
    st.floats(), st.sampled_from([0.0, -0.0, 1e-300, 1e300, float("inf"), float("-inf"), float("nan")]),
    st.text(max_size=20), st.sampled_from(NASTY_STRINGS),
)
#: Keys: the schema's own (in the wrong place), unknown ones, and non-strings (YAML allows any scalar).
SCHEMA_KEYS = sorted({"name", "preset", "model", "cluster", "workload", "slos", "space", "budget", "executor",
                      "gpu", "nodes", "gpus_per_node", "isl", "osl", "mean", "metric", "op", "value", "mixed",
                      "prefill", "decode", "modes", "dp_sizes", "tp_sizes", "max_num_seqs", "path", "kind", "env"})
keys = st.one_of(st.sampled_from(SCHEMA_KEYS), st.text(max_size=12), st.integers(-3, 3), st.booleans(), st.none(),
                 st.floats(allow_nan=False))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


def nest(depth: int, leaf: Any, kind: str) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"a": leaf}
    return leaf


deep_values = st.builds(nest, st.integers(20, 120), scalars, st.sampled_from(["list", "dict"]))


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list) and doc:
        out += _paths(doc[0], (*prefix, 0))
    return out


RESOLVED = job_from_dict(BASE_JOB).model_dump(mode="json")
#: Every field path of a fully resolved job (defaults included): where structured documents put values.
FIELD_PATHS = sorted(set(_paths(RESOLVED)) | {
    ("baseline", "config", "mode"), ("baseline", "config", "decode", "data_parallel_size"), ("model", "path"),
    ("model", "weight_bytes"), ("workload", "trace_path"), ("executor", "perf_params"), ("unknown_key",),
    ("space", "mixed", "unknown"), ("executor", "env", "NCCL_SOCKET_IFNAME")}, key=str)


def put(node: Any, path: tuple, value: Any) -> Any:
    """``node`` with ``path`` set to ``value`` (a list index sets the first element; whatever is not a mapping
    or a list on the way is replaced by one)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(node) if isinstance(node, list) and node else [{}]
        items[0] = put(items[0], rest, value)
        return items
    out = dict(node) if isinstance(node, dict) else {}
    out[head] = put(out.get(head), rest, value)
    return out


def _at(doc: Any, path: tuple) -> Any:
    for part in path:
        if isinstance(part, int):
            doc = doc[0] if isinstance(doc, list) and doc else None
        else:
            doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def typed(base: Any) -> st.SearchStrategy[Any]:
    """Values of the field's own type that are still wrong: zero, negative, huge, NaN, empty, repeated,
    unknown names (most of what a structured document gets: a wrong type alone is rejected first)."""
    if isinstance(base, bool):
        return st.one_of(st.booleans(), st.sampled_from(["yes", "no", "true", "False", 0, 1, 2]))
    if isinstance(base, int):
        return st.one_of(st.sampled_from(NASTY_INTS), st.integers(-5, 100_000), st.sampled_from(["8", "1e3", 1.5]))
    if isinstance(base, float):
        return st.one_of(st.floats(), st.sampled_from(NASTY_INTS), st.sampled_from([0.0, -1.0, 1e-300, 1e300]))
    if isinstance(base, str):
        return st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=20))
    if isinstance(base, list):
        return st.lists(typed(base[0]) if base else scalars, max_size=6)
    return values


@st.composite
def job_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(FIELD_PATHS))
        value = draw(st.one_of(typed(_at(RESOLVED, path)), typed(_at(RESOLVED, path)), values, deep_values,
                               st.just([]), st.just({}), st.lists(st.text(max_size=3), max_size=3)))
        doc = put(doc, path, value)
    if draw(st.integers(0, 9)) == 0:  # a top-level field gone, or the whole document replaced by a value
        doc.pop(draw(st.sampled_from(sorted(doc))), None)
    return doc


# ------------------------------------------------------------------------------------------ job files
@fuzz("raw_bytes")
@given(prefix=st.sampled_from([b"", b"name: fuzz\npreset: cpu-tiny-moe\n", b"\xef\xbb\xbf", b"\xff\xfe"]),
       data=st.binary(max_size=3000))
@example(prefix=b"", data=b"\x00" * 100)
@example(prefix=b"", data=b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
@example(prefix=b"name: fuzz\npreset: cpu-tiny-moe\n", data=b"description: \xe9t\xe9\n")
def test_raw_bytes(work: Path, prefix: bytes, data: bytes) -> None:
    validate(work / "bytes.yaml", prefix + data, "raw_bytes")


#: Pieces of YAML syntax (tags, anchors, directives, flow and block, odd scalars) for text that is almost YAML.
YAML_TOKENS = ["name: ", "preset: ", "cpu-tiny-moe", "fuzz", "\n", "  ", "- ", ": ", "{", "}", "[", "]", ", ", "&a ",
               "*a", "&b ", "*b", "<<: ", "? ", "|\n", ">-\n", "'", '"', "# c\n", "---\n", "...\n", "%YAML 1.1\n",
               "%TAG ! tag:x,2000:\n", "!!python/object/apply:os.system ['true']", "!!binary ", "!!set ", "!!int ",
               "!!float ", "!!timestamp ", "!!str ", "!!map ", "!!seq ", "!!omap ", "!!pairs ", "!local ", "\t",
               "\x00", "\ufeff", "\x85", "1e400", "0x1F", "0o17", "0b101", "1_000", "1:20:30", "2001-12-14",
               "2001-13-45", ".nan", ".inf", "-.inf", "~", "null", "yes", "9" * 5000, "cluster: ", "nodes: ", "model: ",
               "space: ", "slos: ", "executor: ", "budget: {trials: ", "workload: ", "\\u0000", "\\x85", "=", "@"]
yamlish = st.lists(st.one_of(st.sampled_from(YAML_TOKENS), st.text(max_size=4)), max_size=50).map("".join)


@fuzz("yamlish_text")
@given(head=st.sampled_from(["", "name: fuzz\npreset: cpu-tiny-moe\n",
                             "name: fuzz\npreset: cpu-tiny-moe\nspace:\n  "]),
       text=yamlish)
@example(head="name: fuzz\npreset: cpu-tiny-moe\n", text="budget: {trials: !!int x}\n")
@example(head="name: fuzz\npreset: cpu-tiny-moe\n", text="description: !!timestamp x\n")
@example(head="name: fuzz\npreset: cpu-tiny-moe\n", text="budget: {trials: " + "9" * 5000 + "}\n")
@example(head="name: fuzz\n", text="preset: \"cpu-tiny-moe\\0\"\n")
@example(head="name: fuzz\n", text="preset: " + "p" * 300 + "\n")
@example(head="", text="name: fuzz\npreset: cpu-tiny-moe\nexecutor: {env: {\"a\\nb\": [1]}}\n")
def test_yamlish_text(work: Path, head: str, text: str) -> None:
    validate(work / "text.yaml", head + text, "yamlish_text")


@fuzz("job_documents")
@given(doc=job_documents(), flow=st.booleans())
def test_job_documents(work: Path, doc: dict[str, Any], flow: bool) -> None:
    """Valid bases with fields replaced by values of wrong types, huge or negative numbers, deep nesting,
    unknown keys, empty lists, None, strings where lists go."""
    try:
        text = json.dumps(doc, allow_nan=True) if flow else dump(doc)  # JSON is YAML's flow style
    except (ValueError, RecursionError):  # a number Python will not print: not a document anyone can write
        assume(False)
    validate(work / "doc.yaml", text, "job_documents")


# ------------------------------------------------------------------------------- aliases and nesting
WHERE = ["description: {}", "slos: {}", "executor: {{env: {}}}", "executor: {{extra_serve_args: {}}}",
         "space: {{mixed: {{max_num_seqs: {}}}}}", "workload: {{load_levels: {}}}", "zzz: {}", "model: {}",
         "cluster: {}", "baseline: {{config: {}}}"]


@st.composite
def alias_bombs(draw: st.DrawFn) -> str:
    levels, fan = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    leaf = draw(st.sampled_from(['"lol"', "1", "[1]", "{a: 1}", '"' + "x" * 4000 + '"', "{<<: {a: 1}}"]))
    kind = draw(st.sampled_from(["seq", "map", "merge"]))
    defs = [f"&a0 {leaf}"]
    for i in range(1, levels):
        if kind == "seq":
            defs.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
        elif kind == "map":
            defs.append(f"&a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(fan)) + "}")
        else:
            defs.append(f"&a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * fan) + f"], k{i}: *a{i - 1}}}")
    bomb = "[" + ", ".join(defs) + "]"
    where = draw(st.sampled_from(WHERE))
    return "name: fuzz\npreset: cpu-tiny-moe\n" + where.format(bomb) + "\n"


SELF_REFERENCES = [
    "name: fuzz\npreset: cpu-tiny-moe\nslos: &s [*s]\n",
    "name: fuzz\npreset: cpu-tiny-moe\nworkload: &w {isl: *w}\n",
    "&r {name: fuzz, preset: cpu-tiny-moe, workload: *r}\n",
    "name: fuzz\npreset: cpu-tiny-moe\nexecutor: &e {env: *e}\n",
    "name: fuzz\npreset: cpu-tiny-moe\nspace: &m {<<: *m}\n",
    "name: fuzz\npreset: cpu-tiny-moe\nspace: {mixed: &m {max_num_seqs: [*m]}}\n",
]


@fuzz("alias_bombs")
@given(text=st.one_of(alias_bombs(), st.sampled_from(SELF_REFERENCES)))
@example(text="name: fuzz\npreset: cpu-tiny-moe\nexecutor: {extra_serve_args: [&s '" + "x" * 100_000 + "', "
         + ", ".join(["*s"] * 200) + "]}\n")
def test_alias_bombs(work: Path, text: str) -> None:
    """Anchors inside anchors ("billion laughs"), merge keys, and documents that contain themselves."""
    o = validate(work / "bomb.yaml", text, "alias_bombs")
    if "&s '" in text:  # 20 MB of arguments from a 100 kB file: refused before anything copies or stores it
        assert o.code == 2 and "alias" in o.err, o


@fuzz("deep_nesting")
@given(depth=st.sampled_from([50, 200, 500, 1000, 5000, 100_000]),
       opener=st.sampled_from(["[", "{a: ", "- ", "a:\n"]),
       where=st.sampled_from(["", "name: fuzz\npreset: cpu-tiny-moe\nspace: ",
                              "name: fuzz\npreset: cpu-tiny-moe\nslos: "]))
def test_deep_nesting(work: Path, depth: int, opener: str, where: str) -> None:
    if opener in ("[", "{a: "):
        body = opener * depth + "1" + ("]" if opener == "[" else "}") * depth
    elif opener == "- ":
        body = "".join(" " * (2 * i) + "-\n" for i in range(min(depth, 2000))) + " " * (2 * min(depth, 2000)) + "1\n"
    else:
        body = "".join(" " * i + "a:\n" for i in range(min(depth, 2000))) + " " * min(depth, 2000) + "1\n"
    validate(work / "deep.yaml", where + body, "deep_nesting")


# ---------------------------------------------------------------------------- model.path config.json
QWEN_CONFIG = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
               "vocab_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 64}
DEEPSEEK_CONFIG = {"num_hidden_layers": 3, "first_k_dense_replace": 1, "hidden_size": 128, "vocab_size": 1024,
                   "num_attention_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 64, "qk_rope_head_dim": 16,
                   "qk_nope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 8, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 128,
                   "quantization_config": {"quant_method": "fp8"}, "num_nextn_predict_layers": 1}


@st.composite
def model_configs(draw: st.DrawFn) -> bytes | None:
    """config.json: a real-looking one with keys missing or of the wrong type, another JSON value, random
    bytes, or none at all (None)."""
    kind = draw(st.sampled_from(["dict", "dict", "dict", "json", "bytes", "none"]))
    if kind == "none":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=500))
    if kind == "json":
        v = draw(st.one_of(values, deep_values))
        return json.dumps(v).encode()
    cfg = copy.deepcopy(draw(st.sampled_from([QWEN_CONFIG, DEEPSEEK_CONFIG])))
    for k in draw(st.lists(st.sampled_from(sorted(cfg)), max_size=3)):
        cfg.pop(k, None)
    for k in draw(st.lists(st.sampled_from(sorted(set(QWEN_CONFIG) | set(DEEPSEEK_CONFIG))), max_size=3)):
        cfg[k] = draw(st.one_of(typed(1), typed(1), values))  # mostly numbers: zero, negative, huge, fractional
    return json.dumps(cfg, allow_nan=True).encode()


@fuzz("model_configs")
@given(config=model_configs())
@example(config=b'{"num_experts": ' + b"9" * 5000 + b"}")
@example(config=b"[" * 100_000)
def test_model_configs(work: Path, config: bytes | None) -> None:
    """``model.path`` names a folder whose config.json is broken; a missing key is named with the file."""
    folder = work / "model"
    folder.mkdir(exist_ok=True)
    cfg = folder / "config.json"
    cfg.unlink(missing_ok=True)
    if config is not None:
        cfg.write_bytes(config)
    job = dump({**BASE_JOB, "model": {"preset": None, "path": "model"}})
    o = validate(work / "model_job.yaml", job, "model_configs")
    if o.code == 2 and config is not None and config.startswith(b"{") and "missing" in o.err:
        assert "config.json" in o.err and "model.path" in o.err, o  # the key and the file


# ----------------------------------------------------------------------------- executor.perf_params
PERF_FIELDS = ["mfu_prefill", "mfu_decode", "hbm_eff", "step_latency_s", "kv_xfer_eff", "tpot_cv"]


@st.composite
def perf_files(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["dict", "dict", "json", "bytes", "none"]))
    if kind == "none":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=500))
    if kind == "json":
        return json.dumps(draw(st.one_of(values, deep_values))).encode()
    return json.dumps(draw(st.dictionaries(st.one_of(st.sampled_from(PERF_FIELDS), st.text(max_size=8)),
                                           st.one_of(typed(0.5), typed(0.5), values), max_size=4)),
                      allow_nan=True).encode()


@fuzz("perf_params")
@given(params=perf_files(), command=st.sampled_from(["validate", "validate", "tune"]))
@example(params=b'{"mfu_prefill": 0.5}', command="validate")
@example(params=b'{"mfu_prefill": 5}', command="tune")
@example(params=b"[" * 100_000, command="validate")
@example(params=b'{"mfu_prefill": ' + b"9" * 5000 + b"}", command="validate")
def test_perf_params(work: Path, params: bytes | None, command: str) -> None:
    """``executor.perf_params`` names a calibration file that is random bytes, JSON of the wrong shape, a
    parameter out of range, or no file: validate and tune (which loads it) both say so in one line."""
    pp = work / "perf.json"
    pp.unlink(missing_ok=True)
    if params is not None:
        pp.write_bytes(params)
    job = work / "perf_job.yaml"
    job.write_text(dump({**BASE_JOB, "executor": {"kind": "simulated", "perf_params": "perf.json"}}))
    if command == "validate":
        o = assert_exit_0_or_one_line(advisor("validate", str(job), count="perf_params"), params)
    else:
        from executors.perf import PerfParams

        try:  # a valid file would start a study: only broken ones go to tune
            PerfParams.load(pp)
            assume(False)
        except (OSError, ValueError):
            pass
        db = work / "perf.db"
        o = assert_exit_0_or_one_line(advisor("tune", str(job), "--trials", "1", "--storage", f"sqlite:///{db}",
                                              count="perf_params"), params)
        assert o.code == 2 and not db.exists(), o
    if o.code == 2:
        assert "executor.perf_params" in o.err and "perf.json" in o.err, o


# ------------------------------------------------------------------------- advisor simulate --config
#: The cpu-tiny-moe space's candidates (aggregated and disaggregated), as simulate --config files hold them.
CONFIGS = [cfg.model_dump(mode="json") for _, cfg in job_from_dict(BASE_JOB).space.enumerate()]


@st.composite
def simulate_configs(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["doc", "doc", "doc", "bytes", "text"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(yamlish)
    cfg = copy.deepcopy(draw(st.sampled_from(CONFIGS)))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(cfg) or [("mode",)]))
        cfg = put(cfg, path, draw(st.one_of(typed(_at(cfg, path)), typed(_at(cfg, path)), values)))
    try:
        return dump(cfg)
    except (ValueError, RecursionError):
        assume(False)
        raise


@fuzz("simulate_configs")
@given(doc=simulate_configs())
def test_simulate_configs(work: Path, doc: str | bytes) -> None:
    """``advisor simulate JOB --config FILE``: the configuration file is the other file it reads, and a
    configuration of huge or zero sizes goes through the performance model."""
    job = work / "sim_job.yaml"
    job.write_text(dump(BASE_JOB))
    conf = work / "config.yaml"
    conf.write_bytes(doc.encode("utf-8", "surrogatepass") if isinstance(doc, str) else doc)
    assert_exit_0_or_one_line(advisor("simulate", str(job), "--config", str(conf), count="simulate_configs"), doc)


# ------------------------------------------------------------------------------------- command lines
arg_text = st.one_of(st.text(max_size=12), st.sampled_from(NASTY_STRINGS[:-1] + ["-1", "0", "1e9", "--", "-",
                                                                                   "--help=x", "--storage"]))


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """Argument lists for every command that reads input, with random values where they take one. A study
    never starts: tune gets a job file that does not load (its options are parsed first)."""
    db = "sqlite:///no-such.db"
    a = arg_text
    return draw(st.sampled_from([
        lambda: ["validate", draw(a)],
        lambda: ["validate", "bad.yaml", draw(st.sampled_from(["--show", "--shw", "-s", draw(a)]))],
        lambda: ["tune", "bad.yaml", "--trials", draw(a), "--storage", db],
        lambda: ["tune", "bad.yaml", "--wall-time", draw(a), "--storage", db],
        lambda: ["tune", "bad.yaml", "--executor", draw(a), "--storage", db],
        lambda: ["tune", "bad.yaml", "--study", draw(a), "--ray-address", draw(a), "--storage", db],
        lambda: ["studies", "--storage", draw(st.one_of(a, a.map(lambda s: "sqlite:///" + s),
                                                        a.map(lambda s: s + "://")))],
        lambda: ["studies", "--format", draw(a), "--storage", db],
        lambda: ["trials", draw(a), "--state", draw(a), "--storage", db],
        lambda: ["best", draw(a), "--top", draw(a), "--storage", db],
        lambda: ["export", draw(a), "--format", draw(a), "--trial", draw(a), "--storage", db],
        lambda: ["query", draw(a), draw(a), "--format", draw(a), "--storage", db],
        lambda: ["calibrate", draw(a), "--folds", draw(a), "--seed", draw(a), "--params", draw(a),
                 "--storage", db],
        lambda: ["calibrate", "--out", draw(a)],
        lambda: ["simulate", "bad.yaml", "--config", draw(a)],
        lambda: ["cleanup", draw(a), "--stale-after", draw(a), "--storage", db],
        lambda: [draw(a), draw(a)],
    ]))()


@fuzz("command_lines")
@given(args=command_lines())
def test_command_lines(work: Path, args: list[str]) -> None:
    (work / "bad.yaml").write_text("name: fuzz\npreset: no-such-preset\n")
    if "--help" in args or (args and args[0] in ("--help", "-h")):
        assume(False)  # help is exit 0 and many lines: not bad input
    o = assert_exit_0_or_one_line(advisor(*args, count="command_lines"), args)
    assert not (work / "no-such.db").exists(), f"{args} created the database ({o.code})"


def test_enough_inputs() -> None:
    """The issue's bar: at least 1,000 generated documents, byte strings and command lines per run (counted
    when the whole file ran; a -k selection skips this)."""
    if set(RAN) != set(EXAMPLES):
        pytest.skip(f"only {sorted(RAN)} ran")
    assert sum(RAN.values()) >= 1000, RAN
