/* Fault injection for every file zoff writes: checkpoints (through zoff_ckpt_set_io_hook and
 * ZOFF_CKPT_FAULT), token shards and zoff tokenize output, metrics.jsonl (ZOFF_IO_FAULT,
 * include/zoff/iofault.h), plus the host-memory check (include/zoff/resources.h).
 *
 * For each: disk full, I/O errors, short and zero-byte writes, failed fsyncs, at every I/O
 * call of a save. Each must give a clear error naming the file, leave no partial output, and
 * keep the newest complete checkpoint loadable. A "crash" at each I/O point of a save (the
 * directory as it is at that instant) must never show a step_X directory without its COMPLETE
 * marker. The CLI tests run the zoff binary (ZOFF_BINARY) with the faults set in its environment.
 * See docs/reliability.md. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/ckpt.h"
#include "zoff/data.h"
#include "zoff/iofault.h"
#include "zoff/resources.h"

/* ------------------------------------------------------------------ helpers */

static char g_tmp[256];

static int rm_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return type == FTW_DP ? rmdir(p) : unlink(p);
}
static void rmtree(const char *p) {
    if (access(p, F_OK) == 0) nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state) {
    snprintf(g_tmp, sizeof g_tmp, "%s/zoff-faults-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(g_tmp));
    *state = g_tmp;
    zoff_log_set_level(ZOFF_LOG_ERROR);
    return 0;
}
static int teardown(void **state) {
    zoff_ckpt_set_io_hook(NULL, NULL);
    unsetenv("ZOFF_IO_FAULT");
    unsetenv("ZOFF_CKPT_FAULT");
    rmtree(g_tmp);
    return 0;
}

static void path2(char *out, size_t cap, const char *a, const char *b) { snprintf(out, cap, "%s/%s", a, b); }

static bool contains(const char *hay, const char *needle) { return hay && strstr(hay, needle) != NULL; }
#define assert_contains(hay, needle)                                                             \
    do {                                                                                         \
        if (!contains((hay), (needle))) fail_msg("\"%s\" not in: %s", (needle), (hay) ? (hay) : "(null)"); \
    } while (0)

/* Names in dir that contain needle. */
static int count_names(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, needle)) n++;
    closedir(d);
    return n;
}

/* Every DIR/step_<digits> directory (no suffix) has a COMPLETE marker; returns the number of them. */
static int check_all_step_dirs_complete(const char *root) {
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        const char *p = e->d_name + 5;
        while (*p >= '0' && *p <= '9') p++;
        if (*p) continue; /* step_X.tmp-..., step_X.old-...: ignored by readers */
        char m[1024];
        snprintf(m, sizeof m, "%s/%s/COMPLETE", root, e->d_name);
        if (access(m, F_OK) != 0) fail_msg("%s/%s is a step directory without COMPLETE", root, e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* The newest complete checkpoint of root opens, verifies, and is step `want` with our data. */
static void expect_loadable(const char *root, int64_t want) {
    zoff_ckpt_reader *r = NULL;
    zoff_status s = zoff_ckpt_open(root, 0, &r);
    if (s != ZOFF_OK) fail_msg("newest checkpoint of %s does not open: %s", root, zoff_last_error());
    assert_int_equal(zoff_ckpt_reader_step(r), want);
    assert_int_equal(zoff_ckpt_verify(r, NULL), ZOFF_OK);
    float w[3000];
    assert_int_equal(zoff_ckpt_read(r, "w", w, sizeof w), ZOFF_OK);
    for (int i = 0; i < 3000; i++) assert_true(w[i] == (float)(want * 10000 + i));
    zoff_ckpt_close(r);
}

/* A save as `zoff train` does one: tensors, a state vector, a JSON blob; commit, finalize, prune. */
static zoff_status save_step(const char *root, int64_t step, int keep_last) {
    static float w[3000], m[70000];
    for (int i = 0; i < 3000; i++) w[i] = (float)(step * 10000 + i);
    for (int i = 0; i < 70000; i++) m[i] = (float)i * 0.5f;
    zoff_ckpt_writer *wr = NULL;
    zoff_status s = zoff_ckpt_writer_open(root, step, 0, NULL, &wr);
    if (s == ZOFF_OK) s = zoff_ckpt_add(wr, "w", ZOFF_F32, 2, (int64_t[]){30, 100}, w, sizeof w);
    if (s == ZOFF_OK) s = zoff_ckpt_add(wr, "optimizer.exp_avg", ZOFF_F32, 1, (int64_t[]){70000}, m, sizeof m);
    if (s == ZOFF_OK) s = zoff_ckpt_add_blob(wr, "meta", "{\"step\": 1}", 11);
    if (s != ZOFF_OK) {
        zoff_ckpt_abort(wr);
        return s;
    }
    s = zoff_ckpt_commit(wr);
    if (s == ZOFF_OK) s = zoff_ckpt_finalize(root, step, 1, NULL);
    if (s == ZOFF_OK && keep_last > 0) s = zoff_ckpt_prune(root, keep_last);
    return s;
}

/* ------------------------------------------------------------------ checkpoints */

typedef struct ck_fault {
    int call;          /* fail the call with this index (-1: none) */
    int kind;          /* 0 ENOSPC, 1 EIO, 2 zero-byte write (fsync: EIO), 3 short writes (never an error) */
    int calls;         /* calls seen */
    const char *root;  /* crash check: scan this dir at every call */
    int64_t prev;      /* crash check: the newest step before this save */
    int64_t step;      /* ... and the step being saved */
    char failed_path[1024];
    zoff_ckpt_io_op failed_op;
} ck_fault;

static int64_t ck_hook(void *user, zoff_ckpt_io_op op, const char *path, int fd, const void *buf, size_t n,
                       int64_t off) {
    ck_fault *f = user;
    int idx = f->calls++;
    if (f->root) {
        /* a crash at this point would leave the directory as it is now */
        check_all_step_dirs_complete(f->root);
        int64_t latest = -2;
        assert_int_equal(zoff_ckpt_latest(f->root, &latest), ZOFF_OK);
        if (latest != f->prev && latest != f->step)
            fail_msg("at I/O call %d the newest checkpoint is %lld (expected %lld or %lld)", idx, (long long)latest,
                     (long long)f->prev, (long long)f->step);
    }
    if (f->kind == 3 && op == ZOFF_CKPT_IO_WRITE && n > 1) n = n / 2 + 1; /* every write short */
    if (idx == f->call && f->kind != 3) {
        snprintf(f->failed_path, sizeof f->failed_path, "%s", path);
        f->failed_op = op;
        if (op == ZOFF_CKPT_IO_FSYNC) {
            errno = EIO;
            return -1;
        }
        if (f->kind == 2) return 0;
        errno = f->kind == 0 ? ENOSPC : EIO;
        return -1;
    }
    return zoff_ckpt_io_default(op, fd, buf, n, off);
}

/* Simulated crash at every I/O call of saves 1..5 (with pruning to 2): the directory never
 * holds a step dir without COMPLETE, and the newest checkpoint is the previous or the new one. */
static void test_ckpt_crash_at_every_io_point(void **state) {
    char root[512];
    path2(root, sizeof root, *state, "crash");
    ck_fault f = {.call = -1, .root = root, .prev = -1};
    zoff_ckpt_set_io_hook(ck_hook, &f);
    for (int64_t step = 1; step <= 5; step++) {
        f.step = step;
        assert_int_equal(save_step(root, step, 2), ZOFF_OK);
        f.prev = step;
    }
    zoff_ckpt_set_io_hook(NULL, NULL);
    printf("crash points checked: %d I/O calls over 5 saves\n", f.calls);
    assert_true(f.calls >= 5 * 6);
    assert_int_equal(check_all_step_dirs_complete(root), 2);
    expect_loadable(root, 5);
}

/* Every I/O call of a save (writes, fsyncs of the file, the marker, the directories, the
 * prune) fails once, with each kind of fault; short writes are continued. */
static void test_ckpt_fault_at_every_io_call(void **state) {
    char root[512];
    path2(root, sizeof root, *state, "sweep");
    ck_fault probe = {.call = -1};
    assert_int_equal(save_step(root, 1, 0), ZOFF_OK);
    assert_int_equal(save_step(root, 2, 0), ZOFF_OK);
    zoff_ckpt_set_io_hook(ck_hook, &probe);
    assert_int_equal(save_step(root, 3, 2), ZOFF_OK);
    zoff_ckpt_set_io_hook(NULL, NULL);
    const int ncalls = probe.calls;
    assert_true(ncalls >= 6);
    int checked = 0;
    for (int kind = 0; kind < 4; kind++)
        for (int call = 0; call < ncalls; call++) {
            rmtree(root);
            assert_int_equal(save_step(root, 1, 0), ZOFF_OK);
            assert_int_equal(save_step(root, 2, 0), ZOFF_OK);
            ck_fault f = {.call = call, .kind = kind};
            zoff_ckpt_set_io_hook(ck_hook, &f);
            zoff_clear_error();
            zoff_status s = save_step(root, 3, 2);
            zoff_ckpt_set_io_hook(NULL, NULL);
            int64_t latest = -1;
            assert_int_equal(zoff_ckpt_latest(root, &latest), ZOFF_OK);
            if (kind == 3) { /* short writes: the save completes */
                if (s != ZOFF_OK) fail_msg("short writes: %s", zoff_last_error());
                expect_loadable(root, 3);
            } else {
                if (s == ZOFF_OK) fail_msg("kind %d at call %d (%s): the save did not fail", kind, call, f.failed_path);
                const char *m = zoff_last_error();
                assert_int_equal(s, ZOFF_ERR_IO);
                assert_contains(m, root); /* names the file or directory */
                const char *want = f.failed_op == ZOFF_CKPT_IO_FSYNC ? "Input/output error"
                                   : kind == 0                        ? "No space left on device"
                                   : kind == 1                        ? "Input/output error"
                                                                      : "short write";
                assert_contains(m, want);
                /* the newest complete checkpoint: the previous one, or the new one when the
                 * fault hit after its rename (directory fsync, prune) */
                assert_true(latest == 2 || latest == 3);
                expect_loadable(root, latest);
            }
            check_all_step_dirs_complete(root);
            assert_int_equal(count_names(root, ".tmp-") - count_names(root, ".tmp-prune-"), 0);
            checked++;
        }
    printf("checkpoint faults checked: %d (%d I/O calls x 4 kinds)\n", checked, ncalls);
}

/* A temp dir left by a killed save (another pid) is removed by the next successful save;
 * .old- dirs (kept for recovery by hand) are not. */
static void test_ckpt_stale_tmp_removed(void **state) {
    char root[512], p[1024];
    path2(root, sizeof root, *state, "stale");
    assert_int_equal(save_step(root, 1, 0), ZOFF_OK);
    const char *left[] = {"step_00000002.tmp-999999999", "step_00000007.tmp-job3", "step_00000001.old-42"};
    for (int i = 0; i < 3; i++) {
        path2(p, sizeof p, root, left[i]);
        assert_int_equal(mkdir(p, 0755), 0);
        char f[1100];
        path2(f, sizeof f, p, "rank_00000.zckpt");
        FILE *fp = fopen(f, "w");
        assert_non_null(fp);
        fputs("partial", fp);
        fclose(fp);
    }
    int64_t latest;
    assert_int_equal(zoff_ckpt_latest(root, &latest), ZOFF_OK);
    assert_int_equal(latest, 1);
    assert_int_equal(save_step(root, 2, 0), ZOFF_OK);
    assert_int_equal(count_names(root, ".tmp-"), 0);
    assert_int_equal(count_names(root, "step_00000001.old-42"), 1);
    expect_loadable(root, 2);
}

/* ZOFF_CKPT_FAULT (the CLI's injection) at several offsets: the error names the file. */
static void test_ckpt_fault_env(void **state) {
    char root[512];
    path2(root, sizeof root, *state, "env");
    assert_int_equal(save_step(root, 1, 0), ZOFF_OK);
    const char *faults[] = {"ENOSPC@0", "ENOSPC@4096", "EIO@5000", "ENOSPC@20000", "EIO@300000"};
    for (int i = 0; i < 5; i++) {
        setenv("ZOFF_CKPT_FAULT", faults[i], 1);
        zoff_status s = save_step(root, 2, 0);
        unsetenv("ZOFF_CKPT_FAULT");
        assert_int_equal(s, ZOFF_ERR_IO);
        assert_contains(zoff_last_error(), "rank_00000.zckpt");
        assert_contains(zoff_last_error(), strncmp(faults[i], "EIO", 3) ? "No space left" : "Input/output error");
        expect_loadable(root, 1);
        assert_int_equal(count_names(root, ".tmp-"), 0);
    }
}

/* ------------------------------------------------------------------ shards and zoff tokenize */

static void write_shard_ok(const char *path, int64_t n, uint16_t base) {
    uint16_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (uint16_t)((base + i) % 256);
    assert_int_equal(zoff_shard_write(path, t, n, 256), ZOFF_OK);
    free(t);
}

static void expect_shard(const char *path, int64_t n, uint16_t base) {
    zoff_shard *s = NULL;
    if (zoff_shard_open(path, 256, &s) != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_int_equal(zoff_shard_num_tokens(s), n);
    const uint16_t *t = zoff_shard_tokens(s);
    for (int64_t i = 0; i < n; i++) assert_int_equal(t[i], (base + i) % 256);
    zoff_shard_close(s);
}

static void test_shard_write_faults(void **state) {
    char dir[512], path[1024];
    path2(dir, sizeof dir, *state, "shards");
    assert_int_equal(mkdir(dir, 0755), 0);
    path2(path, sizeof path, dir, "data.bin");
    write_shard_ok(path, 5000, 7); /* 11024 bytes, the old content */
    const char *faults[] = {"ENOSPC@0", "EIO@0", "ENOSPC@1", "ENOSPC@1023", "EIO@1024", "ENOSPC@1025", "EIO@6000",
                            "ENOSPC@11023", "ENOSPC@11024:data.bin", "EIO@100:data.bin"};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        setenv("ZOFF_IO_FAULT", faults[i], 1);
        uint16_t t[6000];
        for (int k = 0; k < 6000; k++) t[k] = (uint16_t)(k % 256);
        zoff_status s = zoff_shard_write(path, t, 6000, 256); /* 13024 bytes */
        unsetenv("ZOFF_IO_FAULT");
        if (s != ZOFF_ERR_IO) fail_msg("%s: status %d: %s", faults[i], s, zoff_last_error());
        assert_contains(zoff_last_error(), "data.bin");
        assert_contains(zoff_last_error(), faults[i][0] == 'E' && faults[i][1] == 'I' ? "Input/output error"
                                                                                      : "No space left on device");
        expect_shard(path, 5000, 7); /* untouched */
        assert_int_equal(count_names(dir, ".tmp"), 0); /* no partial file left */
    }
    /* a fault for another file, or past the end: the write succeeds */
    setenv("ZOFF_IO_FAULT", "ENOSPC@0:other.bin", 1);
    write_shard_ok(path, 100, 3);
    setenv("ZOFF_IO_FAULT", "EIO@1224", 1); /* exactly the size of a 100-token shard */
    write_shard_ok(path, 100, 4);
    unsetenv("ZOFF_IO_FAULT");
    expect_shard(path, 100, 4);
}

static void test_tokenize_faults(void **state) {
    char dir[512], text[1024], prefix[1024], trainp[1100], valp[1100];
    path2(dir, sizeof dir, *state, "tok");
    assert_int_equal(mkdir(dir, 0755), 0);
    path2(text, sizeof text, dir, "in.txt");
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < 400; i++) fprintf(f, "line %d of a small corpus for zoff tokenize.\n", i);
    fclose(f);
    path2(prefix, sizeof prefix, dir, "out");
    snprintf(trainp, sizeof trainp, "%s_train.bin", prefix);
    snprintf(valp, sizeof valp, "%s_val.bin", prefix);
    zoff_tokenizer *tok = NULL;
    assert_int_equal(zoff_tokenizer_open_byte(&tok), ZOFF_OK);
    const char *files[1] = {text};
    zoff_tokenize_options o = {.output_prefix = prefix, .val_fraction = 0.1, .quiet = true};
    const char *faults[] = {"ENOSPC@0:_train", "EIO@2000:_train", "ENOSPC@1500:_val", "EIO@0:_val"};
    for (int i = 0; i < 4; i++) {
        zoff_tokenize_result res;
        memset(&res, 0, sizeof res);
        setenv("ZOFF_IO_FAULT", faults[i], 1);
        zoff_status s = zoff_tokenize_files(tok, files, 1, &o, &res);
        unsetenv("ZOFF_IO_FAULT");
        zoff_tokenize_result_free(&res);
        assert_int_equal(s, ZOFF_ERR_IO);
        assert_contains(zoff_last_error(), strstr(faults[i], "_train") ? "out_train" : "out_val");
        assert_int_equal(count_names(dir, "out"), 0); /* nothing new left behind */
    }
    zoff_tokenize_result res;
    memset(&res, 0, sizeof res);
    assert_int_equal(zoff_tokenize_files(tok, files, 1, &o, &res), ZOFF_OK);
    zoff_tokenize_result_free(&res);
    struct stat st;
    assert_int_equal(stat(trainp, &st), 0);
    assert_int_equal(stat(valp, &st), 0);
    zoff_tokenizer_free(tok);
}

/* ------------------------------------------------------------------ host memory */

static void test_host_memory_check(void **state) {
    zoff_host_memory m = {.total = (size_t)16 << 30, .available = (size_t)10 << 30, .cgroup_limit = SIZE_MAX,
                          .cgroup_usage = 0, .as_limit = SIZE_MAX, .vm_size = (size_t)1 << 30,
                          .memlock_limit = (size_t)8 << 20, .locked = 0};
    zoff_host_request rq = {.what = "the optimizer state", .pageable = (size_t)6 << 30, .pinned = (size_t)2 << 30};
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_OK);
    /* more than MemAvailable */
    rq.pageable = (size_t)9 << 30;
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_ERR_NOMEM);
    assert_contains(zoff_last_error(), "the optimizer state");
    assert_contains(zoff_last_error(), "needs 11.00 GiB (9.00 GiB pageable + 2.00 GiB pinned)");
    assert_contains(zoff_last_error(), "only 10.00 GiB is available");
    rq.hint = "offload to NVMe";
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_ERR_NOMEM);
    assert_contains(zoff_last_error(), "offload to NVMe");
    /* a cgroup (container) limit tighter than MemAvailable */
    rq.pageable = (size_t)3 << 30;
    m.cgroup_limit = (size_t)8 << 30;
    m.cgroup_usage = (size_t)4 << 30;
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_ERR_NOMEM);
    assert_contains(zoff_last_error(), "cgroup");
    assert_contains(zoff_last_error(), "allows only 4.00 GiB more");
    m.cgroup_limit = SIZE_MAX;
    /* locked memory: only when the pinned memory is charged to RLIMIT_MEMLOCK */
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_OK);
    rq.pinned_memlock = true;
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_ERR_NOMEM);
    assert_contains(zoff_last_error(), "ulimit -l");
    assert_contains(zoff_last_error(), "8.00 MiB");
    m.memlock_limit = SIZE_MAX;
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_OK);
    /* address space */
    m.as_limit = (size_t)4 << 30;
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_ERR_NOMEM);
    assert_contains(zoff_last_error(), "ulimit -v");
    m.as_limit = SIZE_MAX;
    /* overflowing requests are refused, not wrapped */
    rq.pageable = SIZE_MAX - 10;
    assert_int_equal(zoff_host_memory_check_against(&m, &rq), ZOFF_ERR_NOMEM);

    /* this machine */
    zoff_host_memory here;
    assert_int_equal(zoff_host_memory_query(&here), ZOFF_OK);
    assert_true(here.total > ((size_t)64 << 20) && here.total != SIZE_MAX);
    assert_true(here.available > 0 && here.available <= here.total);
    zoff_host_request small = {.what = "a small buffer", .pageable = 1 << 20};
    assert_int_equal(zoff_host_memory_check(&small), ZOFF_OK);
    zoff_host_request huge = {.what = "a huge buffer", .pageable = (size_t)1 << 60};
    assert_int_equal(zoff_host_memory_check(&huge), ZOFF_ERR_NOMEM);
    setenv("ZOFF_SKIP_MEMORY_CHECK", "1", 1);
    assert_int_equal(zoff_host_memory_check(&huge), ZOFF_OK);
    unsetenv("ZOFF_SKIP_MEMORY_CHECK");
}

/* ------------------------------------------------------------------ the zoff command */

/* Run the zoff binary with extra environment (NAME=VALUE, NULL-terminated), stdout+stderr to
 * out; returns the exit status (128 + signal when killed by a signal). */
static int run_zoff(const char *const *env, const char *out, const char *const *args) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        const char *argv[64];
        int n = 0;
        argv[n++] = ZOFF_BINARY;
        for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(ZOFF_BINARY, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1);
    if (n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) b[0] = 0;
    fclose(f);
    return b;
}

/* Every line of metrics.jsonl is whole: starts with {"step": and ends with }, no inf/nan. */
static int check_metrics_lines(const char *path) {
    char *t = slurp(path);
    int lines = 0;
    for (char *p = t; *p;) {
        char *e = strchr(p, '\n');
        if (!e) fail_msg("%s: last line is unfinished: %s", path, p);
        *e = 0;
        if (strncmp(p, "{\"step\":", 8) != 0 || e[-1] != '}') fail_msg("%s: not a whole line: %s", path, p);
        if (strstr(p, "inf") || strstr(p, "nan")) fail_msg("%s: a number JSON cannot hold: %s", path, p);
        lines++;
        p = e + 1;
    }
    free(t);
    return lines;
}

typedef struct cli_env {
    char dir[512], train[1100], val[1100], out[1100];
} cli_env;

static void cli_setup(cli_env *c, const char *base) {
    path2(c->dir, sizeof c->dir, base, "cli");
    assert_int_equal(mkdir(c->dir, 0755), 0);
    char text[1024], prefix[1024];
    path2(text, sizeof text, c->dir, "corpus.txt");
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < 3000; i++) fprintf(f, "%d: the quick brown fox jumps over the lazy dog; ", i * 7919 % 1000);
    fclose(f);
    path2(prefix, sizeof prefix, c->dir, "corpus");
    zoff_tokenizer *tok = NULL;
    assert_int_equal(zoff_tokenizer_open_byte(&tok), ZOFF_OK);
    const char *files[1] = {text};
    zoff_tokenize_options o = {.output_prefix = prefix, .val_fraction = 0.05, .quiet = true};
    zoff_tokenize_result res;
    memset(&res, 0, sizeof res);
    assert_int_equal(zoff_tokenize_files(tok, files, 1, &o, &res), ZOFF_OK);
    zoff_tokenize_result_free(&res);
    zoff_tokenizer_free(tok);
    snprintf(c->train, sizeof c->train, "%s_train.bin", prefix);
    snprintf(c->val, sizeof c->val, "%s_val.bin", prefix);
    path2(c->out, sizeof c->out, c->dir, "out.txt");
}

#define TINY(c, iters, save)                                                                                        \
    "train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",        \
        "--micro-batch-size", "4", "--tokenizer", "byte", "--data-path", (c)->train, "--val-path", (c)->val,        \
        "--eval-iters", "1", "--quiet", "--save-interval", "1", "--train-iters", iters, "--save", save

/* metrics.jsonl on a full disk / failing device: exit 1 naming the file; the newest
 * checkpoint stays loadable; resuming without the fault completes; every line is whole. */
static void test_cli_metrics_faults(void **state) {
    cli_env c;
    cli_setup(&c, *state);
    const char *faults[] = {"ZOFF_IO_FAULT=ENOSPC@1000:metrics.jsonl", "ZOFF_IO_FAULT=EIO@1500:metrics.jsonl"};
    for (int i = 0; i < 2; i++) {
        char run[1024], mpath[1100];
        snprintf(run, sizeof run, "%s/run%d", c.dir, i);
        snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", run);
        const char *env[] = {faults[i], NULL};
        const char *args[] = {TINY(&c, "8", run), NULL};
        int rc = run_zoff(env, c.out, args);
        char *o = slurp(c.out);
        if (rc != 1) fail_msg("%s: exit %d: %s", faults[i], rc, o);
        assert_contains(o, "metrics.jsonl");
        assert_contains(o, i == 0 ? "No space left on device" : "Input/output error");
        free(o);
        int64_t latest = -1;
        assert_int_equal(zoff_ckpt_latest(run, &latest), ZOFF_OK);
        assert_true(latest >= 1 && latest < 8);
        zoff_ckpt_reader *r = NULL;
        assert_int_equal(zoff_ckpt_open(run, 0, &r), ZOFF_OK);
        assert_int_equal(zoff_ckpt_verify(r, NULL), ZOFF_OK);
        zoff_ckpt_close(r);
        /* the fault left a partial line; resuming cuts it and appends whole lines */
        const char *resume[] = {TINY(&c, "8", run), "--load", run, NULL};
        rc = run_zoff(NULL, c.out, resume);
        o = slurp(c.out);
        if (rc != 0) fail_msg("resume after %s: exit %d: %s", faults[i], rc, o);
        free(o);
        assert_true(check_metrics_lines(mpath) >= 8);
        assert_int_equal(check_all_step_dirs_complete(run), 8);
    }
}

/* A checkpoint write fault in a resumed run: exit 1 naming the .zckpt file; the checkpoint
 * it resumed from stays the newest and loads; no temp dir left. */
static void test_cli_checkpoint_faults(void **state) {
    cli_env c;
    cli_setup(&c, *state);
    char run[1024];
    path2(run, sizeof run, c.dir, "run");
    const char *first[] = {TINY(&c, "3", run), NULL};
    assert_int_equal(run_zoff(NULL, c.out, first), 0);
    const char *faults[] = {"ZOFF_CKPT_FAULT=ENOSPC@0", "ZOFF_CKPT_FAULT=EIO@4096", "ZOFF_CKPT_FAULT=ENOSPC@70000"};
    for (int i = 0; i < 3; i++) {
        const char *env[] = {faults[i], NULL};
        const char *args[] = {TINY(&c, "6", run), "--load", run, NULL};
        int rc = run_zoff(env, c.out, args);
        char *o = slurp(c.out);
        if (rc != 1) fail_msg("%s: exit %d: %s", faults[i], rc, o);
        assert_contains(o, "rank_00000.zckpt");
        assert_contains(o, strstr(faults[i], "EIO") ? "Input/output error" : "No space left on device");
        free(o);
        int64_t latest = -1;
        assert_int_equal(zoff_ckpt_latest(run, &latest), ZOFF_OK);
        assert_int_equal(latest, 3);
        assert_int_equal(count_names(run, ".tmp-"), 0);
        zoff_ckpt_reader *r = NULL;
        assert_int_equal(zoff_ckpt_open(run, 0, &r), ZOFF_OK);
        assert_int_equal(zoff_ckpt_verify(r, NULL), ZOFF_OK);
        zoff_ckpt_close(r);
    }
    const char *resume[] = {TINY(&c, "6", run), "--load", run, NULL};
    assert_int_equal(run_zoff(NULL, c.out, resume), 0);
    assert_int_equal(check_all_step_dirs_complete(run), 6);
}

/* zoff tokenize on a full disk: non-zero exit naming the file, no output files. */
static void test_cli_tokenize_faults(void **state) {
    cli_env c;
    cli_setup(&c, *state);
    char text[1024], prefix[1024];
    path2(text, sizeof text, c.dir, "corpus.txt");
    path2(prefix, sizeof prefix, c.dir, "tk");
    const char *env[] = {"ZOFF_IO_FAULT=ENOSPC@3000:tk_train", NULL};
    const char *args[] = {"tokenize", "--tokenizer", "byte", "--quiet", "--output-prefix", prefix, text, NULL};
    int rc = run_zoff(env, c.out, args);
    char *o = slurp(c.out);
    if (rc == 0 || rc >= 128) fail_msg("exit %d: %s", rc, o);
    assert_contains(o, "tk_train");
    assert_contains(o, "No space left on device");
    free(o);
    assert_int_equal(count_names(c.dir, "tk"), 0);
}

/* fp16 with a loss scale that overflows at once: the skipped steps' grad_norm is not finite;
 * metrics.jsonl writes null (JSON has no inf/nan). */
static void test_cli_metrics_nonfinite(void **state) {
    cli_env c;
    cli_setup(&c, *state);
    char cfg[1024], run[1024], mpath[1100];
    path2(cfg, sizeof cfg, c.dir, "fp16.json");
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"train_micro_batch_size_per_gpu\": 4, \"fp16\": {\"enabled\": true, \"initial_scale_power\": 32}}", f);
    fclose(f);
    path2(run, sizeof run, c.dir, "run");
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", run);
    const char *args[] = {TINY(&c, "3", run), "--config", cfg, NULL};
    int rc = run_zoff(NULL, c.out, args);
    char *o = slurp(c.out);
    if (rc != 0) fail_msg("exit %d: %s", rc, o);
    free(o);
    check_metrics_lines(mpath);
    char *m = slurp(mpath);
    assert_contains(m, "\"grad_norm\":null");
    free(m);
}

/* Checkpoints whose metadata is wrong in ways a CRC cannot catch (written by another tool, or
 * by hand): refused with a message, never a crash. */
static void test_cli_bad_meta(void **state) {
    cli_env c;
    cli_setup(&c, *state);
    char run[1024];
    path2(run, sizeof run, c.dir, "good");
    const char *first[] = {TINY(&c, "2", run), NULL};
    assert_int_equal(run_zoff(NULL, c.out, first), 0);
    zoff_ckpt_reader *r = NULL;
    assert_int_equal(zoff_ckpt_open(run, 0, &r), ZOFF_OK);
    char *meta = NULL;
    assert_int_equal(zoff_ckpt_read_blob(r, "meta", &meta, NULL), ZOFF_OK);
    static const struct {
        const char *from, *to, *says; /* says: in the message, where a particular one is expected */
    } edits[] = {
        {"\"num_layers\": 2", "\"num_layers\": -3", "the checkpoint's model: shape.num_layers is -3"},
        {"\"num_layers\": 2", "\"num_layers\": 4611686018427387904",
         "the checkpoint's model: shape.num_layers is 4611686018427387904"}, /* before any size is computed */
        {"\"hidden_size\": 32", "\"hidden_size\": 0", "the checkpoint's model: shape.hidden_size is 0"},
        {"\"num_heads\": 2", "\"num_heads\": 3", NULL},
        {"\"seq_len\": 16", "\"seq_len\": 0", NULL},
        {"\"seq_len\": 16", "\"seq_len\": 100000", NULL},
        {"\"vocab_size\": 256", "\"vocab_size\": -1", "the checkpoint's model: shape.vocab_size is -1"},
        {"\"tokenizer\": \"byte\"", "\"tokenizer\": \"../../etc/passwd\"", NULL},
        {"\"epoch\": 0", "\"epoch\": 9223372036854775807", NULL},
        {"\"window\": ", "\"window\": -7, \"x\": ", NULL},
        {"\"format\": \"zoff-train-state\"", "\"format\": \"something-else\"", NULL},
        {"\"step\": 2", "\"step\": -5", NULL},
        {"\"step\": 2", "\"step\": \"two\"", NULL},
    };
    int tried = 0;
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char *at = strstr(meta, edits[i].from);
        if (!at) {
            printf("meta has no '%s'; skipped\n", edits[i].from);
            continue;
        }
        char bad[8192];
        snprintf(bad, sizeof bad, "%.*s%s%s", (int)(at - meta), meta, edits[i].to, at + strlen(edits[i].from));
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/bad%zu", c.dir, i);
        /* a valid container (CRCs right) holding the edited metadata and the same tensors */
        zoff_ckpt_writer *w = NULL;
        assert_int_equal(zoff_ckpt_writer_open(dir, 2, 0, NULL, &w), ZOFF_OK);
        for (size_t k = 0; k < zoff_ckpt_num_entries(r); k++) {
            const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, k);
            void *buf = malloc((size_t)e->bytes + 1);
            assert_int_equal(zoff_ckpt_read(r, e->name, buf, (size_t)e->bytes), ZOFF_OK);
            if (!strcmp(e->name, "meta")) assert_int_equal(zoff_ckpt_add_blob(w, "meta", bad, strlen(bad)), ZOFF_OK);
            else if (e->dtype == ZOFF_CKPT_RAW && e->ndim == 0)
                assert_int_equal(zoff_ckpt_add_blob(w, e->name, buf, (size_t)e->bytes), ZOFF_OK);
            else
                assert_int_equal(zoff_ckpt_add(w, e->name, e->dtype, e->ndim, e->shape, buf, (size_t)e->bytes),
                                 ZOFF_OK);
            free(buf);
        }
        assert_int_equal(zoff_ckpt_commit(w), ZOFF_OK);
        assert_int_equal(zoff_ckpt_finalize(dir, 2, 1, NULL), ZOFF_OK);
        char save[1200];
        snprintf(save, sizeof save, "%s/resumed%zu", c.dir, i);
        const char *args[] = {"train", "--data-path", c.train, "--val-path", c.val, "--eval-iters", "1", "--quiet",
                              "--train-iters", "3", "--micro-batch-size", "4", "--load", dir, "--save", save, NULL};
        int rc = run_zoff(NULL, c.out, args);
        char *o = slurp(c.out);
        if (rc != 1 && rc != 2) fail_msg("meta with %s: exit %d (expected a refusal, 1 or 2): %s", edits[i].to, rc, o);
        assert_contains(o, "zoff train");
        if (edits[i].says) assert_contains(o, edits[i].says);
        printf("meta with %s: exit %d: %.200s", edits[i].to, rc, strstr(o, "zoff train"));
        free(o);
        tried++;
    }
    free(meta);
    zoff_ckpt_close(r);
    assert_true(tried >= 8);
}

/* A model that cannot fit in host memory is refused before anything is allocated or written. */
static void test_cli_host_memory(void **state) {
    cli_env c;
    cli_setup(&c, *state);
    char run[1024];
    path2(run, sizeof run, c.dir, "huge");
    const char *args[] = {"train", "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96",
                          "--seq-length", "16", "--micro-batch-size", "1", "--tokenizer", "byte", "--data-path",
                          c.train, "--val-path", c.val, "--quiet", "--train-iters", "1", "--save", run, NULL};
    int rc = run_zoff(NULL, c.out, args);
    char *o = slurp(c.out);
    if (rc != 1) fail_msg("exit %d: %s", rc, o);
    assert_contains(o, "not enough host memory");
    assert_contains(o, "GiB");
    free(o);
    assert_int_equal(access(run, F_OK), -1); /* nothing written */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ckpt_crash_at_every_io_point, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_fault_at_every_io_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_stale_tmp_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_fault_env, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_write_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokenize_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_memory_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_metrics_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_checkpoint_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_tokenize_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_metrics_nonfinite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_bad_meta, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_host_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
