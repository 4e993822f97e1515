"""GPU bench: gdn beside flash-linear-attention (FLA, Triton) in one process, on one card.

Every row times one op at one shape on both sides and prints

    op | shape | gdn us | FLA us | FLA/gdn | gdn % copy | gdn % mm | rel err

  - times: median of >= 10 (mostly 20-50) runs after warm-up, each run timed
    alone with CUDA events (synchronised after each run);
  - FLA/gdn > 1 means gdn is faster;
  - the card's limits are measured at the start of the same run: copy
    bandwidth (torch D2D copy of a 2 GiB buffer, bytes read + written) and the
    bf16 matmul rate (torch.mm 8192 x 8192 x 8192), each the best of its runs;
    "% copy" = model bytes / time / copy bandwidth, "% mm" = model FLOPs / time
    / matmul rate, with the FLOP and byte models of tools/flops.h (ported in
    gpu_common.py);
  - rel err: ||gdn - FLA|| / ||FLA|| (Frobenius), the largest over the op's
    outputs (o and ht; every gradient for fwd+bwd), from one call on fresh
    inputs with gdn's outputs filled with NaN before it; both sides are bf16 /
    f16 approximations, so ~1e-3 is agreement and "!" marks > 1e-2;
  - where a working set fits in L2 (50 MiB), inputs are rotated over several
    copies (the decode state pools) so L2 does not flatter.

Forward+backward rows also give the peak device memory of one training step
above its inputs on each side (torch's allocator peak for FLA; for gdn, which
allocates nothing, the buffers the caller holds: o, ht, saved, one workspace
for both passes, the gradients) and "ref err": gdn's largest error over every
output and gradient against a float64 reference (torch, token by token, with
autograd) on a slice of the shape (two sequences, 150 + 64 tokens, two q/k
heads, the same K, G, dtype and options), both sides on the same rounded inputs.
FLA's Triton backward refuses Triton >= 3.4, < 3.7.1 on Hopper (its issue 640:
wrong gradients from a miscompile of chunk_bwd_dqkwg); there the bench lifts
FLA's guard to time the same kernels, says so, and reads gdn's accuracy from
the float64 column, not from FLA's gradients.

Rows: chunk forward (inference: gdn keeps no saved, FLA and FlashQLA run under
no_grad) and forward+backward at the DESIGN.md section 7 shapes
(qwen3next, long1, tp8_4k, varlen, d256), the fused decode step at B = 1, 32, 256
(B = 1 also as CUDA graph replay), and the layer ops (conv1d forward and
single-token update, gated RMSNorm forward, L2 norm forward). An op that gdn's
CUDA backend does not do yet reads "unsupported" (GDN_ERR_UNSUPPORTED, asked
of the library, not assumed); gdn's backward reads "n/a" until it exists.

The chunk rows add FlashQLA (flash_qla.chunk_gated_delta_rule, TileLang, Hopper,
K = V = 128 in bf16 / f16 only) as a third side where it is installed: its time
(QLA us), QLA/gdn, and its peak memory for forward+backward, on the same inputs
(the fused gate and beta's sigmoid by torch ops inside its timed call, as for an
FLA without them). It comes from two pip wheels, tilelang (~50 MB, with
apache-tvm-ffi, z3-solver, ml-dtypes, cloudpickle, torch-c-dlpack-ext) and
flash-qla; on a device reached through a 64 MiB upload, carry the tilelang wheel
in one call and the rest in the next (bench/qla_wheels.sh).

Run on a machine with an H100/H200, torch and FLA (at ./.fla here):

    cmake -B build-gpu && cmake --build build-gpu -j16
    PYTHONPATH=$PWD/python:$PWD/.fla python3 bench/bench_gpu.py [--only=SUBSTRING] [--json]

--only keeps the rows whose "op shape" contains SUBSTRING (e.g. --only=decode,
--only=qwen3next, --only=chunk_fwd+bwd); --json prints one JSON document
instead of the table. The first run on a fresh machine spends minutes in
Triton's compile and autotune (outside the timed runs). libgdn.so is found
through $GDN_LIB or ./build-gpu/libgdn.so (gdn.capi).
"""
import argparse
import importlib.util
import json
import os
import sys

import torch
import triton

from gdn import capi as gdn

import fla

# the parts, beside this file (python3 bench/bench_gpu.py puts bench/ first on sys.path)
from gpu_common import (FLA_CHUNK_BETA, FLA_CHUNK_GATE, FLA_REC_BETA, FLA_REC_GATE, NOTES, QLA, card_limits, note,
                        print_table)
from gpu_chunk import CHUNK_SHAPES, bench_chunk
from gpu_layer import DEC_SHAPE, LAYER_OPS, bench_decode


def main():
    ap = argparse.ArgumentParser(description="gdn beside FLA on one GPU (see the module docstring)")
    ap.add_argument("--only", default="", help='keep the rows whose "op shape" contains this')
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    opt = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device visible to torch")
    if not gdn.backend_available(gdn.BACKEND_CUDA):
        sys.exit(f"bench_gpu: this libgdn has no usable CUDA backend ({gdn.last_error()})")

    def want(op, shape):
        return opt.only in f"{op} {shape}"

    rows = []

    def run_case(name, fn, *a):
        # a case that fails outside the timed calls (a size query, out of memory) costs its rows only
        try:
            new = fn(*a)
            rows.extend(new)
            for r in new:   # as each case ends: a run cut short (a time limit) keeps what it measured
                print(f"bench_gpu: {r.op} {r.shape}: gdn {r.gdn} us, FLA {r.fla} us, peak MiB {r.mem or '-'}",
                      file=sys.stderr, flush=True)
        except Exception as e:               # noqa: BLE001
            note(f"{name}: {type(e).__name__}: {str(e).strip()[:200]} (rows left out)")
        torch.cuda.empty_cache()

    copy, mm = card_limits()
    for s in CHUNK_SHAPES:
        wf, wb = want("chunk_fwd", s.name), want("chunk_fwd+bwd", s.name)
        if wf or wb:
            run_case(f"chunk {s.name}", bench_chunk, s, wf, wb)
    for B in (1, 32, 256):
        shape = f"B{B} {DEC_SHAPE}"
        we, wg = want("decode", shape), B == 1 and want("decode_graph", shape)
        if we or wg:
            run_case(f"decode B{B}", bench_decode, B, we, wg)
    for op, shape, fn in LAYER_OPS:
        if want(op, shape):
            run_case(op, fn, shape)

    if not FLA_CHUNK_GATE or not FLA_REC_GATE:
        note("this FLA has no in-kernel gate: g = -exp(A_log) * softplus(a + dt_bias) is computed with torch "
             "inside FLA's timed call")
    if not FLA_CHUNK_BETA or not FLA_REC_BETA:
        note("this FLA has no in-kernel beta sigmoid: beta = sigmoid(b) is computed with torch inside FLA's "
             "timed call")
    if any(r.op == "chunk_fwd+bwd" for r in rows):
        note("chunk_fwd+bwd: gdn times chunk_fwd (keeping saved) + chunk_bwd; FLA one forward and "
             "torch.autograd.grad of (o, ht) w.r.t. every input; FLOPs = 3.5 x forward (tools/flops.h)")
    qla = importlib.util.find_spec("flash_qla") is not None
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "fla": getattr(fla, "__version__", "?"),
            "fla_chunk_backend": "triton" if os.environ.get("FLA_FLASH_QLA") == "0" or not qla
                                 else "flash_qla (TileLang) where it accepts the call, else triton",
            "flash_qla": getattr(QLA, "__version__", "?") if QLA is not None else None,
            "gdn_lib": gdn.lib._name, "copy_GBps": copy * 1e-9, "mm_bf16_TFLOPs": mm * 1e-12, "notes": NOTES}
    out = [r.as_dict(copy, mm) for r in rows]
    if opt.json:
        print(json.dumps({"meta": meta, "rows": out}, indent=1))
    else:
        print_table(out, meta)


if __name__ == "__main__":
    main()
