/* Host memory checks before large allocations (include/zoff/resources.h). */
#define _GNU_SOURCE
#include "zoff/resources.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

/* cgroup limits at or above this are "no limit" (v1 reports 2^63 - page size) */
#define RES_NO_LIMIT ((unsigned long long)1 << 62)

/* "Key:   1234 kB" from a /proc file, in bytes; SIZE_MAX when absent. */
static size_t proc_kb(const char *file, const char *key) {
    FILE *f = fopen(file, "r");
    if (!f) return SIZE_MAX;
    char line[256];
    size_t klen = strlen(key), v = SIZE_MAX;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strncmp(line, key, klen) == 0 && line[klen] == ':' && sscanf(line + klen + 1, "%llu", &kb) == 1) {
            v = kb > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* A number (or "max") from a cgroup file; false when unreadable. */
static bool read_cg(const char *dir, const char *name, unsigned long long *out) {
    char p[4200], buf[64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    if (!f) return false;
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok) return false;
    if (strncmp(buf, "max", 3) == 0) {
        *out = RES_NO_LIMIT;
        return true;
    }
    char *end;
    errno = 0;
    *out = strtoull(buf, &end, 10);
    return errno == 0 && end != buf;
}

/* The tightest memory limit among this process's cgroup and its ancestors (v2, else v1). */
static void cgroup_limit(size_t *limit, size_t *usage) {
    *limit = SIZE_MAX;
    *usage = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[4096], v2[4096] = "", v1[4096] = "";
    bool have_v2 = false, have_v1 = false;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "0::", 3) == 0) {
            snprintf(v2, sizeof v2, "%s", line + 3);
            have_v2 = true;
        } else {
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c1 && c2) {
                *c2 = 0;
                for (char *t = strtok(c1 + 1, ","); t; t = strtok(NULL, ","))
                    if (strcmp(t, "memory") == 0) {
                        snprintf(v1, sizeof v1, "%s", c2 + 1);
                        have_v1 = true;
                    }
            }
        }
    }
    fclose(f);
    const char *base = have_v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
    const char *lim_name = have_v1 ? "memory.limit_in_bytes" : "memory.max";
    const char *use_name = have_v1 ? "memory.usage_in_bytes" : "memory.current";
    if (!have_v1 && !have_v2) return;
    char path[4096];
    snprintf(path, sizeof path, "%s", have_v1 ? v1 : v2);
    unsigned long long best_head = RES_NO_LIMIT;
    for (;;) { /* this cgroup, then each parent up to the (namespace) root */
        char dir[8300];
        snprintf(dir, sizeof dir, "%s%s", base, strcmp(path, "/") ? path : "");
        unsigned long long lim, use = 0;
        if (read_cg(dir, lim_name, &lim) && lim < RES_NO_LIMIT) {
            (void)read_cg(dir, use_name, &use);
            unsigned long long head = lim > use ? lim - use : 0;
            if (head < best_head) {
                best_head = head;
                *limit = (size_t)lim;
                *usage = (size_t)use;
            }
        }
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) {
            if (strcmp(path, "/") == 0 || path[0] == 0) break;
            snprintf(path, sizeof path, "/");
            continue;
        }
        *slash = 0;
    }
}

zoff_status zoff_host_memory_query(zoff_host_memory *m) {
    if (!m) return zoff_error(ZOFF_ERR_INVALID, "zoff_host_memory_query: out is NULL");
    m->total = proc_kb("/proc/meminfo", "MemTotal");
    m->available = proc_kb("/proc/meminfo", "MemAvailable");
    if (m->available == SIZE_MAX) { /* kernels before 3.14 */
        size_t fr = proc_kb("/proc/meminfo", "MemFree"), ca = proc_kb("/proc/meminfo", "Cached");
        if (fr != SIZE_MAX) m->available = fr + (ca != SIZE_MAX ? ca : 0);
    }
    const char *fake = getenv("ZOFF_TEST_MEM_AVAILABLE"); /* tests: pretend this little is available */
    if (fake && *fake) {
        char *end;
        unsigned long long v = strtoull(fake, &end, 10);
        if (*end == 0) m->available = (size_t)v;
    }
    cgroup_limit(&m->cgroup_limit, &m->cgroup_usage);
    struct rlimit rl;
    m->as_limit = getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (size_t)rl.rlim_cur : SIZE_MAX;
    m->memlock_limit =
        getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (size_t)rl.rlim_cur : SIZE_MAX;
    m->vm_size = proc_kb("/proc/self/status", "VmSize");
    if (m->vm_size == SIZE_MAX) m->vm_size = 0;
    m->locked = proc_kb("/proc/self/status", "VmLck");
    if (m->locked == SIZE_MAX) m->locked = 0;
    m->resident_peak = proc_kb("/proc/self/status", "VmHWM");
    return ZOFF_OK;
}

static size_t sub0(size_t a, size_t b) { return a > b ? a - b : 0; }

size_t zoff_host_memory_left(const zoff_host_memory *m) {
    size_t cg = m->cgroup_limit != SIZE_MAX ? sub0(m->cgroup_limit, m->cgroup_usage) : SIZE_MAX;
    return cg < m->available ? cg : m->available;
}

zoff_status zoff_host_memory_check_against(const zoff_host_memory *m, const zoff_host_request *rq) {
    if (!m || !rq) return zoff_error(ZOFF_ERR_INVALID, "zoff_host_memory_check: NULL argument");
    const char *what = rq->what ? rq->what : "an allocation";
    char hint[512] = "";
    if (rq->hint && rq->hint[0]) snprintf(hint, sizeof hint, "; or %s", rq->hint);
    size_t need = rq->pageable + rq->pinned;
    if (need < rq->pageable) need = SIZE_MAX;
    char b[6][32];
    char parts[128] = "";
    if (rq->pinned && rq->pageable)
        snprintf(parts, sizeof parts, " (%s pageable + %s pinned)", zoff_format_bytes(rq->pageable, b[4], 32),
                 zoff_format_bytes(rq->pinned, b[5], 32));
    else if (rq->pinned)
        snprintf(parts, sizeof parts, " (pinned)");

    /* 1. physical memory: MemAvailable and the cgroup limit, whichever leaves less */
    size_t avail = zoff_host_memory_left(m);
    bool by_cgroup = avail != m->available;
    if (avail != SIZE_MAX && need > avail) {
        if (by_cgroup)
            return zoff_error(ZOFF_ERR_NOMEM,
                              "not enough host memory for %s: it needs %s%s but this process's cgroup (container) "
                              "memory limit allows only %s more (limit %s, %s in use); raise the limit (docker run "
                              "--memory, Kubernetes resources.limits.memory, systemd MemoryMax)%s",
                              what, zoff_format_bytes(need, b[0], 32), parts, zoff_format_bytes(avail, b[1], 32),
                              zoff_format_bytes(m->cgroup_limit, b[2], 32),
                              zoff_format_bytes(m->cgroup_usage, b[3], 32), hint);
        return zoff_error(ZOFF_ERR_NOMEM,
                          "not enough host memory for %s: it needs %s%s but only %s is available (MemAvailable in "
                          "/proc/meminfo, of %s in total); free memory (other processes), run on a machine with "
                          "more memory%s",
                          what, zoff_format_bytes(need, b[0], 32), parts, zoff_format_bytes(avail, b[1], 32),
                          m->total == SIZE_MAX ? "?" : zoff_format_bytes(m->total, b[2], 32), hint);
    }
    /* 2. address space (ulimit -v) */
    if (m->as_limit != SIZE_MAX && need > sub0(m->as_limit, m->vm_size))
        return zoff_error(ZOFF_ERR_NOMEM,
                          "%s needs %s%s of address space but the address-space limit (ulimit -v) is %s with %s "
                          "already mapped; raise it (ulimit -v unlimited)%s",
                          what, zoff_format_bytes(need, b[0], 32), parts, zoff_format_bytes(m->as_limit, b[1], 32),
                          zoff_format_bytes(m->vm_size, b[2], 32), hint);
    /* 3. locked memory (ulimit -l), for pinned memory that is charged to it */
    if (rq->pinned_memlock && rq->pinned && m->memlock_limit != SIZE_MAX &&
        rq->pinned > sub0(m->memlock_limit, m->locked))
        return zoff_error(ZOFF_ERR_NOMEM,
                          "%s needs %s of pinned (locked) host memory but the locked-memory limit (ulimit -l) is %s "
                          "with %s already locked; raise it (ulimit -l unlimited; memlock in "
                          "/etc/security/limits.conf; docker run --ulimit memlock=-1), or set "
                          "offload_optimizer.pin_memory false%s",
                          what, zoff_format_bytes(rq->pinned, b[0], 32), zoff_format_bytes(m->memlock_limit, b[1], 32),
                          zoff_format_bytes(m->locked, b[2], 32), hint);
    return ZOFF_OK;
}

zoff_status zoff_host_memory_check(const zoff_host_request *rq) {
    zoff_host_memory m;
    ZOFF_TRY(zoff_host_memory_query(&m));
    zoff_status s = zoff_host_memory_check_against(&m, rq);
    if (s == ZOFF_OK) return ZOFF_OK;
    const char *skip = getenv("ZOFF_SKIP_MEMORY_CHECK");
    if (skip && strcmp(skip, "1") == 0) {
        zoff_log(ZOFF_LOG_WARN, "%s (continuing: ZOFF_SKIP_MEMORY_CHECK=1)", zoff_last_error());
        zoff_clear_error();
        return ZOFF_OK;
    }
    return s;
}

bool zoff_disk_free(const char *path, size_t *bytes, char *where, size_t cap) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path && *path ? path : ".");
    for (struct stat st; stat(dir, &st) != 0 || !S_ISDIR(st.st_mode);) { /* up to an existing directory */
        char *slash = strrchr(dir, '/');
        while (slash && slash > dir && slash[1] == 0) { /* trailing slashes */
            *slash = 0;
            slash = strrchr(dir, '/');
        }
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = 0; /* "/" */
        else *slash = 0;
        if ((!slash || slash == dir) && stat(dir, &st) != 0) return false;
    }
    if (where && cap) snprintf(where, cap, "%s", dir);
    const char *fake = getenv("ZOFF_TEST_DISK_FREE");
    if (fake && *fake) {
        char *end;
        unsigned long long v = strtoull(fake, &end, 10);
        if (*end == 0) {
            *bytes = (size_t)v;
            return true;
        }
    }
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0 || sv.f_blocks == 0) return false;
    *bytes = (size_t)sv.f_bavail * (size_t)sv.f_frsize;
    return true;
}
