"""The chunk rows of the GPU bench (bench_gpu.py): chunk forward and
forward + backward beside FLA, and gdn against a float64 reference on a slice."""
import importlib
import math
import random

import torch
import torch.nn.functional as F
import triton

from gdn import capi as gdn

from fla.ops.gated_delta_rule import chunk_gated_delta_rule

from gpu_common import (DEV, FLA_CHUNK_CU_CPU, GDN_DTYPE, QLA, QLA_MISSING, ChunkShape, Row, buffer,
                        fla_fused_gates,
                        bytes_chunk_bwd, bytes_chunk_fwd, flops_chunk_bwd, flops_chunk_fwd, gdn_exec, note, ptr,
                        rel_err)


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


# ---- chunk forward, forward + backward ----

CHUNK_SHAPES = [
    ChunkShape("qwen3next", 4, 8192, 16, 32, 128, torch.bfloat16, fused=True),
    ChunkShape("long1", 1, 65536, 2, 8, 128, torch.bfloat16, fused=True),
    ChunkShape("tp8_4k", 8, 4096, 2, 4, 128, torch.bfloat16, fused=True),
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
        g, beta = fla_fused_gates(g, beta, x["A_log"], x["dt_bias"], kw)
    return chunk_gated_delta_rule(x["q"], x["k"], x["v"], g, beta, **kw)


def qla_takes(s):
    """Whether FlashQLA (installed) takes shape s: bf16 / f16, K = V = 128, on Hopper; else says why not once."""
    if QLA is None:
        note(f"FlashQLA: not installed here ({QLA_MISSING}); pip wheels flash-qla and tilelang bring it")
        return False
    if s.K != 128 or s.V != 128 or s.dtype not in (torch.bfloat16, torch.float16):
        note(f"FlashQLA: {s.name} left out (it takes K = V = 128 in bf16 / f16 only)")
        return False
    return True


def qla_chunk(s, t, x):
    """FlashQLA's chunk_gated_delta_rule on x with the options of s (the fused gate and beta's
    sigmoid by torch ops inside the timed call: it has neither in its kernel); returns (o, ht)."""
    import torch.nn.functional as Fn
    g, beta = x["g"], x["beta"]
    if s.fused:
        g = -x["A_log"].exp() * Fn.softplus(g.float() + x["dt_bias"])
        beta = beta.sigmoid()
    return QLA.chunk_gated_delta_rule(x["q"], x["k"], x["v"], g, beta, initial_state=x["h0"], output_final_state=True,
                                      use_qk_l2norm_in_kernel=s.fused,
                                      cu_seqlens=t["cu_dev"] if s.varlen else None)


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

    if want_fwd:     # inference, as FLA's and FlashQLA's under no_grad: nothing saved for a backward
        fa_inf = gdn.FwdArgs(q=ptr(t["q"]), k=ptr(t["k"]), v=ptr(t["v"]), g=ptr(t["g"]), beta=ptr(t["beta"]),
                             A_log=ptr(t["A_log"]), dt_bias=ptr(t["dt_bias"]), h0=ptr(t["h0"]), o=ptr(o), ht=ptr(ht),
                             saved=None, saved_bytes=0, workspace=ptr(ws), workspace_bytes=ws_n)

        def gdn_fwd(i=0):
            gdn.chunk_fwd(ex, cfg, fa_inf)

        def fla_fwd(i=0):
            with torch.no_grad():
                return fla_chunk(s, t, t)

        def qla_fwd(i=0):
            with torch.no_grad():
                return qla_chunk(s, t, t)

        row = Row("chunk_fwd", s.name, flops_chunk_fwd(s), bytes_chunk_fwd(s, nseq))
        row.check(gdn_fwd, fla_fwd, (o, ht), lambda ref: {"o": rel_err(o, ref[0]), "ht": rel_err(ht, ref[1])})
        row.time_both(gdn_fwd, fla_fwd, qla_fwd if qla_takes(s) else None)
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

        def qla_fwd_bwd(i=0):
            out = qla_chunk(s, t, leaves)
            return torch.autograd.grad(out, [leaves[n] for n in names], (do, dht))

        row = Row("chunk_fwd+bwd", s.name, flops_chunk_fwd(s) + flops_chunk_bwd(s),
                  bytes_chunk_fwd(s, nseq) + bytes_chunk_bwd(s, nseq))
        lifted = fla_lift_640_guard()
        row.check(gdn_fwd_bwd, fla_fwd_bwd, gr.values(),
                  lambda ref: {grad_name.get(n, "d" + n) + (" (FLA wrong, 640)" if lifted else ""): rel_err(gr[n], r)
                               for n, r in zip(names, ref)})
        qla_on = qla_takes(s)
        row.time_both(gdn_fwd_bwd, fla_fwd_bwd, qla_fwd_bwd if qla_on else None)
        if row.gdn == "unsupported":
            row.gdn = "n/a"              # no backward on gdn's CUDA backend yet
        # peak memory above the inputs (and dout, dht) of one forward + backward
        held = [o, ht, saved, ws] + list(gr.values())
        row.mem["gdn"] = sum(x.numel() * x.element_size() for x in held) / 2**20
        for side, attempt, fn in (("fla", row.try_fla, fla_fwd_bwd), ("qla", row.try_qla, qla_fwd_bwd if qla_on else None)):
            if fn is None:
                continue
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            res = attempt(fn)
            torch.cuda.synchronize()
            if not isinstance(res, str):
                row.mem[side] = (torch.cuda.max_memory_allocated() - base) / 2**20
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
