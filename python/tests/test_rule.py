"""The gated delta rule through the Python functions: forward and gradients
against the float64 reference (reference.py), on numpy and torch (CPU, and
CUDA where a GPU is seen), every option; gradcheck; what backward skips."""
import numpy as np
import pytest
import torch

import gdn
import reference as ref
from conftest import DEVICES, SEED, close, rel_err, terms_err

F32_FWD, F32_GRAD = 1e-5, 1e-4
LOW_FWD, LOW_GRAD = 5e-3, 1e-2


def inputs(gen, B, T, H, HV, K, V, fused, sigmoid, N=None, dtype=torch.float32):
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)   # noqa: E731
    x = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V))
    if fused:
        x["g"] = r(B, T, HV)
        x["A_log"] = (1 + 7 * torch.rand(HV, generator=gen, dtype=torch.float64)).log()
        x["dt_bias"] = 0.5 * r(HV)
    else:
        x["g"] = torch.nn.functional.logsigmoid(r(B, T, HV))
    x["beta"] = r(B, T, HV) if sigmoid else torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    x["h0"] = r(N if N is not None else B, HV, K, V)
    return x


CASES = [   # B, T, H, HV, K, V, options
    (2, 70, 2, 4, 16, 8, dict(l2=True, fused=True, sigmoid=True)),
    (1, 130, 1, 2, 32, 24, dict(l2=True, fused=False, sigmoid=False)),
    (1, 100, 2, 2, 8, 16, dict(l2=True, fused=True, sigmoid=True, varlen=[0, 1, 40, 40, 100])),
    (2, 65, 1, 1, 12, 20, dict(l2=True, fused=True, sigmoid=True, v_first=True)),
    (1, 64, 2, 4, 16, 16, dict(l2=True, fused=True, sigmoid=True, negative=True)),
]


def run_case(gen, device, B, T, H, HV, K, V, opt, fn, dtype=torch.float32):
    cu = torch.tensor(opt["varlen"], dtype=torch.int64) if "varlen" in opt else None
    N = len(opt["varlen"]) - 1 if cu is not None else B
    x = inputs(gen, B, T, H, HV, K, V, opt["fused"], opt["sigmoid"], N)
    if not opt["l2"]:   # |k| <= 1 keeps the rule stable without the kernel's norm
        x["k"] = x["k"] / x["k"].norm(dim=-1, keepdim=True)
    v_first = opt.get("v_first", False)
    if v_first:
        x["h0"] = x["h0"].transpose(-1, -2).contiguous()
    leaf = {n: t.clone().requires_grad_() for n, t in x.items()}
    kw = dict(scale=None, cu_seqlens=cu, qk_l2norm=opt["l2"], gate_fused=opt["fused"], beta_sigmoid=opt["sigmoid"],
              beta_negative=opt.get("negative", False), v_first=v_first)
    geff = ref.gate(leaf["g"], leaf["A_log"], leaf["dt_bias"]) if opt["fused"] else leaf["g"]
    if opt["fused"]:
        geff.retain_grad()
    o_ref, ht_ref = ref.gated_delta_rule(leaf["q"], leaf["k"], leaf["v"], geff, leaf["beta"], h0=leaf["h0"],
                                         **{**kw, "gate_fused": False})
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(ht_ref.shape, generator=gen, dtype=torch.float64)
    ((o_ref * do).sum() + (ht_ref * dht).sum()).backward()

    dev = {n: t.to(device=device, dtype=dtype if n in "qkv" else torch.float32).requires_grad_()
           for n, t in x.items()}
    extra = dict(use_gate_in_kernel=True, A_log=dev["A_log"], dt_bias=dev["dt_bias"]) if opt["fused"] else {}
    o, ht = fn(dev["q"], dev["k"], dev["v"], dev["g"], beta=dev["beta"], initial_state=dev["h0"],
               output_final_state=True, use_qk_l2norm_in_kernel=opt["l2"], use_beta_sigmoid_in_kernel=opt["sigmoid"],
               allow_neg_eigval=opt.get("negative", False), state_v_first=v_first,
               cu_seqlens=cu.to(device) if cu is not None else None, **extra)
    assert o.dtype == dtype and o.device.type == device and ht.dtype == torch.float32
    bf, bg = (F32_FWD, F32_GRAD) if dtype == torch.float32 else (LOW_FWD, LOW_GRAD)
    close("o", o, o_ref, bf)
    close("final_state", ht, ht_ref, bf)
    (o.double() * do.to(device)).sum().add((ht.double() * dht.to(device)).sum()).backward()
    for n in ("q", "k", "v", "beta", "h0"):
        close(f"d{n}", dev[n].grad, leaf[n].grad, bg)
    close("dg", dev["g"].grad, leaf["g"].grad, bg)
    if opt["fused"]:   # sums over tokens whose terms can cancel: against the terms
        t_A = ((geff.grad * geff) ** 2).sum((0, 1))
        t_dt = (leaf["g"].grad ** 2).sum((0, 1))
        for n, t2 in (("A_log", t_A), ("dt_bias", t_dt)):
            e = terms_err(dev[n].grad, leaf[n].grad, t2)
            assert e <= bg, f"d{n}: error {e:.3e} against its terms over {bg:.0e} (GDN_TEST_SEED={SEED})"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("fn", [gdn.chunk_gated_delta_rule, gdn.fused_recurrent_gated_delta_rule],
                         ids=["chunk", "recurrent"])
def test_rule_matches_reference(gen, device, case, fn):
    B, T, H, HV, K, V, opt = CASES[case]
    run_case(gen, device, B, T, H, HV, K, V, opt, fn)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rule_low_precision(gen, device, dtype):
    B, T, H, HV, K, V, opt = CASES[0]
    run_case(gen, device, B, T, H, HV, K, V, opt, gdn.chunk_gated_delta_rule, dtype)


def test_numpy_forward(gen):
    x = inputs(gen, 1, 50, 2, 4, 16, 8, True, True)
    o_ref, ht_ref = ref.gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], h0=x["h0"], qk_l2norm=True,
                                         gate_fused=True, A_log=x["A_log"], dt_bias=x["dt_bias"], beta_sigmoid=True)
    a = {n: t.numpy().astype(np.float32) for n, t in x.items()}
    for fn in (gdn.chunk_gated_delta_rule, gdn.fused_recurrent_gated_delta_rule):
        o, ht = fn(a["q"], a["k"], a["v"], a["g"], beta=a["beta"], initial_state=a["h0"], output_final_state=True,
                   use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                   A_log=a["A_log"], dt_bias=a["dt_bias"])
        assert isinstance(o, np.ndarray) and o.dtype == np.float32
        close("o (numpy)", torch.from_numpy(o), o_ref, F32_FWD)
        close("final_state (numpy)", torch.from_numpy(ht), ht_ref, F32_FWD)


def test_gradcheck(gen):
    """torch.autograd.gradcheck through a float64 -> float32 -> float64 wrapper (gdn computes in f32)."""
    x = inputs(gen, 1, 9, 1, 2, 4, 4, True, True)
    names = ["q", "k", "v", "g", "beta", "A_log", "dt_bias", "h0"]

    def f(q, k, v, g, beta, A_log, dt_bias, h0):
        c = [t.float() for t in (q, k, v, g, beta, A_log, dt_bias, h0)]
        o, ht = gdn.chunk_gated_delta_rule(c[0], c[1], c[2], c[3], c[4], initial_state=c[7], output_final_state=True,
                                           use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                           use_gate_in_kernel=True, A_log=c[5], dt_bias=c[6])
        return o.double(), ht.double()

    args = tuple(x[n].clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(f, args, eps=1e-3, atol=2e-3, rtol=2e-2)


def test_backward_skips_what_is_not_needed(gen, monkeypatch):
    seen = {}
    real = gdn._core.chunk_bwd

    def spy(*a, **kw):
        seen["args"] = a
        return real(*a, **kw)

    monkeypatch.setattr(gdn._core, "chunk_bwd", spy)
    x = inputs(gen, 1, 20, 1, 2, 8, 8, True, True)
    t = {n: v.float() for n, v in x.items()}
    for n in ("q", "k", "v", "g", "beta"):
        t[n].requires_grad_()
    o, _ = gdn.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["h0"],
                                      use_gate_in_kernel=True, A_log=t["A_log"], dt_bias=t["dt_bias"],
                                      use_beta_sigmoid_in_kernel=True)
    o.sum().backward()
    want_ddt_bias, want_dh0 = seen["args"][-2:]
    assert not want_ddt_bias and not want_dh0
    assert t["A_log"].grad is None and t["h0"].grad is None and t["q"].grad is not None


def test_bad_arguments_name_them():
    q = torch.randn(1, 8, 2, 4)
    v = torch.randn(1, 8, 2, 4)
    g, b = torch.zeros(1, 8, 2), torch.ones(1, 8, 2)
    with pytest.raises(gdn.GdnArgumentError, match="q, k, v must have one dtype"):
        gdn.chunk_gated_delta_rule(q, q.half(), v, g, b)
    with pytest.raises(gdn.GdnArgumentError, match="float64"):
        gdn.chunk_gated_delta_rule(q.double(), q.double(), v.double(), g, b)
    with pytest.raises(gdn.GdnArgumentError, match="beta: shape"):
        gdn.chunk_gated_delta_rule(q, q, v, g, b[:, :4])
    with pytest.raises(gdn.GdnArgumentError, match="gk and gv"):
        gdn.fused_recurrent_gated_delta_rule(q, q, v, gk=g)
    with pytest.raises(gdn.GdnArgumentError, match="allow_neg_eigval"):
        gdn.chunk_gated_delta_rule(q, q, v, g, b, allow_neg_eigval=True)
    with pytest.raises(gdn.GdnArgumentError, match="unknown arguments"):
        gdn.chunk_gated_delta_rule(q, q, v, g, b, use_gate_in_kernal=True)
    big = torch.randn(1, 2, 1, 300)   # K = 300: the C library refuses, with its own message
    with pytest.raises(gdn.GdnError, match="K"):
        gdn.chunk_gated_delta_rule(big, big, torch.randn(1, 2, 1, 4), torch.zeros(1, 2, 1), torch.ones(1, 2, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fla_side_by_side(gen):
    """gdn and FLA's chunk_gated_delta_rule on the same bf16 inputs, both against the float64 reference."""
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    B, T, H, HV, K, V = 2, 300, 2, 4, 64, 64
    x = inputs(gen, B, T, H, HV, K, V, False, False)
    leaf = {n: t.clone().requires_grad_() for n, t in x.items()}
    o_ref, ht_ref = ref.gated_delta_rule(leaf["q"], leaf["k"], leaf["v"], leaf["g"], leaf["beta"], h0=leaf["h0"],
                                         qk_l2norm=True)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    (o_ref * do).sum().backward()
    errs = {}
    for name, fn in (("gdn", gdn.chunk_gated_delta_rule), ("fla", fla.chunk_gated_delta_rule)):
        t = {n: v.to("cuda", torch.bfloat16 if n in ("q", "k", "v") else torch.float32).requires_grad_()
             for n, v in x.items()}
        o, ht = fn(t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["h0"], output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
        errs[name] = {"o": rel_err(o, o_ref), "ht": rel_err(ht, ht_ref)}
        try:
            (o.double() * do.cuda()).sum().backward()
        except RuntimeError as e:   # FLA refuses its gated backward on some Triton versions (its #640)
            print(f"\n{name} backward: {str(e)[:100]}")
            continue
        errs[name].update({f"d{n}": rel_err(t[n].grad, leaf[n].grad) for n in ("q", "k", "v", "g", "beta", "h0")})
    print("\nrelative error against float64, bf16 inputs:")
    for what in errs["gdn"]:
        print(f"  {what:5s} gdn {errs['gdn'][what]:.2e}  fla {errs['fla'].get(what, float('nan')):.2e}")
    for what, e in errs["gdn"].items():
        assert e <= (LOW_FWD if what in ("o", "ht") else LOW_GRAD), f"gdn {what}: {e:.3e} (GDN_TEST_SEED={SEED})"
