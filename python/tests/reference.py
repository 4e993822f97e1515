"""Plain torch float64 references for the package's tests: the gated delta
rule written as its recurrence (DESIGN.md §2, token by token), the causal
conv1d, the gated RMSNorm, and the Qwen3-Next gated-delta-net layer built
from them. Slow and obvious on purpose; autograd through them gives the
reference gradients."""
import torch
import torch.nn.functional as F


def gate(a, A_log, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias)."""
    x = a + (dt_bias if dt_bias is not None else 0.0)
    return -A_log.exp() * F.softplus(x)


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gated_delta_rule(q, k, v, g, beta, scale=None, h0=None, cu_seqlens=None, qk_l2norm=False, gate_fused=False,
                     A_log=None, dt_bias=None, beta_sigmoid=False, beta_negative=False, v_first=False, terms=False):
    """o [B,T,HV,V], ht [N,HV,K,V] (v-first: [N,HV,V,K]), in the dtype of the inputs (use float64);
    terms: also o's terms2 [B,T,HV,V], the squared norm of the terms scale S[k,e] q_k summed into
    each o element (DESIGN.md section 5, sums that cancel)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    scale = K ** -0.5 if scale is None else scale
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if g is None:
        g = torch.zeros(B, T, HV, dtype=q.dtype, device=q.device)
    if gate_fused:
        g = gate(g, A_log, dt_bias)
    if beta_sigmoid:
        beta = beta.sigmoid() * (2.0 if beta_negative else 1.0)
    q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        c = [int(x) for x in cu_seqlens]
        spans = [(0, c[n], c[n + 1]) for n in range(len(c) - 1)]
    pieces, hts, tpieces = [], [], []
    for n, (b, t0, t1) in enumerate(spans):
        S = torch.zeros(HV, K, V, dtype=q.dtype, device=q.device)
        if h0 is not None:
            S = h0[n].transpose(-1, -2) if v_first else h0[n]
        rows, trows = [], []
        for t in range(t0, t1):
            S = S * g[b, t].exp()[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t]))
            S = S + k[b, t][:, :, None] * u[:, None, :]
            rows.append(scale * torch.einsum("hkv,hk->hv", S, q[b, t]))
            trows.append(scale * scale * torch.einsum("hkv,hk->hv", S * S, q[b, t] * q[b, t]))
        pieces.append(torch.stack(rows) if rows else q.new_zeros(0, HV, V))
        tpieces.append(torch.stack(trows) if trows else q.new_zeros(0, HV, V))
        hts.append(S.transpose(-1, -2) if v_first else S)
    o = torch.cat(pieces)[None] if cu_seqlens is not None else torch.stack(pieces)
    if terms:
        return o, torch.stack(hts), torch.cat(tpieces)[None] if cu_seqlens is not None else torch.stack(tpieces)
    return o, torch.stack(hts)


def causal_conv1d(x, weight, bias=None, h0=None, cu_seqlens=None, silu=True):
    """y [B,T,D], ht [N,D,W]: the last W raw inputs of each sequence, newest last."""
    B, T, D = x.shape
    W = weight.shape[1]
    spans = [(b, 0, T) for b in range(B)] if cu_seqlens is None else \
        [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]
    ys, hts = [], []
    for n, (b, t0, t1) in enumerate(spans):
        past = h0[n].transpose(0, 1) if h0 is not None else torch.zeros(W, D, dtype=x.dtype, device=x.device)
        xs = torch.cat([past, x[b, t0:t1]], 0)            # [W + L, D]
        L = t1 - t0
        y = sum(weight[:, w] * xs[1 + w:1 + w + L] for w in range(W))
        if bias is not None:
            y = y + bias
        if silu:
            y = F.silu(y)
        ys.append(y if L else x.new_zeros(0, D))
        hts.append(xs[-W:].transpose(0, 1))
    return (torch.cat(ys)[None] if cu_seqlens is not None else torch.stack(ys)), torch.stack(hts)


def rms_norm_gated(x, z, weight, eps=1e-6, activation="swish"):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight
    return y * (F.silu(z) if activation in ("swish", "silu") else z.sigmoid())


def qwen3next_layer(layer, x, cache=None, attention_mask=None, params=None, info=None):
    """The Qwen3-Next gated-delta-net layer's math on a module's parameters (float64, token by
    token): transformers' torch path written with the functions above. cache: dict with 'conv'
    [B, D, W] and 'rec' [B, HV, K, V], updated. params: float64 tensors by state_dict name, to
    differentiate; default the layer's own, detached. info: a dict that gets 'cancel' [B, T, HV],
    each head's ||terms of o|| / ||o|| (>= 1): how far the rule's o cancelled against its terms,
    which the gated RMSNorm then scales back to full size."""
    p = params if params is not None else {n: t.detach().double().cpu() for n, t in layer.state_dict().items()}
    x = x.double()
    if attention_mask is not None:
        x = x * attention_mask[:, :, None].double()
    B, T = x.shape[:2]
    H, HV, K, V = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    G = HV // H
    qkvz = (x @ p["in_proj_qkvz.weight"].T).view(B, T, H, 2 * K + 2 * G * V)
    ba = (x @ p["in_proj_ba.weight"].T).view(B, T, H, 2 * G)
    q, k, v, z = torch.split(qkvz, [K, K, G * V, G * V], dim=3)
    b, a = torch.split(ba, [G, G], dim=3)
    mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], -1)
    conv0 = cache.get("conv") if cache is not None else None
    rec0 = cache.get("rec") if cache is not None else None
    y, conv_t = causal_conv1d(mixed, p["conv1d.weight"].squeeze(1), None, conv0, silu=True)
    q, k, v = torch.split(y, [H * K, H * K, HV * V], -1)
    o, rec_t, o_t2 = gated_delta_rule(q.reshape(B, T, H, K), k.reshape(B, T, H, K), v.reshape(B, T, HV, V),
                                      a.reshape(B, T, HV), b.reshape(B, T, HV), h0=rec0, qk_l2norm=True,
                                      gate_fused=True, A_log=p["A_log"], dt_bias=p["dt_bias"], beta_sigmoid=True,
                                      terms=True)
    if info is not None:
        info["cancel"] = (o_t2.sum(-1).sqrt() / o.norm(dim=-1).clamp_min(1e-300)).detach().clamp_min(1.0)
    if cache is not None:
        cache["conv"], cache["rec"] = conv_t, rec_t
    o = rms_norm_gated(o, z.reshape(B, T, HV, V), p["norm.weight"], layer.eps)
    return o.reshape(B, T, HV * V) @ p["out_proj.weight"].T
