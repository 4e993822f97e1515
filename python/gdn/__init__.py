"""gdn: Gated DeltaNet kernels (C and CUDA) for Python.

    import gdn
    o, ht = gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)

The functions take torch tensors (CPU or CUDA, with autograd) or numpy arrays
(CPU), under the names and arguments of flash-linear-attention (gdn.api).
gdn.GatedDeltaNet is a Qwen3-Next gated-delta-net layer built on them
(gdn.layer; needs torch). gdn.cp runs them under context parallel over
torch.distributed (one token stream cut over the ranks of a process group;
needs torch). gdn.capi is the ctypes mirror of the C API.
Errors: gdn.GdnError (the C library refused a call; its message) and
gdn.GdnArgumentError (an argument gdn cannot take, named in the message).
"""
from . import capi
from ._core import GdnArgumentError
from .api import (causal_conv1d, chunk_gated_delta_rule, chunk_gdn, decode_step, fused_recurrent_gated_delta_rule,
                  fused_recurrent_gdn, rms_norm_gated)
from .capi import GdnError, Unsupported

__version__ = "0.1.0"

__all__ = ["capi", "GdnError", "GdnArgumentError", "Unsupported", "chunk_gated_delta_rule", "chunk_gdn",
           "fused_recurrent_gated_delta_rule", "fused_recurrent_gdn", "causal_conv1d", "rms_norm_gated",
           "decode_step", "GatedDeltaNet", "GatedDeltaNetCache", "cp"]


def __getattr__(name):   # the layer and gdn.cp import torch: only when asked for
    if name == "cp":
        import importlib
        return importlib.import_module(__name__ + ".cp")
    if name in ("GatedDeltaNet", "GatedDeltaNetCache", "layer"):
        import importlib
        layer = importlib.import_module(__name__ + ".layer")
        return layer if name == "layer" else getattr(layer, name)
    raise AttributeError(f"module 'gdn' has no attribute {name!r}")
