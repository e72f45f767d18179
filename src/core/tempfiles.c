/* Temp files removed when a signal stops the process (include/zoff/core.h, "temp files"). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "zoff/core.h"

enum { TEMP_SLOTS = 32, TEMP_PATH = 4352, TREE_DEPTH = 8 };

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

static void on_stop(int sig) {
    int saved = errno;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int kind = __atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE);
        if (kind == 1) unlink(g_slots[i].path);
        if (kind == 2) {
            remove_under(open(g_slots[i].path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW), 0);
            rmdir(g_slots[i].path);
        }
    }
    errno = saved;
    signal(sig, SIG_DFL); /* then stop as the signal would have: exit status 128 + sig */
    raise(sig);
}

void zoff_temp_cleanup_on_signals(void) {
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
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (!__atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE)) {
            snprintf(g_slots[i].path, TEMP_PATH, "%s", path);
            __atomic_store_n(&g_slots[i].used, kind, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_lock);
}

void zoff_temp_register(const char *path) { temp_add(path, 1); }
void zoff_temp_register_dir(const char *path) { temp_add(path, 2); }

void zoff_temp_forget(const char *path) {
    if (!path) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (__atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE) && !strcmp(g_slots[i].path, path))
            __atomic_store_n(&g_slots[i].used, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
}
