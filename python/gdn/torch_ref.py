"""Pure-torch versions of what gdn.GatedDeltaNet runs, for comparison: the
gated delta rule as its recurrence (token by token, autograd through plain
torch ops), the causal conv1d through F.conv1d, the gated RMSNorm. Slow and
obvious on purpose. GatedDeltaNet(kernel="torch") uses them with the same
parameters, so one model trains on either and the curves can be compared.
"""
import torch
import torch.nn.functional as F


def gated_delta_rule(q, k, v, a, b, A_log, dt_bias, initial_state=None, output_final_state=False):
    """Qwen3-Next's form: q/k L2 norm, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
    q, k [B, T, H, K]; v [B, T, HV, V]; a, b [B, T, HV]; state [B, HV, K, V] f32. Computes in f32."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    decay = (-A_log.float().exp() * F.softplus(a.float() + dt_bias.float())).exp()
    beta = b.float().sigmoid()
    S = initial_state.float() if initial_state is not None else q.new_zeros(B, HV, K, V)
    scale = K ** -0.5
    outs = []
    for t in range(T):
        S = S * decay[:, t, :, None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, HV, V)
    return o.to(dtype), (S if output_final_state else None)


def causal_conv1d(x, weight, initial_state=None, output_final_state=False):
    """SiLU(depthwise causal conv) of x [B, T, D] with weight [D, W]; states [B, D, W] (last W inputs)."""
    B, T, D = x.shape
    W = weight.shape[1]
    past = initial_state.to(x.dtype) if initial_state is not None else x.new_zeros(B, D, W)
    xs = torch.cat([past, x.transpose(1, 2)], 2)               # [B, D, W + T]
    y = F.conv1d(xs[:, :, 1:], weight[:, None, :].to(x.dtype), groups=D)
    return F.silu(y).transpose(1, 2), (xs[:, :, -W:].float() if output_final_state else None)


def rms_norm_gated(x, z, weight, eps=1e-6):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * F.silu(z.float())).to(x.dtype)
