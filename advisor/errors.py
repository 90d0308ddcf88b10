"""Errors that reach the user as one line and exit code 2 (bad input), never as a traceback."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

#: What ``str.splitlines`` breaks a line at (besides \r and \n): a message holding one would print as two lines.
_LINE_BREAKS = re.compile(r"[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+")
#: Other control characters, written as escapes (a terminal would act on them).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")


def one_line(text: str) -> str:
    """``text`` as one printable line: line breaks become spaces, other control characters ``\\xNN``."""
    text = _LINE_BREAKS.sub(" ", text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text).strip()


class BadInput(Exception):
    """The user's input is wrong: the message names what, where, and what is allowed. Always one line:
    whatever the message quotes (a key, a value, an exception's text) cannot break it."""

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(one_line(str(message)) or "bad input", *args)


class EnvironmentFailed(Exception):
    """The machine, not the input, failed (a deployment that died, a probe that could not run): one line on
    stderr and exit 3, like a study stopped by repeated environment failures."""

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(one_line(str(message)) or "the environment failed", *args)


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 4 MB string or a 5,000-digit number is not repeated)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"<an integer of about {value.bit_length() * 0.30103:,.0f} digits>" if isinstance(value, int) \
            else f"<{type(value).__name__}>"
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis."""
    return text if len(text) <= limit else f"{text[:limit - 1]}…"


def _loc(loc: tuple) -> str:
    def part(p: Any) -> str:
        if isinstance(p, str) and not re.fullmatch(r"[\w.-]+", p):  # a key with blanks, quotes, breaks: quoted
            return shown(p, 40)
        return str(p)

    return ".".join(part(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def describe_validation_error(e: ValidationError, source: str) -> str:
    """The first problem of a pydantic error, in one line: ``job.yaml: cluster.gpu: …``."""
    err = e.errors(include_url=False)[0]
    loc = _loc(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _loc(err["loc"][:-1])
        allowed = _allowed_fields(e, err["loc"][:-1])
        where = f" in {parent}" if parent else ""
        return (f"{source}: unknown field {shown(err['loc'][-1], 60)}{where}"
                + (f"; allowed: {', '.join(allowed)}" if allowed else ""))
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = err.get("input")
    quoted = got is not None and not isinstance(got, dict | list) and kind != "missing"
    return f"{source}: {loc or 'document'}: {msg}" + (f" (got {shown(got)})" if quoted else "")


def _allowed_fields(e: ValidationError, parent_loc: tuple) -> list[str]:
    """Field names the model at ``parent_loc`` accepts (best effort, for the message only)."""
    model = getattr(e, "_advisor_model", None)
    if model is None:
        return []
    for part in parent_loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        ann = field.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")]
        if not inner:
            return []
        model = inner[0]
    return sorted(model.model_fields)


# ----------------------------------------------------------------------------------------- reading YAML
def read_capped(path: Path, what: str, *, max_bytes: int, too_large: str) -> bytes:
    """The bytes of a file the user names, read no further than ``max_bytes`` (/dev/zero is no input either), or
    ``BadInput`` with one line: unreadable (naming ``what``), or larger (``too_large`` says what such a file is)."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise BadInput(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    if len(raw) > max_bytes:
        raise BadInput(f"{path}: more than {max_bytes:,} bytes {too_large}")
    return raw


def read_yaml_file(path: Path, what: str, *, max_bytes: int) -> Any:
    """The YAML document of a file the user names (``what``: "job file", "configuration"), or ``BadInput``
    with one line: unreadable, larger than ``max_bytes`` (read no further: /dev/zero is no job either), not
    UTF-8, or not YAML (``parse_yaml``)."""
    raw = read_capped(path, what, max_bytes=max_bytes,
                      too_large=f"is too large for a {what}; a {what} is a small YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); a {what} is a "
                       "YAML file") from None
    return parse_yaml(text, str(path), max_expanded=max_bytes)


def parse_yaml(text: str, source: str, *, max_expanded: int) -> Any:
    """``yaml.safe_load(text)``, or ``BadInput`` with one line naming ``source`` and what is wrong.

    Besides what YAML itself rejects: a document whose aliases expand to more than ``max_expanded``
    characters ("billion laughs": anchors repeated inside anchors; the parsed objects are shared, but code
    that walks, copies or stores the job would expand them), an alias inside the node it refers to (a
    self-referencing document: nothing a job holds contains itself), nesting too deep to read, and what the
    constructors raise on values they cannot build (``!!int x``, ``!!timestamp x``, a 5,000-digit number)."""
    loader = node = None
    try:
        loader = yaml.SafeLoader(text)  # the reader checks the characters here already
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, source, max_expanded)
        _check_unique_keys(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(e, yaml.reader.ReaderError):  # a control character: say which and where
            where = f" (character #x{e.character:04x} at offset {e.position})" if isinstance(e.character, int) else ""
        what = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e)
        raise BadInput(f"{source}: not valid YAML{where}: {what}") from None
    except RecursionError:
        raise BadInput(f"{source}: nested too deeply for YAML to read (a job is a few levels of mappings and "
                       "lists)") from None
    except (ValueError, TypeError, AttributeError, OverflowError, IndexError, KeyError) as e:
        # the constructors' own errors: `!!int x` (ValueError), `!!timestamp x` (AttributeError), 2001-13-45
        bad = _unbuildable(loader, node) if loader is not None and node is not None else None
        where = f" at line {bad.start_mark.line + 1}, column {bad.start_mark.column + 1}" if bad else ""
        value = f" {shown(bad.value, 40)}" if bad else ""
        tag = f" as {bad.tag.replace('tag:yaml.org,2002:', '!!')}" if bad else ""
        if isinstance(e, ValueError) and "integer string conversion" in str(e):
            raise BadInput(f"{source}: a number{where} has more digits than can be read (at most "
                           f"{sys.get_int_max_str_digits():,}); no field takes such a number") from None
        why = f" ({cut(str(e), 120)})" if isinstance(e, ValueError | OverflowError) else ""  # not `'NoneType'…`
        raise BadInput(f"{source}: not valid YAML{where}: the value{value} cannot be read{tag}{why}; write it as "
                       "a plain value (a number, true/false, or quoted text)") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_unique_keys(root: yaml.Node, source: str) -> None:
    """A key given twice in one mapping is refused: YAML loaders keep the last silently, so a job with two
    ``budget:`` blocks would run with one of them, and nobody would know which."""
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[tuple[str, str], yaml.Node] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if (k.tag, k.value) in keys:
                        raise BadInput(f"{source}: not valid YAML at line {k.start_mark.line + 1}, column "
                                       f"{k.start_mark.column + 1}: the key {shown(k.value, 40)} is given twice "
                                       f"(first at line {keys[k.tag, k.value].start_mark.line + 1}); give it once")
                    keys[k.tag, k.value] = k
                stack += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def _check_expansion(root: yaml.Node, source: str, limit: int) -> None:
    """How large the document is with every alias written out (memoised by node, iteratively: a deep
    document does not recurse here); a node that contains itself is an error."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > limit:
                raise BadInput(f"{source}: YAML anchors and aliases expand to more than {limit:,} characters "
                               f"(aliases of anchors that hold aliases, a 'billion laughs', near line "
                               f"{node.start_mark.line + 1}); a job is a small file: write values out or use "
                               f"fewer aliases")
            continue
        if key in size:
            continue
        if key in on_path:
            raise BadInput(f"{source}: the YAML node at line {node.start_mark.line + 1}, column "
                           f"{node.start_mark.column + 1} contains itself through an alias (a self-referencing "
                           f"document); an alias may only repeat a node that ends before it")
        if isinstance(node, yaml.ScalarNode):
            size[key] = 1 + len(node.value)
            continue
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def _unbuildable(loader: yaml.SafeLoader, root: yaml.Node) -> yaml.ScalarNode | None:
    """The first scalar whose tag's constructor fails (the node to name in the message)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            try:
                loader.construct_object(node, deep=True)
            except Exception:  # noqa: BLE001 - whatever the constructor raises marks the node
                return node
        stack.extend(reversed(_children(node)))
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    return []
