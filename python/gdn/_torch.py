"""The torch custom ops: gdn's calls as torch.library.custom_op, each with a
fake (meta) implementation for torch.compile and, for the differentiable
ones, autograd that calls the matching backward op.

Optional outputs are returned as empty tensors (custom ops cannot return
None) and turned back into None by the functions of gdn.api. Backward
computes only what needs_input_grad asks for where the C API lets it skip
(ddt_bias, dh0, dbias); dq, dk, dv, dg, dbeta are one pass and come together.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _core, capi

Opt = Optional[Tensor]


def _none(x, device, dtype=torch.float32):
    return torch.empty(0, device=device, dtype=dtype) if x is None else x


def _n_seqs(q, cu_seqlens):
    return cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]


def _state_shape(N, HV, K, V, flags):
    return (N, HV, V, K) if flags & capi.STATE_V_FIRST else (N, HV, K, V)


# ---- the gated delta rule ----

@torch.library.custom_op("gdn::rule_fwd", mutates_args=())
def rule_fwd(q: Tensor, k: Tensor, v: Tensor, g: Opt, beta: Tensor, A_log: Opt, dt_bias: Opt, h0: Opt,
             cu_seqlens: Opt, cu_seqlens_cpu: Opt, scale: float, flags: int, want_ht: bool,
             recurrent: bool) -> Tuple[Tensor, Tensor, Tensor]:
    o, ht, saved = _core.chunk_fwd(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, scale, flags,
                                   want_ht=want_ht, want_saved=not recurrent, recurrent=recurrent)
    return o, _none(ht, q.device), _none(saved, q.device, torch.uint8)


@rule_fwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, scale, flags, want_ht, recurrent):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = v.new_empty(v.shape, dtype=q.dtype)
    ht = q.new_empty(_state_shape(_n_seqs(q, cu_seqlens), HV, K, V, flags) if want_ht else (0,),
                     dtype=torch.float32)
    n_saved = 8 * B * T * H if (flags & capi.QK_L2NORM) and not recurrent else 0
    return o, ht, q.new_empty((n_saved,), dtype=torch.uint8)


@torch.library.custom_op("gdn::rule_bwd", mutates_args=())
def rule_bwd(q: Tensor, k: Tensor, v: Tensor, g: Opt, beta: Tensor, A_log: Opt, dt_bias: Opt, h0: Opt,
             cu_seqlens: Opt, cu_seqlens_cpu: Opt, saved: Tensor, do: Tensor, dht: Opt, scale: float, flags: int,
             want_ddt_bias: bool, want_dh0: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                            Tensor]:
    grads = _core.chunk_bwd(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu,
                            saved if saved.numel() else None, do, dht, scale, flags, want_ddt_bias, want_dh0)
    return tuple(_none(x, q.device) for x in grads)


@rule_bwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, saved, do, dht, scale, flags,
      want_ddt_bias, want_dh0):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    fused = bool(flags & capi.GATE_FUSED)
    f32 = dict(dtype=torch.float32)
    e = q.new_empty((0,), **f32)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(g) if g is not None else e, torch.empty_like(beta),
            q.new_empty((HV,), **f32) if fused else e,
            q.new_empty((HV,), **f32) if fused and want_ddt_bias else e,
            q.new_empty(_state_shape(_n_seqs(q, cu_seqlens), HV, K, V, flags), **f32) if want_dh0 else e)


def _rule_setup(ctx, inputs, output):
    q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu, scale, flags, want_ht, recurrent = inputs
    ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu, output[2])
    ctx.scale, ctx.flags, ctx.want_ht = scale, flags, want_ht


def _rule_backward(ctx, do, dht, _dsaved):
    q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu, saved = ctx.saved_tensors
    need = ctx.needs_input_grad
    dq, dk, dv, dg, dbeta, dA, ddt, dh0 = rule_bwd(
        q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu, saved, do.contiguous(),
        dht.contiguous() if ctx.want_ht else None, ctx.scale, ctx.flags,
        bool(need[6] and dt_bias is not None), bool(need[7] and h0 is not None))
    fused = bool(ctx.flags & capi.GATE_FUSED)
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
            dg if need[3] and g is not None else None, dbeta if need[4] else None,
            dA if need[5] and fused else None, ddt if need[6] and dt_bias is not None else None,
            dh0 if need[7] and h0 is not None else None, None, None, None, None, None, None)


rule_fwd.register_autograd(_rule_backward, setup_context=_rule_setup)


# ---- causal conv1d ----

@torch.library.custom_op("gdn::conv1d_fwd", mutates_args=())
def conv1d_fwd(x: Tensor, weight: Tensor, bias: Opt, h0: Opt, cu_seqlens: Opt, cu_seqlens_cpu: Opt, silu: bool,
               want_ht: bool) -> Tuple[Tensor, Tensor]:
    y, ht = _core.conv1d_fwd(x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu, want_ht)
    return y, _none(ht, x.device)


@conv1d_fwd.register_fake
def _(x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu, want_ht):
    N = _n_seqs(x, cu_seqlens)
    return torch.empty_like(x), x.new_empty((N,) + tuple(weight.shape) if want_ht else (0,), dtype=torch.float32)


@torch.library.custom_op("gdn::conv1d_bwd", mutates_args=())
def conv1d_bwd(x: Tensor, weight: Tensor, bias: Opt, h0: Opt, cu_seqlens: Opt, cu_seqlens_cpu: Opt, silu: bool,
               dy: Tensor, dht: Opt, want_dbias: bool, want_dh0: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    grads = _core.conv1d_bwd(x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu, dy, dht, want_dbias, want_dh0)
    return tuple(_none(t, x.device) for t in grads)


@conv1d_bwd.register_fake
def _(x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu, dy, dht, want_dbias, want_dh0):
    f32 = dict(dtype=torch.float32)
    N = _n_seqs(x, cu_seqlens)
    return (torch.empty_like(x), x.new_empty(tuple(weight.shape), **f32),
            x.new_empty((weight.shape[0],) if want_dbias and bias is not None else (0,), **f32),
            x.new_empty((N,) + tuple(weight.shape) if want_dh0 else (0,), **f32))


def _conv_setup(ctx, inputs, output):
    x, weight, bias, h0, cu, cu_cpu, silu, want_ht = inputs
    ctx.save_for_backward(x, weight, bias, h0, cu, cu_cpu)
    ctx.silu, ctx.want_ht = silu, want_ht


def _conv_backward(ctx, dy, dht):
    x, weight, bias, h0, cu, cu_cpu = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db, dh0 = conv1d_bwd(x, weight, bias, h0, cu, cu_cpu, ctx.silu, dy.contiguous(),
                                 dht.contiguous() if ctx.want_ht else None, bool(need[2] and bias is not None),
                                 bool(need[3] and h0 is not None))
    return (dx if need[0] else None, dw if need[1] else None, db if need[2] and bias is not None else None,
            dh0 if need[3] and h0 is not None else None, None, None, None, None)


conv1d_fwd.register_autograd(_conv_backward, setup_context=_conv_setup)


# ---- gated RMSNorm ----

@torch.library.custom_op("gdn::rmsnorm_gated_fwd", mutates_args=())
def rmsnorm_gated_fwd(x: Tensor, z: Tensor, weight: Tensor, eps: float, gate: int) -> Tuple[Tensor, Tensor]:
    return _core.rmsnorm_gated_fwd(x, z, weight, eps, gate, want_rstd=True)


@rmsnorm_gated_fwd.register_fake
def _(x, z, weight, eps, gate):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return torch.empty_like(x), x.new_empty((rows,), dtype=torch.float32)


@torch.library.custom_op("gdn::rmsnorm_gated_bwd", mutates_args=())
def rmsnorm_gated_bwd(x: Tensor, z: Tensor, weight: Tensor, rstd: Tensor, dy: Tensor, eps: float,
                      gate: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _core.rmsnorm_gated_bwd(x, z, weight, rstd, dy, eps, gate)


@rmsnorm_gated_bwd.register_fake
def _(x, z, weight, rstd, dy, eps, gate):
    return torch.empty_like(x), torch.empty_like(z), x.new_empty(tuple(weight.shape), dtype=torch.float32)


def _norm_setup(ctx, inputs, output):
    x, z, weight, eps, gate = inputs
    ctx.save_for_backward(x, z, weight, output[1])
    ctx.eps, ctx.gate = eps, gate


def _norm_backward(ctx, dy, _drstd):
    x, z, weight, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dz, dw = rmsnorm_gated_bwd(x, z, weight, rstd, dy.contiguous(), ctx.eps, ctx.gate)
    return dx if need[0] else None, dz if need[1] else None, dw if need[2] else None, None, None


rmsnorm_gated_fwd.register_autograd(_norm_backward, setup_context=_norm_setup)


# ---- the fused decode step (no backward: inference) ----

@torch.library.custom_op("gdn::decode_step", mutates_args=("state", "conv_state"))
def decode_step(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Opt, state: Tensor, H: int,
                K: int, slots: Opt, scale: float, flags: int, conv_state: Opt, conv_weight: Opt,
                conv_bias: Opt) -> Tensor:
    return _core.decode_step(mixed_qkv, a, b, A_log, dt_bias, state, H, K, slots, scale, flags, conv_state,
                             conv_weight, conv_bias)


@decode_step.register_fake
def _(mixed_qkv, a, b, A_log, dt_bias, state, H, K, slots, scale, flags, conv_state, conv_weight, conv_bias):
    V = state.shape[2] if flags & capi.STATE_V_FIRST else state.shape[3]
    return mixed_qkv.new_empty((mixed_qkv.shape[0], a.shape[1], V))
