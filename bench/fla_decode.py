"""FLA's decode-time kernel on the same card as gdn_bench_cuda, same shapes:
fused_recurrent_gated_delta_rule with T = 1 per sequence, q/k L2 norm, gate
and beta sigmoid in the kernel, fp32 state in, final state out. Bytes =
state read + written, as in gdn_bench_cuda. Needs flash-linear-attention on
PYTHONPATH (not part of gdn; bring it in on the bench machine)."""
import torch
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

H, HV, K, V = 16, 32, 128, 128
dev = "cuda"


def timed(fn, reps=50):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for r in range(-5, reps):
        e0.record()
        fn(r)
        e1.record()
        torch.cuda.synchronize()
        if r >= 0:
            ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2] * 1e3  # us


x = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
y = torch.empty_like(x)
copy = max(2.0 * x.numel() / (timed(lambda r: y.copy_(x), 10) * 1e-6) * 1e-9 for _ in range(2))
print(f"copy bandwidth (torch D2D copy 2 GiB, read+write) {copy:8.1f} GB/s")
del x, y
for B in (1, 32, 256):
    st_bytes = B * HV * K * V * 4
    npool = max(2, min(64, (512 << 20) // st_bytes))
    q = torch.randn(B, 1, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, 1, H, K, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, 1, HV, V, device=dev, dtype=torch.bfloat16)
    a = torch.randn(B, 1, HV, device=dev, dtype=torch.bfloat16)
    b = torch.randn(B, 1, HV, device=dev, dtype=torch.bfloat16)
    A_log = torch.zeros(HV, device=dev, dtype=torch.float32)
    dt_bias = torch.zeros(HV, device=dev, dtype=torch.float32)
    states = [torch.zeros(B, HV, K, V, device=dev, dtype=torch.float32) for _ in range(npool)]
    cu = torch.arange(B + 1, device=dev, dtype=torch.long)

    def step(r):
        return fused_recurrent_gated_delta_rule(
            q.view(1, B, H, K), k.view(1, B, H, K), v.view(1, B, HV, V), g=a.view(1, B, HV), beta=b.view(1, B, HV),
            initial_state=states[r % npool], output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, cu_seqlens=cu)

    us = timed(step)
    gbs = 2.0 * st_bytes / (us * 1e-6) * 1e-9
    print(f"FLA fused_recurrent decode B{B} H{H} HV{HV} K{K} V{V} {us:10.2f} us {gbs:9.1f} GB/s {100 * gbs / copy:6.1f}%")
    if B == 1:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for r in range(3):
                step(r)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for r in range(20):
                step(r)
        us = timed(lambda r: g.replay()) / 20
        gbs = 2.0 * st_bytes / (us * 1e-6) * 1e-9
        print(f"FLA fused_recurrent decode B1, graph replay (per step) {us:10.2f} us {gbs:9.1f} GB/s {100 * gbs / copy:6.1f}%")
