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

/* n 16-bit values from src to dst; where stream is set, the 64-byte lines
 * the row covers whole by streaming stores and its partial first and last
 * lines by plain ones. A line written in part by a streaming store is
 * flushed in pieces before its other part comes (the backward of conv1d
 * writes a row 128 bytes at a time, a block of channels after another):
 * dx 16 bytes off a line took the main job's conv1d backward from 4.2 to
 * 6.3 ms (bench/NOTES.md CPU v21). */
static inline void gdn_store16_row(uint16_t *restrict dst, const uint16_t *restrict src, int n, int stream) {
#if defined(__SSE2__)
    if (stream) {
        const uintptr_t a = (uintptr_t)dst, e = a + (uintptr_t)n * 2;
        const uintptr_t a64 = (a + 63) & ~(uintptr_t)63, e64 = e & ~(uintptr_t)63;
        if (e64 > a64) {
            const size_t head = a64 - a, tail = e - e64;
            memcpy(dst, src, head);
            const char *s = (const char *)src + head;
            for (uintptr_t p = a64; p < e64; p += 16, s += 16)
                _mm_stream_si128((__m128i *)p, _mm_loadu_si128((const __m128i *)s));
            memcpy((char *)e64, s, tail);
            return;
        }
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
