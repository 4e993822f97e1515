"""gdn.cp: context parallel over torch.distributed (include/gdn.h, DESIGN.md §8).

The ranks of a process group hold one token stream (B = 1, one sequence or
packed sequences with cu_seqlens) cut into contiguous slices, in rank order.
Each rank runs the layer on its own slice; what crosses a cut moves between
the ranks:

- the gated delta rule: each rank's map (HV * (K*K + K*V) float32: the
  transition P and the state S of the sequence that crosses its edge) is
  all-gathered, and a scan gives each rank the state its first sequence
  comes in with; backward does the same with the state gradients (the
  matching maps, all-gathered, scanned from the last rank back);
- the short causal conv1d: the last W-1 inputs of each rank are
  all-gathered, and a sequence that continues from earlier ranks takes the
  W-1 inputs before the cut (the halo) as its conv state; backward sends the
  halo's gradient back to the ranks that hold those inputs (all-reduce).

    ctx = gdn.cp.build_cp_context(cu_seqlens, group=group)      # once per batch layout
    o, _ = gdn.chunk_gated_delta_rule(q_loc, k_loc, v_loc, g_loc, beta_loc, cp_context=ctx)
    y, _ = gdn.causal_conv1d(x_loc, w, activation="silu", cp_context=ctx)
    y = layer(x_loc, cp_context=ctx)                             # gdn.GatedDeltaNet

Local tensors are [1, T_local, ...]. initial_state and the final state are
per local sequence ([N_local, ...]): row 0 of initial_state is not read
where the first sequence continues from the previous rank (its gradient is
zero), and the final-state row of a sequence that continues into the next
rank is its state at this rank's last token. Gradients of shared parameters
(A_log, dt_bias, the conv weight and bias, a layer's weights) are this
rank's part of the sum: add them over the group (as data parallel does).

Torch tensors on the CPU (gloo, or any backend that moves CPU tensors) or on
a CUDA device (NCCL: one process per GPU, the maps and the conv halo move as
CUDA tensors on the current stream).
"""
import torch
import torch.distributed as dist

from . import _core, capi
from ._core import GdnArgumentError, ptr


class CPContext:
    """Where this rank's slice sits in the token stream (build it with build_cp_context).

    rank, world, group; starts: [world+1] token offsets of the slices; cu_seqlens: the local
    cu_seqlens (int64 tensor), or None for one sequence without cu_seqlens; num_seqs: local
    sequences; seq0: global index of local sequence 0; first_continues, last_continues.
    """

    def __init__(self, group, rank, world, starts, global_cu):
        self.group, self.rank, self.world = group, rank, world
        self.starts = [int(s) for s in starts]
        self.global_cu = None if global_cu is None else [int(c) for c in global_cu]
        s, e = self.starts[rank], self.starts[rank + 1]
        self.T = e - s
        if self.global_cu is None:       # one sequence over the whole stream
            self.cu_seqlens, self.num_seqs, self.seq0 = None, 1, 0
            self.first_continues, self.last_continues = s > 0, e < self.starts[-1]
            self._seq_start = 0
            return
        cu = self.global_cu
        local, seq0 = [], None
        for n in range(len(cu) - 1):
            a, b = cu[n], cu[n + 1]
            if b > a:
                mine = a < e and b > s
            else:   # an empty sequence: the first rank that ends after it (the last rank at the end)
                owner = next((q for q in range(world) if a < self.starts[q + 1]), world - 1)
                mine = owner == rank
            if mine:
                seq0 = n if seq0 is None else seq0
                local.append(min(b, e) - s)
        if not local:
            raise GdnArgumentError(f"rank {rank} holds no token and no sequence (its slice {s}..{e} is empty and "
                                   "sits on a sequence edge): give it at least one token")
        self.cu_seqlens = torch.tensor([0] + local, dtype=torch.int64)
        self.num_seqs, self.seq0 = len(local), seq0
        self.first_continues = cu[seq0] < s
        self.last_continues = cu[seq0 + len(local)] > e
        self._seq_start = cu[seq0]

    def cp_config(self):
        return capi.CpConfig(rank=self.rank, world=self.world, first_continues=int(self.first_continues),
                             last_continues=int(self.last_continues))

    def __repr__(self):
        return (f"CPContext(rank={self.rank}, world={self.world}, tokens={self.starts[self.rank]}.."
                f"{self.starts[self.rank + 1]}, num_seqs={self.num_seqs}, seq0={self.seq0}, "
                f"first_continues={self.first_continues}, last_continues={self.last_continues})")


def _group_rank_world(group):
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise GdnArgumentError("group is given but torch.distributed is not initialized")
        return None, 0, 1
    return group, dist.get_rank(group), dist.get_world_size(group)


def build_cp_context(cu_seqlens=None, group=None, local_len=None, lengths=None, total_len=None):
    """This rank's CPContext.

    cu_seqlens: the global cu_seqlens [N+1] of the whole stream (before the cut; tensor or list), or
    None for one sequence. The cut, in order of precedence: lengths (every rank's token count, in
    rank order: no communication), local_len (this rank's count; one all_gather of the counts), or
    an even cut of total_len (default cu_seqlens[-1]) with the first T % world ranks one token longer.
    group: a torch.distributed process group (None: the default group; a single rank when
    torch.distributed is not initialized).
    """
    group, rank, world = _group_rank_world(group)
    cu = None
    if cu_seqlens is not None:
        cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
        if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
            raise GdnArgumentError(f"cu_seqlens must start at 0 and be sorted, got {cu[:8]}...")
    if lengths is not None:
        lengths = [int(x) for x in lengths]
        if len(lengths) != world:
            raise GdnArgumentError(f"lengths has {len(lengths)} entries for a group of {world} ranks")
    elif local_len is not None:
        if world == 1:
            lengths = [int(local_len)]
        else:
            # NCCL moves CUDA tensors only
            dev = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
                   else torch.device("cpu"))
            mine = torch.tensor([int(local_len)], dtype=torch.int64, device=dev)
            got = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(got, mine, group=group)
            lengths = [int(x.item()) for x in got]
    else:
        T = cu[-1] if cu is not None else total_len
        if T is None:
            raise GdnArgumentError("without cu_seqlens, give lengths, local_len or total_len")
        lengths = [T // world + (1 if r < T % world else 0) for r in range(world)]
    if any(x < 0 for x in lengths):
        raise GdnArgumentError(f"lengths {lengths}: a rank's token count must be >= 0")
    starts = [0]
    for x in lengths:
        starts.append(starts[-1] + x)
    if cu is not None and cu[-1] != starts[-1]:
        raise GdnArgumentError(f"the ranks hold {starts[-1]} tokens, cu_seqlens[-1] is {cu[-1]}")
    if total_len is not None and int(total_len) != starts[-1]:
        raise GdnArgumentError(f"the ranks hold {starts[-1]} tokens, total_len is {total_len}")
    return CPContext(group, rank, world, starts, cu)


def _all_gather(t, cpc):
    """[world * n]: t (flat, on its device) of every rank in rank order."""
    if cpc.world == 1:
        return t.clone()
    parts = [torch.empty_like(t) for _ in range(cpc.world)]
    dist.all_gather(parts, t.contiguous(), group=cpc.group)
    return torch.cat(parts)


def _check_cpc(cpc, x, name):
    if not isinstance(cpc, CPContext):
        raise GdnArgumentError(f"cp_context must be a gdn.cp.CPContext (gdn.cp.build_cp_context), got "
                               f"{type(cpc).__name__}")
    if not isinstance(x, torch.Tensor):
        raise GdnArgumentError(f"{name}: context parallel takes torch tensors")
    if x.ndim < 2 or x.shape[0] != 1:
        raise GdnArgumentError(f"{name}: shape {tuple(x.shape)}: context parallel takes this rank's slice of one "
                               "token stream, [1, T_local, ...] (pack the batch with cu_seqlens)")
    if x.shape[1] != cpc.T:
        raise GdnArgumentError(f"{name} has {x.shape[1]} tokens, this rank's slice of the context has {cpc.T}")


# ---- the gated delta rule ----

class _RuleCP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, h0, cpc, scale, flags, want_ht):
        cu = cpc.cu_seqlens
        rule = _core.Rule(q, k, v, g, beta, A_log, dt_bias, h0, cu, None, scale, flags)
        ex, cfg, cpcfg = rule.ctx.ex, rule.cfg, cpc.cp_config()
        dev = q.device
        # the incoming state goes into h0 row 0 (step 3), between the two halves of the forward
        h0_loc = rule.h0
        if cpc.first_continues:
            h0_loc = (rule.h0.clone() if rule.h0 is not None
                      else torch.zeros(rule.state_shape, dtype=torch.float32, device=dev))
        o = rule.ctx.empty(rule.v.shape, rule.code)
        ht = rule.ctx.empty(rule.state_shape, capi.F32) if want_ht else None
        saved_n = capi.chunk_saved_size(cfg)
        saved = rule.ctx.bytes(saved_n)
        if saved is None:
            saved = torch.empty(0, dtype=torch.uint8, device=dev)
        ws_n = capi.cp_fwd_workspace_size(ex, cfg, cpcfg)
        ws = rule.ctx.bytes(ws_n)
        args = capi.FwdArgs(q=ptr(rule.q), k=ptr(rule.k), v=ptr(rule.v), g=ptr(rule.g), beta=ptr(rule.beta),
                            A_log=ptr(rule.A_log), dt_bias=ptr(rule.dt_bias), h0=ptr(h0_loc), o=ptr(o), ht=ptr(ht),
                            saved=ptr(saved) if saved_n else None, saved_bytes=saved_n, workspace=ptr(ws),
                            workspace_bytes=ws_n)
        # 1. this rank's forward map, begun as the first part of the local forward (gdn_cp_fwd_begin:
        # their shared work done once), 2. the all-gather, 3. the scan into h0 row 0, 4. the forward finished
        fmap = torch.empty(capi.cp_map_floats(cfg), dtype=torch.float32, device=dev)
        capi.cp_fwd_begin(ex, cfg, cpcfg, args, ptr(fmap))
        maps = _all_gather(fmap, cpc)
        if cpc.first_continues:
            capi.cp_fwd_scan(ex, cfg, cpcfg, ptr(maps), ptr(h0_loc))
        capi.cp_fwd_finish(ex, cfg, cpcfg, args)
        del ws
        ctx.save_for_backward(rule.q, rule.k, rule.v, rule.g, rule.beta, rule.A_log, rule.dt_bias, h0_loc, saved,
                              fmap)
        ctx.cpc, ctx.scale, ctx.flags, ctx.want_ht, ctx.has_h0 = cpc, scale, flags, want_ht, h0 is not None
        if ht is None:
            ht = torch.empty(0, dtype=torch.float32, device=dev)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, A_log, dt_bias, h0_loc, saved, fmap = ctx.saved_tensors
        cpc, need = ctx.cpc, ctx.needs_input_grad
        cu = cpc.cu_seqlens
        do = do.contiguous()
        dht = dht.contiguous() if ctx.want_ht and dht is not None and dht.numel() else None
        rule = _core.Rule(q, k, v, g, beta, A_log, dt_bias, h0_loc, cu, None, ctx.scale, ctx.flags)
        ex, cfg, cpcfg = rule.ctx.ex, rule.cfg, cpc.cp_config()
        # 5. this rank's backward map (the forward map's P reused), begun as the first part of the
        # local backward (gdn_cp_bwd_begin: their shared work done once), 6. the all-gather
        want_dh0 = bool(need[7] and ctx.has_h0)
        ws_n = capi.cp_bwd_workspace_size(ex, cfg, cpcfg)
        args, outs, keep = _core.bwd_call(rule, saved if saved is not None and saved.numel() else None, do, dht, ctx.flags,
                                          bool(need[6] and dt_bias is not None), want_dh0, ws_n)
        dev = q.device
        bmap = torch.empty(capi.cp_map_floats(cfg), dtype=torch.float32, device=dev)
        capi.cp_bwd_begin(ex, cfg, cpcfg, args, ptr(fmap), ptr(bmap))
        bmaps = _all_gather(bmap, cpc)
        # 7. the reverse scan: the state gradient at this rank's end; 8. the local backward finished with it
        dS_out = None
        if cpc.last_continues:
            dS_out = torch.empty(rule.state_shape[1:], dtype=torch.float32, device=dev)
            capi.cp_bwd_scan(ex, cfg, cpcfg, ptr(bmaps), ptr(dS_out))
        capi.cp_bwd_finish(ex, cfg, cpcfg, args, ptr(dS_out))
        del keep
        dq, dk, dv, dg, dbeta, dA, ddt, dh0 = outs
        if want_dh0 and cpc.first_continues:
            dh0[0] = 0   # row 0 was the incoming state, not read from initial_state
        fused = bool(ctx.flags & capi.GATE_FUSED)
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                dg if need[3] and g is not None else None, dbeta if need[4] else None,
                dA if need[5] and fused else None, ddt if need[6] and dt_bias is not None else None,
                dh0 if want_dh0 else None, None, None, None, None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cp_context=None, use_gate_in_kernel=False, A_log=None,
                           dt_bias=None):
    """gdn.chunk_gated_delta_rule on this rank's slice under context parallel (the module's doc).

    q, k [1, T_local, H, K], v [1, T_local, HV, V], g, beta [1, T_local, HV]; initial_state
    [N_local, HV, K, V] ([.., V, K] with state_v_first) or None. Returns (o, final_state or None),
    final_state [N_local, ...]. Differentiable; collectives in forward and in backward.
    """
    from . import api
    cpc = cp_context
    _check_cpc(cpc, q, "q")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise GdnArgumentError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    if use_gate_in_kernel and A_log is None:
        raise GdnArgumentError("A_log is required with use_gate_in_kernel=True")
    if not use_gate_in_kernel:
        A_log = dt_bias = None
    flags = api._rule_flags(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                            allow_neg_eigval, state_v_first)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise GdnArgumentError("q, k must be [1, T, H, K] and v [1, T, HV, V]")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise GdnArgumentError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if initial_state is not None and initial_state.shape[0] != cpc.num_seqs:
        raise GdnArgumentError(f"initial_state has {initial_state.shape[0]} states for this rank's "
                               f"{cpc.num_seqs} local sequences")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    g, beta = api._gates(q, g, beta)
    A_log, dt_bias, h0 = api._f32(A_log), api._f32(dt_bias), api._f32(initial_state)
    o, ht = _RuleCP.apply(q, k, v, g, beta, A_log, dt_bias, h0, cpc, float(scale), flags, bool(output_final_state))
    return o, (ht if output_final_state else None)


# ---- the short causal conv1d ----

def _halo_sources(cpc, W):
    """[(m, rank i, tail row)]: input m+1 before this rank's first token (m = 0 the nearest) of the
    sequence that continues from earlier ranks, and where it sits in rank i's gathered tail."""
    if not cpc.first_continues:
        return []
    s = cpc.starts[cpc.rank]
    out = []
    for m in range(W - 1):
        pos = s - 1 - m
        if pos < cpc._seq_start:
            break
        i = next(r for r in range(cpc.rank) if cpc.starts[r] <= pos < cpc.starts[r + 1])
        out.append((m, i, (W - 1) - (cpc.starts[i + 1] - pos)))
    return out


class _ConvCP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, h0, cpc, silu, want_ht):
        D, W = weight.shape
        T = x.shape[1]
        cu = cpc.cu_seqlens
        # every rank's last W-1 inputs (float32, front-padded), gathered
        src = _halo_sources(cpc, W)
        if W > 1:
            tail = torch.zeros(W - 1, D, dtype=torch.float32, device=x.device)
            n = min(W - 1, T)
            if n > 0:
                tail[W - 1 - n:] = x[0, T - n:].float()
            tails = _all_gather(tail.reshape(-1), cpc).reshape(cpc.world, W - 1, D)
        h0_loc = h0
        if cpc.first_continues:
            h0_loc = h0.clone() if h0 is not None else torch.zeros(cpc.num_seqs, D, W, dtype=torch.float32, device=x.device)
            h0_loc[0] = 0
            for m, i, row in src:   # state column W-1 is the newest input
                h0_loc[0, :, W - 1 - m] = tails[i, row]
        y, ht = _core.conv1d_fwd(x, weight, bias, h0_loc, cu, None, silu, want_ht)
        ctx.save_for_backward(x, weight, bias, h0_loc)
        ctx.cpc, ctx.silu, ctx.want_ht, ctx.src, ctx.has_h0 = cpc, silu, want_ht, src, h0 is not None
        return y, (ht if ht is not None else torch.empty(0, dtype=torch.float32, device=x.device))

    @staticmethod
    def backward(ctx, dy, dht):
        x, weight, bias, h0_loc = ctx.saved_tensors
        cpc, need = ctx.cpc, ctx.needs_input_grad
        D, W = weight.shape
        T = x.shape[1]
        dht = dht.contiguous() if ctx.want_ht and dht is not None and dht.numel() else None
        dx, dw, db, dh0 = _core.conv1d_bwd(x, weight, bias, h0_loc, cpc.cu_seqlens, None, ctx.silu, dy.contiguous(),
                                           dht, want_dbias=bool(need[2] and bias is not None),
                                           want_dh0=bool(ctx.has_h0 or cpc.first_continues))
        # the halo's gradient goes back to the ranks that hold those inputs (summed over the group)
        if cpc.world > 1 and W > 1:
            back = torch.zeros(cpc.world, W - 1, D, dtype=torch.float32, device=x.device)
            for m, i, row in ctx.src:
                back[i, row] += dh0[0, :, W - 1 - m]
            dist.all_reduce(back, group=cpc.group)
            n = min(W - 1, T)
            if n > 0:
                dx[0, T - n:] = (dx[0, T - n:].float() + back[cpc.rank, W - 1 - n:]).to(dx.dtype)
        if dh0 is not None and cpc.first_continues:
            dh0[0] = 0   # row 0 was the halo, not read from initial_state
        return (dx if need[0] else None, dw if need[1] else None, db if need[2] and bias is not None else None,
                dh0 if need[3] and ctx.has_h0 else None, None, None, None)


def causal_conv1d(x, weight=None, bias=None, residual=None, initial_state=None, output_final_state=False,
                  activation=None, cp_context=None):
    """gdn.causal_conv1d on this rank's slice under context parallel: x [1, T_local, D], weight [D, W],
    initial_state [N_local, D, W] or None (row 0 not read where the first sequence continues: the W-1
    inputs before the cut come from the earlier ranks). Returns (y, final_state or None)."""
    from . import api
    cpc = cp_context
    _check_cpc(cpc, x, "x")
    if weight is None:
        raise GdnArgumentError("weight is required")
    if activation not in (None, "swish", "silu"):
        raise GdnArgumentError(f"activation {activation!r}: gdn's conv1d has None and 'swish'/'silu'")
    if x.ndim != 3:
        raise GdnArgumentError(f"x: shape {tuple(x.shape)}, expected [1, T_local, D]")
    if initial_state is not None and initial_state.shape[0] != cpc.num_seqs:
        raise GdnArgumentError(f"initial_state has {initial_state.shape[0]} states for this rank's "
                               f"{cpc.num_seqs} local sequences")
    w, b, h0 = api._f32(weight), api._f32(bias), api._f32(initial_state)
    if w.ndim != 2 or w.shape[0] != x.shape[2]:
        raise GdnArgumentError(f"weight: shape {tuple(w.shape)}, expected [D, W] = [{x.shape[2]}, W]")
    y, ht = _ConvCP.apply(x, w.contiguous(), b, h0, cpc, activation is not None, bool(output_final_state))
    if residual is not None:
        y = y + residual
    return y, (ht if output_final_state else None)


__all__ = ["CPContext", "build_cp_context", "chunk_gated_delta_rule", "causal_conv1d"]
