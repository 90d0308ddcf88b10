"""The deployments a prediction is asked about, as the load-level model (``executors.perf.levels``) reads them:
what does not depend on the load level — the roles' constants gathered into arrays, the KV hand-off, a lone
request's prefill, the decode step grid — computed once per deployment (each distinct role once). Part of
``executors.perf`` (``docs/performance-model.md`` §4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from executors.perf.derived import _md, _ModelDerived, _Role, _wd, _WorkloadDerived
from executors.perf.params import PerfParams
from executors.perf.step import Arr, _decode_cv, _Roles, _step
from search_spaces import Mode, ModelProfile, Workload

if TYPE_CHECKING:
    from executors.topology import Topology


def _kv_handoff(topo: Topology, md: _ModelDerived, wd: _WorkloadDerived, p: PerfParams) -> tuple[float, float]:
    """(time, capacity in requests/s) of moving one request's KV from prefill to decode."""
    cfg, cluster = topo.config, topo.cluster
    assert cfg.prefill is not None
    spec = cluster.spec
    # KV hand-off: the whole context (prefix included) moves; NVLink when the cluster is one domain
    kv_bytes = md.kv_tok * wd.isl
    one_domain = cluster.total_gpus <= max(spec.scaleup_domain, cluster.gpus_per_node)
    link = (spec.scaleup_gbps if one_domain else spec.scaleout_gbps) * 1e9 * p.kv_xfer_eff
    t_kv = p.kv_xfer_latency_s + kv_bytes / link + p.request_latency_s  # the request's way in rides along
    mu_kv = min(cfg.prefill.gpus, cfg.decode.gpus) * link / kv_bytes
    return t_kv, mu_kv


def _prefill_alone(Rp: _Roles) -> Arr:
    """Prefill latency of one request with the prefill instance otherwise idle."""
    wd = Rp.wd
    P1 = np.minimum(Rp.mnbt, wd.isl_new)
    zero = np.zeros_like(P1)
    s_alone = _step(Rp, zero, P1, P1 / wd.isl_new, zero, np.ones_like(P1))
    return np.maximum(wd.isl_new / P1, 1.0) * s_alone.total


def _decode_grid(Rd: _Roles) -> tuple[Arr, Arr, Arr, Arr, Arr, Arr]:
    """(decode steps per request, KV batch cap, batch cap, τ(b) at a few batch sizes: the sizes, the times and how
    many there are) of decode roles: the closed-loop solve interpolates τ(b) through the grid and is exact at its
    answer. A role's grid is padded with its last point to the longest one's length."""
    wd = Rd.wd
    osl_steps = wd.osl / Rd.acc
    b_kv = Rd.kv_cap / (wd.isl + wd.osl)
    b_cap = np.maximum(np.minimum(Rd.mns, b_kv), 1.0)
    grids = [sorted({1.0, c ** (1 / 3), c ** (2 / 3), c}) for c in b_cap.tolist()]
    owner = np.array([i for i, g in enumerate(grids) for _ in g], dtype=int)
    R = Rd.take(owner)
    b = np.array([x for g in grids for x in g], dtype=float)
    tau = _step(R, b, np.zeros_like(b), np.zeros_like(b), _decode_cv(R, b), np.ones_like(b)).total.tolist()
    npts = np.array([len(g) for g in grids], dtype=int)
    width, at = int(npts.max()), 0
    pts_b, pts_t = np.zeros((len(grids), width)), np.zeros((len(grids), width))
    for i, g in enumerate(grids):
        ts = tau[at:at + len(g)]
        at += len(g)
        pts_b[i], pts_t[i] = g + [g[-1]] * (width - len(g)), ts + [ts[-1]] * (width - len(g))
    return osl_steps, b_kv, b_cap, pts_b, pts_t, npts



def _distinct(ids: list[int]) -> tuple[Arr, Arr]:
    """(the distinct ``ids`` in order of first appearance, where each of ``ids`` is among them)."""
    first: dict[int, int] = {}
    at = [first.setdefault(i, len(first)) for i in ids]
    return np.array(list(first), dtype=int), np.array(at, dtype=int)


class Deployments:
    """Placed deployments of one model and workload under one set of parameters, with what does not depend on the
    load level computed once: aggregated ones (``agg``) and P/D ones (``dis``), each mode's constants one element
    per deployment, in that mode's order (``pos``)."""

    def __init__(self, topologies: Sequence[Topology], model: ModelProfile, wl: Workload, p: PerfParams) -> None:
        self.topologies, self.model, self.wl, self.p = list(topologies), model, wl, p
        self.wd = _wd(wl)
        md = _md(model)
        modes = [t.config.mode is Mode.AGGREGATED for t in self.topologies]
        self.agg = np.array([i for i, a in enumerate(modes) if a], dtype=int)
        self.dis = np.array([i for i, a in enumerate(modes) if not a], dtype=int)
        # position of each deployment inside its mode's arrays
        self.pos = np.zeros(len(self.topologies), dtype=int)
        self.pos[self.agg] = np.arange(len(self.agg))
        self.pos[self.dis] = np.arange(len(self.dis))
        self.gpus = np.array([float(t.gpus) for t in self.topologies])
        # One ``_Role`` per distinct (role, draft tokens, cluster): a space's thousands of candidates combine a few
        # hundred roles, and building a role's constants was most of a batch's set-up
        uniq: dict[tuple[Any, ...], int] = {}
        roles: list[_Role] = []

        def role(cfg: Any, mtp: int, cluster: Any) -> int:
            key = (cfg, mtp, id(cluster))
            i = uniq.get(key)
            if i is None:
                i = uniq[key] = len(roles)
                roles.append(_Role(cfg, md, self.wd, cluster, p, mtp))
            return i

        ia, ip, idd = [], [], []
        for t in self.topologies:
            cfg = t.config
            d = role(cfg.decode, cfg.speculative_mtp_tokens, t.cluster)
            if cfg.mode is Mode.AGGREGATED:
                ia.append(d)
            else:
                assert cfg.prefill is not None
                ip.append(role(cfg.prefill, 0, t.cluster))
                idd.append(d)
        every = _Roles(roles, p, self.wd)
        if len(self.agg):
            self.Ra = every.take(np.array(ia, dtype=int))
            self.inst_a = np.array([float(self.topologies[i].config.decode.instances) for i in self.agg])
        if len(self.dis):
            tops = [self.topologies[i] for i in self.dis]
            self.Rp, self.Rd = every.take(np.array(ip, dtype=int)), every.take(np.array(idd, dtype=int))
            kv = [_kv_handoff(t, md, self.wd, p) for t in tops]
            self.t_kv = np.array([x[0] for x in kv], dtype=float)
            self.mu_kv = np.array([x[1] for x in kv], dtype=float)
            # each distinct role's lone prefill and decode grid once, then one element per deployment
            up, at_p = _distinct(ip)
            ud, at_d = _distinct(idd)
            self.S_p = _prefill_alone(every.take(up))[at_p]
            grid = _decode_grid(every.take(ud))
            self.osl_steps_d, self.b_kv_d, self.b_cap_d, self.pts_b, self.pts_t, self.npts = (x[at_d] for x in grid)
            pre: list[Any] = [t.config.prefill for t in tops]  # every one set: these are P/D deployments
            dec = [t.config.decode for t in tops]
            self.ranks_p = np.array([float(r.instances * r.data_parallel_size) for r in pre])
            self.ranks_d = np.array([float(r.instances * r.data_parallel_size) for r in dec])
            self.inst_pd = np.array([float(min(a.instances, b.instances)) for a, b in zip(pre, dec, strict=True)])
            self.tp_p = np.array([float(r.tensor_parallel_size) for r in pre])
