/* Streaming stores of 16-bit rows for the CPU layer ops whose outputs are
 * written once and not read back by the op: a normal store first reads each
 * line it writes (write-allocate), a streaming store does not. Only outputs
 * of GDN_STREAM_BYTES or more stream (past L2 and most of L3 of the
 * machines in bench/NOTES.md, where the next op would find a smaller output
 * in cache); each thread fences its streaming stores before its parallel
 * region ends (gdn_stream_fence). Without SSE2 both are plain. Used by
 * conv1d (y, dx); the gated RMSNorm backward's dz, dx measured slower this
 * way (bench/NOTES.md v9), so it stores normally. */
#ifndef GDN_CPU_STREAM_H
#define GDN_CPU_STREAM_H
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define GDN_STREAM_BYTES ((int64_t)8 << 20)

/* n 16-bit values from src to dst; by streaming stores where stream is set,
 * dst is 16-byte aligned and n a multiple of 8 */
static inline void gdn_store16_row(uint16_t *restrict dst, const uint16_t *restrict src, int n, int stream) {
#if defined(__SSE2__)
    if (stream && ((uintptr_t)dst & 15) == 0 && (n & 7) == 0) {
        for (int k = 0; k < n / 8; k++) _mm_stream_si128((__m128i *)dst + k, _mm_loadu_si128((const __m128i *)src + k));
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, (size_t)n * 2);
}

static inline void gdn_stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

#endif
