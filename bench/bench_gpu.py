"""GPU bench: gdn beside flash-linear-attention (FLA, Triton) in one process, on one card.

Every row times one op at one shape on both sides and prints

    op | shape | gdn us | FLA us | FLA/gdn | gdn % copy | gdn % mm | rel err

  - times: median of >= 10 (mostly 20-50) runs after warm-up, each run timed
    alone with CUDA events (synchronised after each run);
  - FLA/gdn > 1 means gdn is faster;
  - the card's limits are measured at the start of the same run: copy
    bandwidth (torch D2D copy of a 2 GiB buffer, bytes read + written) and the
    bf16 matmul rate (torch.mm 8192 x 8192 x 8192), each the best of its runs;
    "% copy" = model bytes / time / copy bandwidth, "% mm" = model FLOPs / time
    / matmul rate, with the FLOP and byte models of tools/flops.h (ported below);
  - rel err: ||gdn - FLA|| / ||FLA|| (Frobenius), the largest over the op's
    outputs (o and ht; every gradient for fwd+bwd), from one call on fresh
    inputs with gdn's outputs filled with NaN before it; both sides are bf16 /
    f16 approximations, so ~1e-3 is agreement and "!" marks > 1e-2;
  - where a working set fits in L2 (50 MiB), inputs are rotated over several
    copies (the decode state pools) so L2 does not flatter.

Forward+backward rows also give the peak device memory of one training step
above its inputs on each side (torch's allocator peak for FLA; for gdn, which
allocates nothing, the buffers the caller holds: o, ht, saved, one workspace
for both passes, the gradients) and "ref err": gdn's largest error over every
output and gradient against a float64 reference (torch, token by token, with
autograd) on a slice of the shape (two sequences, 150 + 64 tokens, two q/k
heads, the same K, G, dtype and options), both sides on the same rounded inputs.
FLA's Triton backward refuses Triton >= 3.4, < 3.7.1 on Hopper (its issue 640:
wrong gradients from a miscompile of chunk_bwd_dqkwg); there the bench lifts
FLA's guard to time the same kernels, says so, and reads gdn's accuracy from
the float64 column, not from FLA's gradients.

Rows: chunk forward and forward+backward at the DESIGN.md section 7 shapes
(qwen3next, long1, varlen, d256), the fused decode step at B = 1, 32, 256
(B = 1 also as CUDA graph replay), and the layer ops (conv1d forward and
single-token update, gated RMSNorm forward, L2 norm forward). An op that gdn's
CUDA backend does not do yet reads "unsupported" (GDN_ERR_UNSUPPORTED, asked
of the library, not assumed); gdn's backward reads "n/a" until it exists.

Run on a machine with an H100/H200, torch and FLA (at ./.fla here):

    cmake -B build-gpu && cmake --build build-gpu -j16
    PYTHONPATH=$PWD/python:$PWD/.fla python3 bench/bench_gpu.py [--only=SUBSTRING] [--json]

--only keeps the rows whose "op shape" contains SUBSTRING (e.g. --only=decode,
--only=qwen3next, --only=chunk_fwd+bwd); --json prints one JSON document
instead of the table. The first run on a fresh machine spends minutes in
Triton's compile and autotune (outside the timed runs). libgdn.so is found
through $GDN_LIB or ./build-gpu/libgdn.so (gdn.capi).
"""
import argparse
import importlib
import importlib.util
import inspect
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from gdn import capi as gdn

import fla
import fla.ops.gated_delta_rule.chunk as _fla_chunk_module
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _fla_optional(module, name):
    """An FLA function that not every FLA version has (None if absent: its cells read n/a)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


fla_causal_conv1d = _fla_optional("fla.modules.conv", "causal_conv1d")
fla_causal_conv1d_update = _fla_optional("fla.modules.conv.triton", "causal_conv1d_update")
fla_rms_norm_gated = _fla_optional("fla.modules.fused_norm_gate", "rms_norm_gated")
fla_l2norm_fwd = _fla_optional("fla.modules.l2norm", "l2norm_fwd")



def fla_lift_640_guard():
    """FLA refuses its gated Triton backward on Hopper with Triton >= 3.4, < 3.7.1
    (FLA issue 640). Lift the guard so the same kernels can be timed; returns
    True when it was lifted (their gradients are then not used as a reference)."""
    try:
        chunk_o = importlib.import_module("fla.ops.common.chunk_o")
    except ImportError:
        return False
    if getattr(chunk_o, "TRITON_ABOVE_3_7_1", True) or not getattr(chunk_o, "IS_NVIDIA_HOPPER", False):
        return False
    if not getattr(chunk_o, "TRITON_ABOVE_3_4_0", False):
        return False
    chunk_o.TRITON_ABOVE_3_7_1 = True
    note(f"FLA backward: triton {triton.__version__} on Hopper is inside FLA's issue-640 guard (its gated "
         "chunk_bwd_dqkwg gives wrong gradients there); the guard was lifted to time the same Triton kernels, "
         "so FLA's gradients are no reference: gdn's accuracy is the 'ref err' column (float64)")
    return True


DEV = "cuda"
L2_BYTES = 50 << 20
GDN_DTYPE = {torch.float32: gdn.F32, torch.bfloat16: gdn.BF16, torch.float16: gdn.F16}
ERR_FLAG = 1e-2

# What this FLA version does inside its kernels. Where it lacks the in-kernel
# gate or beta sigmoid, the FLA call computes them with torch inside the timed
# region, and a note says so.
_chunk_params = inspect.signature(chunk_gated_delta_rule).parameters
_rec_params = inspect.signature(fused_recurrent_gated_delta_rule).parameters
# (chunk_gated_delta_rule takes use_gate_in_kernel through **kwargs, so look at its module's source)
FLA_CHUNK_GATE = "use_gate_in_kernel" in _chunk_params or "use_gate_in_kernel" in inspect.getsource(_fla_chunk_module)
FLA_CHUNK_BETA = "use_beta_sigmoid_in_kernel" in _chunk_params
FLA_CHUNK_CU_CPU = "cu_seqlens_cpu" in _chunk_params
FLA_REC_GATE = "use_gate_in_kernel" in _rec_params
FLA_REC_BETA = "use_beta_sigmoid_in_kernel" in _rec_params

NOTES = []


def note(text):
    if text not in NOTES:
        NOTES.append(text)


# ---- FLOP and byte models: a port of tools/flops.h (its comment derives them) ----
# A multiply-add is 2 FLOPs; bytes are every input read once and every output
# written once at its dtype, a state updated in place read once and written once.

MODEL_CHUNK = 64


@dataclass
class ChunkShape:
    name: str
    B: int
    T: int
    H: int
    HV: int
    K: int
    dtype: torch.dtype
    fused: bool          # q/k L2 norm, gate (raw a, A_log, dt_bias) and beta sigmoid in the kernel
    varlen: bool = False

    @property
    def V(self):
        return self.K

    @property
    def gate_dtype(self):
        # raw a, b come from the model's bf16 projection; a given log decay g and beta are f32
        return self.dtype if self.fused else torch.float32


def flops_chunk_fwd(s):
    K, V, C = s.K, s.V, MODEL_CHUNK
    per = 2.0 * (3.0 * K * V) + 2.0 * (1.5 * C * K) + 2.0 * (C * V) + C * C / 3.0
    return per * s.B * s.T * s.HV


def flops_chunk_bwd(s):
    return 2.5 * flops_chunk_fwd(s)


def bytes_chunk_fwd(s, nseq, has_h0=True, has_ht=True):
    tok, ds, gs = s.B * s.T, _esize(s.dtype), _esize(s.gate_dtype)
    st = nseq * s.HV * s.K * s.V * 4.0
    b = tok * (2.0 * s.H * s.K + s.HV * s.V) * ds + tok * 2.0 * s.HV * gs + tok * s.HV * s.V * ds
    if s.fused:
        b += 2.0 * s.HV * 4.0 + tok * 2.0 * s.H * 4.0    # A_log, dt_bias; saved rstd
    return b + (st if has_h0 else 0.0) + (st if has_ht else 0.0)


def bytes_chunk_bwd(s, nseq, has_h0=True, has_dht=True, has_dh0=True):
    tok, ds, gs = s.B * s.T, _esize(s.dtype), _esize(s.gate_dtype)
    st = nseq * s.HV * s.K * s.V * 4.0
    qkv, gb = tok * (2.0 * s.H * s.K + s.HV * s.V) * ds, tok * 2.0 * s.HV * gs
    b = 2.0 * qkv + 2.0 * gb + tok * s.HV * s.V * ds
    if s.fused:
        b += 4.0 * s.HV * 4.0 + tok * 2.0 * s.H * 4.0    # A_log, dt_bias and their grads; saved rstd
    return b + st * (has_h0 + has_dht + has_dh0)


def flops_decode(B, H, HV, K, V):
    return 7.0 * K * V * B * HV


def bytes_decode(B, H, HV, K, V, ds, has_dt_bias=True, has_slots=True):
    D = 2 * H * K + HV * V
    b = B * D * ds + 2.0 * B * HV * ds + B * HV * V * ds + 2.0 * B * HV * K * V * 4.0 + (1 + has_dt_bias) * HV * 4.0
    return b + (B * 4.0 if has_slots else 0.0)


def bytes_conv1d_fwd(B, T, D, W, ds, nseq, has_bias=True, has_h0=True, has_ht=True):
    st = nseq * D * W * 4.0
    return 2.0 * B * T * D * ds + D * W * 4.0 + (D * 4.0 if has_bias else 0.0) + st * (has_h0 + has_ht)


def bytes_conv1d_update(B, D, W, ds, has_bias=True, has_slots=True):
    # not in tools/flops.h; the same rule: x in, y out [B,D]; each row's state
    # [D,W] f32 read and written; weight [D,W], bias [D], slots [B] in
    return 2.0 * B * D * ds + 2.0 * B * D * W * 4.0 + D * W * 4.0 + (D * 4.0 if has_bias else 0.0) \
        + (B * 4.0 if has_slots else 0.0)


def bytes_rmsnorm_gated_fwd(rows, V, ds, has_rstd=True):
    return 3.0 * rows * V * ds + V * 4.0 + (rows * 4.0 if has_rstd else 0.0)


def bytes_l2norm_fwd(rows, dim, ds, has_rstd=True):
    return rows * dim * 2.0 * ds + (rows * 4.0 if has_rstd else 0.0)


def _esize(dt):
    return torch.empty((), dtype=dt).element_size()


# ---- timing ----

def run_times(fn, reps, warmup):
    """Times in us of reps runs of fn(i), i = 0, 1, ... (the input rotation),
    each timed alone with CUDA events, after warmup runs; 10 runs only where
    one takes over 50 ms."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts, i = [], 0
    while len(ts) < reps:
        e0.record()
        fn(i)
        e1.record()
        e1.synchronize()
        if i >= warmup:
            ts.append(e0.elapsed_time(e1) * 1e3)
            if len(ts) == 1 and ts[0] > 50e3:
                reps = min(reps, 10)
        i += 1
    return ts


def time_us(fn, reps=20, warmup=3):
    return statistics.median(run_times(fn, reps, warmup))


def graph_us(make_step, nsteps, reps=50):
    """Per-step time of nsteps calls captured in one CUDA graph and replayed.
    make_step(stream_handle) returns step(i) for that stream (gdn needs the
    capturing stream's handle; FLA ignores it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):            # warm-up off the default stream, as torch asks before a capture
        step = make_step(side.cuda_stream)
        for i in range(3):
            step(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step = make_step(torch.cuda.current_stream().cuda_stream)
        for i in range(nsteps):
            step(i)
    return time_us(lambda i: graph.replay(), reps) / nsteps


def copy_bandwidth():
    """Bytes read + written per second by a torch D2D copy of 2 GiB, best of 10."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    return 2.0 * x.numel() / (min(run_times(lambda i: y.copy_(x), reps=10, warmup=2)) * 1e-6)


def matmul_rate(n=8192):
    """bf16 FLOP/s of torch.mm n x n x n, best of 20."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=DEV)
    c = torch.empty(n, n, dtype=torch.bfloat16, device=DEV)
    return 2.0 * n ** 3 / (min(run_times(lambda i: torch.mm(a, b, out=c), reps=20, warmup=3)) * 1e-6)


def card_limits():
    copy, mm = copy_bandwidth(), matmul_rate()
    torch.cuda.empty_cache()
    return copy, mm


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


# ---- rows ----

class Row:
    """One op at one shape. gdn / fla hold a time in us or a word
    ("unsupported", "n/a", "error"); errs maps output name to rel. error."""

    def __init__(self, op, shape, flops=0.0, nbytes=0.0):
        self.op, self.shape, self.flops, self.bytes = op, shape, flops, nbytes
        self.gdn, self.fla, self.errs = None, None, {}
        self.mem = {}        # fwd+bwd: peak MiB above the inputs, per side
        self.ref_errs = {}   # fwd+bwd: gdn vs float64 on a slice, per output

    def try_gdn(self, fn, *a, **kw):
        return _attempt("gdn", self.op, self.shape, fn, *a, **kw)

    def try_fla(self, fn, *a, **kw):
        return _attempt("FLA", self.op, self.shape, fn, *a, **kw)

    def time_both(self, gdn_fn, fla_fn, **kw):
        """Times of both sides (time_us keywords kw); a side that fails keeps its word."""
        self.gdn = self.try_gdn(time_us, gdn_fn, **kw)
        self.fla = self.try_fla(time_us, fla_fn, **kw) if fla_fn else "n/a"

    def check(self, gdn_fn, fla_fn, outs, compare):
        """One call of each side on the same inputs, gdn's outputs outs filled with
        NaN first; errs = compare(FLA's result) when both ran."""
        for x in outs:
            x.fill_(float("nan"))
        gdn_ran = self.try_gdn(gdn_fn) is None
        ref = self.try_fla(fla_fn) if fla_fn else None
        if gdn_ran and ref is not None and not isinstance(ref, str):
            self.errs = compare(ref)

    def as_dict(self, copy, mm):
        d = {"op": self.op, "shape": self.shape, "flops": self.flops, "bytes": self.bytes,
             "gdn_us": _num(self.gdn), "gdn_status": _word(self.gdn), "fla_us": _num(self.fla),
             "fla_status": _word(self.fla), "rel_err": self.errs, "peak_MiB": self.mem,
             "ref_err": self.ref_errs}
        d["fla_over_gdn"] = d["fla_us"] / d["gdn_us"] if d["gdn_us"] and d["fla_us"] else None
        for side in ("gdn", "fla"):
            us = d[f"{side}_us"]
            d[f"{side}_pct_copy"] = 100.0 * self.bytes / (us * 1e-6) / copy if us and self.bytes else None
            d[f"{side}_pct_mm"] = 100.0 * self.flops / (us * 1e-6) / mm if us and self.flops else None
        return d


def _attempt(side, op, shape, fn, *a, **kw):
    """fn's result, or "unsupported" / "error" (with a note) instead of an exception."""
    try:
        return fn(*a, **kw)
    except gdn.Unsupported as e:
        note(f"{side} {op}: unsupported ({e.message})")
        return "unsupported"
    except Exception as e:                   # noqa: BLE001 -- one failing op must not stop the bench
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        note(f"{side} {op} {shape}: {type(e).__name__}: {msg}")
        return "error"


def _num(v):
    return v if isinstance(v, float) else None


def _word(v):
    return "ok" if isinstance(v, float) else (v or "n/a")


def gdn_exec(stream_handle=None):
    if stream_handle is None:
        stream_handle = torch.cuda.current_stream().cuda_stream
    return gdn.Exec(backend=gdn.BACKEND_CUDA, stream=stream_handle, threads=0, seq_split=0)


def ptr(t):
    return t.data_ptr() if t is not None else None


def buffer(nbytes):
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=DEV)


# ---- chunk forward, forward + backward ----

CHUNK_SHAPES = [
    ChunkShape("qwen3next", 4, 8192, 16, 32, 128, torch.bfloat16, fused=True),
    ChunkShape("long1", 1, 65536, 2, 8, 128, torch.bfloat16, fused=True),
    ChunkShape("varlen", 1, 32768, 16, 32, 128, torch.bfloat16, fused=True, varlen=True),
    ChunkShape("d256", 16, 4096, 8, 8, 256, torch.float16, fused=False),
]
VARLEN_SEQS, VARLEN_SEED = 8, 2024


def chunk_inputs(s, cu=None):
    """Fresh inputs of shape s: raw a, b with A_log / dt_bias (Mamba-style
    initialisation: slow decays) when fused, else unit-norm q, k, a log decay g
    and beta in (0, 1). cu: the varlen cut (default: VARLEN_SEQS random ones)."""
    if cu is None:
        torch.manual_seed(0)
    B, T, H, HV, K, V, dt, gdt = s.B, s.T, s.H, s.HV, s.K, s.V, s.dtype, s.gate_dtype
    t = {}
    if s.varlen:
        if cu is None:
            rng = random.Random(VARLEN_SEED)
            cuts = sorted(rng.sample(range(1, T), VARLEN_SEQS - 1))
            cu = [0] + cuts + [T]
            note(f"varlen: {VARLEN_SEQS} sequences of lengths {[b - a for a, b in zip(cu, cu[1:])]} "
                 f"(seed {VARLEN_SEED})")
        t["cu_cpu"] = torch.tensor(cu, dtype=torch.int64)
        t["cu_dev"] = t["cu_cpu"].to(DEV)
    nseq = len(cu) - 1 if s.varlen else B
    if s.fused:
        t["q"] = torch.randn(B, T, H, K, dtype=dt, device=DEV)
        t["k"] = torch.randn(B, T, H, K, dtype=dt, device=DEV)
        t["g"] = torch.randn(B, T, HV, dtype=gdt, device=DEV)          # raw a
        t["beta"] = torch.randn(B, T, HV, dtype=gdt, device=DEV)       # raw b
        t["A_log"] = torch.empty(HV, device=DEV).uniform_(1, 16).log()
        dtv = torch.empty(HV, device=DEV).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        t["dt_bias"] = dtv + torch.log(-torch.expm1(-dtv))             # softplus^-1(dt)
    else:
        t["q"] = F.normalize(torch.randn(B, T, H, K, device=DEV), dim=-1).to(dt)
        t["k"] = F.normalize(torch.randn(B, T, H, K, device=DEV), dim=-1).to(dt)
        t["g"] = F.logsigmoid(torch.randn(B, T, HV, device=DEV) + 3.0).to(gdt)
        t["beta"] = torch.rand(B, T, HV, device=DEV).to(gdt)
        t["A_log"] = t["dt_bias"] = None
    t["v"] = torch.randn(B, T, HV, V, dtype=dt, device=DEV)
    t["h0"] = 0.1 * torch.randn(nseq, HV, K, V, device=DEV)
    return t, nseq


def gdn_chunk_config(s, t):
    flags = (gdn.QK_L2NORM | gdn.GATE_FUSED | gdn.BETA_SIGMOID) if s.fused else 0
    cfg = gdn.Config(B=s.B, T=s.T, H=s.H, HV=s.HV, K=s.K, V=s.V, dtype=GDN_DTYPE[s.dtype],
                     gate_dtype=GDN_DTYPE[s.gate_dtype], scale=0.0, flags=flags)
    if s.varlen:
        cfg.cu_seqlens, cfg.cu_seqlens_dev = ptr(t["cu_cpu"]), ptr(t["cu_dev"])
        cfg.num_seqs = len(t["cu_cpu"]) - 1
    return cfg


def fla_chunk(s, t, x):
    """FLA's chunk_gated_delta_rule on the tensors x (t's, or leaves that
    require grad) with the options of s; returns (o, ht)."""
    kw = dict(initial_state=x["h0"], output_final_state=True)
    if s.varlen:
        kw["cu_seqlens"] = t["cu_dev"]
        if FLA_CHUNK_CU_CPU:
            kw["cu_seqlens_cpu"] = t["cu_cpu"]
    g, beta = x["g"], x["beta"]
    if s.fused:
        kw["use_qk_l2norm_in_kernel"] = True
        if FLA_CHUNK_GATE:
            kw.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
        else:
            g = -x["A_log"].exp() * F.softplus(g.float() + x["dt_bias"])
        if FLA_CHUNK_BETA:
            kw["use_beta_sigmoid_in_kernel"] = True
        else:
            beta = beta.sigmoid()
    return chunk_gated_delta_rule(x["q"], x["k"], x["v"], g, beta, **kw)


def bench_chunk(s, want_fwd, want_bwd):
    t, nseq = chunk_inputs(s)
    ex = gdn_exec()
    cfg = gdn_chunk_config(s, t)
    o = torch.empty_like(t["v"])
    ht = torch.empty_like(t["h0"])
    sv = gdn.chunk_saved_size(cfg)
    saved = buffer(sv)
    ws_n = gdn.chunk_fwd_workspace_size(ex, cfg)
    bws_n = 0
    if want_bwd:          # one workspace serves both passes: backward recomputes what forward left in it
        try:
            bws_n = gdn.chunk_bwd_workspace_size(ex, cfg)
        except gdn.Error:
            bws_n = 0
    ws = buffer(max(ws_n, bws_n))
    fa = gdn.FwdArgs(q=ptr(t["q"]), k=ptr(t["k"]), v=ptr(t["v"]), g=ptr(t["g"]), beta=ptr(t["beta"]),
                     A_log=ptr(t["A_log"]), dt_bias=ptr(t["dt_bias"]), h0=ptr(t["h0"]), o=ptr(o), ht=ptr(ht),
                     saved=ptr(saved), saved_bytes=sv, workspace=ptr(ws), workspace_bytes=ws_n)
    rows = []

    if want_fwd:
        def gdn_fwd(i=0):
            gdn.chunk_fwd(ex, cfg, fa)

        def fla_fwd(i=0):
            with torch.no_grad():
                return fla_chunk(s, t, t)

        row = Row("chunk_fwd", s.name, flops_chunk_fwd(s), bytes_chunk_fwd(s, nseq))
        row.check(gdn_fwd, fla_fwd, (o, ht), lambda ref: {"o": rel_err(o, ref[0]), "ht": rel_err(ht, ref[1])})
        row.time_both(gdn_fwd, fla_fwd)
        rows.append(row)

    if want_bwd:
        # gradients w.r.t. these inputs; gdn's names for them with the in-kernel gate and beta
        names = ["q", "k", "v", "g", "beta", "h0"] + (["A_log", "dt_bias"] if s.fused else [])
        grad_name = {"g": "da" if s.fused else "dg", "beta": "db" if s.fused else "dbeta"}
        do = torch.randn_like(t["v"])
        dht = torch.randn_like(t["h0"])
        gr = {n: torch.empty_like(t[n]) for n in names}
        bws = ws
        ba = gdn.BwdArgs(q=ptr(t["q"]), k=ptr(t["k"]), v=ptr(t["v"]), g=ptr(t["g"]), beta=ptr(t["beta"]),
                         A_log=ptr(t["A_log"]), dt_bias=ptr(t["dt_bias"]), h0=ptr(t["h0"]), saved=ptr(saved),
                         saved_bytes=sv, dout=ptr(do), dht=ptr(dht), dq=ptr(gr["q"]), dk=ptr(gr["k"]),
                         dv=ptr(gr["v"]), dg=ptr(gr["g"]), dbeta=ptr(gr["beta"]), dA_log=ptr(gr.get("A_log")),
                         ddt_bias=ptr(gr.get("dt_bias")), dh0=ptr(gr["h0"]), workspace=ptr(bws),
                         workspace_bytes=bws_n)
        leaves = {n: (x.detach().clone().requires_grad_() if n in names else x) for n, x in t.items()}

        def gdn_fwd_bwd(i=0):
            gdn.chunk_fwd(ex, cfg, fa)
            gdn.chunk_bwd(ex, cfg, ba)

        def fla_fwd_bwd(i=0):
            out = fla_chunk(s, t, leaves)
            return torch.autograd.grad(out, [leaves[n] for n in names], (do, dht))

        row = Row("chunk_fwd+bwd", s.name, flops_chunk_fwd(s) + flops_chunk_bwd(s),
                  bytes_chunk_fwd(s, nseq) + bytes_chunk_bwd(s, nseq))
        lifted = fla_lift_640_guard()
        row.check(gdn_fwd_bwd, fla_fwd_bwd, gr.values(),
                  lambda ref: {grad_name.get(n, "d" + n) + (" (FLA wrong, 640)" if lifted else ""): rel_err(gr[n], r)
                               for n, r in zip(names, ref)})
        row.time_both(gdn_fwd_bwd, fla_fwd_bwd)
        if row.gdn == "unsupported":
            row.gdn = "n/a"              # no backward on gdn's CUDA backend yet
        # peak memory above the inputs (and dout, dht) of one forward + backward
        held = [o, ht, saved, ws] + list(gr.values())
        row.mem["gdn"] = sum(x.numel() * x.element_size() for x in held) / 2**20
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        res = row.try_fla(fla_fwd_bwd)
        torch.cuda.synchronize()
        if not isinstance(res, str):
            row.mem["fla"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        del res
        row.ref_errs = row.try_gdn(ref_slice_errors, s) if isinstance(row.gdn, float) else {}
        if isinstance(row.ref_errs, str):
            row.ref_errs = {}
        rows.append(row)
    return rows


# ---- float64 reference on a slice (forward + backward) ----

def ref_gdn_f64(x, fused, scale, lens, G):
    """The gated delta rule, token by token, in float64, on the rows of x
    (B = 1, sequences of lengths lens back to back): returns (o, ht)."""
    q, k, v, g, beta, h0 = x["q"][0], x["k"][0], x["v"][0], x["g"][0], x["beta"][0], x["h0"]
    if fused:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        g = -x["A_log"].exp() * F.softplus(g + x["dt_bias"])
        beta = beta.sigmoid()
    q, k = q.repeat_interleave(G, dim=1), k.repeat_interleave(G, dim=1)   # [T, HV, K]
    os, hts, r = [], [], 0
    for n, L in enumerate(lens):
        S = h0[n]
        for t in range(r, r + L):
            S = S * g[t].exp()[:, None, None]
            u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
            S = S + k[t][:, :, None] * u[:, None, :]
            os.append(scale * torch.einsum("hkv,hk->hv", S, q[t]))
        hts.append(S)
        r += L
    return torch.stack(os)[None], torch.stack(hts)


def ref_slice_errors(s):
    """gdn's forward + backward on a slice of shape s (two sequences, varlen,
    two q/k heads, s's K, G, dtype and options) against ref_gdn_f64 on the
    same rounded inputs: {output: ||gdn - ref|| / ||ref||}."""
    G, lens = s.HV // s.H, [150, 64]
    sl = ChunkShape(s.name + "-slice", 1, sum(lens), 2, 2 * G, s.K, s.dtype, s.fused, varlen=True)
    torch.manual_seed(1)
    t, nseq = chunk_inputs(sl, cu=[0, lens[0], sum(lens)])
    ex, cfg = gdn_exec(), gdn_chunk_config(sl, t)
    names = ["q", "k", "v", "g", "beta", "h0"] + (["A_log", "dt_bias"] if s.fused else [])
    o, ht = torch.full_like(t["v"], float("nan")), torch.full_like(t["h0"], float("nan"))
    sv = gdn.chunk_saved_size(cfg)
    saved = buffer(sv)
    ws_n = max(gdn.chunk_fwd_workspace_size(ex, cfg), gdn.chunk_bwd_workspace_size(ex, cfg))
    ws = buffer(ws_n)
    gdn.chunk_fwd(ex, cfg, gdn.FwdArgs(q=ptr(t["q"]), k=ptr(t["k"]), v=ptr(t["v"]), g=ptr(t["g"]),
                                       beta=ptr(t["beta"]), A_log=ptr(t["A_log"]), dt_bias=ptr(t["dt_bias"]),
                                       h0=ptr(t["h0"]), o=ptr(o), ht=ptr(ht), saved=ptr(saved), saved_bytes=sv,
                                       workspace=ptr(ws), workspace_bytes=ws_n))
    do, dht = torch.randn_like(t["v"]), torch.randn_like(t["h0"])
    gr = {n: torch.full_like(t[n], float("nan")) for n in names}
    gdn.chunk_bwd(ex, cfg, gdn.BwdArgs(q=ptr(t["q"]), k=ptr(t["k"]), v=ptr(t["v"]), g=ptr(t["g"]),
                                       beta=ptr(t["beta"]), A_log=ptr(t["A_log"]), dt_bias=ptr(t["dt_bias"]),
                                       h0=ptr(t["h0"]), saved=ptr(saved), saved_bytes=sv, dout=ptr(do), dht=ptr(dht),
                                       dq=ptr(gr["q"]), dk=ptr(gr["k"]), dv=ptr(gr["v"]), dg=ptr(gr["g"]),
                                       dbeta=ptr(gr["beta"]), dA_log=ptr(gr.get("A_log")),
                                       ddt_bias=ptr(gr.get("dt_bias")), dh0=ptr(gr["h0"]), workspace=ptr(ws),
                                       workspace_bytes=ws_n))
    x = {n: t[n].double().requires_grad_() for n in names}
    ro, rht = ref_gdn_f64(x, s.fused, 1.0 / math.sqrt(s.K), lens, G)
    rg = torch.autograd.grad((ro, rht), [x[n] for n in names], (do.double(), dht.double()))
    grad_name = {"g": "da" if s.fused else "dg", "beta": "db" if s.fused else "dbeta"}
    errs = {"o": rel_err(o, ro), "ht": rel_err(ht, rht)}
    errs.update({grad_name.get(n, "d" + n): rel_err(gr[n], r) for n, r in zip(names, rg)})
    return errs


# ---- fused decode step ----

DEC_H, DEC_HV, DEC_K, DEC_V = 16, 32, 128, 128
DEC_SHAPE = f"H{DEC_H} HV{DEC_HV} K{DEC_K} V{DEC_V}"


def bench_decode(B, want_eager, want_graph):
    """gdn_decode_step (mixed_qkv in, pool rows picked by slots, state updated in
    place) against FLA's fused_recurrent_gated_delta_rule with T = 1 per
    sequence through cu_seqlens (as serving engines call it), in-kernel L2 norm,
    gate and beta sigmoid, the same pool rows as initial_state, final state out."""
    H, HV, K, V = DEC_H, DEC_HV, DEC_K, DEC_V
    D = 2 * H * K + HV * V
    st_bytes = B * HV * K * V * 4
    npool = max(2, min(256, (512 << 20) // st_bytes))    # >= 512 MiB of states, as bench_cuda.c
    torch.manual_seed(0)
    pool = 0.1 * torch.randn(npool * B, HV, K, V, device=DEV)
    # rotation r uses pool rows r*B .. r*B+B-1, in a shuffled order through gdn's slots
    slots = torch.stack([torch.randperm(B) + r * B for r in range(npool)]).to(torch.int32).to(DEV)
    mixed = torch.randn(B, D, dtype=torch.bfloat16, device=DEV)
    a = torch.randn(B, HV, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(B, HV, dtype=torch.bfloat16, device=DEV)
    A_log = torch.empty(HV, device=DEV).uniform_(1, 16).log()
    dt_bias = torch.zeros(HV, device=DEV)
    o = torch.empty(B, HV, V, dtype=torch.bfloat16, device=DEV)
    cfg = gdn.DecodeConfig(B=B, H=H, HV=HV, K=K, V=V, dtype=gdn.BF16, scale=0.0, flags=gdn.QK_L2NORM,
                           num_slots=npool * B, conv_W=0)
    args = [gdn.DecodeArgs(mixed_qkv=ptr(mixed), a=ptr(a), b=ptr(b), A_log=ptr(A_log), dt_bias=ptr(dt_bias),
                           state=ptr(pool), slots=ptr(slots[r]), o=ptr(o)) for r in range(npool)]
    # FLA takes q, k, v apart (split here, outside the timed calls) and no slots
    q = mixed[:, :H * K].reshape(1, B, H, K).contiguous()
    k = mixed[:, H * K:2 * H * K].reshape(1, B, H, K).contiguous()
    v = mixed[:, 2 * H * K:].reshape(1, B, HV, V).contiguous()
    cu = torch.arange(B + 1, dtype=torch.int64, device=DEV)

    def gdn_step_for(stream_handle):
        ex = gdn_exec(stream_handle)
        return lambda i=0: gdn.decode_step(ex, cfg, args[i % npool])

    def fla_step(i=0, h0=None):
        g, beta, kw = a.view(1, B, HV), b.view(1, B, HV), {}
        if FLA_REC_GATE:
            kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
        else:
            g = -A_log.exp() * F.softplus(g.float() + dt_bias)
        if FLA_REC_BETA:
            kw["use_beta_sigmoid_in_kernel"] = True
        else:
            beta = beta.sigmoid()
        r = i % npool
        return fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=pool[r * B:(r + 1) * B] if h0 is None else h0,
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **kw)

    shape = f"B{B} {DEC_SHAPE}"
    flops, nbytes = flops_decode(B, H, HV, K, V), bytes_decode(B, H, HV, K, V, 2)
    rows = []
    if want_eager:
        row = Row("decode", shape, flops, nbytes)
        s0 = slots[0].long()
        h0 = pool[s0].clone()                            # rotation 0's states in slot order, for FLA
        row.check(gdn_step_for(torch.cuda.current_stream().cuda_stream), lambda: fla_step(0, h0), (o,),
                  lambda ref: {"o": rel_err(o, ref[0].view(B, HV, V)), "state": rel_err(pool[s0], ref[1])})
        del h0
        row.time_both(gdn_step_for(torch.cuda.current_stream().cuda_stream), fla_step, reps=50, warmup=5)
        rows.append(row)
    if want_graph:
        # enough steps per graph that the states they touch overflow L2
        nsteps = min(npool, max(20, math.ceil(4 * L2_BYTES / st_bytes)))
        row = Row("decode_graph", shape, flops, nbytes)
        row.gdn = row.try_gdn(graph_us, gdn_step_for, nsteps)
        row.fla = row.try_fla(graph_us, lambda stream: fla_step, nsteps)
        rows.append(row)
        note(f"decode_graph: {nsteps} steps captured in one torch.cuda.CUDAGraph, replayed; time per step")
    note("decode: FLA gets q, k, v split apart beforehand (not timed), has no state slots (its initial_state "
         "is the same pool rows, contiguous) and writes its final state to a new tensor; gdn reads the "
         "concatenated mixed_qkv and updates the pool rows in place through slots")
    return rows


# ---- layer ops: conv1d, gated RMSNorm, L2 norm (qwen3next-like sizes) ----

LAYER_B, LAYER_T = 4, 8192
CONV_D, CONV_W = 2 * DEC_H * DEC_K + DEC_HV * DEC_V, 4      # the short conv over mixed_qkv
UPD_B = 256
NORM_ROWS = LAYER_B * LAYER_T * DEC_HV                      # the output norm: one row per token and value head
L2_ROWS = LAYER_B * LAYER_T * DEC_H                         # q (or k): one row per token and q/k head


def bench_conv1d_fwd(shape):
    B, T, D, W = LAYER_B, LAYER_T, CONV_D, CONV_W
    torch.manual_seed(0)
    x = torch.randn(B, T, D, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(D, W, device=DEV) / W
    bias = 0.1 * torch.randn(D, device=DEV)
    h0 = torch.randn(B, D, W, device=DEV)
    y = torch.empty_like(x)
    ht = torch.empty_like(h0)
    ex = gdn_exec()
    cfg = gdn.Conv1dConfig(B=B, T=T, D=D, W=W, dtype=gdn.BF16, silu=1)
    args = gdn.Conv1dArgs(x=ptr(x), weight=ptr(w), bias=ptr(bias), h0=ptr(h0), y=ptr(y), ht=ptr(ht))

    def gdn_fn(i=0):
        gdn.conv1d_fwd(ex, cfg, args)

    def fla_fn(i=0):
        with torch.no_grad():
            return fla_causal_conv1d(x, w, bias, initial_state=h0, output_final_state=True, activation="silu",
                                     backend="triton")

    fla_fn = fla_fn if fla_causal_conv1d else None
    row = Row("conv1d_fwd", shape, 0.0, bytes_conv1d_fwd(B, T, D, W, 2, B))
    row.check(gdn_fn, fla_fn, (y, ht), lambda ref: {"y": rel_err(y, ref[0]), "ht": rel_err(ht, ref[1])})
    row.time_both(gdn_fn, fla_fn)
    note("conv1d_fwd: FLA keeps its final conv state in the input dtype (bf16), gdn in f32")
    return [row]


def bench_conv1d_update(shape):
    B, D, W = UPD_B, CONV_D, CONV_W
    npool = max(2, math.ceil(4 * L2_BYTES / (B * D * W * 4)))
    torch.manual_seed(0)
    pool = torch.randn(npool * B, D, W, device=DEV)
    slots = torch.stack([torch.randperm(B) + r * B for r in range(npool)]).to(torch.int32).to(DEV)
    x = torch.randn(B, D, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(D, W, device=DEV) / W
    bias = 0.1 * torch.randn(D, device=DEV)
    y = torch.empty_like(x)
    ex = gdn_exec()
    cfg = gdn.Conv1dConfig(B=B, T=1, D=D, W=W, dtype=gdn.BF16, silu=1)

    def gdn_fn(i=0):
        gdn.conv1d_update(ex, cfg, ptr(x), ptr(w), ptr(bias), ptr(pool), npool * B, ptr(slots[i % npool]), ptr(y))

    def fla_fn(i=0, cache=None):
        r = i % npool
        with torch.no_grad():
            return fla_causal_conv1d_update(x, pool[r * B:(r + 1) * B] if cache is None else cache, weight=w,
                                            bias=bias, activation="silu")

    fla_fn = fla_fn if fla_causal_conv1d_update else None
    s0 = slots[0].long()
    cache = pool[s0].clone()                             # rotation 0's states in slot order, for FLA
    row = Row("conv1d_update", shape, 0.0, bytes_conv1d_update(B, D, W, 2))
    row.check(gdn_fn, fla_fn and (lambda: fla_fn(0, cache)), (y,),
              lambda ref: {"y": rel_err(y, ref[0]), "state": rel_err(pool[s0], cache)})
    row.time_both(gdn_fn, fla_fn, reps=50, warmup=5)
    note("conv1d_update: FLA has no state slots (its cache is the same pool rows, contiguous)")
    return [row]


def bench_rmsnorm_gated_fwd(shape):
    rows_n, V = NORM_ROWS, DEC_V
    torch.manual_seed(0)
    x = torch.randn(rows_n, V, dtype=torch.bfloat16, device=DEV)
    z = torch.randn(rows_n, V, dtype=torch.bfloat16, device=DEV)
    w = 1.0 + 0.1 * torch.randn(V, device=DEV)
    y = torch.empty_like(x)
    rstd = torch.empty(rows_n, device=DEV)
    ex = gdn_exec()
    cfg = gdn.RmsnormConfig(rows=rows_n, V=V, dtype=gdn.BF16, eps=1e-6, gate=gdn.NORM_GATE_SILU)

    def gdn_fn(i=0):
        gdn.rmsnorm_gated_fwd(ex, cfg, ptr(x), ptr(z), ptr(w), ptr(y), ptr(rstd))

    def fla_fn(i=0):
        with torch.no_grad():
            return fla_rms_norm_gated(x, z, w, None, activation="swish", eps=1e-6)

    fla_fn = fla_fn if fla_rms_norm_gated else None
    row = Row("rmsnorm_gated_fwd", shape, 0.0, bytes_rmsnorm_gated_fwd(rows_n, V, 2))
    row.check(gdn_fn, fla_fn, (y,), lambda ref: {"y": rel_err(y, ref)})
    row.time_both(gdn_fn, fla_fn)
    return [row]


def bench_l2norm_fwd(shape):
    rows_n, dim = L2_ROWS, DEC_K
    torch.manual_seed(0)
    x = torch.randn(rows_n, dim, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    rstd = torch.empty(rows_n, device=DEV)
    ex = gdn_exec()

    def gdn_fn(i=0):
        gdn.l2norm_fwd(ex, rows_n, dim, gdn.BF16, ptr(x), ptr(y), ptr(rstd))

    def fla_fn(i=0):
        return fla_l2norm_fwd(x)

    fla_fn = fla_fn if fla_l2norm_fwd else None
    row = Row("l2norm_fwd", shape, 0.0, bytes_l2norm_fwd(rows_n, dim, 2))
    row.check(gdn_fn, fla_fn, (y, rstd), lambda ref: {"y": rel_err(y, ref[0]), "rstd": rel_err(rstd, ref[1])})
    row.time_both(gdn_fn, fla_fn)
    return [row]


LAYER_OPS = [
    ("conv1d_fwd", f"B{LAYER_B} T{LAYER_T} D{CONV_D} W{CONV_W} silu", bench_conv1d_fwd),
    ("conv1d_update", f"B{UPD_B} D{CONV_D} W{CONV_W} silu", bench_conv1d_update),
    ("rmsnorm_gated_fwd", f"rows {NORM_ROWS} V{DEC_V} silu", bench_rmsnorm_gated_fwd),
    ("l2norm_fwd", f"rows {L2_ROWS} dim {DEC_K}", bench_l2norm_fwd),
]


# ---- output ----

def print_table(rows, meta):
    print(f"device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, FLA {meta['fla']} "
          f"(chunk backend: {meta['fla_chunk_backend']})")
    print(f"copy bandwidth (torch D2D copy of 2 GiB, read + write, best of 10) {meta['copy_GBps']:8.1f} GB/s")
    print(f"bf16 matmul (torch.mm 8192 x 8192 x 8192, best of 20)             {meta['mm_bf16_TFLOPs']:8.1f} TFLOP/s")
    print()
    hdr = ("op", "shape", "gdn us", "FLA us", "FLA/gdn", "gdn %copy", "gdn %mm", "rel err")
    w = (17, max([len(r["shape"]) for r in rows] + [5]), 11, 11, 8, 9, 8, 8)

    def line(cells):
        return "  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(cells)).rstrip()

    def us(v, word):
        return word if v is None else f"{v:.2f}" if v < 100 else f"{v:.1f}"

    def pct(v):
        return "-" if v is None else f"{v:.1f} %"

    print(line(hdr))
    for r in rows:
        err = max(r["rel_err"].values()) if r["rel_err"] else None
        print(line((r["op"], r["shape"], us(r["gdn_us"], r["gdn_status"]), us(r["fla_us"], r["fla_status"]),
                    "-" if r["fla_over_gdn"] is None else f"{r['fla_over_gdn']:.2f}",
                    pct(r["gdn_pct_copy"]), pct(r["gdn_pct_mm"]),
                    "-" if err is None else f"{err:.1e}" + ("" if err <= ERR_FLAG else "!"))))
    fb = [r for r in rows if r["peak_MiB"] or r["ref_err"]]
    if fb:
        print()
        print(line(("op", "shape", "gdn MiB", "FLA MiB", "FLA/gdn", "", "", "ref err")))
        for r in fb:
            m, err = r["peak_MiB"], max(r["ref_err"].values()) if r["ref_err"] else None
            g_, f_ = m.get("gdn"), m.get("fla")
            print(line((r["op"], r["shape"], "-" if g_ is None else f"{g_:.0f}", "-" if f_ is None else f"{f_:.0f}",
                        "-" if not (g_ and f_) else f"{f_ / g_:.2f}", "", "",
                        "-" if err is None else f"{err:.1e}")))
        print("MiB: peak device memory of one forward + backward above its inputs (and dout, dht); "
              "ref err: gdn vs float64 on a slice, the largest over o, ht and every gradient")
        for r in fb:
            if r["ref_err"]:
                print(f"  {r['shape']} ref err: " + ", ".join(f"{k} {v:.1e}" for k, v in r["ref_err"].items()))
    print()
    print(f"rel err: ||gdn - FLA|| / ||FLA||, the largest over the op's outputs; ! = above {ERR_FLAG:g}")
    for n in meta["notes"]:
        print(f"note: {n}")


def main():
    ap = argparse.ArgumentParser(description="gdn beside FLA on one GPU (see the module docstring)")
    ap.add_argument("--only", default="", help='keep the rows whose "op shape" contains this')
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    opt = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device visible to torch")
    if not gdn.backend_available(gdn.BACKEND_CUDA):
        sys.exit(f"bench_gpu: this libgdn has no usable CUDA backend ({gdn.last_error()})")

    def want(op, shape):
        return opt.only in f"{op} {shape}"

    rows = []

    def run_case(name, fn, *a):
        # a case that fails outside the timed calls (a size query, out of memory) costs its rows only
        try:
            rows.extend(fn(*a))
        except Exception as e:               # noqa: BLE001
            note(f"{name}: {type(e).__name__}: {str(e).strip()[:200]} (rows left out)")
        torch.cuda.empty_cache()

    copy, mm = card_limits()
    for s in CHUNK_SHAPES:
        wf, wb = want("chunk_fwd", s.name), want("chunk_fwd+bwd", s.name)
        if wf or wb:
            run_case(f"chunk {s.name}", bench_chunk, s, wf, wb)
    for B in (1, 32, 256):
        shape = f"B{B} {DEC_SHAPE}"
        we, wg = want("decode", shape), B == 1 and want("decode_graph", shape)
        if we or wg:
            run_case(f"decode B{B}", bench_decode, B, we, wg)
    for op, shape, fn in LAYER_OPS:
        if want(op, shape):
            run_case(op, fn, shape)

    if not FLA_CHUNK_GATE or not FLA_REC_GATE:
        note("this FLA has no in-kernel gate: g = -exp(A_log) * softplus(a + dt_bias) is computed with torch "
             "inside FLA's timed call")
    if not FLA_CHUNK_BETA or not FLA_REC_BETA:
        note("this FLA has no in-kernel beta sigmoid: beta = sigmoid(b) is computed with torch inside FLA's "
             "timed call")
    if any(r.op == "chunk_fwd+bwd" for r in rows):
        note("chunk_fwd+bwd: gdn times chunk_fwd (keeping saved) + chunk_bwd; FLA one forward and "
             "torch.autograd.grad of (o, ht) w.r.t. every input; FLOPs = 3.5 x forward (tools/flops.h)")
    qla = importlib.util.find_spec("flash_qla") is not None
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "fla": getattr(fla, "__version__", "?"),
            "fla_chunk_backend": "flash_qla (TileLang) where it accepts the call, else triton" if qla else "triton",
            "gdn_lib": gdn.lib._name, "copy_GBps": copy * 1e-9, "mm_bf16_TFLOPs": mm * 1e-12, "notes": NOTES}
    out = [r.as_dict(copy, mm) for r in rows]
    if opt.json:
        print(json.dumps({"meta": meta, "rows": out}, indent=1))
    else:
        print_table(out, meta)


if __name__ == "__main__":
    main()
