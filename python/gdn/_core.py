"""The calls behind the public functions: arrays in, new arrays out.

Each function here takes numpy arrays (host) or torch tensors (CPU or
CUDA), checks every argument (dtype, device, shape) with a message that
names it, allocates the outputs and the workspace with the inputs' own
library on the inputs' device, and makes one C call (gdn.capi) on the
CPU or on the current CUDA stream of that device. No autograd here: the
torch layer (gdn._torch) wraps these as custom ops with their backward.
"""
import numpy as np

from . import capi

try:   # torch is optional: numpy alone is enough for the CPU
    import torch
except ImportError:   # pragma: no cover - exercised where torch is absent
    torch = None


class GdnArgumentError(ValueError):
    """An argument gdn cannot take (wrong dtype, device, shape or option); the message names it."""


# ---- array library adapters ----

def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


_NP_CODES = {np.dtype(np.float32): capi.F32, np.dtype(np.float16): capi.F16}
_TORCH_CODES = {} if torch is None else {torch.float32: capi.F32, torch.bfloat16: capi.BF16,
                                          torch.float16: capi.F16}
_TORCH_OF = {v: k for k, v in _TORCH_CODES.items()}
_NP_OF = {capi.F32: np.float32, capi.F16: np.float16}


def dtype_code(x, name):
    """The gdn dtype of an array, or an error naming the argument."""
    if is_torch(x):
        code = _TORCH_CODES.get(x.dtype)
        if code is None:
            raise GdnArgumentError(f"{name}: dtype {x.dtype} is not supported (float32, bfloat16 or float16"
                                   f"{'; cast float64 to float32 yourself' if x.dtype == torch.float64 else ''})")
        return code
    code = _NP_CODES.get(np.asarray(x).dtype)
    if code is None:
        raise GdnArgumentError(f"{name}: dtype {np.asarray(x).dtype} is not supported with numpy "
                               "(float32 or float16; bfloat16 needs torch)")
    return code


class Ctx:
    """The array library, device and execution of one call, taken from its first tensor."""

    def __init__(self, first, name):
        self.torch = is_torch(first)
        if self.torch:
            self.device = first.device
            if self.device.type == "cuda":
                if not capi.backend_available(capi.BACKEND_CUDA):
                    raise GdnArgumentError(f"{name} is on {self.device}, but this libgdn has no CUDA backend "
                                           "or sees no device (build it where nvcc is found)")
                stream = torch.cuda.current_stream(self.device).cuda_stream
                self.ex = capi.Exec(backend=capi.BACKEND_CUDA, stream=stream, threads=0, seq_split=0)
            elif self.device.type == "cpu":
                self.ex = capi.Exec(backend=capi.BACKEND_CPU, stream=None, threads=0, seq_split=0)
            else:
                raise GdnArgumentError(f"{name} is on {self.device}: gdn runs on cpu and cuda devices")
        else:
            self.device = None
            self.ex = capi.Exec(backend=capi.BACKEND_CPU, stream=None, threads=0, seq_split=0)
        self.cuda = self.ex.backend == capi.BACKEND_CUDA

    def empty(self, shape, code):
        if self.torch:
            return torch.empty(tuple(shape), dtype=_TORCH_OF[code], device=self.device)
        return np.empty(tuple(shape), dtype=_NP_OF[code])

    def zeros(self, shape, code):
        x = self.empty(shape, code)
        x[...] = 0
        return x

    def bytes(self, n):
        """A workspace of n bytes (None for 0)."""
        if n == 0:
            return None
        if self.torch:
            return torch.empty(n, dtype=torch.uint8, device=self.device)
        return np.empty(n, dtype=np.uint8)

    def arg(self, x, name, shape=None, code=None, codes=None, optional=False, align=True):
        """Check one argument: same array library and device, dtype, shape; contiguous copy if strided
        or, on a GPU with align, not 16-byte aligned (the CUDA kernels' rows: gdn.h, "Alignment")."""
        if x is None:
            if optional:
                return None
            raise GdnArgumentError(f"{name} is required")
        if self.torch:
            if not is_torch(x):
                raise GdnArgumentError(f"{name} is a {type(x).__name__}, the other arguments are torch tensors")
            if x.device != self.device:
                raise GdnArgumentError(f"{name} is on {x.device}, the other arguments on {self.device}")
        else:
            if is_torch(x):
                raise GdnArgumentError(f"{name} is a torch tensor, the other arguments are numpy arrays")
            x = np.asarray(x)
        c = dtype_code(x, name)
        if code is not None and c != code:
            raise GdnArgumentError(f"{name}: dtype {x.dtype}, expected {capi.dtype_name(code)}")
        if codes is not None and c not in codes:
            raise GdnArgumentError(f"{name}: dtype {x.dtype}, expected one of "
                                   + ", ".join(capi.dtype_name(k) for k in codes))
        if shape is not None and tuple(x.shape) != tuple(shape):
            raise GdnArgumentError(f"{name}: shape {tuple(x.shape)}, expected {tuple(shape)}")
        if self.torch:
            x = x.contiguous()
            if align and x.is_cuda and x.data_ptr() % 16:
                x = x.clone()
            return x
        return np.ascontiguousarray(x)


def ptr(x):
    if x is None:
        return None
    if is_torch(x):
        return x.data_ptr() if x.numel() else None
    return x.ctypes.data if x.size else None


def seqlens(ctx, cu_seqlens, cu_seqlens_cpu, B, T):
    """cu_seqlens as the C API wants them: (host int64 array, device int64 tensor or None, N)."""
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise GdnArgumentError("cu_seqlens_cpu is given without cu_seqlens")
        return None, None, B
    if B != 1:
        raise GdnArgumentError(f"with cu_seqlens the batch size must be 1, got {B} (flatten the sequences)")
    if is_torch(cu_seqlens):
        host = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens.detach().cpu()
        host = host.to(torch.int64).contiguous()
        if host.dim() != 1 or host.numel() < 2:
            raise GdnArgumentError(f"cu_seqlens: shape {tuple(cu_seqlens.shape)}, expected [N+1] with N >= 1")
        dev = None
        if ctx.cuda:
            dev = cu_seqlens.to(device=ctx.device, dtype=torch.int64).contiguous()
        return host, dev, host.numel() - 1
    if ctx.cuda:
        raise GdnArgumentError("cu_seqlens is a numpy array, the other arguments are CUDA tensors")
    host = np.ascontiguousarray(np.asarray(cu_seqlens), dtype=np.int64)
    if host.ndim != 1 or host.size < 2:
        raise GdnArgumentError(f"cu_seqlens: shape {host.shape}, expected [N+1] with N >= 1")
    return host, None, host.size - 1


def _state_shape(N, HV, K, V, v_first):
    return (N, HV, V, K) if v_first else (N, HV, K, V)


# ---- the gated delta rule ----

class Rule:
    """One chunk/recurrent call's checked arguments and its gdn_config."""

    def __init__(self, q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, scale, flags):
        ctx = self.ctx = Ctx(q, "q")
        if getattr(q, "ndim", 0) != 4:
            raise GdnArgumentError(f"q: shape {tuple(q.shape)}, expected [B, T, H, K]")
        if getattr(v, "ndim", 0) != 4:
            raise GdnArgumentError(f"v: shape {tuple(v.shape)}, expected [B, T, HV, V]")
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        self.dims = (B, T, H, HV, K, V)
        code = dtype_code(q, "q")
        self.q = ctx.arg(q, "q", code=code)
        self.k = ctx.arg(k, "k", (B, T, H, K), code)
        self.v = ctx.arg(v, "v", (B, T, HV, V), code)
        gcode = dtype_code(beta, "beta")
        if gcode not in (capi.F32, code):
            raise GdnArgumentError(f"beta: dtype {beta.dtype}: the gate dtype must be float32 or that of q")
        fused = bool(flags & capi.GATE_FUSED)
        self.g = ctx.arg(g, "g", (B, T, HV), gcode, optional=not fused)
        self.beta = ctx.arg(beta, "beta", (B, T, HV), gcode)
        self.A_log = ctx.arg(A_log, "A_log", (HV,), capi.F32, optional=not fused)
        self.dt_bias = ctx.arg(dt_bias, "dt_bias", (HV,), capi.F32, optional=True)
        if not fused and (A_log is not None or dt_bias is not None):
            raise GdnArgumentError("A_log and dt_bias are used only with the gate in the kernel "
                                   "(use_gate_in_kernel=True)")
        self.cu_host, self.cu_dev, N = seqlens(ctx, cu_seqlens, cu_seqlens_cpu, B, T)
        self.N = N
        self.state_shape = _state_shape(N, HV, K, V, flags & capi.STATE_V_FIRST)
        self.h0 = ctx.arg(h0, "initial_state", self.state_shape, capi.F32, optional=True)
        self.code, self.gcode = code, gcode
        self.cfg = capi.Config(B=B, T=T, H=H, HV=HV, K=K, V=V, cu_seqlens=ptr(self.cu_host),
                               cu_seqlens_dev=ptr(self.cu_dev),
                               num_seqs=N if cu_seqlens is not None else 0, dtype=code, gate_dtype=gcode,
                               scale=float(scale or 0.0), flags=int(flags))


def chunk_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, h0=None, cu_seqlens=None, cu_seqlens_cpu=None,
              scale=0.0, flags=0, want_ht=False, want_saved=False, recurrent=False):
    """o, ht (or None), saved (or None): gdn_chunk_fwd, or gdn_recurrent_fwd with recurrent=True."""
    r = Rule(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, scale, flags)
    return _fwd(r, want_ht, want_saved, recurrent)


def _fwd(r, want_ht, want_saved, recurrent):
    ctx, cfg = r.ctx, r.cfg
    o = ctx.empty(r.v.shape, r.code)
    ht = ctx.empty(r.state_shape, capi.F32) if want_ht else None
    saved_n = capi.chunk_saved_size(cfg) if want_saved and not recurrent else 0
    saved = ctx.bytes(saved_n)
    ws_n = 0 if recurrent else capi.chunk_fwd_workspace_size(ctx.ex, cfg)
    ws = ctx.bytes(ws_n)
    args = capi.FwdArgs(q=ptr(r.q), k=ptr(r.k), v=ptr(r.v), g=ptr(r.g), beta=ptr(r.beta), A_log=ptr(r.A_log),
                        dt_bias=ptr(r.dt_bias), h0=ptr(r.h0), o=ptr(o), ht=ptr(ht), saved=ptr(saved),
                        saved_bytes=saved_n, workspace=ptr(ws), workspace_bytes=ws_n)
    (capi.recurrent_fwd if recurrent else capi.chunk_fwd)(ctx.ex, cfg, args)
    return o, ht, saved


def chunk_bwd(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, saved, do, dht,
              scale=0.0, flags=0, want_ddt_bias=True, want_dh0=True):
    """dq, dk, dv, dg (None without g), dbeta, dA_log, ddt_bias, dh0 (None where not wanted or not defined).

    saved: what chunk_fwd(want_saved=True) returned; None recomputes it (one more forward)."""
    r = Rule(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, cu_seqlens_cpu, scale, flags)
    ws_n = capi.chunk_bwd_workspace_size(r.ctx.ex, r.cfg)
    args, outs, _keep = bwd_call(r, saved, do, dht, flags, want_ddt_bias, want_dh0, ws_n)
    capi.chunk_bwd(r.ctx.ex, r.cfg, args)
    return outs


def bwd_call(r, saved, do, dht, flags, want_ddt_bias, want_dh0, ws_n):
    """The gdn_bwd_args of a backward on Rule r with its outputs allocated and a workspace of ws_n
    bytes: (args, (dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0), what must outlive the call)."""
    ctx, cfg = r.ctx, r.cfg
    B, T, H, HV, K, V = r.dims
    do = ctx.arg(do, "do", (B, T, HV, V), r.code)
    dht = ctx.arg(dht, "dht", r.state_shape, capi.F32, optional=True)
    saved_n = capi.chunk_saved_size(cfg)
    if saved_n and saved is None:
        _, _, saved = _fwd(r, False, True, False)
    fused = bool(flags & capi.GATE_FUSED)
    dq, dk, dv = ctx.empty(r.q.shape, r.code), ctx.empty(r.k.shape, r.code), ctx.empty(r.v.shape, r.code)
    dg = ctx.empty((B, T, HV), r.gcode) if r.g is not None else None
    dbeta = ctx.empty((B, T, HV), r.gcode)
    dA = ctx.empty((HV,), capi.F32) if fused else None
    ddt = ctx.empty((HV,), capi.F32) if fused and want_ddt_bias else None
    dh0 = ctx.empty(r.state_shape, capi.F32) if want_dh0 else None
    ws = ctx.bytes(ws_n)
    args = capi.BwdArgs(q=ptr(r.q), k=ptr(r.k), v=ptr(r.v), g=ptr(r.g), beta=ptr(r.beta), A_log=ptr(r.A_log),
                        dt_bias=ptr(r.dt_bias), h0=ptr(r.h0), saved=ptr(saved) if saved_n else None,
                        saved_bytes=saved_n, dout=ptr(do), dht=ptr(dht), dq=ptr(dq), dk=ptr(dk), dv=ptr(dv),
                        dg=ptr(dg), dbeta=ptr(dbeta), dA_log=ptr(dA), ddt_bias=ptr(ddt), dh0=ptr(dh0),
                        workspace=ptr(ws), workspace_bytes=ws_n)
    return args, (dq, dk, dv, dg, dbeta, dA, ddt, dh0), (do, dht, saved, ws)


# ---- causal conv1d ----

def _conv_cfg(ctx, x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu):
    if getattr(x, "ndim", 0) != 3:
        raise GdnArgumentError(f"x: shape {tuple(x.shape)}, expected [B, T, D]")
    B, T, D = x.shape
    if getattr(weight, "ndim", 0) != 2 or weight.shape[0] != D:
        raise GdnArgumentError(f"weight: shape {tuple(getattr(weight, 'shape', ()))}, expected [D, W] = [{D}, W]")
    W = weight.shape[1]
    code = dtype_code(x, "x")
    x = ctx.arg(x, "x", code=code)
    weight = ctx.arg(weight, "weight", (D, W), capi.F32)
    bias = ctx.arg(bias, "bias", (D,), capi.F32, optional=True)
    host, dev, N = seqlens(ctx, cu_seqlens, cu_seqlens_cpu, B, T)
    h0 = ctx.arg(h0, "initial_state", (N, D, W), capi.F32, optional=True)
    cfg = capi.Conv1dConfig(B=B, T=T, D=D, W=W, cu_seqlens=ptr(host), cu_seqlens_dev=ptr(dev),
                            num_seqs=N if cu_seqlens is not None else 0, dtype=code, silu=int(bool(silu)))
    return cfg, (x, weight, bias, h0, host, dev), N


def conv1d_fwd(x, weight, bias=None, h0=None, cu_seqlens=None, cu_seqlens_cpu=None, silu=True, want_ht=False):
    """y [B,T,D], ht [N,D,W] f32 (or None)."""
    ctx = Ctx(x, "x")
    cfg, (x, weight, bias, h0, _h, _d), N = _conv_cfg(ctx, x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu)
    y = ctx.empty(x.shape, cfg.dtype)
    ht = ctx.empty((N, cfg.D, cfg.W), capi.F32) if want_ht else None
    capi.conv1d_fwd(ctx.ex, cfg, capi.Conv1dArgs(x=ptr(x), weight=ptr(weight), bias=ptr(bias), h0=ptr(h0),
                                                 y=ptr(y), ht=ptr(ht)))
    return y, ht


def conv1d_bwd(x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu, dy, dht, want_dbias=True, want_dh0=True):
    """dx, dweight, dbias (or None), dh0 (or None)."""
    ctx = Ctx(x, "x")
    cfg, (x, weight, bias, h0, _h, _d), N = _conv_cfg(ctx, x, weight, bias, h0, cu_seqlens, cu_seqlens_cpu, silu)
    dy = ctx.arg(dy, "dy", x.shape, cfg.dtype)
    dht = ctx.arg(dht, "dht", (N, cfg.D, cfg.W), capi.F32, optional=True)
    dx = ctx.empty(x.shape, cfg.dtype)
    dw = ctx.empty((cfg.D, cfg.W), capi.F32)
    db = ctx.empty((cfg.D,), capi.F32) if want_dbias and bias is not None else None
    dh0 = ctx.empty((N, cfg.D, cfg.W), capi.F32) if want_dh0 else None
    capi.conv1d_bwd(ctx.ex, cfg, capi.Conv1dBwdArgs(x=ptr(x), weight=ptr(weight), bias=ptr(bias), h0=ptr(h0),
                                                    dy=ptr(dy), dht=ptr(dht), dx=ptr(dx), dweight=ptr(dw),
                                                    dbias=ptr(db), dh0=ptr(dh0)))
    return dx, dw, db, dh0


def check_inplace(ctx, x, name, shape, code):
    """A tensor updated in place: it must already be contiguous, of this dtype and shape."""
    y = ctx.arg(x, name, shape, code, align=False)   # its elements' alignment is enough (a copy would lose the update)
    if ptr(y) != ptr(x if ctx.torch else np.asarray(x)):
        raise GdnArgumentError(f"{name} is updated in place and must be contiguous")
    return y


def _slots(ctx, slots, B):
    if slots is None:
        return None
    if ctx.torch:
        if not is_torch(slots) or slots.device != ctx.device:
            raise GdnArgumentError(f"slots must be a torch int32 tensor on {ctx.device}")
        if slots.dtype != torch.int32 or tuple(slots.shape) != (B,):
            raise GdnArgumentError(f"slots: {slots.dtype} {tuple(slots.shape)}, expected int32 [{B}]")
        return slots.contiguous()
    s = np.asarray(slots)
    if s.dtype != np.int32 or s.shape != (B,):
        raise GdnArgumentError(f"slots: {s.dtype} {s.shape}, expected int32 [{B}]")
    return np.ascontiguousarray(s)


# ---- gated RMSNorm ----

_GATES = {"swish": capi.NORM_GATE_SILU, "silu": capi.NORM_GATE_SILU, "sigmoid": capi.NORM_GATE_SIGMOID}


def norm_gate(activation):
    if activation not in _GATES:
        raise GdnArgumentError(f"activation {activation!r}: gdn's gated RMSNorm has 'swish' (= 'silu') "
                               "and 'sigmoid'")
    return _GATES[activation]


def _norm_cfg(ctx, x, z, weight, eps, gate):
    V = x.shape[-1]
    code = dtype_code(x, "x")
    x = ctx.arg(x, "x", code=code)
    z = ctx.arg(z, "g", tuple(x.shape), code)
    weight = ctx.arg(weight, "weight", (V,), capi.F32)
    rows = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
    return capi.RmsnormConfig(rows=rows, V=V, dtype=code, eps=float(eps), gate=gate), x, z, weight


def rmsnorm_gated_fwd(x, z, weight, eps=1e-6, gate=capi.NORM_GATE_SILU, want_rstd=False):
    ctx = Ctx(x, "x")
    cfg, x, z, weight = _norm_cfg(ctx, x, z, weight, eps, gate)
    y = ctx.empty(x.shape, cfg.dtype)
    rstd = ctx.empty((cfg.rows,), capi.F32) if want_rstd else None
    capi.rmsnorm_gated_fwd(ctx.ex, cfg, ptr(x), ptr(z), ptr(weight), ptr(y), ptr(rstd))
    return y, rstd


def rmsnorm_gated_bwd(x, z, weight, rstd, dy, eps=1e-6, gate=capi.NORM_GATE_SILU):
    ctx = Ctx(x, "x")
    cfg, x, z, weight = _norm_cfg(ctx, x, z, weight, eps, gate)
    rstd = ctx.arg(rstd, "rstd", (cfg.rows,), capi.F32, optional=True)
    dy = ctx.arg(dy, "dy", x.shape, cfg.dtype)
    dx, dz, dw = ctx.empty(x.shape, cfg.dtype), ctx.empty(x.shape, cfg.dtype), ctx.empty((cfg.V,), capi.F32)
    capi.rmsnorm_gated_bwd(ctx.ex, cfg, ptr(x), ptr(z), ptr(weight), ptr(rstd), ptr(dy), ptr(dx), ptr(dz), ptr(dw))
    return dx, dz, dw


# ---- the fused decode step ----

def decode_step(mixed_qkv, a, b, A_log, dt_bias, state, H, K, slots=None, scale=0.0, flags=0,
                conv_state=None, conv_weight=None, conv_bias=None):
    """One token per row; state (and conv_state) updated in place; returns o [B, HV, V]."""
    ctx = Ctx(mixed_qkv, "mixed_qkv")
    if getattr(mixed_qkv, "ndim", 0) != 2 or getattr(a, "ndim", 0) != 2:
        raise GdnArgumentError("mixed_qkv must be [B, 2*H*K + HV*V] and a [B, HV]")
    B, D = mixed_qkv.shape
    HV = a.shape[1]
    if getattr(state, "ndim", 0) != 4:
        raise GdnArgumentError(f"state: shape {tuple(getattr(state, 'shape', ()))}, expected "
                               "[num_slots, HV, K, V] ([num_slots, HV, V, K] with state_v_first)")
    v_first = bool(flags & capi.STATE_V_FIRST)
    V = state.shape[2] if v_first else state.shape[3]
    if D != 2 * H * K + HV * V:
        raise GdnArgumentError(f"mixed_qkv: width {D}, expected 2*H*K + HV*V = {2 * H * K + HV * V}")
    code = dtype_code(mixed_qkv, "mixed_qkv")
    x = ctx.arg(mixed_qkv, "mixed_qkv", (B, D), code)
    a = ctx.arg(a, "a", (B, HV), code)
    b = ctx.arg(b, "b", (B, HV), code)
    A_log = ctx.arg(A_log, "A_log", (HV,), capi.F32)
    dt_bias = ctx.arg(dt_bias, "dt_bias", (HV,), capi.F32, optional=True)
    pool = state.shape[0]
    state = check_inplace(ctx, state, "state", (pool,) + _state_shape(1, HV, K, V, v_first)[1:], capi.F32)
    W = 0
    if conv_state is not None or conv_weight is not None:
        if conv_weight is None or conv_state is None:
            raise GdnArgumentError("the conv update needs both conv_state and conv_weight")
        W = conv_weight.shape[1] if getattr(conv_weight, "ndim", 0) == 2 else 0
        conv_weight = ctx.arg(conv_weight, "conv_weight", (D, W), capi.F32)
        conv_bias = ctx.arg(conv_bias, "conv_bias", (D,), capi.F32, optional=True)
        conv_state = check_inplace(ctx, conv_state, "conv_state", (conv_state.shape[0], D, W), capi.F32)
        if conv_state.shape[0] != pool:
            raise GdnArgumentError(f"conv_state has {conv_state.shape[0]} slots, state {pool}")
    sl = _slots(ctx, slots, B)
    o = ctx.empty((B, HV, V), code)
    cfg = capi.DecodeConfig(B=B, H=H, HV=HV, K=K, V=V, dtype=code, scale=float(scale or 0.0), flags=int(flags),
                            num_slots=pool, conv_W=W)
    args = capi.DecodeArgs(mixed_qkv=None if W else ptr(x), proj=ptr(x) if W else None, conv_state=ptr(conv_state),
                           conv_weight=ptr(conv_weight), conv_bias=ptr(conv_bias), a=ptr(a), b=ptr(b),
                           A_log=ptr(A_log), dt_bias=ptr(dt_bias), state=ptr(state), slots=ptr(sl), o=ptr(o))
    capi.decode_step(ctx.ex, cfg, args)
    return o


__all__ = ["GdnArgumentError", "chunk_fwd", "chunk_bwd", "conv1d_fwd", "conv1d_bwd",
           "rmsnorm_gated_fwd", "rmsnorm_gated_bwd", "decode_step"]
