"""A real stall on vLLM's CPU build: the level is measured again and the run without the pause kept.

On the session's tiny-MoE deployment (``tests/shared_runs.py``, ``tiny_local_probe``), after its own levels, one
level (``STALL``, c=2) runs while the test stops the vLLM server's process group with SIGSTOP for ``STALL_PAUSE_S``
(10 s: long enough for 20× a bursty level's reference gap, ``tests/shared_runs.py``) once the server takes its first
request, then continues it (in a ``finally``). The pause is what a just-in-time kernel compile
does to a level on a GPU (the H200 of 4 Dec: 6.7-13.2 s, docs/measurement.md "Stalls"); the measure loop must see
it, measure the level again, and keep the second run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shared_runs import STALL_PAUSE_S


@pytest.mark.vllm
def test_a_level_paused_by_sigstop_is_measured_again_without_the_pause(tiny_local_probe):
    side = tiny_local_probe["side"]
    assert "stall_error" not in side, side.get("stall_error")
    paused, m = side["stall_pause"], side["stall"]
    note = m.raw.get("stall_remeasured") or {}
    print(f"\npaused {paused.get('paused_s')} s; first run's longest pause {note.get('first_pause_s')} s, "
          f"its reference {(note.get('dropped') or {}).get('pause_reference_s')} s; kept run's "
          f"{m.raw.get('longest_pause_s')} s (reference {m.raw.get('pause_reference_s')} s); "
          f"flags {m.flags}")
    assert paused["paused_s"] >= STALL_PAUSE_S
    assert note["kept"] == "rerun"
    assert note["first_pause_s"] >= STALL_PAUSE_S - 0.5  # the client saw the whole pause (less a poll's delay)
    assert "stall-remeasured" in m.flags and "stalled" not in m.flags
    assert m.completed == m.num_requests
    # the re-run's result is on disk beside the first's (``c2-2``: its own name and seed)
    (second,) = [json.loads(p.read_text()) for p in Path(tiny_local_probe["runs"]).glob("*/bench/c2-2.json")]
    assert second["completed"] == m.completed
