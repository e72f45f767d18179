/* zoff resources: check host memory before large allocations.
 *
 * On Linux an allocation larger than the memory that is really there usually succeeds
 * (overcommit) and the process is OOM-killed later, mid-run, when the pages are first
 * touched: days of training lost without a message. Call zoff_host_memory_check with what
 * is about to be allocated; it fails at once with how much is needed, how much there is,
 * which limit is in the way and how to get more.
 *
 *     zoff_host_request rq = {.what = "the optimizer state (fp32 master, Adam m and v)",
 *                             .pageable = 12 * n, .pinned = 4 * n,
 *                             .hint = "offload the optimizer state to NVMe"};
 *     ZOFF_TRY(zoff_host_memory_check(&rq));
 *
 * Limits taken into account: MemAvailable (/proc/meminfo), the cgroup memory limit of this
 * process (v2 memory.max minus memory.current; v1 memory.limit_in_bytes minus usage), the
 * address-space limit (ulimit -v: RLIMIT_AS minus VmSize), and for memory that is charged to
 * the locked-memory limit (mlock, io_uring registered buffers) ulimit -l (RLIMIT_MEMLOCK minus
 * VmLck). CUDA's cudaHostAlloc pins through the driver and is not charged to RLIMIT_MEMLOCK;
 * its pinned memory counts against available memory (it can never be swapped out).
 *
 * ZOFF_SKIP_MEMORY_CHECK=1 turns the check into a warning (for machines where the numbers
 * mislead, e.g. a large swap the user wants to use). ZOFF_TEST_MEM_AVAILABLE=BYTES replaces
 * MemAvailable (for tests of the callers' checks). */
#ifndef ZOFF_RESOURCES_H
#define ZOFF_RESOURCES_H

#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the machine and this process allow. SIZE_MAX = no limit / unknown. */
typedef struct zoff_host_memory {
    size_t total;          /* MemTotal */
    size_t available;      /* MemAvailable (or MemFree + Cached on old kernels) */
    size_t cgroup_limit;   /* this process's cgroup memory limit; SIZE_MAX = none */
    size_t cgroup_usage;   /* ... and what the cgroup uses now */
    size_t as_limit;       /* RLIMIT_AS soft limit (ulimit -v); SIZE_MAX = unlimited */
    size_t vm_size;        /* VmSize of this process */
    size_t memlock_limit;  /* RLIMIT_MEMLOCK soft limit (ulimit -l); SIZE_MAX = unlimited */
    size_t locked;         /* VmLck of this process */
    size_t resident_peak;  /* VmHWM of this process: the most of its pages resident at once; SIZE_MAX = unknown */
} zoff_host_memory;

/* Read the numbers above. Fields that cannot be read are SIZE_MAX (or 0 for usage). */
zoff_status zoff_host_memory_query(zoff_host_memory *out);
/* Physical memory this process may still take: MemAvailable or its cgroup's room, whichever is
 * less (SIZE_MAX: unknown). */
size_t zoff_host_memory_left(const zoff_host_memory *m);

typedef struct zoff_host_request {
    const char *what;      /* what is being allocated, for the message */
    size_t pageable;       /* ordinary host memory about to be allocated, bytes */
    size_t pinned;         /* page-locked (pinned) host memory about to be allocated, bytes */
    bool pinned_memlock;   /* the pinned memory is charged to RLIMIT_MEMLOCK (mlock, io_uring buffers) */
    const char *hint;      /* what the user can change to need less, e.g. "use a smaller --micro-batch-size";
                              NULL: no extra advice */
} zoff_host_request;

/* Check req against m (pure: no system calls; for tests and for callers that query once).
 * ZOFF_ERR_NOMEM with a message naming what, the bytes needed, the bytes allowed, the limit
 * that is short and how to raise it. */
zoff_status zoff_host_memory_check_against(const zoff_host_memory *m, const zoff_host_request *req);

/* zoff_host_memory_query + zoff_host_memory_check_against (see ZOFF_SKIP_MEMORY_CHECK above). */
zoff_status zoff_host_memory_check(const zoff_host_request *req);

/* Free bytes for an unprivileged writer (statvfs f_bavail) on the filesystem that holds path, or
 * would hold it: the nearest existing directory up from it (path need not exist yet). false
 * where that cannot be told (statvfs fails, or the filesystem reports no size). Tests:
 * ZOFF_TEST_DISK_FREE=BYTES pretends that much is free. The directory asked is written to
 * where (cap bytes) when where is not NULL. */
bool zoff_disk_free(const char *path, size_t *bytes, char *where, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
