"""The decode and layer-op rows of the GPU bench (bench_gpu.py): the fused decode
step (eager and CUDA graph), conv1d forward and update, gated RMSNorm forward and
L2 norm forward, each beside FLA."""
import math

import torch

from gdn import capi as gdn

from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

from gpu_common import (DEV, FLA_REC_BETA, FLA_REC_GATE, L2_BYTES, Row, _fla_optional, bytes_conv1d_fwd,
                        fla_fused_gates,
                        bytes_conv1d_update, bytes_decode, bytes_l2norm_fwd, bytes_rmsnorm_gated_fwd, flops_decode,
                        gdn_exec, graph_us, note, ptr, rel_err)


fla_causal_conv1d = _fla_optional("fla.modules.conv", "causal_conv1d")
fla_causal_conv1d_update = _fla_optional("fla.modules.conv.triton", "causal_conv1d_update")
fla_rms_norm_gated = _fla_optional("fla.modules.fused_norm_gate", "rms_norm_gated")
fla_l2norm_fwd = _fla_optional("fla.modules.l2norm", "l2norm_fwd")


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
        kw = {}
        g, beta = fla_fused_gates(a.view(1, B, HV), b.view(1, B, HV), A_log, dt_bias, kw, FLA_REC_GATE, FLA_REC_BETA)
        r = i % npool
        return fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=pool[r * B:(r + 1) * B] if h0 is None else h0,
            output_final_state=True, cu_seqlens=cu, **kw)

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
