"""gdn.GatedDeltaNet: the gated-delta-net layer of Qwen3-Next / Qwen3.5 on
gdn's kernels, a torch.nn.Module whose parameters and state_dict keys are
those of transformers' Qwen3NextGatedDeltaNet (in_proj_qkvz, in_proj_ba,
conv1d, dt_bias, A_log, norm.weight, out_proj), so that layer's weights load
as they are.

    layer = gdn.GatedDeltaNet.from_config(hf_config, layer_idx=0)
    layer.load_state_dict(hf_layer.state_dict())
    y = layer(x)                                  # prefill, training
    cache = gdn.GatedDeltaNetCache()
    y = layer(prompt, cache=cache)                # prefill that keeps the states
    y = layer(next_token, cache=cache)            # one token: the fused decode step

Prefill runs causal_conv1d, chunk_gated_delta_rule (q/k L2 norm, gate and
beta sigmoid in the kernel) and the gated RMSNorm; a cached single token
runs gdn's decode step, which does the conv update, the gate and the
recurrence in one call on the cache's states in place.

Context parallel (gdn.cp): with a cp_context (gdn.cp.build_cp_context),
given to forward or set as layer.cp_context, each rank runs the layer on its
slice [1, T_local, hidden] of one token stream: the conv takes the inputs
before the cut from the earlier ranks and the gated delta rule their state;
every weight's gradient is then this rank's part of the sum (add them over
the group, as data parallel does).
"""
import torch
from torch import nn

from . import api, torch_ref


class GatedDeltaNetCache:
    """The conv and recurrent states of each layer, by layer index: conv [B, D, W] and
    recurrent [B, HV, K, V], both float32."""

    def __init__(self):
        self.conv, self.recurrent = {}, {}

    def has(self, layer_idx):
        return layer_idx in self.recurrent


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size=4,
                 rms_norm_eps=1e-6, layer_idx=0, hidden_act="silu", kernel="gdn"):
        super().__init__()
        if kernel not in ("gdn", "torch", "fla"):
            raise ValueError(f"kernel {kernel!r}: 'gdn' (the library), 'torch' (gdn.torch_ref) or 'fla' "
                             "(flash-linear-attention's Triton delta rule; CUDA only), the last two to compare")
        self.kernel = kernel
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads})")
        if hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act {hidden_act!r}: the layer's conv activation is SiLU")
        self.hidden_size, self.layer_idx = hidden_size, layer_idx
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = head_k_dim * num_k_heads, head_v_dim * num_v_heads
        self.conv_kernel_size, self.eps = conv_kernel_size, rms_norm_eps
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel_size, bias=False, groups=self.conv_dim,
                                padding=conv_kernel_size - 1)
        self.in_proj_qkvz = nn.Linear(hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(hidden_size, 2 * num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.empty(num_v_heads).uniform_(0.01, 16).log())
        self.norm = _NormWeight(head_v_dim)
        self.out_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.cp_context = None   # a gdn.cp.CPContext: forward runs this rank's slice (context parallel)

    @classmethod
    def from_config(cls, config, layer_idx=0):
        """From a transformers Qwen3NextConfig (or anything with its linear_* attributes)."""
        return cls(config.hidden_size, config.linear_num_key_heads, config.linear_num_value_heads,
                   config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim,
                   config.rms_norm_eps, layer_idx, getattr(config, "hidden_act", "silu"))

    def _split(self, x):
        """qkvz and ba projections, in the head-grouped order of Qwen3-Next's in_proj_qkvz / in_proj_ba."""
        B, T = x.shape[:2]
        H, G, K, V = self.num_k_heads, self.num_v_heads // self.num_k_heads, self.head_k_dim, self.head_v_dim
        qkvz = self.in_proj_qkvz(x).view(B, T, H, 2 * K + 2 * G * V)
        ba = self.in_proj_ba(x).view(B, T, H, 2 * G)
        q, k, v, z = torch.split(qkvz, [K, K, G * V, G * V], dim=3)
        b, a = torch.split(ba, [G, G], dim=3)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)
        return (mixed, z.reshape(B, T, self.num_v_heads, V), b.reshape(B, T, self.num_v_heads),
                a.reshape(B, T, self.num_v_heads))

    def forward(self, hidden_states, cache=None, attention_mask=None, cu_seqlens=None, cp_context=None):
        """hidden_states [B, T, hidden]; attention_mask [B, T] (0 = padding, zeroed as transformers
        does) or cu_seqlens [N+1] with B = 1 for packed sequences; cache: a GatedDeltaNetCache.
        cp_context (or self.cp_context): hidden_states is this rank's slice [1, T_local, hidden] of
        the token stream the context describes (its sequences come from the context)."""
        cp_context = cp_context if cp_context is not None else self.cp_context
        if cp_context is not None:
            return self._forward_cp(hidden_states, cp_context, cache, attention_mask, cu_seqlens)
        if attention_mask is not None:
            hidden_states = (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)
        B, T = hidden_states.shape[:2]
        mixed, z, b, a = self._split(hidden_states)
        weight = self.conv1d.weight.squeeze(1)
        idx = self.layer_idx
        if self.kernel in ("torch", "fla"):
            o = self._torch_path(mixed, a, b, weight, cache, cu_seqlens)
        elif cache is not None and T == 1 and cache.has(idx) and cu_seqlens is None:
            o = api.decode_step(mixed[:, 0].contiguous(), a[:, 0].contiguous(), b[:, 0].contiguous(), self.A_log,
                                self.dt_bias, cache.recurrent[idx], self.num_k_heads, self.head_k_dim,
                                conv_state=cache.conv[idx], conv_weight=weight)
            o = o[:, None]
        else:
            conv0 = cache.conv.get(idx) if cache is not None else None
            rec0 = cache.recurrent.get(idx) if cache is not None else None
            x, conv_t = api.causal_conv1d(mixed, weight, initial_state=conv0, output_final_state=cache is not None,
                                          activation="silu", cu_seqlens=cu_seqlens)
            q, k, v = torch.split(x, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
            q = q.reshape(B, T, self.num_k_heads, self.head_k_dim)
            k = k.reshape(B, T, self.num_k_heads, self.head_k_dim)
            v = v.reshape(B, T, self.num_v_heads, self.head_v_dim)
            o, rec_t = api.chunk_gated_delta_rule(q, k, v, a, b, initial_state=rec0,
                                                  output_final_state=cache is not None, use_qk_l2norm_in_kernel=True,
                                                  use_beta_sigmoid_in_kernel=True, cu_seqlens=cu_seqlens,
                                                  use_gate_in_kernel=True, A_log=self.A_log, dt_bias=self.dt_bias)
            if cache is not None:
                cache.conv[idx], cache.recurrent[idx] = conv_t, rec_t
        if self.kernel in ("torch", "fla"):
            y = torch_ref.rms_norm_gated(o, z, self.norm.weight, self.eps)
        else:
            y = api.rms_norm_gated(o, z, self.norm.weight, activation="silu", eps=self.eps)
        return self.out_proj(y.reshape(B, T, self.value_dim))

    def _forward_cp(self, hidden_states, cpc, cache, attention_mask, cu_seqlens):
        """forward on this rank's slice under context parallel (gdn.cp)."""
        if self.kernel != "gdn":
            raise ValueError("context parallel runs on kernel='gdn'")
        if cache is not None or attention_mask is not None or cu_seqlens is not None:
            raise ValueError("under context parallel, pass no cache, attention_mask or cu_seqlens: the sequences "
                             "come from cp_context (prefill and training only)")
        from . import cp
        B, T = hidden_states.shape[:2]
        mixed, z, b, a = self._split(hidden_states)
        x, _ = cp.causal_conv1d(mixed, self.conv1d.weight.squeeze(1), activation="silu", cp_context=cpc)
        q, k, v = torch.split(x, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        o, _ = cp.chunk_gated_delta_rule(q.reshape(B, T, self.num_k_heads, self.head_k_dim),
                                         k.reshape(B, T, self.num_k_heads, self.head_k_dim),
                                         v.reshape(B, T, self.num_v_heads, self.head_v_dim), a, b,
                                         use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                         cp_context=cpc, use_gate_in_kernel=True, A_log=self.A_log,
                                         dt_bias=self.dt_bias)
        y = api.rms_norm_gated(o, z, self.norm.weight, activation="silu", eps=self.eps)
        return self.out_proj(y.reshape(B, T, self.value_dim))

    def _torch_path(self, mixed, a, b, weight, cache, cu_seqlens):
        """The same layer on gdn.torch_ref (plain torch ops), prefill or cached tokens alike; with
        kernel='fla' the delta rule is flash-linear-attention's chunk_gated_delta_rule (the gate and
        beta formed with torch first, q/k L2 norm in its kernel) and the rest stays on torch_ref."""
        if cu_seqlens is not None:
            raise ValueError(f"kernel={self.kernel!r} takes no cu_seqlens")
        B, T = mixed.shape[:2]
        idx = self.layer_idx
        conv0 = cache.conv.get(idx) if cache is not None else None
        rec0 = cache.recurrent.get(idx) if cache is not None else None
        x, conv_t = torch_ref.causal_conv1d(mixed, weight, conv0, cache is not None)
        q, k, v = torch.split(x, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(B, T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(B, T, self.num_v_heads, self.head_v_dim)
        if self.kernel == "fla":
            fla_chunk = _fla_chunk_gated_delta_rule()
            g = -self.A_log.float().exp() * torch.nn.functional.softplus(a.float() + self.dt_bias.float())
            o, rec_t = fla_chunk(q, k, v, g, b.sigmoid(), initial_state=rec0, output_final_state=cache is not None,
                                 use_qk_l2norm_in_kernel=True)
        else:
            o, rec_t = torch_ref.gated_delta_rule(q, k, v, a, b, self.A_log, self.dt_bias, rec0, cache is not None)
        if cache is not None:
            cache.conv[idx], cache.recurrent[idx] = conv_t, rec_t
        return o


def _fla_chunk_gated_delta_rule():
    """flash-linear-attention's chunk_gated_delta_rule (kernel='fla'), imported when first used."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        raise ImportError("kernel='fla' needs flash-linear-attention (pip install flash-linear-attention, "
                          "or its source on PYTHONPATH) and a CUDA device") from e
    return chunk_gated_delta_rule


class _NormWeight(nn.Module):
    """Holds norm.weight (ones), as transformers' Qwen3NextRMSNormGated does."""

    def __init__(self, V):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(V))


__all__ = ["GatedDeltaNet", "GatedDeltaNetCache"]
