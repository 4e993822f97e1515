"""gdn.cp: context parallel over torch.distributed: gloo on the CPU (2 and 3
processes), and NCCL with one process per GPU where the machine has 2 or more
CUDA devices and libgdn its CUDA backend (2 ranks).

Every worker builds the same global inputs from the run's seed, computes the
one-process result with gdn's regular functions on the whole stream, then
its own slice under context parallel, and checks its part of the forward and
of every gradient against it (DESIGN.md §5 bounds; parameter gradients are
summed over the group first). Uneven cuts, varlen sequences crossing one and
two cuts, a rank holding the middle of one sequence only, a rank shorter
than the conv halo, h0 / final states, bf16, and the GatedDeltaNet layer.
"""
import os
import socket
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gdn  # noqa: E402
from gdn import cp  # noqa: E402

from conftest import SEED  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

BOUNDS = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (5e-3, 1e-2)}


def _rel(out, ref):
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    return (out - ref).norm().item() / den if den > 0 else (out - ref).norm().item()


def _close(what, out, ref, bound, rank, seed):
    e = _rel(out, ref)
    assert e <= bound, f"rank {rank}: {what}: relative error {e:.3e} over {bound:.0e} (GDN_TEST_SEED={seed})"


def _slices(lengths):
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


def _sum_over(t, group=None):
    t = t.detach().clone()
    dist.all_reduce(t, group=group)
    return t


# ---- the scenarios (each runs on every rank of the group) ----

def _rule_case(rank, world, seed, name, lens, lengths, dtype, v_first, fused, h0_on, dev="cpu"):
    """chunk_gated_delta_rule under CP against the one-process call, forward and every gradient."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens) if lens else sum(lengths)
    H, HV, K, V = 2, 4, 16, 8
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dev)  # noqa: E731
    rand = lambda *shape: torch.rand(*shape, generator=gen).to(dev)  # noqa: E731
    cu = torch.tensor(_slices(lens)) if lens else None
    N = len(lens) if lens else 1
    q = randn(1, T, H, K).to(dtype).requires_grad_()
    k = randn(1, T, H, K).to(dtype).requires_grad_()
    v = randn(1, T, HV, V).to(dtype).requires_grad_()
    if fused:
        g = (randn(1, T, HV) - 4.0).requires_grad_()      # raw a: weak decay
        A_log = rand(HV).requires_grad_()
        dt_bias = (0.5 * randn(HV)).requires_grad_()
        beta = (randn(1, T, HV) - 1.0).requires_grad_()   # raw b
    else:
        g = F.logsigmoid(randn(1, T, HV) + 3.0).requires_grad_()
        A_log = dt_bias = None
        beta = rand(1, T, HV).requires_grad_()
    sshape = (N, HV, V, K) if v_first else (N, HV, K, V)
    h0 = randn(*sshape).requires_grad_() if h0_on else None
    w_o = randn(1, T, HV, V)
    w_ht = randn(*sshape)
    kw = dict(use_qk_l2norm_in_kernel=True, state_v_first=v_first, output_final_state=True)
    if fused:
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    leaves = [x for x in (q, k, v, g, beta, A_log, dt_bias, h0) if x is not None]
    names = ["dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"]
    names = [n for n, x in zip(names, (q, k, v, g, beta, A_log, dt_bias, h0)) if x is not None]

    o, ht = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **kw)
    ref_grads = torch.autograd.grad((o.float() * w_o).sum() + (ht * w_ht).sum(), leaves)
    o_ref, ht_ref = o.detach(), ht.detach()

    ctx = cp.build_cp_context(cu, lengths=lengths)
    s, e = ctx.starts[rank], ctx.starts[rank + 1]
    n0, nl = ctx.seq0, ctx.num_seqs
    h0_loc = h0[n0:n0 + nl] if h0 is not None else None
    o_l, ht_l = gdn.chunk_gated_delta_rule(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                                           initial_state=h0_loc, cp_context=ctx, **kw)
    ends = [i for i in range(nl) if not (i == nl - 1 and ctx.last_continues)]
    loss = (o_l.float() * w_o[:, s:e]).sum() + sum((ht_l[i] * w_ht[n0 + i]).sum() for i in ends)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    bf, bg = BOUNDS[dtype]
    what = f"{name} (world {world}, cuts {ctx.starts})"
    _close(f"{what}: o", o_l, o_ref[:, s:e], bf, rank, SEED)
    for i in ends:
        _close(f"{what}: final state of sequence {n0 + i}", ht_l[i], ht_ref[n0 + i], bf, rank, SEED)
    for nm, gr, rf, x in zip(names, grads, ref_grads, leaves):
        gr = torch.zeros_like(x) if gr is None else gr
        if x.ndim >= 2 and x.shape[0] == 1 and x.shape[1] == T:   # per token: this rank's slice
            _close(f"{what}: {nm}", gr[:, s:e], rf[:, s:e], bg, rank, SEED)
        else:                                                      # shared (A_log, dt_bias) and h0: summed
            _close(f"{what}: {nm} (summed over the ranks)", _sum_over(gr), rf, bg, rank, SEED)


def _conv_case(rank, world, seed, lens, lengths, dtype, dev="cpu"):
    """causal_conv1d under CP: the halo from earlier ranks (a rank shorter than W-1 among them)."""
    gen = torch.Generator().manual_seed(seed + 1)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dev)  # noqa: E731
    T, D, W = sum(lens), 24, 4
    cu = torch.tensor(_slices(lens))
    x = randn(1, T, D).to(dtype).requires_grad_()
    w = (0.5 * randn(D, W)).requires_grad_()
    b = randn(D).requires_grad_()
    wy = randn(1, T, D)
    y, _ = gdn.causal_conv1d(x, w, b, activation="silu", cu_seqlens=cu)
    ref = torch.autograd.grad((y.float() * wy).sum(), (x, w, b))
    ctx = cp.build_cp_context(cu, lengths=lengths)
    s, e = ctx.starts[rank], ctx.starts[rank + 1]
    y_l, _ = gdn.causal_conv1d(x[:, s:e], w, b, activation="silu", cp_context=ctx)
    gx, gw, gb = torch.autograd.grad((y_l.float() * wy[:, s:e]).sum(), (x, w, b))
    bf, bg = BOUNDS[dtype]
    what = f"conv1d (world {world}, cuts {ctx.starts})"
    _close(f"{what}: y", y_l, y.detach()[:, s:e], bf, rank, SEED)
    # dx: every rank's part, summed (the halo's gradient lands on the ranks before)
    _close(f"{what}: dx (summed over the ranks)", _sum_over(gx.float()), ref[0].float(), bg, rank, SEED)
    _close(f"{what}: dweight (summed)", _sum_over(gw), ref[1], bg, rank, SEED)
    _close(f"{what}: dbias (summed)", _sum_over(gb), ref[2], bg, rank, SEED)


def _layer_case(rank, world, seed, lens, lengths, dev="cpu"):
    """gdn.GatedDeltaNet under CP: output, input gradient and every weight's gradient."""
    torch.manual_seed(seed + 2)
    layer = gdn.GatedDeltaNet(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8).to(dev)
    gen = torch.Generator().manual_seed(seed + 3)
    T = sum(lens)
    cu = torch.tensor(_slices(lens))
    x = torch.randn(1, T, 32, generator=gen).to(dev).requires_grad_()
    wy = torch.randn(1, T, 32, generator=gen).to(dev)
    params = list(layer.parameters())
    y = layer(x, cu_seqlens=cu)
    ref = torch.autograd.grad((y * wy).sum(), [x] + params)
    ctx = cp.build_cp_context(cu, lengths=lengths)
    s, e = ctx.starts[rank], ctx.starts[rank + 1]
    layer.cp_context = ctx
    y_l = layer(x[:, s:e])
    layer.cp_context = None
    got = torch.autograd.grad((y_l * wy[:, s:e]).sum(), [x] + params)
    what = f"GatedDeltaNet (world {world}, cuts {ctx.starts})"
    _close(f"{what}: y", y_l, y.detach()[:, s:e], 1e-5, rank, SEED)
    _close(f"{what}: dx (summed over the ranks)", _sum_over(got[0]), ref[0], 1e-4, rank, SEED)
    for (nm, _), gp, rp in zip(layer.named_parameters(), got[1:], ref[1:]):
        _close(f"{what}: d{nm} (summed)", _sum_over(gp), rp, 1e-4, rank, SEED)


def _worker(rank, world, port, seed, dev="cpu"):
    torch.set_num_threads(1)
    if dev == "cuda":   # NCCL, one GPU per rank
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=dev)
        try:
            _rule_case(rank, world, seed, "one sequence, uneven (NCCL)", None, [70, 131], torch.float32, False, True,
                       True, dev)
            _rule_case(rank, world, seed + 10, "varlen over a cut, v-first (NCCL)", [40, 150, 0, 37], [100, 127],
                       torch.float32, True, False, True, dev)
            _rule_case(rank, world, seed + 20, "varlen, bf16 (NCCL)", [90, 80, 30], [130, 70], torch.bfloat16, False,
                       True, True, dev)
            _rule_case(rank, world, seed + 30, "one long sequence, bf16 (NCCL)", None, [1500, 2600], torch.bfloat16,
                       False, True, True, dev)
            _conv_case(rank, world, seed, [50, 70, 31], [61, 90], torch.float32, dev)
            _conv_case(rank, world, seed + 5, [50, 70, 31], [61, 90], torch.bfloat16, dev)
            _layer_case(rank, world, seed, [60, 90], [83, 67], dev)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        _leave()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        if world == 2:
            _rule_case(rank, world, seed, "one sequence, uneven", None, [70, 131], torch.float32, False, True, True)
            _rule_case(rank, world, seed + 10, "varlen over a cut, v-first", [40, 150, 0, 37], [100, 127],
                       torch.float32, True, False, True)
            _rule_case(rank, world, seed + 20, "varlen, bf16", [90, 80, 30], [130, 70], torch.bfloat16, False,
                       True, True)
            _conv_case(rank, world, seed, [50, 70, 31], [61, 90], torch.float32)
            _layer_case(rank, world, seed, [60, 90], [83, 67])
        else:
            # a sequence over two cuts: rank 1 holds its middle only
            _rule_case(rank, world, seed, "varlen over two cuts", [30, 200, 25], [90, 70, 95], torch.float32,
                       False, True, True)
            _rule_case(rank, world, seed + 10, "one sequence, no h0, bf16", None, [65, 64, 80], torch.bfloat16,
                       True, True, False)
            # rank 1 holds 2 tokens, fewer than the conv's W-1 = 3: rank 2's halo reaches rank 0
            _conv_case(rank, world, seed, [40, 90], [60, 2, 68], torch.float32)
            _conv_case(rank, world, seed + 5, [40, 90], [60, 2, 68], torch.bfloat16)
            _layer_case(rank, world, seed, [20, 150, 10], [70, 60, 50])
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _leave()


def _leave():
    """A worker whose checks all passed ends here, without the interpreter's teardown: there, now
    and then (about one run in six on a 2-core machine), a thread of torch's C++ runtime is destroyed
    while joinable and the process aborts ("terminate called without an active exception", SIGABRT)
    after every result was checked. A failed check raises before this and is reported as usual."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _nccl_ready():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not dist.is_nccl_available():
        return False
    from gdn import capi
    return capi.backend_available(capi.BACKEND_CUDA)


@pytest.mark.parametrize("world,dev", [(2, "cpu"), (3, "cpu"), (2, "cuda")])
def test_cp_matches_one_process(world, dev):
    import torch.multiprocessing as mp
    if dev == "cuda" and not _nccl_ready():
        pytest.skip("NCCL over 2 GPUs: needs 2 CUDA devices and libgdn's CUDA backend")
    # the children's environment: libgdn on one thread each (a small machine), the run's seed in their messages
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "GDN_TEST_SEED": str(SEED)}
    if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = "lo"   # gloo on the loopback: no dependence on the host name resolving
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        mp.start_processes(_worker, args=(world, _free_port(), SEED % (2 ** 31), dev), nprocs=world, join=True,
                           start_method="spawn")
    finally:
        for name, val in saved.items():
            if val is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = val


# ---- in one process: one rank, the context, the errors ----

def test_one_rank_is_the_plain_call():
    gen = torch.Generator().manual_seed(SEED % (2 ** 31))
    q, k = torch.randn(1, 70, 2, 16, generator=gen), torch.randn(1, 70, 2, 16, generator=gen)
    v = torch.randn(1, 70, 2, 16, generator=gen)
    g, beta = -torch.rand(1, 70, 2, generator=gen), torch.rand(1, 70, 2, generator=gen)
    ctx = cp.build_cp_context(total_len=70)
    assert ctx.world == 1 and not ctx.first_continues and not ctx.last_continues
    o1, h1 = gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cp_context=ctx)
    o2, h2 = gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


def test_context_of_a_cut():
    # global sequences [0,30) [30,230) [230,255); cuts at 90 and 160: rank 1 holds the middle of sequence 1
    ctxs = [cp.CPContext(None, r, 3, [0, 90, 160, 255], [0, 30, 230, 255]) for r in range(3)]
    assert [c.cu_seqlens.tolist() for c in ctxs] == [[0, 30, 90], [0, 70], [0, 70, 95]]
    assert [(c.first_continues, c.last_continues) for c in ctxs] == [(False, True), (True, True), (True, False)]
    assert [c.seq0 for c in ctxs] == [0, 1, 1]


def test_errors():
    ctx = cp.build_cp_context(total_len=10)
    x = torch.randn(1, 10, 2, 8)
    with pytest.raises(gdn.GdnArgumentError, match="cp_context"):
        gdn.chunk_gated_delta_rule(x, x, x, None, torch.rand(1, 10, 2), cp_context=object())
    with pytest.raises(gdn.GdnArgumentError, match="cu_seqlens"):
        gdn.chunk_gated_delta_rule(x, x, x, None, torch.rand(1, 10, 2), cp_context=ctx,
                                   cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(gdn.GdnArgumentError, match="tokens"):
        gdn.chunk_gated_delta_rule(x[:, :9], x[:, :9], x[:, :9], None, torch.rand(1, 9, 2), cp_context=ctx)
    with pytest.raises(gdn.GdnArgumentError, match=r"\[1, T_local"):
        gdn.causal_conv1d(torch.randn(2, 10, 4), torch.randn(4, 3), cp_context=ctx)
    with pytest.raises(gdn.GdnArgumentError, match="total_len"):
        cp.build_cp_context(torch.tensor([0, 5, 10]), total_len=11)
    with pytest.raises(gdn.GdnArgumentError, match="group"):
        cp.build_cp_context(total_len=10, group=object())


if __name__ == "__main__":   # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
