"""The knobs' lists of choices on ``RoleSpace`` are generated from ``search_spaces.knobs.KNOBS`` alone: no class
declares them by hand (a hand-kept copy for the type checker fell behind the table), and each is read by the
knob's name through the typed accessor ``RoleSpace.choices``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from search_spaces import KNOBS, RoleSpace
from search_spaces import space as space_module


def test_no_class_declares_a_knobs_list_by_hand() -> None:
    tree = ast.parse(Path(space_module.__file__).read_text())
    declared = {node.target.id for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    assert declared & {k.space for k in KNOBS} == set()


def test_every_knob_is_a_field_read_by_its_name() -> None:
    default = RoleSpace()
    for k in KNOBS:
        assert k.space in RoleSpace.model_fields, k.name
        assert default.choices(k.name) == [k.default]
    named = RoleSpace(max_num_seqs=[8, 64], dbo=[False, True], kv_cache_dtype=["auto", "fp8"])
    assert named.choices("max_num_seqs") == [8, 64]
    assert named.choices("enable_dbo") == [False, True]  # the knob's name, not its list's field name
    assert named.choices("kv_cache_dtype") == ["auto", "fp8"]
    with pytest.raises(KeyError):
        named.choices("dbo")
