"""Errors that reach the user as one line and exit code 2 (bad input), never as a traceback."""

from __future__ import annotations

from pydantic import ValidationError


class BadInput(Exception):
    """The user's input is wrong: the message names what, where, and what is allowed."""


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def describe_validation_error(e: ValidationError, source: str) -> str:
    """The first problem of a pydantic error, in one line: ``job.yaml: cluster.gpu: …``."""
    err = e.errors(include_url=False)[0]
    loc = _loc(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        parent, _, field = loc.rpartition(".")
        allowed = _allowed_fields(e, err["loc"][:-1])
        where = f" in {parent}" if parent else ""
        return f"{source}: unknown field {field!r}{where}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = err.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) and kind != "missing" else ""
    return f"{source}: {loc or 'document'}: {msg}{shown}"


def _allowed_fields(e: ValidationError, parent_loc: tuple) -> list[str]:
    """Field names the model at ``parent_loc`` accepts (best effort, for the message only)."""
    model = getattr(e, "_advisor_model", None)
    if model is None:
        return []
    for part in parent_loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")]
        if not inner:
            return []
        model = inner[0]
    return sorted(model.model_fields)
