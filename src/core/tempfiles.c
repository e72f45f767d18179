/* Temp files removed when a signal stops the process (include/zoff/core.h, "temp files"). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "zoff/core.h"

/* zoff tokenize keeps one temp file per shard until the last is written (100 shards of 100M tokens
 * for a 40 GB corpus), so there is room for many; untouched slots cost no memory. */
enum { TEMP_SLOTS = 1024, TEMP_PATH = 4352, TREE_DEPTH = 8 };

static struct temp_slot {
    char path[TEMP_PATH];
    int used; /* 0 free, 1 a file, 2 a folder and all under it; set after path, read by the handler */
} g_slots[TEMP_SLOTS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const int g_signals[] = {SIGINT, SIGTERM, SIGHUP};

/* Everything under the folder fd `dir` (then closed), with async-signal-safe calls only. */
static void remove_under(int dir, int depth) {
    char buf[4096];
    long n;
    while (dir >= 0 && (n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct { /* linux_dirent64 */
                unsigned long long ino;
                long long off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *d = (void *)(buf + off);
            off += d->reclen;
            if (!strcmp(d->name, ".") || !strcmp(d->name, "..")) continue;
            if (unlinkat(dir, d->name, 0) == 0 || depth >= TREE_DEPTH) continue;
            remove_under(openat(dir, d->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW), depth + 1);
            unlinkat(dir, d->name, AT_REMOVEDIR);
        }
    }
    if (dir >= 0) close(dir);
}

static pid_t g_main_tid; /* the thread that set the handlers up (zoff's main) */

static void on_stop(int sig) {
    int saved = errno;
    /* Files are registered before their thread creates them, which is safe only while that thread
     * is not running: a handler on another thread (an OpenMP worker of zoff tokenize) could unlink
     * a name just before the main thread creates it. The main thread, which creates most, takes it. */
    if (g_main_tid > 0 && (pid_t)syscall(SYS_gettid) != g_main_tid &&
        syscall(SYS_tgkill, getpid(), g_main_tid, sig) == 0) {
        errno = saved;
        return;
    }
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int kind = __atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE);
        if (kind == 1) unlink(g_slots[i].path);
        for (int tries = 0; kind == 2 && tries < 100; tries++) { /* again if another thread added a file */
            remove_under(open(g_slots[i].path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW), 0);
            if (rmdir(g_slots[i].path) == 0 || errno != ENOTEMPTY) break;
        }
    }
    errno = saved;
    signal(sig, SIG_DFL); /* then stop as the signal would have: exit status 128 + sig */
    raise(sig);
}

void zoff_temp_cleanup_on_signals(void) {
    g_main_tid = (pid_t)syscall(SYS_gettid);
    for (size_t i = 0; i < sizeof g_signals / sizeof *g_signals; i++) {
        struct sigaction old;
        if (sigaction(g_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL) continue; /* ignored, or taken */
        struct sigaction sa = {.sa_handler = on_stop};
        sigemptyset(&sa.sa_mask);
        sigaction(g_signals[i], &sa, NULL);
    }
}

static void temp_add(const char *path, int kind) {
    if (!path || strlen(path) >= TEMP_PATH) return; /* best effort: such a path is not removed */
    static bool warned;
    int i = 0;
    pthread_mutex_lock(&g_lock);
    for (; i < TEMP_SLOTS; i++)
        if (!__atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE)) {
            snprintf(g_slots[i].path, TEMP_PATH, "%s", path);
            __atomic_store_n(&g_slots[i].used, kind, __ATOMIC_RELEASE);
            break;
        }
    bool full = i == TEMP_SLOTS && !warned;
    warned = warned || full;
    pthread_mutex_unlock(&g_lock);
    if (full)
        zoff_log(ZOFF_LOG_WARN, "more than %d temporary files at once: if this run is stopped (Ctrl-C), %s and "
                                "those after it stay behind; remove them by hand", TEMP_SLOTS, path);
}

/* mkstemp / mkdtemp, but the name is registered before the file is created: a signal handled
 * by any thread (blocking it in this one would not do) finds it registered once it exists. */
int zoff_temp_create(char *templ, bool dir) {
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t n = strlen(templ);
    if (n < 6 || strcmp(templ + n - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return -1;
    }
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    for (int attempt = 0; attempt < 1000; attempt++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull + __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        for (int i = 0; i < 6; i++) templ[n - 6 + (size_t)i] = abc[(x >> (58 - 6 * i)) % (sizeof abc - 1)];
        temp_add(templ, dir ? 2 : 1);
        int r = dir ? mkdir(templ, 0700) : open(templ, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (r >= 0 || errno != EEXIST) {
            int e = errno;
            if (r < 0) zoff_temp_forget(templ);
            errno = e;
            return r;
        }
        zoff_temp_forget(templ); /* another file's name: try the next one */
    }
    errno = EEXIST;
    return -1;
}

void zoff_temp_register(const char *path) { temp_add(path, 1); }

void zoff_temp_forget(const char *path) {
    if (!path) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (__atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE) && !strcmp(g_slots[i].path, path))
            __atomic_store_n(&g_slots[i].used, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
}
