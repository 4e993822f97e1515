"""Context parallel on the GPUs of one host: gdn.cp over NCCL, one process per
GPU, one long sequence cut evenly over the ranks.

For each shape (bf16, K = V = 128, q/k L2 norm, gate and beta sigmoid in the
kernel) it prints, in ms (median of --reps after --warmup):
  1 GPU      the plain call on the whole sequence: forward, forward+backward
  local      the plain call on one rank's T / world tokens (what each rank
             would cost with nothing crossing the cut)
  N GPUs     gdn.cp on world ranks: forward, forward+backward (the slowest
             rank), the scaling over 1 GPU, and the collectives alone (the
             all-gathers of the maps, timed by themselves at their sizes)
             against the step.
With FLA importable (PYTHONPATH=.fla; --no-fla to skip) the same rows for
FLA's chunk_gated_delta_rule, plain on 1 GPU and with its own context
parallel (fla.ops.cp) on world ranks, on the same inputs (FLA's CP takes no
initial or final state: neither does gdn's row). FLA's gated backward on
Hopper with Triton < 3.7.1 is behind its issue-640 guard: lifted to time the
same kernels (bench/gpu_chunk.py says why); its gradients are not used.

    python3 bench/gpu_cp.py [--T 131072] [--gpus 2] [--shapes long1,qwen3next] [--no-fla]

Keep NCCL's NVLink multicast off where the host is shared (NCCL_NVLS_ENABLE=0).
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gdn
from gdn import cp

SHAPES = {"long1": (2, 8, 128, 128), "qwen3next": (16, 32, 128, 128)}   # H, HV, K, V


def make_inputs(T, H, HV, K, V, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    bf = torch.bfloat16

    def rn(*shape, dtype=bf):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dtype)

    x = dict(q=rn(1, T, H, K), k=rn(1, T, H, K), v=rn(1, T, HV, V), a=rn(1, T, HV) - 2.0, b=rn(1, T, HV),
             A_log=torch.rand(HV, generator=g, device=dev), dt_bias=0.5 * rn(HV, dtype=torch.float32))
    for n in ("q", "k", "v", "a", "b"):
        x[n].requires_grad_()
    x["do"] = rn(1, T, HV, V)
    return x


def step(x, ctx, backward):
    o, _ = gdn.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], use_qk_l2norm_in_kernel=True,
                                      use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                      use_beta_sigmoid_in_kernel=True, cp_context=ctx)
    if backward:
        torch.autograd.backward(o, x["do"])
    return o


def fla_step(x, ctx, backward):
    """FLA's chunk_gated_delta_rule on the same inputs: the gate and beta in its kernel where this
    FLA has them, else by torch ops inside the step"""
    from gpu_common import chunk_gated_delta_rule, fla_fused_gates
    kw = {}
    g, beta = fla_fused_gates(x["a"], x["b"], x["A_log"], x["dt_bias"], kw)
    if ctx is not None:
        kw["cp_context"] = ctx
    o, _ = chunk_gated_delta_rule(x["q"], x["k"], x["v"], g, beta, **kw)
    if backward:
        torch.autograd.backward(o, x["do"])
    return o


def fla_ready(opts):
    if opts.no_fla:
        return False
    try:
        import fla.ops.cp  # noqa: F401
        from gpu_chunk import fla_lift_640_guard
    except ImportError as e:
        print(f"FLA not run: {e}", flush=True)
        return False
    fla_lift_640_guard()
    return True


def timed(fn, reps, warmup, sync_group=False):
    """median ms of fn over reps (every rank in step where sync_group: the slowest rank's time)"""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        if sync_group:
            dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        dt = torch.tensor([(time.perf_counter() - t0) * 1e3], device="cuda")
        if sync_group:
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        out.append(dt.item())
    return statistics.median(out)


def worker(rank, world, port, opts):
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    use_fla = fla_ready(opts)
    try:
        for name in opts.shapes.split(","):
            H, HV, K, V = SHAPES[name]
            T, Tl = opts.T, opts.T // world
            res = {}
            if rank == 0:   # the 1-GPU figures, the others waiting
                x = make_inputs(T, H, HV, K, V, dev, 1)
                res["one_f"] = timed(lambda: step(x, None, False), opts.reps, opts.warmup)
                res["one_fb"] = timed(lambda: step(x, None, True), opts.reps, opts.warmup)
                del x
                xl = make_inputs(Tl, H, HV, K, V, dev, 2)
                res["loc_f"] = timed(lambda: step(xl, None, False), opts.reps, opts.warmup)
                res["loc_fb"] = timed(lambda: step(xl, None, True), opts.reps, opts.warmup)
                del xl
                if use_fla:
                    x = make_inputs(T, H, HV, K, V, dev, 1)
                    res["fla_f"] = timed(lambda: fla_step(x, None, False), opts.reps, opts.warmup)
                    res["fla_fb"] = timed(lambda: fla_step(x, None, True), opts.reps, opts.warmup)
                    del x
                torch.cuda.empty_cache()
            dist.barrier()
            ctx = cp.build_cp_context(total_len=Tl * world)
            x = make_inputs(Tl, H, HV, K, V, dev, 10 + rank)
            cp_f = timed(lambda: step(x, ctx, False), opts.reps, opts.warmup, True)
            cp_fb = timed(lambda: step(x, ctx, True), opts.reps, opts.warmup, True)
            mem = torch.cuda.max_memory_allocated(dev) / 2 ** 20
            mapf = HV * (K * K + K * V)
            m = torch.empty(mapf, device=dev)
            parts = [torch.empty_like(m) for _ in range(world)]
            comm = timed(lambda: dist.all_gather(parts, m), opts.reps, opts.warmup, True)
            if use_fla:
                from fla.ops.cp import build_cp_context as fla_cp_context
                fctx = fla_cp_context(torch.tensor([0, Tl * world], dtype=torch.long, device=dev), group=dist.group.WORLD)
                fla_cp_f = timed(lambda: fla_step(x, fctx, False), opts.reps, opts.warmup, True)
                fla_cp_fb = timed(lambda: fla_step(x, fctx, True), opts.reps, opts.warmup, True)
            del x
            torch.cuda.empty_cache()
            if rank == 0:
                print(f"{name}: T={T} (one sequence) H{H} HV{HV} K{K} V{V} bf16, {world} GPUs "
                      f"({torch.cuda.get_device_name(dev)}), torch {torch.__version__}")
                print(f"  1 GPU    forward {res['one_f']:8.3f}   forward+backward {res['one_fb']:8.3f}")
                print(f"  local    forward {res['loc_f']:8.3f}   forward+backward {res['loc_fb']:8.3f}   "
                      f"(plain call on T/{world} = {Tl} tokens)")
                print(f"  {world} GPUs   forward {cp_f:8.3f}   forward+backward {cp_fb:8.3f}   scaling "
                      f"{res['one_f'] / cp_f:.2f}x / {res['one_fb'] / cp_fb:.2f}x")
                print(f"  collectives: one all-gather of the maps ({mapf * 4 / 2 ** 20:.2f} MiB a rank) "
                      f"{comm:.3f} ms; forward {comm:.3f} ({100 * comm / cp_f:.1f}%), forward+backward "
                      f"{2 * comm:.3f} ({100 * 2 * comm / cp_fb:.1f}%); peak memory rank 0 {mem:.0f} MiB",
                      flush=True)
                if use_fla:
                    print(f"  FLA 1 GPU  forward {res['fla_f']:8.3f}   forward+backward {res['fla_fb']:8.3f}   "
                          f"(gdn / FLA: {res['one_f'] / res['fla_f']:.2f} / {res['one_fb'] / res['fla_fb']:.2f})")
                    print(f"  FLA {world} GPUs forward {fla_cp_f:8.3f}   forward+backward {fla_cp_fb:8.3f}   scaling "
                          f"{res['fla_f'] / fla_cp_f:.2f}x / {res['fla_fb'] / fla_cp_fb:.2f}x   (gdn / FLA on {world} GPUs: "
                          f"{cp_f / fla_cp_f:.2f} / {cp_fb / fla_cp_fb:.2f})", flush=True)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--gpus", type=int, default=0, help="ranks (default: every visible GPU)")
    ap.add_argument("--shapes", default="long1,qwen3next")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-fla", action="store_true", help="skip FLA's rows")
    opts = ap.parse_args()
    world = opts.gpus or torch.cuda.device_count()
    if world < 2:
        raise SystemExit(f"gpu_cp.py needs 2 or more GPUs, {torch.cuda.device_count()} visible")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    mp.start_processes(worker, args=(world, port, opts), nprocs=world, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
