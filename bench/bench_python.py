"""The cost of gdn's Python layer, per call, beside the C call it makes.

For the decode step (B=1, qwen3next heads: H=16, HV=32, K=V=128, bf16, the
conv update fused) and the chunk forward (qwen3next: B=1, T=4096... as
bench_gpu.py's shape), it times, on one CUDA device:
  capi  the C call through gdn.capi with every struct built once (what an
        engine that manages its own memory pays: ctypes and the launch)
  api   gdn.decode_step / gdn.chunk_gated_delta_rule on torch tensors (the
        custom op: argument checks, output allocation, dispatch)
and prints microseconds per call and the difference: the Python layer's
overhead beyond the kernel. Each is the median of 7 runs of N back-to-back
calls with one synchronize at the end.

    PYTHONPATH=python GDN_LIB=build-gpu/libgdn.so python3 bench/bench_python.py
"""
import statistics
import time

import torch

import gdn
from gdn import capi


def per_call_us(fn, n):
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def decode(dev):
    B, H, HV, K, V, W = 1, 16, 32, 128, 128, 4
    D = 2 * H * K + HV * V
    bf = dict(device=dev, dtype=torch.bfloat16)
    f32 = dict(device=dev, dtype=torch.float32)
    proj, a, b = torch.randn(B, D, **bf), torch.randn(B, HV, **bf), torch.randn(B, HV, **bf)
    A_log, dt_bias = torch.rand(HV, **f32), torch.rand(HV, **f32)
    state, conv_state = torch.zeros(B, HV, K, V, **f32), torch.zeros(B, D, W, **f32)
    conv_w = torch.randn(D, W, **f32) * 0.3
    api = lambda: gdn.decode_step(proj, a, b, A_log, dt_bias, state, H, K, conv_state=conv_state,  # noqa: E731
                                  conv_weight=conv_w)
    o = torch.empty(B, HV, V, **bf)
    ex = capi.Exec(backend=capi.BACKEND_CUDA, stream=torch.cuda.current_stream().cuda_stream)
    cfg = capi.DecodeConfig(B=B, H=H, HV=HV, K=K, V=V, dtype=capi.BF16, flags=capi.QK_L2NORM, num_slots=B, conv_W=W)
    args = capi.DecodeArgs(proj=proj.data_ptr(), conv_state=conv_state.data_ptr(), conv_weight=conv_w.data_ptr(),
                           a=a.data_ptr(), b=b.data_ptr(), A_log=A_log.data_ptr(), dt_bias=dt_bias.data_ptr(),
                           state=state.data_ptr(), o=o.data_ptr())
    raw = lambda: capi.decode_step(ex, cfg, args)   # noqa: E731
    return "decode_step B=1 H16 HV32 K=V=128 bf16 conv W=4", per_call_us(raw, 2000), per_call_us(api, 2000)


def chunk(dev):
    B, T, H, HV, K, V = 1, 4096, 16, 32, 128, 128
    bf = dict(device=dev, dtype=torch.bfloat16)
    f32 = dict(device=dev, dtype=torch.float32)
    q, k, v = torch.randn(B, T, H, K, **bf), torch.randn(B, T, H, K, **bf), torch.randn(B, T, HV, V, **bf)
    a, b = torch.randn(B, T, HV, **f32), torch.randn(B, T, HV, **f32)
    A_log, dt_bias = torch.rand(HV, **f32), torch.rand(HV, **f32)
    api = lambda: gdn.chunk_gated_delta_rule(q, k, v, a, b, use_qk_l2norm_in_kernel=True,  # noqa: E731
                                             use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                                             dt_bias=dt_bias)
    o = torch.empty(B, T, HV, V, **bf)
    ex = capi.Exec(backend=capi.BACKEND_CUDA, stream=torch.cuda.current_stream().cuda_stream)
    cfg = capi.Config(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=capi.BF16, gate_dtype=capi.F32,
                      flags=capi.QK_L2NORM | capi.GATE_FUSED | capi.BETA_SIGMOID)
    ws_n = capi.chunk_fwd_workspace_size(ex, cfg)
    ws = torch.empty(ws_n, device=dev, dtype=torch.uint8)
    args = capi.FwdArgs(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=a.data_ptr(), beta=b.data_ptr(),
                        A_log=A_log.data_ptr(), dt_bias=dt_bias.data_ptr(), o=o.data_ptr(), workspace=ws.data_ptr(),
                        workspace_bytes=ws_n)
    raw = lambda: capi.chunk_fwd(ex, cfg, args)   # noqa: E731
    return "chunk fwd qwen3next B=1 T=4096 H16 HV32 bf16", per_call_us(raw, 50), per_call_us(api, 50)


def main():
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, libgdn {capi.lib._name}")
    print(f"{'call':50s} {'capi us':>9s} {'api us':>9s} {'python layer us':>16s}")
    for fn in (decode, chunk):
        name, raw, api = fn(dev)
        print(f"{name:50s} {raw:9.1f} {api:9.1f} {api - raw:16.1f}")


if __name__ == "__main__":
    main()
