"""gdn's Python functions, with flash-linear-attention's names, arguments,
defaults, shapes and return values, so that code written for FLA runs on gdn
by changing the import:

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule   # before
    from gdn import chunk_gated_delta_rule                        # after

They take torch tensors (CPU or CUDA; differentiable, and traced by
torch.compile without a graph break) or numpy arrays (CPU; forward only;
the *_bwd functions of gdn._core give the gradients). Anything FLA accepts
that gdn cannot do raises an error that names the argument; results never
differ silently. Casts that lose nothing are done for you (a bfloat16 beta
next to a float32 g becomes float32; bfloat16 A_log, dt_bias, conv and norm
weights become float32, and their gradients come back in their own dtype).
"""
import numpy as np

from . import _core, capi
from ._core import GdnArgumentError, is_torch

try:
    import torch
    from . import _torch as _ops
except ImportError:   # pragma: no cover
    torch = None
    _ops = None


def _f32(x):
    """x as float32 (None stays None): a cast that loses nothing for f32/bf16/f16 inputs."""
    if x is None:
        return None
    if is_torch(x):
        if x.dtype == torch.float64:
            raise GdnArgumentError("float64 tensors are not supported: cast them to float32")
        return x if x.dtype == torch.float32 else x.float()
    x = np.asarray(x)
    if x.dtype == np.float64:
        raise GdnArgumentError("float64 arrays are not supported: cast them to float32")
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _gates(q, g, beta):
    """g and beta in one gate dtype: q's dtype when both have it, else float32."""
    qd = q.dtype
    if (g is None or g.dtype == qd) and beta.dtype == qd:
        return g, beta
    return _f32(g), _f32(beta)


def _rule_flags(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                state_v_first):
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise GdnArgumentError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    return ((capi.QK_L2NORM if use_qk_l2norm_in_kernel else 0) | (capi.GATE_FUSED if use_gate_in_kernel else 0)
            | (capi.BETA_SIGMOID if use_beta_sigmoid_in_kernel else 0)
            | (capi.BETA_NEGATIVE if allow_neg_eigval else 0) | (capi.STATE_V_FIRST if state_v_first else 0))


def _legacy_kwargs(kwargs, state_v_first, fn):
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise GdnArgumentError("pass state_v_first or transpose_state_layout, not both")
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    if "head_first" in kwargs:
        raise GdnArgumentError("head_first is not supported: inputs are [B, T, H, ...]")
    return state_v_first


def _rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, flags, A_log,
          dt_bias, recurrent):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise GdnArgumentError("q, k must be [B, T, H, K] and v [B, T, HV, V]")
    if q.shape[2] != k.shape[2]:
        raise GdnArgumentError(f"q and k must have the same number of heads, got {q.shape[2]} and {k.shape[2]}")
    if v.shape[2] % q.shape[2]:
        raise GdnArgumentError(f"the value heads HV={v.shape[2]} must be a multiple of the heads H={q.shape[2]}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise GdnArgumentError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if cu_seqlens is not None and initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise GdnArgumentError(f"initial_state has {initial_state.shape[0]} states for {len(cu_seqlens) - 1} "
                               "sequences")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    g, beta = _gates(q, g, beta)
    A_log, dt_bias, h0 = _f32(A_log), _f32(dt_bias), _f32(initial_state)
    if is_torch(q):
        o, ht, _ = _ops.rule_fwd(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, float(scale),
                                 flags, bool(output_final_state), recurrent)
    else:
        o, ht, _ = _core.chunk_fwd(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, float(scale),
                                   flags, bool(output_final_state), False, recurrent)
    return o, (ht if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """The chunked gated delta rule (chunks of 64 tokens), as FLA's function of the same name.

    q, k [B, T, H, K]; v [B, T, HV, V] (HV a multiple of H); g, beta [B, T, HV]; initial_state
    [N, HV, K, V] ([N, HV, V, K] with state_v_first). Keyword arguments of FLA's fused-gate form:
    use_gate_in_kernel=True takes g as the raw a and computes -exp(A_log) * softplus(a + dt_bias)
    in the kernel (A_log [HV] required, dt_bias [HV] optional). chunk_size (16, 32 or 64) is accepted
    and gdn uses 64: the same math. Returns (o [B, T, HV, V], final_state or None).
    cp_context (gdn.cp.build_cp_context): this rank's slice of a token stream over a process group
    (context parallel; torch tensors on the CPU or a CUDA device; gdn.cp says what moves).
    """
    state_v_first = _legacy_kwargs(kwargs, state_v_first, "chunk_gated_delta_rule")
    use_gate_in_kernel = bool(kwargs.pop("use_gate_in_kernel", False))
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.pop("chunk_size", 64)
    if kwargs:
        raise GdnArgumentError(f"chunk_gated_delta_rule: unknown arguments {sorted(kwargs)}")
    if chunk_size not in (16, 32, 64):
        raise GdnArgumentError(f"chunk_size must be 16, 32 or 64, got {chunk_size}")
    if cp_context is not None:   # this rank's slice of a token stream over a process group (gdn.cp)
        if cu_seqlens is not None or cu_seqlens_cpu is not None:
            raise GdnArgumentError("cu_seqlens: under context parallel the local cu_seqlens come from cp_context")
        from . import cp
        return cp.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                         use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                                         state_v_first, cp_context, use_gate_in_kernel, A_log, dt_bias)
    if use_gate_in_kernel and A_log is None:
        raise GdnArgumentError("A_log is required with use_gate_in_kernel=True")
    if not use_gate_in_kernel:
        A_log = dt_bias = None
    del chunk_indices   # a precomputed form of cu_seqlens; gdn derives what it needs
    flags = _rule_flags(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                        state_v_first)
    return _rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, flags,
                 A_log, dt_bias, recurrent=False)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """The token-by-token gated delta rule, as FLA's function of the same name (g per value head;
    gk and gv, FLA's per-channel gates, are not supported). beta None means 1. Its backward is the
    chunked backward (the same math). Returns (o, final_state or None).
    """
    state_v_first = _legacy_kwargs(kwargs, state_v_first, "fused_recurrent_gated_delta_rule")
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    if kwargs:
        raise GdnArgumentError(f"fused_recurrent_gated_delta_rule: unknown arguments {sorted(kwargs)}")
    if gk is not None or gv is not None:
        raise GdnArgumentError("gk and gv (per-channel gates) are not supported by gdn: pass g [B, T, HV]")
    if use_gate_in_kernel and (A_log is None or g is None):
        raise GdnArgumentError("use_gate_in_kernel=True needs g (the raw a) and A_log")
    if not use_gate_in_kernel:
        A_log = dt_bias = None
    if beta is None:
        shape = tuple(v.shape[:3])
        beta = (torch.ones(shape, dtype=q.dtype, device=q.device) if is_torch(q)
                else np.ones(shape, dtype=np.asarray(q).dtype))
    flags = _rule_flags(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                        state_v_first)
    return _rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, flags,
                 A_log, dt_bias, recurrent=True)


def causal_conv1d(x, weight=None, bias=None, residual=None, initial_state=None, output_final_state=False,
                  activation=None, backend=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                  cp_context=None, **kwargs):
    """The short causal depthwise convolution on x [B, T, D], as FLA's causal_conv1d: weight [D, W]
    (W <= 8), bias [D], initial_state [N, D, W], activation None or 'swish'/'silu'; residual [B, T, D]
    is added to the output. backend is accepted and ignored (gdn has one). Returns (y, final_state or None).
    cp_context (gdn.cp.build_cp_context): this rank's slice of a token stream; a sequence that
    continues from the previous rank takes its W-1 inputs before the cut as its conv state.
    """
    if kwargs:
        raise GdnArgumentError(f"causal_conv1d: unknown arguments {sorted(kwargs)}")
    if weight is None:
        raise GdnArgumentError("weight is required")
    if cp_context is not None:   # this rank's slice of a token stream over a process group (gdn.cp)
        if cu_seqlens is not None or cu_seqlens_cpu is not None:
            raise GdnArgumentError("cu_seqlens: under context parallel the local cu_seqlens come from cp_context")
        from . import cp
        return cp.causal_conv1d(x, weight, bias, residual, initial_state, output_final_state, activation, cp_context)
    if activation not in (None, "swish", "silu"):
        raise GdnArgumentError(f"activation {activation!r}: gdn's conv1d has None and 'swish'/'silu'")
    del chunk_indices, backend
    silu = activation is not None
    w, b, h0 = _f32(weight), _f32(bias), _f32(initial_state)
    if is_torch(x):
        y, ht = _ops.conv1d_fwd(x, w, b, h0, cu_seqlens, cu_seqlens_cpu, silu, bool(output_final_state))
    else:
        y, ht = _core.conv1d_fwd(x, w, b, h0, cu_seqlens, cu_seqlens_cpu, silu, bool(output_final_state))
    if residual is not None:
        y = y + residual
    return y, (ht if output_final_state else None)


def rms_norm_gated(x, g, weight, bias=None, activation="swish", residual=None, prenorm=False,
                   residual_in_fp32=False, eps=1e-6):
    """y = x / rms(x) * weight * act(g) over the last dim, as FLA's rms_norm_gated (activation 'swish'
    (= 'silu') or 'sigmoid'). bias, residual and prenorm are not supported.
    """
    if bias is not None:
        raise GdnArgumentError("bias is not supported by gdn's gated RMSNorm")
    if residual is not None or prenorm:
        raise GdnArgumentError("residual and prenorm are not supported by gdn's gated RMSNorm")
    gate = _core.norm_gate(activation)
    w = _f32(weight)
    if is_torch(x):
        return _ops.rmsnorm_gated_fwd(x, g, w, float(eps), gate)[0]
    return _core.rmsnorm_gated_fwd(x, g, w, eps, gate)[0]


def decode_step(mixed_qkv, a, b, A_log, dt_bias, state, num_heads, head_k_dim, slots=None, scale=None,
                use_qk_l2norm_in_kernel=True, allow_neg_eigval=False, state_v_first=False, conv_state=None,
                conv_weight=None, conv_bias=None):
    """One decode token for each of B rows, in place on a state pool (gdn_decode_step).

    mixed_qkv [B, 2*H*K + HV*V] is the conv output (q, k, v side by side), or, with conv_state
    [num_slots, D, W] and conv_weight [D, W] given, the raw projection: the conv update and SiLU
    run first in the same call. a, b [B, HV] raw gate and beta inputs; state [num_slots, HV, K, V]
    float32 ([.., V, K] with state_v_first), updated in place; slots [B] int32 (-1 = padding) or None.
    Returns o [B, HV, V].
    """
    flags = ((capi.QK_L2NORM if use_qk_l2norm_in_kernel else 0) | (capi.BETA_NEGATIVE if allow_neg_eigval else 0)
             | (capi.STATE_V_FIRST if state_v_first else 0))
    A_log, dt_bias, cw, cb = _f32(A_log), _f32(dt_bias), _f32(conv_weight), _f32(conv_bias)
    if is_torch(mixed_qkv) and torch.compiler.is_compiling():   # eager: no dispatch needed (no autograd)
        return _ops.decode_step(mixed_qkv, a, b, A_log, dt_bias, state, int(num_heads), int(head_k_dim), slots,
                                float(scale or 0.0), flags, conv_state, cw, cb)
    return _core.decode_step(mixed_qkv, a, b, A_log, dt_bias, state, int(num_heads), int(head_k_dim), slots,
                             scale or 0.0, flags, conv_state, cw, cb)


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
