/* CRC32C internals: the two implementations behind zoff_crc32c, for tests and
 * benchmarks inside the tree (not installed, not part of the API). */
#ifndef ZOFF_CORE_CRC32C_INTERNAL_H
#define ZOFF_CORE_CRC32C_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The SSE4.2 path hashes three interleaved streams over blocks of 3 x LONG
 * bytes, then 3 x SHORT bytes, then one stream for the rest. */
#define ZOFF_CRC32C_LONG 8192
#define ZOFF_CRC32C_SHORT 256

/* Portable slicing-by-8 tables (the fallback). */
uint32_t zoff_crc32c__table(uint32_t crc, const void *data, size_t n);
/* Whether this CPU runs the SSE4.2 path (false on other architectures). */
bool zoff_crc32c__have_sse42(void);
/* The SSE4.2 path; only when zoff_crc32c__have_sse42() (else: the table path). */
uint32_t zoff_crc32c__sse42(uint32_t crc, const void *data, size_t n);

#endif
