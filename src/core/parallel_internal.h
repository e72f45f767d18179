/* zoff_copy_streaming's implementations, for tests and benchmarks inside the tree (not
 * installed, not part of the API). */
#ifndef ZOFF_CORE_PARALLEL_INTERNAL_H
#define ZOFF_CORE_PARALLEL_INTERNAL_H

#include <stddef.h>

/* The widest streaming store this build and CPU have, in bytes: 64 (AVX-512F), 32 (AVX2),
 * 16 (SSE2), or 0 (no streaming stores: other architectures, sanitizer builds; plain memcpy).
 * zoff_copy_streaming uses it. */
int zoff_copy_streaming__widest(void);
/* zoff_copy_streaming with stores of this width (0, 16, 32 or 64 bytes, at most the widest):
 * the head up to the first width-aligned byte of dst and the tail with memcpy, the rest with
 * aligned streaming stores of that width. */
void zoff_copy_streaming__width(void *dst, const void *src, size_t n, int width);

#endif
