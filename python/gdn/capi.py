"""gdn.capi: the ctypes mirror of the C API (include/gdn.h), one to one.

Pure standard library. The enums, the structs and the prototypes mirror
include/gdn.h; the header is the documentation of every call. Pointers are
plain ints (device or host addresses), so a torch tensor is passed as
tensor.data_ptr() and a CUDA stream as stream.cuda_stream. A call that
returns a non-zero gdn_status raises GdnError (Unsupported for
GDN_ERR_UNSUPPORTED) with the text of gdn_last_error().

Most users want the functions of the gdn package instead (arrays in, arrays
out, autograd); this module is for engines that manage their own memory.

The library is loaded at import from $GDN_LIB, else the libgdn.so installed
inside this package (pip install .), else a build folder of the source tree
this file sits in (build-gpu/, then build/).

    from gdn import capi
    ex = capi.Exec(backend=capi.BACKEND_CUDA, stream=torch.cuda.current_stream().cuda_stream)
    cfg = capi.Config(B=1, T=128, H=2, HV=4, K=64, V=64, dtype=capi.BF16, gate_dtype=capi.F32,
                      flags=capi.QK_L2NORM | capi.GATE_FUSED | capi.BETA_SIGMOID)
    args = capi.FwdArgs(q=q.data_ptr(), k=k.data_ptr(), ...)
    capi.chunk_fwd(ex, cfg, args)
"""
import ctypes
import os
from ctypes import POINTER, Structure, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint, c_void_p

# ---- enums (include/gdn.h) ----

OK = 0
ERR_NULL = 1
ERR_SHAPE = 2
ERR_DTYPE = 3
ERR_SEQLENS = 4
ERR_OPTION = 5
ERR_WORKSPACE = 6
ERR_BACKEND = 7
ERR_UNSUPPORTED = 8

F32, BF16, F16 = 0, 1, 2                  # gdn_dtype
BACKEND_CPU, BACKEND_CUDA = 0, 1          # gdn_backend

QK_L2NORM = 1 << 0                        # gdn_flags
GATE_FUSED = 1 << 1
BETA_SIGMOID = 1 << 2
BETA_NEGATIVE = 1 << 3
STATE_V_FIRST = 1 << 4

NORM_GATE_SILU, NORM_GATE_SIGMOID = 0, 1  # gdn_norm_gate

# C enums are int-sized on every ABI gdn targets
_enum = c_int


# ---- structs (same order, same types as include/gdn.h) ----

class Exec(Structure):
    _fields_ = [("backend", _enum), ("stream", c_void_p), ("threads", c_int), ("seq_split", c_int)]


class Config(Structure):
    _fields_ = [("B", c_int64), ("T", c_int64), ("H", c_int), ("HV", c_int), ("K", c_int), ("V", c_int),
                ("cu_seqlens", c_void_p), ("cu_seqlens_dev", c_void_p), ("num_seqs", c_int64),
                ("dtype", _enum), ("gate_dtype", _enum), ("scale", c_float), ("flags", c_uint)]


class FwdArgs(Structure):
    _fields_ = [("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("g", c_void_p), ("beta", c_void_p),
                ("A_log", c_void_p), ("dt_bias", c_void_p), ("h0", c_void_p), ("o", c_void_p), ("ht", c_void_p),
                ("saved", c_void_p), ("saved_bytes", c_size_t), ("workspace", c_void_p),
                ("workspace_bytes", c_size_t)]


class BwdArgs(Structure):
    _fields_ = [("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("g", c_void_p), ("beta", c_void_p),
                ("A_log", c_void_p), ("dt_bias", c_void_p), ("h0", c_void_p),
                ("saved", c_void_p), ("saved_bytes", c_size_t), ("dout", c_void_p), ("dht", c_void_p),
                ("dq", c_void_p), ("dk", c_void_p), ("dv", c_void_p), ("dg", c_void_p), ("dbeta", c_void_p),
                ("dA_log", c_void_p), ("ddt_bias", c_void_p), ("dh0", c_void_p),
                ("workspace", c_void_p), ("workspace_bytes", c_size_t)]


class Conv1dConfig(Structure):
    _fields_ = [("B", c_int64), ("T", c_int64), ("D", c_int), ("W", c_int), ("cu_seqlens", c_void_p),
                ("cu_seqlens_dev", c_void_p), ("num_seqs", c_int64), ("dtype", _enum), ("silu", c_int)]


class Conv1dArgs(Structure):
    _fields_ = [("x", c_void_p), ("weight", c_void_p), ("bias", c_void_p), ("h0", c_void_p), ("y", c_void_p),
                ("ht", c_void_p)]


class Conv1dBwdArgs(Structure):
    _fields_ = [("x", c_void_p), ("weight", c_void_p), ("bias", c_void_p), ("h0", c_void_p), ("dy", c_void_p),
                ("dht", c_void_p), ("dx", c_void_p), ("dweight", c_void_p), ("dbias", c_void_p),
                ("dh0", c_void_p)]


class DecodeConfig(Structure):
    _fields_ = [("B", c_int), ("H", c_int), ("HV", c_int), ("K", c_int), ("V", c_int), ("dtype", _enum),
                ("scale", c_float), ("flags", c_uint), ("num_slots", c_int64), ("conv_W", c_int)]


class DecodeArgs(Structure):
    _fields_ = [("mixed_qkv", c_void_p), ("proj", c_void_p), ("conv_state", c_void_p), ("conv_weight", c_void_p),
                ("conv_bias", c_void_p), ("a", c_void_p), ("b", c_void_p), ("A_log", c_void_p),
                ("dt_bias", c_void_p), ("state", c_void_p), ("slots", c_void_p), ("o", c_void_p)]


class RmsnormConfig(Structure):
    _fields_ = [("rows", c_int64), ("V", c_int), ("dtype", _enum), ("eps", c_float), ("gate", _enum)]


class CpConfig(Structure):
    _fields_ = [("rank", c_int), ("world", c_int), ("first_continues", c_int), ("last_continues", c_int)]


# C name of each mirrored struct (for layout checks against the header)
STRUCTS = {
    "gdn_exec": Exec, "gdn_config": Config, "gdn_fwd_args": FwdArgs, "gdn_bwd_args": BwdArgs,
    "gdn_conv1d_config": Conv1dConfig, "gdn_conv1d_args": Conv1dArgs, "gdn_conv1d_bwd_args": Conv1dBwdArgs,
    "gdn_decode_config": DecodeConfig, "gdn_decode_args": DecodeArgs, "gdn_rmsnorm_config": RmsnormConfig,
    "gdn_cp_config": CpConfig,
}


# ---- the library ----

def _find_lib():
    env = os.environ.get("GDN_LIB")
    if env:
        if not os.path.exists(env):
            raise OSError(f"GDN_LIB is set to {env!r}, which does not exist")
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, os.pardir, os.pardir))
    cands = [os.path.join(here, "libgdn.so")]
    cands += [os.path.join(repo, d, "libgdn.so") for d in ("build-gpu", "build")]
    for cand in cands:
        if os.path.exists(cand):
            return cand
    raise OSError("libgdn.so not found (looked at " + ", ".join(cands) + "): install the package with "
                  "`pip install .`, or build the library with `cmake -B build && cmake --build build`, "
                  "or set GDN_LIB to its path")


lib = ctypes.CDLL(_find_lib())
_E, _C, _F, _BW = POINTER(Exec), POINTER(Config), POINTER(FwdArgs), POINTER(BwdArgs)
_CC, _CA, _CB = POINTER(Conv1dConfig), POINTER(Conv1dArgs), POINTER(Conv1dBwdArgs)
_DC, _DA, _RC = POINTER(DecodeConfig), POINTER(DecodeArgs), POINTER(RmsnormConfig)
_CP = POINTER(CpConfig)
_p = c_void_p
_PROTOS = {   # name: (restype, argtypes)
    "gdn_status_string": (c_char_p, [_enum]),
    "gdn_last_error": (c_char_p, []),
    "gdn_dtype_size": (c_size_t, [_enum]),
    "gdn_dtype_name": (c_char_p, [_enum]),
    "gdn_backend_available": (c_int, [_enum]),
    "gdn_chunk_saved_size": (c_size_t, [_C]),
    "gdn_chunk_fwd_workspace_size": (c_size_t, [_E, _C]),
    "gdn_chunk_bwd_workspace_size": (c_size_t, [_E, _C]),
    "gdn_chunk_fwd": (_enum, [_E, _C, _F]),
    "gdn_chunk_bwd": (_enum, [_E, _C, _BW]),
    "gdn_recurrent_fwd": (_enum, [_E, _C, _F]),
    "gdn_gate_fwd": (_enum, [_E, c_int64, c_int, _enum, _p, _p, _p, _p]),
    "gdn_gate_bwd": (_enum, [_E, c_int64, c_int, _enum, _p, _p, _p, _p, _p, _p, _p]),
    "gdn_l2norm_fwd": (_enum, [_E, c_int64, c_int, _enum, _p, _p, _p]),
    "gdn_l2norm_bwd": (_enum, [_E, c_int64, c_int, _enum, _p, _p, _p, _p]),
    "gdn_conv1d_fwd": (_enum, [_E, _CC, _CA]),
    "gdn_conv1d_bwd": (_enum, [_E, _CC, _CB]),
    "gdn_conv1d_update": (_enum, [_E, _CC, _p, _p, _p, _p, c_int64, _p, _p]),
    "gdn_decode_step": (_enum, [_E, _DC, _DA]),
    "gdn_rmsnorm_gated_fwd": (_enum, [_E, _RC, _p, _p, _p, _p, _p]),
    "gdn_rmsnorm_gated_bwd": (_enum, [_E, _RC, _p, _p, _p, _p, _p, _p, _p, _p]),
    "gdn_cp_map_floats": (c_size_t, [_C]),
    "gdn_cp_fwd_map_workspace_size": (c_size_t, [_E, _C, _CP]),
    "gdn_cp_bwd_map_workspace_size": (c_size_t, [_E, _C, _CP]),
    "gdn_cp_fwd_map": (_enum, [_E, _C, _CP, _F, _p]),
    "gdn_cp_bwd_map": (_enum, [_E, _C, _CP, _BW, _p, _p]),
    "gdn_cp_fwd_scan": (_enum, [_E, _C, _CP, _p, _p]),
    "gdn_cp_bwd_scan": (_enum, [_E, _C, _CP, _p, _p]),
    "gdn_cp_fwd_workspace_size": (c_size_t, [_E, _C, _CP]),
    "gdn_cp_fwd_begin": (_enum, [_E, _C, _CP, _F, _p]),
    "gdn_cp_fwd_finish": (_enum, [_E, _C, _CP, _F]),
    "gdn_cp_bwd_workspace_size": (c_size_t, [_E, _C, _CP]),
    "gdn_cp_bwd_begin": (_enum, [_E, _C, _CP, _BW, _p, _p]),
    "gdn_cp_bwd_finish": (_enum, [_E, _C, _CP, _BW, _p]),
}
for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


# ---- errors ----

class GdnError(RuntimeError):
    """A gdn call returned a non-zero status; .status, .name and .message say which and why."""

    def __init__(self, func, status, message):
        self.func, self.status, self.message = func, status, message
        self.name = status_string(status) if status is not None else "error"
        super().__init__(f"{func}: {self.name}: {message}")


class Unsupported(GdnError):
    """GDN_ERR_UNSUPPORTED: a valid request that this backend does not do (yet)."""


def status_string(s):
    return lib.gdn_status_string(s).decode()


def last_error():
    return lib.gdn_last_error().decode()


def _check(func, status):
    if status != OK:
        raise (Unsupported if status == ERR_UNSUPPORTED else GdnError)(func, status, last_error())


def _size(func, n):
    # the size queries answer 0 and set the last error on a bad config (no status to name)
    msg = last_error() if n == 0 else ""
    if msg:
        raise GdnError(func, None, msg)
    return n


# ---- calls (arguments in the order of include/gdn.h; structs by value, passed by reference) ----

def dtype_size(t):
    return lib.gdn_dtype_size(t)


def dtype_name(t):
    return lib.gdn_dtype_name(t).decode()


def backend_available(b):
    return bool(lib.gdn_backend_available(b))


def chunk_saved_size(cfg):
    return _size("gdn_chunk_saved_size", lib.gdn_chunk_saved_size(cfg))


def chunk_fwd_workspace_size(ex, cfg):
    return _size("gdn_chunk_fwd_workspace_size", lib.gdn_chunk_fwd_workspace_size(ex, cfg))


def chunk_bwd_workspace_size(ex, cfg):
    return _size("gdn_chunk_bwd_workspace_size", lib.gdn_chunk_bwd_workspace_size(ex, cfg))


def chunk_fwd(ex, cfg, args):
    _check("gdn_chunk_fwd", lib.gdn_chunk_fwd(ex, cfg, args))


def chunk_bwd(ex, cfg, args):
    _check("gdn_chunk_bwd", lib.gdn_chunk_bwd(ex, cfg, args))


def recurrent_fwd(ex, cfg, args):
    _check("gdn_recurrent_fwd", lib.gdn_recurrent_fwd(ex, cfg, args))


def gate_fwd(ex, rows, HV, a_dtype, a, A_log, dt_bias, g):
    _check("gdn_gate_fwd", lib.gdn_gate_fwd(ex, rows, HV, a_dtype, a, A_log, dt_bias, g))


def gate_bwd(ex, rows, HV, a_dtype, a, A_log, dt_bias, dg, da, dA_log, ddt_bias):
    _check("gdn_gate_bwd", lib.gdn_gate_bwd(ex, rows, HV, a_dtype, a, A_log, dt_bias, dg, da, dA_log, ddt_bias))


def l2norm_fwd(ex, rows, dim, dtype, x, y, rstd):
    _check("gdn_l2norm_fwd", lib.gdn_l2norm_fwd(ex, rows, dim, dtype, x, y, rstd))


def l2norm_bwd(ex, rows, dim, dtype, x, rstd, dy, dx):
    _check("gdn_l2norm_bwd", lib.gdn_l2norm_bwd(ex, rows, dim, dtype, x, rstd, dy, dx))


def conv1d_fwd(ex, cfg, args):
    _check("gdn_conv1d_fwd", lib.gdn_conv1d_fwd(ex, cfg, args))


def conv1d_bwd(ex, cfg, args):
    _check("gdn_conv1d_bwd", lib.gdn_conv1d_bwd(ex, cfg, args))


def conv1d_update(ex, cfg, x, weight, bias, state, num_slots, slots, y):
    _check("gdn_conv1d_update", lib.gdn_conv1d_update(ex, cfg, x, weight, bias, state, num_slots, slots, y))


def decode_step(ex, cfg, args):
    _check("gdn_decode_step", lib.gdn_decode_step(ex, cfg, args))


def rmsnorm_gated_fwd(ex, cfg, x, z, w, y, rstd):
    _check("gdn_rmsnorm_gated_fwd", lib.gdn_rmsnorm_gated_fwd(ex, cfg, x, z, w, y, rstd))


def rmsnorm_gated_bwd(ex, cfg, x, z, w, rstd, dy, dx, dz, dw):
    _check("gdn_rmsnorm_gated_bwd", lib.gdn_rmsnorm_gated_bwd(ex, cfg, x, z, w, rstd, dy, dx, dz, dw))


# ---- context parallel (include/gdn.h: what moves between ranks, and the order of the calls) ----

def cp_map_floats(cfg):
    return _size("gdn_cp_map_floats", lib.gdn_cp_map_floats(cfg))


def cp_fwd_map_workspace_size(ex, cfg, cp):
    return _size("gdn_cp_fwd_map_workspace_size", lib.gdn_cp_fwd_map_workspace_size(ex, cfg, cp))


def cp_bwd_map_workspace_size(ex, cfg, cp):
    return _size("gdn_cp_bwd_map_workspace_size", lib.gdn_cp_bwd_map_workspace_size(ex, cfg, cp))


def cp_fwd_map(ex, cfg, cp, args, map_):
    _check("gdn_cp_fwd_map", lib.gdn_cp_fwd_map(ex, cfg, cp, args, map_))


def cp_bwd_map(ex, cfg, cp, args, fwd_map, bmap):
    _check("gdn_cp_bwd_map", lib.gdn_cp_bwd_map(ex, cfg, cp, args, fwd_map, bmap))


def cp_fwd_scan(ex, cfg, cp, maps, S_in):
    _check("gdn_cp_fwd_scan", lib.gdn_cp_fwd_scan(ex, cfg, cp, maps, S_in))


def cp_bwd_scan(ex, cfg, cp, maps, dS_out):
    _check("gdn_cp_bwd_scan", lib.gdn_cp_bwd_scan(ex, cfg, cp, maps, dS_out))


def cp_fwd_workspace_size(ex, cfg, cp):
    return _size("gdn_cp_fwd_workspace_size", lib.gdn_cp_fwd_workspace_size(ex, cfg, cp))


def cp_fwd_begin(ex, cfg, cp, args, map_):
    _check("gdn_cp_fwd_begin", lib.gdn_cp_fwd_begin(ex, cfg, cp, args, map_))


def cp_fwd_finish(ex, cfg, cp, args):
    _check("gdn_cp_fwd_finish", lib.gdn_cp_fwd_finish(ex, cfg, cp, args))


def cp_bwd_workspace_size(ex, cfg, cp):
    return _size("gdn_cp_bwd_workspace_size", lib.gdn_cp_bwd_workspace_size(ex, cfg, cp))


def cp_bwd_begin(ex, cfg, cp, args, fwd_map, bmap):
    _check("gdn_cp_bwd_begin", lib.gdn_cp_bwd_begin(ex, cfg, cp, args, fwd_map, bmap))


def cp_bwd_finish(ex, cfg, cp, args, dS_out):
    _check("gdn_cp_bwd_finish", lib.gdn_cp_bwd_finish(ex, cfg, cp, args, dS_out))
