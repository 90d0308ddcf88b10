"""The step-time model over many deployments at once: ``perf_step`` with each deployment's role constants as one
element of NumPy arrays. Part of ``executors.perf_batch`` (whose docstring says why, and how the two are kept the
same floats)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from executors.perf_derived import _Role, _WorkloadDerived
from executors.perf_params import PerfParams
from executors.perf_step import DBO_DECODE_THRESHOLD, DBO_PREFILL_THRESHOLD, LL_MAX_TOKENS

Arr = np.ndarray

#: ``_Role`` attributes the step model reads, gathered into one array each.
_ROLE_FIELDS = ("q", "z_dp", "rate_lin", "f_body", "f_lm", "w_dense_t", "ctx_dec", "fa_dec", "rate_attn", "ctx_pf",
                "fa_pf", "kvb", "bw", "dp", "z_e", "k", "group", "cv_static2", "f_pair_g", "exp_eff", "slots_local",
                "log_miss", "w_slot_t", "mtp_factor", "c_byte", "own_div", "bytes_copy", "tp", "copies", "a2a_lat",
                "ar_t0", "ar_byte", "eager", "dp_sync", "eplb_amort", "acc", "kv_cap", "e")
_ROLE_FLAGS = ("agrs", "ll_chunked", "dbo", "graphable")


def _exp(x: Arr) -> Arr:
    """``math.exp`` of each element (bit-identical to the scalar model)."""
    return np.array([math.exp(v) for v in x.tolist()], dtype=float)


def _pow(x: Arr, y: Arr) -> Arr:
    """``x ** y`` element by element with Python floats (bit-identical to the scalar model)."""
    return np.array([a ** b for a, b in zip(x.tolist(), y.tolist(), strict=True)], dtype=float)


class _Roles:
    """One role's constants (``perf_derived._Role``) of many deployments, attribute by attribute."""

    def __init__(self, roles: Sequence[_Role], p: PerfParams, wd: _WorkloadDerived) -> None:
        self.p, self.wd = p, wd
        for name in _ROLE_FIELDS:
            setattr(self, name, np.array([float(getattr(r, name)) for r in roles], dtype=float))
        for name in _ROLE_FLAGS:
            setattr(self, name, np.array([bool(getattr(r, name)) for r in roles], dtype=bool))
        self.L_moe = np.array([float(r.md.L_moe) for r in roles], dtype=float)
        self.mnbt = np.array([float(r.cfg.max_num_batched_tokens) for r in roles], dtype=float)
        self.mns = np.array([float(r.cfg.max_num_seqs) for r in roles], dtype=float)

    def take(self, idx: Arr) -> _Roles:
        out = _Roles.__new__(_Roles)
        out.p, out.wd = self.p, self.wd
        for name in (*_ROLE_FIELDS, *_ROLE_FLAGS, "L_moe", "mnbt", "mns"):
            setattr(out, name, getattr(self, name)[idx])
        return out


class _Step:
    """``perf_step.Step`` of many deployments."""

    __slots__ = ("total", "dense", "attention", "experts", "comm", "exposed_comm", "overhead", "frontend",
                 "dp_imbalance", "expert_imbalance", "tokens")

    def __init__(self, *values: Arr) -> None:
        for name, v in zip(self.__slots__, values, strict=True):
            setattr(self, name, v)


def _step(R: _Roles, b: Arr, P: Arr, pf_seqs: Arr, cv_dp: Arr, occ: Arr) -> _Step:
    """``perf_step._step``, element by element."""
    p = R.p
    Td = b * R.q
    T = Td + P
    imb = np.where(occ >= 1.0, 1.0 + R.z_dp * cv_dp, 1.0)
    mfu = np.where(P > 0.0, p.mfu_decode + (p.mfu_prefill - p.mfu_decode) * (P / np.where(T > 0.0, T, 1.0)),
                   p.mfu_decode)
    rate = R.rate_lin * mfu
    t_dense = np.maximum((T * R.f_body + (Td + pf_seqs) * R.f_lm) * imb / rate, R.w_dense_t)
    t_attn_c = imb * (Td * R.ctx_dec * R.fa_dec / (R.rate_attn * p.attn_eff_decode)
                      + P * R.ctx_pf * R.fa_pf / (R.rate_attn * p.attn_eff_prefill))
    t_attn_m = imb * (b * R.ctx_dec + pf_seqs * R.ctx_pf) * R.kvb / R.bw
    t_attn = np.where(t_attn_c > t_attn_m, t_attn_c, t_attn_m)
    Tg = T * occ * R.dp
    spread = (R.z_e > 0.0) & (Tg > 0.0)
    pairs = np.where(spread, Tg * R.k / R.group, 1.0)
    imb_e = np.where(spread, 1.0 + R.z_e * np.sqrt(R.cv_static2 + 1.0 / pairs), 1.0)
    t_exp_c = Tg * R.k * R.f_pair_g * imb_e / (rate * R.exp_eff)
    touched = np.where(Tg > 0.0, R.slots_local * (1.0 - _exp(Tg * R.log_miss)), 0.0)
    t_exp_m = touched * R.w_slot_t
    t_exp = np.where(t_exp_c > t_exp_m, t_exp_c, t_exp_m)
    compute = (t_dense + t_attn + t_exp) * R.mtp_factor
    own = T / R.own_div
    vol = np.where(R.agrs, np.where(Tg > own, Tg - own, 0.0) * R.bytes_copy,
                   (T / R.tp) * R.copies * R.bytes_copy * imb_e)
    calls = 2.0 * np.where(R.ll_chunked & (T > LL_MAX_TOKENS), np.ceil(T / LL_MAX_TOKENS), 1.0)
    comm = np.where(R.c_byte > 0.0, R.L_moe * (calls * R.a2a_lat + vol * R.c_byte), 0.0)
    comm = np.where(R.ar_t0 > 0.0, comm + (R.ar_t0 + T * R.ar_byte), comm)
    split = R.dbo & (T >= np.where(P > 0.0, DBO_PREFILL_THRESHOLD, DBO_DECODE_THRESHOLD))
    c2 = compute * (1.0 + p.dbo_overhead)
    first = c2 > comm
    core_split = np.where(first, c2, comm) + (1.0 - p.dbo_overlap) * np.where(first, comm, c2)
    core = np.where(split, core_split, compute + comm)
    exposed = np.where(split, core_split - c2, comm)
    graphs = (P <= 0.0) & R.graphable
    overhead = (p.step_latency_s + np.where(graphs, 0.0, R.eager) + p.cpu_step_s
                + p.cpu_per_seq_s * (b + pf_seqs) + R.dp_sync + R.eplb_amort)
    gpu = core + overhead
    front = (b * R.acc + pf_seqs) * R.dp * occ * p.frontend_per_token_s
    total = np.where(gpu > front, gpu, front)
    return _Step(total, t_dense, t_attn, t_exp, comm, exposed, overhead, front, imb, imb_e, T)


def _decode_cv(R: _Roles, b: Arr) -> Arr:
    """``perf_step._decode_cv``."""
    return np.where(R.dp <= 1, 0.0,
                    R.p.dp_balance_cv * np.sqrt((1.0 + R.wd.cv_ctx_dec ** 2) / np.maximum(b, 1.0)))


def _prefill_cv(R: _Roles, P: Arr, q: Arr) -> Arr:
    """``perf_step._prefill_cv``."""
    wd = R.wd
    a = wd.ctx_pf * R.fa_pf / (R.rate_attn * R.p.attn_eff_prefill)
    lin = (R.f_body + R.k * R.f_pair_g * R.group / R.tp) / (R.rate_lin * R.p.mfu_prefill)
    f_att = a / (a + lin)
    cv_req = wd.cv_isl * (1.0 + f_att)
    n_step = np.maximum(P / wd.isl_new, 1.0)
    cv = R.p.dp_balance_cv * cv_req * np.sqrt(1.0 / n_step + 1.0 / np.maximum(q, 1.0))
    return np.where(R.dp <= 1, 0.0, cv)


def _prefill_capacity(R: _Roles, q: Arr) -> tuple[Arr, _Step]:
    """``perf_step._prefill_capacity`` (with imbalance): (new tokens/s per rank, the step)."""
    wd = R.wd
    P = np.minimum(np.minimum(R.mnbt, R.mns * wd.isl_new), np.maximum(q, 1.0) * wd.isl_new)
    P = np.where(R.kv_cap > 0, np.minimum(P, np.maximum(R.kv_cap, 1.0)), P)
    P = np.maximum(P, 1.0)
    st = _step(R, np.zeros_like(P), P, P / wd.isl_new, _prefill_cv(R, P, q), np.ones_like(P))
    return P / st.total, st
