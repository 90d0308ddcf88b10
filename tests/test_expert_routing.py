"""Skewed expert routing as a workload property (issue #18): the value's forms and errors, the server
environment it maps to, the vLLM plugin's Zipf strategy run on vLLM's own routing simulator (CPU tensors),
EPLB's diagnosis flag in ``--eplb-config`` and its log line read per level, and the value stored with each level.
The real servers (plugin loaded, strategy logged, value stored) are in tests/test_tune_real.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import db
from executors.measuring import metrics
from executors.vllm.render import eplb_config_json, role_flags
from executors.vllm.routing import zipf_exponent, zipf_shares
from search_spaces import Measurement, Workload
from search_spaces.deployment import EPLBConfig, Role, RoleConfig
from search_spaces.workload import ROUTING_ENV, ExpertRouting, routing_env, routing_label, server_env


# ----------------------------------------------------------------------------------------- the value
@pytest.mark.parametrize(("written", "text", "strategy"), [
    ("real", "real", None),
    ("uniform", "uniform", "uniform_random"),
    ("normal", "normal", "normal_routing"),
    ("zipf", "zipf 1.1", "zipf_1.1"),
    ("zipf 1.3", "zipf 1.3", "zipf_1.3"),
    ("zipf:2", "zipf 2", "zipf_2"),
    ("ZIPF_0.5", "zipf 0.5", "zipf_0.5"),
    ({"kind": "zipf", "exponent": 1.25}, "zipf 1.25", "zipf_1.25"),
    ({"kind": "uniform"}, "uniform", "uniform_random"),
])
def test_forms_text_and_server_environment(written: object, text: str, strategy: str | None) -> None:
    r = ExpertRouting.model_validate(written)
    assert str(r) == text
    assert r.strategy == strategy
    assert routing_env(r) == ({ROUTING_ENV: strategy} if strategy else {})
    assert ExpertRouting.model_validate(text) == r  # the stored text reads back as the same value
    w = Workload(expert_routing=written)
    assert w.model_dump()["expert_routing"] == text
    assert Workload.model_validate_json(w.model_dump_json()).expert_routing == r  # as the Ray bench task reads it
    assert server_env(w) == routing_env(text)


def test_default_is_the_real_router_and_shows_nothing() -> None:
    w = Workload()
    assert str(w.expert_routing) == "real" and routing_env(w.expert_routing) == {}
    assert routing_label(w) is None and routing_label(None) is None and routing_label("real") is None


def test_label_for_every_view() -> None:
    assert routing_label("zipf 1.1") == "simulated routing: zipf 1.1"
    assert routing_label(Workload(expert_routing="zipf")) == "simulated routing: zipf 1.1"
    assert routing_label(ExpertRouting(kind="uniform")) == "simulated routing: uniform"
    assert routing_label("gaussian-ish") == "simulated routing: gaussian-ish"  # a stored value we cannot read


@pytest.mark.parametrize(("written", "words"), [
    ("zipf 0", ["exponent must be > 0"]),
    ("zipf -1.5", ["exponent must be > 0"]),
    ({"kind": "zipf", "exponent": 0}, ["exponent must be > 0"]),
    ("zipf inf", ["exponent must be > 0"]),
    ("zipf steep", ["'steep' is not a number"]),
    ("skewed", ["unknown expert routing", "allowed"]),
    ("uniform 2", ["takes no exponent"]),
    ({"kind": "pareto"}, ["kind"]),
])
def test_bad_values(written: object, words: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        Workload(expert_routing=written)
    assert all(w in str(e.value) for w in words), str(e.value)


# ------------------------------------------------------------------------------------ the vLLM plugin
def test_strategy_names_carry_the_exponent() -> None:
    assert zipf_exponent("zipf_1.1") == 1.1 and zipf_exponent("zipf_2") == 2.0 and zipf_exponent("zipf_.5") == 0.5
    assert zipf_exponent("zipf_0") is None and zipf_exponent("zipf_-1") is None and zipf_exponent("zipf") is None
    assert zipf_exponent("uniform_random") is None
    s = zipf_shares(8, 1.1)
    assert abs(sum(s) - 1) < 1e-12 and all(a > b for a, b in zip(s, s[1:], strict=False))


@pytest.fixture
def simulator(monkeypatch: pytest.MonkeyPatch):
    """vLLM's routing simulator (CPU build) with the registry restored afterwards."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import RoutingSimulator

    saved = dict(RoutingSimulator._routing_strategies)
    yield RoutingSimulator
    RoutingSimulator._routing_strategies.clear()
    RoutingSimulator._routing_strategies.update(saved)


def test_plugin_registers_zipf_and_vllm_routes_with_it(simulator, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from executors.vllm import routing as vllm_routing

    monkeypatch.setenv(ROUTING_ENV, ExpertRouting.model_validate("zipf 1.1").strategy)
    with caplog.at_level(logging.INFO, logger=vllm_routing.log.name):
        vllm_routing.register()
        vllm_routing.register()  # vLLM may load plugins more than once per process
    assert "zipf_1.1" in simulator.get_available_strategies()
    assert "registered MoE routing strategy zipf_1.1" in caplog.text
    n, experts, k = 40_000, 8, 2
    weights, ids = simulator.simulate_routing(torch.randn(n, 16), torch.randn(n, experts), "zipf_1.1", k)
    assert ids.shape == (n, k) and ids.dtype == torch.int32  # what torch.ops._C.cpu_fused_moe takes
    assert bool((ids[:, 0] != ids[:, 1]).all())  # k distinct experts per token
    assert torch.allclose(weights, torch.full((n, k), 1.0 / k))
    first = torch.bincount(ids[:, 0].long(), minlength=experts).double() / n
    expect = torch.tensor(zipf_shares(experts, 1.1), dtype=torch.double)
    assert torch.allclose(first, expect, atol=0.01), (first, expect)  # first choices follow the Zipf law
    load = torch.bincount(ids.flatten().long(), minlength=experts).double() / ids.numel()
    assert load[0] / load.mean() > 1.8  # the skew EPLB has to fix: the hottest expert carries ~2× its share
    # the same draws in every process that runs the same steps (one seed): ranks agree
    again = vllm_routing.make_strategy(1.1).route_tokens(torch.randn(n, 16), torch.randn(n, experts), k)[1]
    fresh = vllm_routing.make_strategy(1.1).route_tokens(torch.randn(n, 16), torch.randn(n, experts), k)[1]
    assert torch.equal(again, fresh)


def test_plugin_makes_vllms_own_strategies_cpu_safe(simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from executors.vllm import routing as vllm_routing

    h, logits = torch.randn(64, 16), torch.randn(64, 8)
    assert simulator.simulate_routing(h, logits, "uniform_random", 2)[1].dtype == torch.long  # as shipped
    monkeypatch.setenv(ROUTING_ENV, "uniform_random")
    vllm_routing.register()
    vllm_routing.register()  # wrapped once
    assert hasattr(simulator._routing_strategies["uniform_random"], "wrapped")
    assert not hasattr(simulator._routing_strategies["uniform_random"].wrapped, "wrapped")
    assert simulator.simulate_routing(h, logits, "uniform_random", 2)[1].dtype == torch.int32
    assert simulator.simulate_routing(h, logits, "uniform_random", 2, torch.long)[1].dtype == torch.long


def test_plugin_is_idle_without_a_simulated_strategy(simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    from executors.vllm import routing as vllm_routing

    before = list(simulator.get_available_strategies())
    for value in ("", "zipf_0", "something_else"):
        monkeypatch.setenv(ROUTING_ENV, value)
        vllm_routing.register()
    assert simulator.get_available_strategies() == before


def test_the_entry_point_is_installed() -> None:
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("deploy_advisor_routing") == "executors.vllm.routing:register", (
        "reinstall the project (scripts/setup.sh --force, or pip install -e '.[cpu,test]')")


# ------------------------------------------------------------------------------------------ EPLB diagnosis
def _decode(eplb: EPLBConfig) -> RoleConfig:
    return RoleConfig(role=Role.DECODE, data_parallel_size=2, enable_expert_parallel=True, eplb=eplb)


def test_eplb_config_carries_log_balancedness_only_when_asked() -> None:
    role = _decode(EPLBConfig(enabled=True, num_redundant_experts=2, window_size=500, step_interval=100))
    plain = role_flags(role)
    asked = role_flags(role, log_balancedness=True)
    doc = json.loads(asked[asked.index("--eplb-config") + 1])
    assert doc == {"window_size": 500, "step_interval": 100, "num_redundant_experts": 2, "log_balancedness": True}
    assert "log_balancedness" not in plain[plain.index("--eplb-config") + 1]
    assert "--eplb-config" not in role_flags(_decode(EPLBConfig()), log_balancedness=True)  # no EPLB: no flag
    assert json.loads(eplb_config_json(role)) == json.loads(role.eplb.config_json())


# vLLM's own line (vllm/distributed/eplb/eplb_state.py, EplbState.step, EP rank 0): "EPLB step: %d for model %s:
# avg_tokens=%.2f, max_tokens=%d, balancedness=%.4f, steps until the next rearrangement: %d", as the server log
# carries it with vLLM's prefix; idle DP steps log zeros.
_FMT = ("(EngineCore_DP0 pid=4242) INFO 12-02 03:00:0{s} [eplb_state.py:633] EPLB step: {step} for model main: "
        "avg_tokens={avg:.2f}, max_tokens={mx:d}, balancedness={bal:.4f}, steps until the next rearrangement: {left:d}\n")


def _line(step: int, avg: float, mx: int) -> str:
    return _FMT.format(s=step % 10, step=step, avg=avg, mx=mx, bal=avg / mx if mx else 0.0, left=100 - step)


def test_balancedness_is_read_per_level_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "decode-0.log"
    log.write_text("(APIServer pid=1) INFO starting\n" + _line(1, 10.0, 20) + _line(2, 30.0, 40))
    mark = metrics.log_size(log)  # a level starts here
    with log.open("a") as fh:
        fh.write(_line(3, 12.5, 25) + _line(4, 0.0, 0) + "(APIServer pid=1) INFO 127.0.0.1 POST /v1/completions\n"
                 + _line(5, 37.5, 50))
    level = metrics.eplb_balancedness(log, mark)
    assert level == pytest.approx((12.5 + 37.5) / (25 + 50))  # idle steps do not count
    assert metrics.eplb_balancedness(log, 0) == pytest.approx((10 + 30 + 12.5 + 37.5) / (20 + 40 + 25 + 50))
    assert metrics.eplb_balancedness(log, metrics.log_size(log)) is None  # nothing logged: unknown, not 0
    assert metrics.eplb_balancedness(tmp_path / "missing.log") is None


# ------------------------------------------------------------------------------------------ stored per level
def _level(**kw: object) -> Measurement:
    base = dict(concurrency=4, source="measured", gpus=2, num_requests=8, completed=8, throughput_per_gpu=10.0)
    return Measurement(**{**base, **kw})


def test_routing_and_balancedness_are_stored_with_each_level(tmp_path: Path) -> None:
    from db import queries
    from search_spaces import TrialState

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with db.connect(url) as d:
        d.upsert_study("s", {})
        tid = d.start_trial("s", 0, params={})
        d.finish_trial(tid, TrialState.COMPLETE, measurements=[
            _level(concurrency=1, expert_routing="zipf 1.1", eplb_balancedness=0.61),
            _level(concurrency=4, expert_routing="zipf 1.1"),
        ])
        t = queries.get_trial(d, "s", 0)
        assert [m.expert_routing for m in t.measurements] == ["zipf 1.1", "zipf 1.1"]
        assert [m.eplb_balancedness for m in t.measurements] == [0.61, None]
        _, rows = queries.level_table(d, "s", ["expert_routing", "eplb_balancedness"])
        assert [(r.expert_routing, r.eplb_balancedness) for r in rows] == [("zipf 1.1", 0.61), ("zipf 1.1", None)]
        assert "expert_routing" not in (t.measurements[0].raw or {}).get("__unmapped__", {})  # a column, not raw


def test_levels_recorded_before_0004_read_none_and_new_ones_their_routing(tmp_path: Path) -> None:
    """A database left at 0003 by an older deploy-advisor upgrades in place: its levels stay, routing None."""
    from alembic import command

    from db import queries
    from db.connection import alembic_config
    from search_spaces import TrialState

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with db.connect(url) as d:
        d.upsert_study("s", {})
        d.finish_trial(d.start_trial("s", 0, params={}), TrialState.COMPLETE, measurements=[_level()])
        cfg = alembic_config()
        with d._engine.execution_options(advisor_write=True).connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0003")
    with db.connect(url) as d:  # upgrades to head again
        old = queries.get_trial(d, "s", 0)
        assert old is not None and old.measurements[0].throughput_per_gpu == 10.0
        assert old.measurements[0].expert_routing is None
        d.finish_trial(d.start_trial("s", 1, params={}), TrialState.COMPLETE,
                       measurements=[_level(expert_routing="uniform")])
        assert queries.get_trial(d, "s", 1).measurements[0].expert_routing == "uniform"
