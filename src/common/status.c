/* Status codes, the last error message (per thread) and dtype names: the
 * public helpers of gdn.h that need no validation, and gdn_fail/gdn_ok, which
 * the API layer and the backends use to report. */
#include <stdarg.h>
#include <stdio.h>
#include "common/common.h"

/* ---- errors ---- */

static _Thread_local char last_error[512];

gdn_status gdn_fail(gdn_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

gdn_status gdn_ok(void) { last_error[0] = 0; return GDN_OK; }

const char *gdn_last_error(void) { return last_error; }

const char *gdn_status_string(gdn_status s) {
    switch (s) {
    case GDN_OK: return "GDN_OK";
    case GDN_ERR_NULL: return "GDN_ERR_NULL";
    case GDN_ERR_SHAPE: return "GDN_ERR_SHAPE";
    case GDN_ERR_DTYPE: return "GDN_ERR_DTYPE";
    case GDN_ERR_SEQLENS: return "GDN_ERR_SEQLENS";
    case GDN_ERR_OPTION: return "GDN_ERR_OPTION";
    case GDN_ERR_WORKSPACE: return "GDN_ERR_WORKSPACE";
    case GDN_ERR_BACKEND: return "GDN_ERR_BACKEND";
    case GDN_ERR_UNSUPPORTED: return "GDN_ERR_UNSUPPORTED";
    }
    return "GDN_ERR_UNKNOWN";
}

size_t gdn_dtype_size(gdn_dtype t) { return t == GDN_F32 ? 4 : (t == GDN_BF16 || t == GDN_F16) ? 2 : 0; }

const char *gdn_dtype_name(gdn_dtype t) {
    switch (t) { case GDN_F32: return "f32"; case GDN_BF16: return "bf16"; case GDN_F16: return "f16"; }
    return "?";
}
