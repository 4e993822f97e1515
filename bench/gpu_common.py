"""Shared parts of the GPU bench (bench_gpu.py): FLA feature flags, the notes,
the FLOP and byte models, timing and the card's limits, the Row class and
the table printer."""
import importlib
import inspect
import os
import statistics
from dataclasses import dataclass

import torch

from gdn import capi as gdn

# FLA dispatches its chunk op to FlashQLA when that is installed (its backend
# registry); the FLA side stays FLA's own Triton kernels, FlashQLA has its own
os.environ.setdefault("FLA_FLASH_QLA", "0")
import fla.ops.gated_delta_rule.chunk as _fla_chunk_module  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _fla_optional(module, name):
    """An FLA function that not every FLA version has (None if absent: its cells read n/a)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


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

# FlashQLA (TileLang, Hopper; pip wheels flash-qla and tilelang) where it is installed: a third side of the chunk rows
try:
    import flash_qla as QLA
except Exception as _e:                      # noqa: BLE001 -- absent, or its TileLang does not load here
    QLA = None
    QLA_MISSING = f"{type(_e).__name__}: {str(_e).strip().splitlines()[0][:160] if str(_e).strip() else ''}"
else:
    QLA_MISSING = None


def fla_fused_gates(g, beta, A_log, dt_bias, kw, gate_in=None, beta_in=None):
    """q/k L2 norm, the gate -exp(A_log) softplus(a + dt_bias) and beta's sigmoid for an FLA call:
    in its kernel where this FLA has them (added to kw; gate_in, beta_in: whether the call takes
    them, default the chunk call's), else by torch ops here (inside the caller's timed region);
    returns the (g, beta) to pass."""
    import torch.nn.functional as F
    gate_in = FLA_CHUNK_GATE if gate_in is None else gate_in
    beta_in = FLA_CHUNK_BETA if beta_in is None else beta_in
    kw["use_qk_l2norm_in_kernel"] = True
    if gate_in:
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    else:
        g = -A_log.exp() * F.softplus(g.float() + dt_bias)
    if beta_in:
        kw["use_beta_sigmoid_in_kernel"] = True
    else:
        beta = beta.sigmoid()
    return g, beta


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
        self.qla = None      # FlashQLA's time or word (chunk rows, where it is installed)
        self.mem = {}        # fwd+bwd: peak MiB above the inputs, per side
        self.ref_errs = {}   # fwd+bwd: gdn vs float64 on a slice, per output

    def try_gdn(self, fn, *a, **kw):
        return _attempt("gdn", self.op, self.shape, fn, *a, **kw)

    def try_fla(self, fn, *a, **kw):
        return _attempt("FLA", self.op, self.shape, fn, *a, **kw)

    def try_qla(self, fn, *a, **kw):
        return _attempt("FlashQLA", self.op, self.shape, fn, *a, **kw)

    def time_both(self, gdn_fn, fla_fn, qla_fn=None, **kw):
        """Times of every side (time_us keywords kw); a side that fails keeps its word.
        qla_fn: FlashQLA's call, where it is installed and takes the shape."""
        self.gdn = self.try_gdn(time_us, gdn_fn, **kw)
        self.fla = self.try_fla(time_us, fla_fn, **kw) if fla_fn else "n/a"
        if qla_fn is not None:
            self.qla = self.try_qla(time_us, qla_fn, **kw)

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
        d["qla_us"], d["qla_status"] = _num(self.qla), _word(self.qla)
        d["fla_over_gdn"] = d["fla_us"] / d["gdn_us"] if d["gdn_us"] and d["fla_us"] else None
        d["qla_over_gdn"] = d["qla_us"] / d["gdn_us"] if d["gdn_us"] and d["qla_us"] else None
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


# ---- output ----

def print_table(rows, meta):
    print(f"device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, FLA {meta['fla']} "
          f"(chunk backend: {meta['fla_chunk_backend']}), FlashQLA {meta.get('flash_qla') or 'not installed'}")
    print(f"copy bandwidth (torch D2D copy of 2 GiB, read + write, best of 10) {meta['copy_GBps']:8.1f} GB/s")
    print(f"bf16 matmul (torch.mm 8192 x 8192 x 8192, best of 20)             {meta['mm_bf16_TFLOPs']:8.1f} TFLOP/s")
    print()
    qla = any(r["qla_status"] != "n/a" for r in rows)
    hdr = ("op", "shape", "gdn us", "FLA us", "FLA/gdn", "gdn %copy", "gdn %mm", "rel err") + (("QLA us", "QLA/gdn") if qla else ())
    w = (17, max([len(r["shape"]) for r in rows] + [5]), 11, 11, 8, 9, 8, 8, 11, 8)

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
                    "-" if err is None else f"{err:.1e}" + ("" if err <= ERR_FLAG else "!"))
                   + ((us(r["qla_us"], r["qla_status"]),
                       "-" if r["qla_over_gdn"] is None else f"{r['qla_over_gdn']:.2f}") if qla else ())))
    fb = [r for r in rows if r["peak_MiB"] or r["ref_err"]]
    if fb:
        print()
        print(line(("op", "shape", "gdn MiB", "FLA MiB", "FLA/gdn", "", "", "ref err") + (("QLA MiB", "QLA/gdn") if qla else ())))
        for r in fb:
            m, err = r["peak_MiB"], max(r["ref_err"].values()) if r["ref_err"] else None
            g_, f_, q_ = m.get("gdn"), m.get("fla"), m.get("qla")
            print(line((r["op"], r["shape"], "-" if g_ is None else f"{g_:.0f}", "-" if f_ is None else f"{f_:.0f}",
                        "-" if not (g_ and f_) else f"{f_ / g_:.2f}", "", "",
                        "-" if err is None else f"{err:.1e}")
                       + (("-" if q_ is None else f"{q_:.0f}", "-" if not (g_ and q_) else f"{q_ / g_:.2f}") if qla else ())))
        print("MiB: peak device memory of one forward + backward above its inputs (and dout, dht); "
              "ref err: gdn vs float64 on a slice, the largest over o, ht and every gradient")
        for r in fb:
            if r["ref_err"]:
                print(f"  {r['shape']} ref err: " + ", ".join(f"{k} {v:.1e}" for k, v in r["ref_err"].items()))
    print()
    print(f"rel err: ||gdn - FLA|| / ||FLA||, the largest over the op's outputs; ! = above {ERR_FLAG:g}")
    if qla:
        print("QLA: FlashQLA's chunk_gated_delta_rule on the same inputs (its own intra-card context parallelism "
              "on, as it ships); QLA/gdn > 1 means gdn is faster")
    for n in meta["notes"]:
        print(f"note: {n}")
