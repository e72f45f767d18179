/* Checkpoint container and directory tests: round trip, latest/resolve, corruption, mismatch
 * messages, abort/overwrite, prune, multi-rank finalize, injected I/O failures. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zoff/ckpt.h"

#include "test_util.h"

/* Set ZOFF_TEST_VERBOSE=1 to print every expected error message. */

/* ------------------------------------------------------------------ helpers */

static int rm_cb(const char *p, const struct stat *sb, int t, struct FTW *f) {
    (void)sb;
    (void)f;
    return (t == FTW_DP || t == FTW_D) ? rmdir(p) : unlink(p);
}
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static int setup(void **state) {
    char *root = malloc(64);
    snprintf(root, 64, "/tmp/zoff_ckpt_test_XXXXXX");
    if (!mkdtemp(root)) return -1;
    *state = root;
    return 0;
}
static int teardown(void **state) {
    zoff_ckpt_set_io_hook(NULL, NULL);
    unsetenv("ZOFF_CKPT_FAULT");
    rm_rf(*state);
    free(*state);
    return 0;
}

/* out = a/b, checked */
static void join(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    assert_true(n > 0 && (size_t)n < cap);
}

static void step_dir(const char *root, int64_t step, char *out, size_t cap) {
    assert_ok(zoff_ckpt_step_path(root, step, out, cap));
}
static void rank_file(const char *root, int64_t step, int rank, char *out, size_t cap) {
    char d[4096];
    step_dir(root, step, d, sizeof d);
    char name[32];
    snprintf(name, sizeof name, "rank_%05d.zckpt", rank);
    join(out, cap, d, name);
}

/* Does root hold any name containing `needle`? */
static bool dir_has(const char *root, const char *needle) {
    DIR *d = opendir(root);
    assert_non_null(d);
    bool found = false;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, needle)) found = true;
    closedir(d);
    return found;
}

static void flip_byte(const char *path, int64_t off) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}
static void put_bytes(const char *path, int64_t off, const void *p, size_t n) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, p, n, off), (ssize_t)n);
    close(fd);
}
static int64_t file_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (int64_t)st.st_size;
}

/* A small checkpoint whose content depends on `seed`. */
#define SMALL_N 300
static void small_weights(float *w, int seed) {
    for (int i = 0; i < SMALL_N; i++) w[i] = (float)(seed * 1000 + i) * 0.5f;
}
static void save_small(const char *root, int64_t step, int seed, const zoff_ckpt_options *opts) {
    zoff_ckpt_writer *w;
    float wt[SMALL_N];
    small_weights(wt, seed);
    int64_t shape[2] = {30, 10};
    char json[64];
    int jn = snprintf(json, sizeof json, "{\"step\": %lld, \"seed\": %d}", (long long)step, seed);
    assert_ok(zoff_ckpt_writer_open(root, step, 0, opts, &w));
    assert_ok(zoff_ckpt_add(w, "h.0.attn.c_attn.weight", ZOFF_F32, 2, shape, wt, sizeof wt));
    assert_ok(zoff_ckpt_add_blob(w, "state.json", json, (size_t)jn));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(root, step, 1, opts));
}
static void check_small(const char *path, int64_t step, int seed) {
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(path, 0, &r));
    assert_int_equal(zoff_ckpt_reader_step(r), step);
    float got[SMALL_N], want[SMALL_N];
    small_weights(want, seed);
    int64_t shape[2] = {30, 10};
    assert_ok(zoff_ckpt_read_tensor(r, "h.0.attn.c_attn.weight", ZOFF_F32, 2, shape, got, sizeof got));
    assert_memory_equal(got, want, sizeof got);
    char *json;
    assert_ok(zoff_ckpt_read_blob(r, "state.json", &json, NULL));
    char expect[64];
    snprintf(expect, sizeof expect, "{\"step\": %lld, \"seed\": %d}", (long long)step, seed);
    assert_string_equal(json, expect);
    free(json);
    zoff_ckpt_close(r);
}

/* ------------------------------------------------------------------ round trip */

static void test_roundtrip_all_dtypes(void **state) {
    const char *root = *state;
    /* f32 > 4096 bytes, bf16, f16, i32, a scalar, an empty tensor, an empty blob, a blob,
     * an entry in pieces larger than the writer's staging buffer, a 127-byte name. */
    enum { NF = 3000, NH = 777, NI = 1234, NBIG = 1500000 };
    float *f = malloc(NF * sizeof *f);
    uint16_t *bf = malloc(NH * 2), *hf = malloc(NH * 2);
    int32_t *iv = malloc(NI * 4);
    float *big = malloc((size_t)NBIG * 4);
    for (int i = 0; i < NF; i++) f[i] = (float)i * 0.25f - 7.0f;
    for (int i = 0; i < NH; i++) {
        bf[i] = zoff_f32_to_bf16((float)i / 3.0f);
        hf[i] = zoff_f32_to_f16((float)-i / 5.0f);
    }
    for (int i = 0; i < NI; i++) iv[i] = i * 7919 - 50000;
    for (int i = 0; i < NBIG; i++) big[i] = (float)(i % 1009) * 1e-3f;
    float scalar = 3.5f;
    const char *blob = "{\"step\": 100, \"loss_scale\": 65536.0, \"config\": \"...\"}";
    char longname[ZOFF_CKPT_MAX_NAME + 1];
    memset(longname, 'n', ZOFF_CKPT_MAX_NAME);
    longname[ZOFF_CKPT_MAX_NAME] = '\0';

    int64_t sf[2] = {60, 50}, sh[1] = {NH}, si[3] = {2, 617, 1}, s0[2] = {0, 768}, sbig[1] = {NBIG};
    zoff_ckpt_writer *w;
    assert_ok(zoff_ckpt_writer_open(root, 100, 0, NULL, &w));
    assert_ok(zoff_ckpt_add(w, "wte.weight", ZOFF_F32, 2, sf, f, NF * sizeof *f));
    assert_ok(zoff_ckpt_add(w, "ln_f.bias.bf16", ZOFF_BF16, 1, sh, bf, NH * 2));
    assert_ok(zoff_ckpt_add(w, "ln_f.bias.f16", ZOFF_F16, 1, sh, hf, NH * 2));
    assert_ok(zoff_ckpt_add(w, "rng.counts", ZOFF_I32, 3, si, iv, NI * 4));
    assert_ok(zoff_ckpt_add(w, "scalar", ZOFF_F32, 0, NULL, &scalar, 4));
    assert_ok(zoff_ckpt_add(w, "empty", ZOFF_F32, 2, s0, NULL, 0));
    assert_ok(zoff_ckpt_add_blob(w, "empty.blob", NULL, 0));
    assert_ok(zoff_ckpt_add_blob(w, "state.json", blob, strlen(blob)));
    assert_ok(zoff_ckpt_begin_entry(w, "optim.m", ZOFF_F32, 1, sbig));
    size_t piece[] = {1, 4095, 4096, (size_t)5 << 20, 100000, 7};
    size_t off = 0, total = (size_t)NBIG * 4;
    for (int k = 0; off < total; k = (k + 1) % 6) {
        size_t n = piece[k] < total - off ? piece[k] : total - off;
        assert_ok(zoff_ckpt_append(w, (const uint8_t *)big + off, n));
        off += n;
    }
    assert_ok(zoff_ckpt_end_entry(w));
    assert_ok(zoff_ckpt_add(w, longname, ZOFF_I32, 1, (int64_t[]){1}, iv, 4));
    assert_ok(zoff_ckpt_commit(w));
    /* not visible before finalize */
    int64_t latest = 0;
    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, -1);
    assert_ok(zoff_ckpt_finalize(root, 100, 1, NULL));
    assert_false(dir_has(root, ".tmp-"));

    zoff_ckpt_reader *r;
    char sd[4096];
    step_dir(root, 100, sd, sizeof sd);
    assert_ok(zoff_ckpt_open(sd, 0, &r));
    assert_int_equal(zoff_ckpt_reader_step(r), 100);
    assert_int_equal(zoff_ckpt_reader_nranks(r), 1);
    assert_non_null(strstr(zoff_ckpt_reader_path(r), "step_00000100/rank_00000.zckpt"));
    assert_int_equal(zoff_ckpt_num_entries(r), 10);
    const char *order[] = {"wte.weight", "ln_f.bias.bf16", "ln_f.bias.f16", "rng.counts", "scalar",
                           "empty",      "empty.blob",     "state.json",    "optim.m"};
    for (size_t i = 0; i < 9; i++) {
        const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, i);
        assert_string_equal(e->name, order[i]);
        assert_int_equal(e->offset % ZOFF_CKPT_ALIGN, 0);
        assert_true(e->offset >= ZOFF_CKPT_ALIGN);
    }
    assert_null(zoff_ckpt_entry_at(r, 10));
    const zoff_ckpt_entry *e = zoff_ckpt_find(r, "rng.counts");
    assert_non_null(e);
    assert_int_equal(e->dtype, ZOFF_I32);
    assert_int_equal(e->ndim, 3);
    assert_int_equal(e->shape[1], 617);
    assert_int_equal(e->bytes, NI * 4);
    assert_null(zoff_ckpt_find(r, "nope"));
    assert_non_null(zoff_ckpt_find(r, longname));
    assert_int_equal(zoff_ckpt_find(r, "state.json")->dtype, ZOFF_CKPT_RAW);

    float *gf = malloc(NF * 4);
    assert_ok(zoff_ckpt_read_tensor(r, "wte.weight", ZOFF_F32, 2, sf, gf, NF * 4));
    assert_memory_equal(gf, f, NF * 4);
    uint16_t *g16 = malloc(NH * 2);
    assert_ok(zoff_ckpt_read_tensor(r, "ln_f.bias.bf16", ZOFF_BF16, 1, sh, g16, NH * 2));
    assert_memory_equal(g16, bf, NH * 2);
    assert_ok(zoff_ckpt_read_tensor(r, "ln_f.bias.f16", ZOFF_F16, 1, sh, g16, NH * 2));
    assert_memory_equal(g16, hf, NH * 2);
    int32_t *gi = malloc(NI * 4);
    assert_ok(zoff_ckpt_read_tensor(r, "rng.counts", ZOFF_I32, 3, si, gi, NI * 4));
    assert_memory_equal(gi, iv, NI * 4);
    float gs = 0;
    assert_ok(zoff_ckpt_read_tensor(r, "scalar", ZOFF_F32, 0, NULL, &gs, 4));
    assert_true(gs == 3.5f);
    assert_ok(zoff_ckpt_read_tensor(r, "empty", ZOFF_F32, 2, s0, NULL, 0));
    char *txt;
    size_t tn = 99;
    assert_ok(zoff_ckpt_read_blob(r, "empty.blob", &txt, &tn));
    assert_int_equal(tn, 0);
    assert_string_equal(txt, "");
    free(txt);
    assert_ok(zoff_ckpt_read_blob(r, "state.json", &txt, &tn));
    assert_int_equal(tn, strlen(blob));
    assert_string_equal(txt, blob);
    free(txt);
    /* streamed back in pieces with read_range */
    float *gb = malloc((size_t)NBIG * 4);
    for (size_t o = 0; o < total;) {
        size_t n = total - o < 999999 ? total - o : 999999;
        assert_ok(zoff_ckpt_read_range(r, "optim.m", (int64_t)o, (uint8_t *)gb + o, n));
        o += n;
    }
    assert_memory_equal(gb, big, total);
    memset(gb, 0, total);
    assert_ok(zoff_ckpt_read(r, "optim.m", gb, total));
    assert_memory_equal(gb, big, total);
    assert_err(zoff_ckpt_read_range(r, "optim.m", (int64_t)total - 4, gb, 8), ZOFF_ERR_INVALID, "outside entry 'optim.m'");
    assert_ok(zoff_ckpt_verify(r, NULL));
    assert_err(zoff_ckpt_read(r, "nope", gb, 4), ZOFF_ERR_FORMAT, "has no entry 'nope'");
    zoff_ckpt_close(r);

    /* the root resolves to the same checkpoint */
    char resolved[4096];
    int64_t step = 0;
    assert_ok(zoff_ckpt_resolve(root, resolved, sizeof resolved, &step));
    assert_int_equal(step, 100);
    assert_string_equal(resolved, sd);
    free(f), free(bf), free(hf), free(iv), free(big), free(gf), free(g16), free(gi), free(gb);
}

static void test_empty_checkpoint(void **state) {
    const char *root = *state;
    zoff_ckpt_writer *w;
    assert_ok(zoff_ckpt_writer_open(root, 0, 0, NULL, &w));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(root, 0, 1, NULL));
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    assert_int_equal(zoff_ckpt_num_entries(r), 0);
    assert_int_equal(zoff_ckpt_reader_step(r), 0);
    zoff_ckpt_close(r);
}

/* ------------------------------------------------------------------ latest / resolve */

static void test_latest_skips_incomplete_and_tmp(void **state) {
    const char *root = *state;
    int64_t latest = 0;
    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, -1);
    assert_err(zoff_ckpt_open(root, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "no complete checkpoint in");
    /* an empty path is said to be empty (before: "checkpoint directory is empty", as if a folder held nothing) */
    assert_err(zoff_ckpt_open("", 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "the checkpoint path is empty ('')");

    save_small(root, 100, 1, NULL);
    save_small(root, 200, 2, NULL);
    /* step 300: files written, never finalized (crash before rename) -> temp dir */
    zoff_ckpt_writer *w;
    assert_ok(zoff_ckpt_writer_open(root, 300, 0, NULL, &w));
    assert_ok(zoff_ckpt_add_blob(w, "x", "abc", 3));
    assert_ok(zoff_ckpt_commit(w));
    /* step 400: renamed but no COMPLETE (crash before the marker) */
    char sd[4096], p[4096];
    save_small(root, 400, 4, NULL);
    step_dir(root, 400, sd, sizeof sd);
    join(p, sizeof p, sd, "COMPLETE");
    assert_int_equal(unlink(p), 0);
    /* junk names are ignored */
    join(p, sizeof p, root, "step_abc");
    assert_int_equal(mkdir(p, 0755), 0);
    join(p, sizeof p, root, "step_500"); /* not our spelling */
    assert_int_equal(mkdir(p, 0755), 0);

    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, 200);
    char trailing[4096];
    join(trailing, sizeof trailing, root, "//");
    assert_ok(zoff_ckpt_latest(trailing, &latest));
    assert_int_equal(latest, 200);
    check_small(root, 200, 2);
    step_dir(root, 100, p, sizeof p);
    check_small(p, 100, 1);
    /* naming the incomplete step directly is an error that says so */
    assert_err(zoff_ckpt_open(sd, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_FORMAT, "is incomplete");
    /* a rank that did not write */
    assert_err(zoff_ckpt_open(root, 1, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "saved by 1 rank(s)");
    /* not a directory */
    join(p, sizeof p, root, "file");
    fclose(fopen(p, "w"));
    assert_err(zoff_ckpt_open(p, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "is not a directory");
    join(p, sizeof p, root, "missing");
    assert_err(zoff_ckpt_open(p, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "cannot open checkpoint"); /* exit 2 */
    assert_err(zoff_ckpt_latest(p, &latest), ZOFF_ERR_IO, "cannot read checkpoint directory");
    /* a step that is not there: the complete ones are listed (not the temp 300, not the unmarked 400) */
    step_dir(root, 150, p, sizeof p);
    assert_err(zoff_ckpt_open(p, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID,
               "No such file or directory; its folder holds complete checkpoints at steps 100, 200");
    assert_string_equal(strstr(zoff_last_error(), "; its"), "; its folder holds complete checkpoints at steps 100, 200");
    join(p, sizeof p, root, "missing/step_00000001");
    assert_err(zoff_ckpt_open(p, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "cannot open checkpoint");
    assert_null(strstr(zoff_last_error(), "its folder"));

    /* the incomplete leftover is replaced by the next save of that step */
    save_small(root, 400, 44, NULL);
    check_small(sd, 400, 44);
    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, 400);
}

/* ------------------------------------------------------------------ corruption */

static void test_corrupt_data_names_entry(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);
    char f[4096];
    rank_file(root, 100, 0, f, sizeof f);
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    const zoff_ckpt_entry *e = zoff_ckpt_find(r, "h.0.attn.c_attn.weight");
    int64_t off = e->offset + 17;
    zoff_ckpt_close(r);
    flip_byte(f, off);
    assert_ok(zoff_ckpt_open(root, 0, &r)); /* the index is fine; the data is checked when read */
    float buf[SMALL_N];
    int64_t shape[2] = {30, 10};
    assert_err(zoff_ckpt_read_tensor(r, "h.0.attn.c_attn.weight", ZOFF_F32, 2, shape, buf, sizeof buf), ZOFF_ERR_FORMAT,
               "checksum mismatch in entry 'h.0.attn.c_attn.weight' of ");
    assert_non_null(strstr(zoff_last_error(), "step_00000100/rank_00000.zckpt: the file is corrupt; use an earlier checkpoint"));
    assert_err(zoff_ckpt_read_range(r, "h.0.attn.c_attn.weight", 0, buf, 8), ZOFF_ERR_FORMAT, "checksum mismatch");
    assert_err(zoff_ckpt_verify(r, NULL), ZOFF_ERR_FORMAT, "'h.0.attn.c_attn.weight'");
    char *json;
    assert_ok(zoff_ckpt_read_blob(r, "state.json", &json, NULL)); /* other entries are still fine */
    free(json);
    zoff_ckpt_close(r);
}

/* Bytes this process has read through read(2)/pread(2) so far (the kernel's count, /proc/self/io rchar). */
/* A field of /proc/self/io: rchar (bytes read through read calls) or read_bytes (bytes the storage layer
 * fetched for this process: page-cache hits do not count, O_DIRECT reads do). */
static int64_t proc_io(const char *field) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128], fmt[64];
    snprintf(fmt, sizeof fmt, "%s: %%lld", field);
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &v) == 1) break;
    fclose(f);
    return v;
}
static int64_t rchar(void) { return proc_io("rchar"); }

/* A checkpoint of step `step` under root holding one entry `name` of nb bytes (nb a multiple of 4) with the
 * bytes of `data`; its rank file's path into f. */
static void one_entry_checkpoint(const char *root, int64_t step, const char *name, const uint8_t *data, size_t nb,
                                 char *f, size_t cap) {
    zoff_ckpt_writer *w;
    int64_t shape[1] = {(int64_t)nb / 4};
    assert_ok(zoff_ckpt_writer_open(root, step, 0, NULL, &w));
    assert_ok(zoff_ckpt_add(w, name, ZOFF_F32, 1, shape, data, nb));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(root, step, 1, NULL));
    rank_file(root, step, 0, f, cap);
}

/* The reader's O_DIRECT path (reader_read): a range whose destination and offset are 4096-aligned is read
 * past the page cache (the test reads the file into the page cache first: only such a read makes the storage
 * layer fetch it again, /proc/self/io read_bytes), its unaligned tail through the page cache; an unaligned
 * destination or offset goes through the page cache whole. The bytes are right either way, in order with the
 * CRC checked and not, and a byte changed in the file through the page cache is seen by the direct read. The
 * storage-layer assertion is skipped where the test directory's filesystem has no O_DIRECT (tmpfs). */
static void test_direct_reads(void **state) {
    const char *root = *state;
    enum { NB = (3 << 20) + 1000 }; /* a 4096-aligned body and a 1000-byte tail */
    uint8_t *data = malloc(NB), *got = aligned_alloc(4096, (NB / 4096 + 2) * 4096); /* (a multiple of the alignment) */
    for (size_t i = 0; i < NB; i++) data[i] = (uint8_t)(i * 2246822519u >> 11);
    char f[4096];
    one_entry_checkpoint(root, 6, "d", data, NB, f, sizeof f);
    int probe = open(f, O_RDONLY | O_DIRECT);
    const bool direct = probe >= 0;
    if (probe >= 0) close(probe);
    if (!direct) print_message("no O_DIRECT on this filesystem: the storage-layer check is skipped\n");
    for (int in_order = 0; in_order < 2; in_order++) {
        int cfd = open(f, O_RDONLY); /* the whole file into the page cache */
        assert_true(cfd >= 0);
        while (read(cfd, got, NB) > 0) {
        }
        close(cfd);
        zoff_ckpt_reader *r;
        assert_ok(zoff_ckpt_open(root, 0, &r));
        zoff_ckpt_reader_verify_in_order(r, in_order);
        /* aligned destination and offset: direct */
        memset(got, 0, NB);
        int64_t b0 = proc_io("read_bytes");
        assert_ok(zoff_ckpt_read_range(r, "d", 0, got, NB));
        int64_t fetched = proc_io("read_bytes") - b0;
        assert_memory_equal(got, data, NB);
        print_message("aligned (in order %d): %lld bytes fetched from storage for %d\n", in_order, (long long)fetched, NB);
        if (direct) assert_true(fetched >= (int64_t)(NB - NB % 4096));
        /* unaligned destination, then unaligned offset: the page cache (the file is in it: nothing fetched) */
        b0 = proc_io("read_bytes");
        assert_ok(zoff_ckpt_read_range(r, "d", 0, got + 1, NB));
        assert_memory_equal(got + 1, data, NB);
        assert_ok(zoff_ckpt_read_range(r, "d", 4100, got, NB - 4100));
        assert_memory_equal(got, data + 4100, NB - 4100);
        fetched = proc_io("read_bytes") - b0;
        print_message("unaligned: %lld bytes fetched from storage\n", (long long)fetched);
        if (direct) assert_true(fetched < (int64_t)(NB / 2));
        zoff_ckpt_close(r);
    }
    /* a byte changed through the page cache (still dirty there: no fsync) is what the direct read returns: the
     * CRC, checked in order over the direct read, catches it (a read of the disk's old bytes would pass) */
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    const int64_t off = zoff_ckpt_find(r, "d")->offset;
    zoff_ckpt_close(r);
    flip_byte(f, off + 8192);
    assert_ok(zoff_ckpt_open(root, 0, &r));
    zoff_ckpt_reader_verify_in_order(r, true);
    assert_err(zoff_ckpt_read_range(r, "d", 0, got, NB), ZOFF_ERR_FORMAT, "checksum mismatch in entry 'd'");
    zoff_ckpt_close(r);
    free(data);
    free(got);
}

/* zoff_ckpt_reader_verify_in_order: an entry read in order is read from the file once (the kernel's byte count:
 * about its size, against twice that without), the data is right, the CRC is compared at its last byte; a
 * corrupt byte is caught by that last read, or, where the reader stopped short or skipped ahead, by
 * zoff_ckpt_verify (which reads what is left), wherever the byte lies. */
static void test_verify_in_order(void **state) {
    const char *root = *state;
    enum { NB = 3 << 20 }; /* 3 MiB, read in four ranges */
    uint8_t *data = malloc(NB), *got = malloc(NB);
    for (size_t i = 0; i < NB; i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    char f[4096];
    one_entry_checkpoint(root, 5, "m", data, NB, f, sizeof f);
    const size_t cut[] = {0, 1000000, 1000000 + 4096, 2500000, NB};
    for (int mode = 0; mode < 2; mode++) { /* 0: checked first (the default), 1: in order */
        zoff_ckpt_reader *r;
        assert_ok(zoff_ckpt_open(root, 0, &r));
        zoff_ckpt_reader_verify_in_order(r, mode == 1);
        memset(got, 0, NB);
        const int64_t r0 = rchar();
        for (int k = 0; k < 4; k++)
            assert_ok(zoff_ckpt_read_range(r, "m", (int64_t)cut[k], got + cut[k], cut[k + 1] - cut[k]));
        const int64_t read = rchar() - r0;
        assert_memory_equal(got, data, NB);
        print_message("verify %s: %lld bytes read for an entry of %d\n", mode ? "in order" : "first", (long long)read, NB);
        if (mode == 0) assert_true(read >= 2 * (int64_t)NB);
        else assert_true(read >= (int64_t)NB && read < (int64_t)NB + 65536);
        assert_ok(zoff_ckpt_verify(r, "m"));
        zoff_ckpt_close(r);
    }
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    const int64_t off = zoff_ckpt_find(r, "m")->offset;
    zoff_ckpt_close(r);
    const int64_t bad[] = {10, 1500000, NB - 1};
    for (int b = 0; b < 3; b++) {
        flip_byte(f, off + bad[b]);
        /* read in order to the end: the last read fails */
        assert_ok(zoff_ckpt_open(root, 0, &r));
        zoff_ckpt_reader_verify_in_order(r, true);
        for (int k = 0; k < 3; k++)
            assert_ok(zoff_ckpt_read_range(r, "m", (int64_t)cut[k], got + cut[k], cut[k + 1] - cut[k]));
        assert_err(zoff_ckpt_read_range(r, "m", (int64_t)cut[3], got + cut[3], NB - cut[3]), ZOFF_ERR_FORMAT,
                   "checksum mismatch in entry 'm'");
        zoff_ckpt_close(r);
        /* only the first range read, then the second skipped over: zoff_ckpt_verify reads the rest and fails */
        assert_ok(zoff_ckpt_open(root, 0, &r));
        zoff_ckpt_reader_verify_in_order(r, true);
        assert_ok(zoff_ckpt_read_range(r, "m", 0, got, cut[1]));
        zoff_status s = zoff_ckpt_read_range(r, "m", (int64_t)cut[2], got, cut[3] - cut[2]);
        assert_true(s == ZOFF_OK);
        assert_err(zoff_ckpt_verify(r, "m"), ZOFF_ERR_FORMAT, "checksum mismatch in entry 'm'");
        zoff_ckpt_close(r);
        flip_byte(f, off + bad[b]); /* restored */
    }
    /* restored: out of order and partial reads verify */
    assert_ok(zoff_ckpt_open(root, 0, &r));
    zoff_ckpt_reader_verify_in_order(r, true);
    assert_ok(zoff_ckpt_read_range(r, "m", (int64_t)cut[2], got, cut[3] - cut[2]));
    assert_memory_equal(got, data + cut[2], cut[3] - cut[2]);
    assert_ok(zoff_ckpt_read_range(r, "m", 0, got, cut[1]));
    assert_memory_equal(got, data, cut[1]);
    assert_ok(zoff_ckpt_verify(r, NULL));
    zoff_ckpt_close(r);
    free(data);
    free(got);
}

static void test_corrupt_header_index_truncated(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);
    char f[4096], backup[4096];
    rank_file(root, 100, 0, f, sizeof f);
    join(backup, sizeof backup, root, "backup");
    int64_t size = file_size(f);
    uint8_t *orig = malloc((size_t)size);
    FILE *fp = fopen(f, "rb");
    assert_int_equal(fread(orig, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
#define RESTORE()                                 \
    do {                                          \
        put_bytes(f, 0, orig, (size_t)size);      \
        assert_int_equal(truncate(f, size), 0);   \
    } while (0)
    zoff_ckpt_reader *r = NULL;

    /* header field (entry_count) */
    flip_byte(f, 40);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "header checksum mismatch in ");
    assert_non_null(strstr(zoff_last_error(), "rank_00000.zckpt"));
    assert_null(r);
    RESTORE();
    /* index record */
    flip_byte(f, size - 256 + 3);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "index checksum mismatch");
    RESTORE();
    /* truncated: lose the tail, or all but a few bytes */
    assert_int_equal(truncate(f, size - 100), 0);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "the file is truncated");
    assert_int_equal(truncate(f, 50), 0);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "too small");
    RESTORE();
    /* trailing garbage */
    put_bytes(f, size, "xx", 2);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "but its header says");
    RESTORE();
    /* wrong magic */
    put_bytes(f, 0, "GGUF", 4);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "is not a zoff checkpoint file");
    RESTORE();
    /* wrong version (newer) -> named before the checksum */
    uint8_t v2[4] = {2, 0, 0, 0};
    put_bytes(f, 8, v2, 4);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "format version 2 but this zoff reads version 1");
    assert_non_null(strstr(zoff_last_error(), "newer zoff"));
    RESTORE();
    /* a valid file again */
    check_small(root, 100, 1);
    /* a missing rank file in a complete checkpoint */
    assert_int_equal(rename(f, backup), 0);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "cannot open checkpoint file");
    assert_int_equal(rename(backup, f), 0);
    /* a malformed COMPLETE marker */
    char m[4096], sd[4096];
    step_dir(root, 100, sd, sizeof sd);
    join(m, sizeof m, sd, "COMPLETE");
    fp = fopen(m, "w");
    fputs("hello\n", fp);
    fclose(fp);
    assert_err(zoff_ckpt_open(root, 0, &r), ZOFF_ERR_FORMAT, "is malformed");
    free(orig);
#undef RESTORE
}

/* A file from another step copied into place is caught by the header's step/rank. */
static void test_mixed_up_files(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);
    save_small(root, 200, 2, NULL);
    char a[4096], b[4096];
    rank_file(root, 100, 0, a, sizeof a);
    rank_file(root, 200, 0, b, sizeof b);
    assert_int_equal(rename(a, b), 0);
    assert_err(zoff_ckpt_open(root, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_FORMAT,
               "says it is rank 0 of step 100, expected rank 0 of step 200");
}

/* ------------------------------------------------------------------ mismatch messages */

static void test_shape_dtype_size_mismatch(void **state) {
    const char *root = *state;
    zoff_ckpt_writer *w;
    int64_t shape[2] = {50304, 8};
    size_t n = 50304 * 8;
    float *data = calloc(n, 4);
    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_ok(zoff_ckpt_add(w, "wte.weight", ZOFF_F32, 2, shape, data, n * 4));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(root, 1, 1, NULL));
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    int64_t model[2] = {50304, 4};
    assert_err(zoff_ckpt_read_tensor(r, "wte.weight", ZOFF_F32, 2, model, data, 50304 * 4 * 4), ZOFF_ERR_INVALID,
               "shape mismatch for 'wte.weight': checkpoint has [50304, 8] but the model has [50304, 4]: was this "
               "checkpoint made with other model flags (--num-layers, --hidden-size");
    int64_t model1[1] = {50304 * 8};
    assert_err(zoff_ckpt_read_tensor(r, "wte.weight", ZOFF_F32, 1, model1, data, n * 4), ZOFF_ERR_INVALID,
               "checkpoint has [50304, 8] but the model has [402432]");
    assert_err(zoff_ckpt_read_tensor(r, "wte.weight", ZOFF_BF16, 2, shape, data, n * 2), ZOFF_ERR_INVALID,
               "dtype mismatch for 'wte.weight': checkpoint has f32 but the model has bf16");
    assert_err(zoff_ckpt_read(r, "wte.weight", data, n * 2), ZOFF_ERR_INVALID,
               "size mismatch for 'wte.weight': checkpoint");
    assert_ok(zoff_ckpt_read_tensor(r, "wte.weight", ZOFF_F32, 2, shape, data, n * 4));
    zoff_ckpt_close(r);
    free(data);
}

static void test_writer_argument_errors(void **state) {
    const char *root = *state;
    zoff_ckpt_writer *w;
    int64_t shape[1] = {4};
    float x[4] = {0};
    char name[200];
    memset(name, 'a', 128);
    name[128] = '\0';
    /* each error kills the writer and removes its temp dir; abort then frees it */
    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_err(zoff_ckpt_add(w, name, ZOFF_F32, 1, shape, x, 16), ZOFF_ERR_INVALID, "is 128 bytes long; the limit is 127");
    assert_err(zoff_ckpt_add(w, "ok", ZOFF_F32, 1, shape, x, 16), ZOFF_ERR_INVALID, "already failed");
    zoff_ckpt_abort(w);
    assert_false(dir_has(root, "step_"));

    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_err(zoff_ckpt_add(w, "x", ZOFF_F32, 1, shape, x, 12), ZOFF_ERR_INVALID,
               "shape [4] of f32 is 16 bytes but 12 bytes were given");
    assert_false(dir_has(root, "step_"));
    zoff_ckpt_abort(w);

    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_ok(zoff_ckpt_add(w, "x", ZOFF_F32, 1, shape, x, 16));
    assert_err(zoff_ckpt_add(w, "x", ZOFF_F32, 1, shape, x, 16), ZOFF_ERR_INVALID, "'x' was added twice");
    zoff_ckpt_abort(w);

    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_err(zoff_ckpt_add(w, "x", (zoff_dtype)7, 1, shape, x, 16), ZOFF_ERR_INVALID, "invalid dtype 7");
    zoff_ckpt_abort(w);

    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_ok(zoff_ckpt_begin_entry(w, "m", ZOFF_F32, 1, shape));
    assert_ok(zoff_ckpt_append(w, x, 8));
    assert_err(zoff_ckpt_end_entry(w), ZOFF_ERR_INVALID, "8 bytes were appended but its shape [4] of f32 needs 16");
    zoff_ckpt_abort(w);

    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_ok(zoff_ckpt_begin_entry(w, "m", ZOFF_F32, 1, shape));
    assert_err(zoff_ckpt_append(w, x, 20), ZOFF_ERR_INVALID, "more than its shape [4] of f32 holds");
    zoff_ckpt_abort(w);

    assert_ok(zoff_ckpt_writer_open(root, 1, 0, NULL, &w));
    assert_ok(zoff_ckpt_begin_entry(w, "m", ZOFF_F32, 1, shape));
    assert_err(zoff_ckpt_commit(w), ZOFF_ERR_INVALID, "was begun but never ended");
    assert_false(dir_has(root, "step_"));

    assert_err(zoff_ckpt_writer_open(root, -1, 0, NULL, &w), ZOFF_ERR_INVALID, "step must be >= 0");
    zoff_ckpt_options bad = {.tmp_tag = "../x"};
    assert_err(zoff_ckpt_writer_open(root, 1, 0, &bad, &w), ZOFF_ERR_INVALID, "may only contain");
    assert_false(dir_has(root, "step_"));
    assert_err(zoff_ckpt_finalize(root, 5, 1, NULL), ZOFF_ERR_IO, "does not exist");
}

/* ------------------------------------------------------------------ abort, overwrite, prune */

static void test_abort_keeps_previous(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);
    zoff_ckpt_writer *w;
    float big[4000] = {0};
    assert_ok(zoff_ckpt_writer_open(root, 200, 0, NULL, &w));
    assert_ok(zoff_ckpt_add(w, "a", ZOFF_F32, 1, (int64_t[]){4000}, big, sizeof big));
    assert_true(dir_has(root, ".tmp-"));
    zoff_ckpt_abort(w);
    assert_false(dir_has(root, ".tmp-"));
    assert_false(dir_has(root, "step_00000200"));
    int64_t latest;
    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, 100);
    check_small(root, 100, 1);
    zoff_ckpt_abort(NULL);

    /* same-step save into a complete checkpoint: refused at open, and at finalize */
    assert_err(zoff_ckpt_writer_open(root, 100, 0, NULL, &w), ZOFF_ERR_INVALID, "already exists and is complete");
    assert_false(dir_has(root, ".tmp-"));
    zoff_ckpt_options ow = {.overwrite = true};
    assert_ok(zoff_ckpt_writer_open(root, 100, 0, &ow, &w));
    assert_ok(zoff_ckpt_commit(w));
    assert_err(zoff_ckpt_finalize(root, 100, 1, NULL), ZOFF_ERR_INVALID, "refusing to overwrite");
    assert_false(dir_has(root, ".tmp-"));
    check_small(root, 100, 1);
    /* with overwrite it is replaced, and nothing is left aside */
    save_small(root, 100, 9, &ow);
    check_small(root, 100, 9);
    assert_false(dir_has(root, ".old-"));
    assert_false(dir_has(root, ".tmp-"));
}

static void test_prune(void **state) {
    const char *root = *state;
    for (int s = 1; s <= 5; s++) save_small(root, s * 10, s, NULL);
    /* an incomplete dir and a temp dir are left alone */
    char p[4096];
    join(p, sizeof p, root, "step_00000005");
    assert_int_equal(mkdir(p, 0755), 0);
    join(p, sizeof p, root, "step_00000060.tmp-123");
    assert_int_equal(mkdir(p, 0755), 0);
    assert_err(zoff_ckpt_prune(root, 0), ZOFF_ERR_INVALID, "keep_last must be >= 1");
    assert_ok(zoff_ckpt_prune(root, 10)); /* fewer than keep_last: nothing to do */
    assert_true(dir_has(root, "step_00000010"));
    assert_ok(zoff_ckpt_prune(root, 2));
    for (int s = 1; s <= 3; s++) {
        char name[32];
        snprintf(name, sizeof name, "step_%08d", s * 10);
        assert_false(dir_has(root, name));
    }
    check_small(root, 50, 5);
    step_dir(root, 40, p, sizeof p);
    check_small(p, 40, 4);
    assert_true(dir_has(root, "step_00000005"));
    assert_true(dir_has(root, "step_00000060.tmp-123"));
    assert_ok(zoff_ckpt_prune(root, 1));
    assert_false(dir_has(root, "step_00000040"));
    check_small(root, 50, 5);
    /* many complete steps: a missing one's error lists the newest eight */
    for (int s = 6; s <= 14; s++) save_small(root, s * 10, s, NULL);
    step_dir(root, 33, p, sizeof p);
    assert_err(zoff_ckpt_open(p, 0, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID, "cannot open checkpoint");
    assert_string_equal(strstr(zoff_last_error(), "; its"),
                        "; its folder holds complete checkpoints at steps ..., 70, 80, 90, 100, 110, 120, 130, 140");
}

/* ------------------------------------------------------------------ several ranks */

static void test_multi_rank_finalize(void **state) {
    const char *root = *state;
    zoff_ckpt_options o = {.tmp_tag = "job42"};
    for (int rank = 0; rank < 3; rank++) {
        zoff_ckpt_writer *w;
        int32_t v = 1000 + rank;
        assert_ok(zoff_ckpt_writer_open(root, 7, rank, &o, &w));
        assert_ok(zoff_ckpt_add(w, "rank", ZOFF_I32, 0, NULL, &v, 4));
        assert_ok(zoff_ckpt_commit(w));
    }
    assert_true(dir_has(root, "step_00000007.tmp-job42"));
    /* finalize with the wrong count: too few is caught, and the temp dir goes away */
    assert_err(zoff_ckpt_finalize(root, 7, 2, &o), ZOFF_ERR_INVALID, "it also holds");
    assert_false(dir_has(root, "step_00000007"));

    for (int rank = 0; rank < 3; rank++) {
        zoff_ckpt_writer *w;
        int32_t v = 1000 + rank;
        assert_ok(zoff_ckpt_writer_open(root, 7, rank, &o, &w));
        assert_ok(zoff_ckpt_add(w, "rank", ZOFF_I32, 0, NULL, &v, 4));
        assert_ok(zoff_ckpt_commit(w));
    }
    assert_err(zoff_ckpt_finalize(root, 7, 4, &o), ZOFF_ERR_IO, "rank_00003.zckpt");
    assert_false(dir_has(root, "step_00000007"));

    for (int rank = 0; rank < 3; rank++) {
        zoff_ckpt_writer *w;
        int32_t v = 1000 + rank;
        assert_ok(zoff_ckpt_writer_open(root, 7, rank, &o, &w));
        assert_ok(zoff_ckpt_add(w, "rank", ZOFF_I32, 0, NULL, &v, 4));
        assert_ok(zoff_ckpt_commit(w));
    }
    assert_ok(zoff_ckpt_finalize(root, 7, 3, &o));
    for (int rank = 0; rank < 3; rank++) {
        zoff_ckpt_reader *r;
        int32_t v = 0;
        assert_ok(zoff_ckpt_open(root, rank, &r));
        assert_int_equal(zoff_ckpt_reader_nranks(r), 3);
        assert_ok(zoff_ckpt_read_tensor(r, "rank", ZOFF_I32, 0, NULL, &v, 4));
        assert_int_equal(v, 1000 + rank);
        zoff_ckpt_close(r);
    }
    assert_err(zoff_ckpt_open(root, 3, &(zoff_ckpt_reader *){NULL}), ZOFF_ERR_INVALID,
               "saved by 3 rank(s) and has no file for rank 3");

    /* one rank aborts: discard removes what the others wrote */
    zoff_ckpt_writer *w;
    assert_ok(zoff_ckpt_writer_open(root, 8, 0, &o, &w));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_writer_open(root, 8, 1, &o, &w));
    zoff_ckpt_abort(w);
    assert_true(dir_has(root, "step_00000008.tmp-job42"));
    assert_ok(zoff_ckpt_discard(root, 8, &o));
    assert_false(dir_has(root, "step_00000008"));
}

/* ------------------------------------------------------------------ injected I/O failures */

typedef struct fault {
    const char *path_needle; /* only files whose path contains this */
    zoff_ckpt_io_op op;
    int64_t fail_at;  /* WRITE: fail writes reaching this offset (after a short write up to it) */
    int err;
    int max_chunk;    /* >0: every write is short, at most this many bytes */
    bool zero;        /* WRITE returns 0 */
    bool suffix;      /* match paths that end with path_needle (instead of containing it) */
    int hits;
} fault;

static int64_t hook(void *user, zoff_ckpt_io_op op, const char *path, int fd, const void *buf, size_t n, int64_t off) {
    fault *f = user;
    size_t pl = strlen(path), nl = strlen(f->path_needle);
    bool match = f->suffix ? (pl >= nl && strcmp(path + pl - nl, f->path_needle) == 0) : strstr(path, f->path_needle) != NULL;
    if (match && op == f->op) {
        if (op == ZOFF_CKPT_IO_FSYNC) {
            f->hits++;
            errno = f->err;
            return -1;
        }
        if (f->zero) {
            f->hits++;
            return 0;
        }
        if (f->max_chunk > 0 && n > (size_t)f->max_chunk) n = (size_t)f->max_chunk;
        if (f->fail_at >= 0 && off + (int64_t)n > f->fail_at) {
            f->hits++;
            if (off < f->fail_at) n = (size_t)(f->fail_at - off); /* short write first */
            else {
                errno = f->err;
                return -1;
            }
        }
    }
    return zoff_ckpt_io_default(op, fd, buf, n, off);
}

/* Write step 200 (entries of 40000 bytes) under the hook; return the status of the first failure. */
static zoff_status save_under_fault(const char *root, fault *f) {
    zoff_ckpt_set_io_hook(hook, f);
    zoff_ckpt_writer *w;
    static float big[10000];
    zoff_status st = zoff_ckpt_writer_open(root, 200, 0, NULL, &w);
    for (int i = 0; i < 3 && st == ZOFF_OK; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        st = zoff_ckpt_add(w, name, ZOFF_F32, 1, (int64_t[]){10000}, big, sizeof big);
    }
    if (st == ZOFF_OK) st = zoff_ckpt_commit(w);
    else zoff_ckpt_abort(w);
    if (st == ZOFF_OK) st = zoff_ckpt_finalize(root, 200, 1, NULL);
    zoff_ckpt_set_io_hook(NULL, NULL);
    return st;
}

static void expect_previous_intact(const char *root) {
    assert_false(dir_has(root, ".tmp-"));
    assert_false(dir_has(root, "step_00000200"));
    int64_t latest;
    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, 100);
    check_small(root, 100, 1);
}

static void test_injected_write_failures(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);

    fault enospc = {.path_needle = "step_00000200", .op = ZOFF_CKPT_IO_WRITE, .fail_at = 50000, .err = ENOSPC};
    assert_err(save_under_fault(root, &enospc), ZOFF_ERR_IO, "cannot write checkpoint file ");
    const char *msg = zoff_last_error();
    assert_non_null(strstr(msg, "step_00000200.tmp-"));
    assert_non_null(strstr(msg, "rank_00000.zckpt at offset 50000"));
    assert_non_null(strstr(msg, "No space left on device"));
    assert_non_null(strstr(msg, "earlier checkpoints in"));
    assert_true(enospc.hits > 0);
    expect_previous_intact(root);

    /* failure in the index / header at commit */
    fault late = {.path_needle = "step_00000200", .op = ZOFF_CKPT_IO_WRITE, .fail_at = 3 * 40960 + 4096, .err = EIO};
    assert_err(save_under_fault(root, &late), ZOFF_ERR_IO, "Input/output error");
    expect_previous_intact(root);

    fault fs = {.path_needle = "rank_00000.zckpt", .op = ZOFF_CKPT_IO_FSYNC, .fail_at = -1, .err = EIO};
    assert_err(save_under_fault(root, &fs), ZOFF_ERR_IO, "cannot fsync ");
    expect_previous_intact(root);

    /* the COMPLETE marker (in the temp dir) cannot be written: the temp dir is removed */
    fault marker = {.path_needle = "COMPLETE", .op = ZOFF_CKPT_IO_WRITE, .fail_at = 0, .err = ENOSPC};
    assert_err(save_under_fault(root, &marker), ZOFF_ERR_IO, "COMPLETE");
    expect_previous_intact(root);

    /* fsync of the temp directory (holding the marker) before the rename */
    char tmpname[64];
    snprintf(tmpname, sizeof tmpname, "/step_00000200.tmp-%ld", (long)getpid());
    fault dirsync = {.path_needle = tmpname, .op = ZOFF_CKPT_IO_FSYNC, .fail_at = -1, .err = EIO, .suffix = true};
    assert_err(save_under_fault(root, &dirsync), ZOFF_ERR_IO, "cannot fsync");
    assert_int_equal(dirsync.hits, 1);
    expect_previous_intact(root);
    /* fsync of the parent directory after the rename */
    fault parentsync = {.path_needle = root, .op = ZOFF_CKPT_IO_FSYNC, .fail_at = -1, .err = EIO, .suffix = true};
    assert_err(save_under_fault(root, &parentsync), ZOFF_ERR_IO, "cannot fsync");
    assert_true(parentsync.hits >= 1);
    expect_previous_intact(root);
    fault markersync = {.path_needle = "/COMPLETE", .op = ZOFF_CKPT_IO_FSYNC, .fail_at = -1, .err = EIO, .suffix = true};
    assert_err(save_under_fault(root, &markersync), ZOFF_ERR_IO, "cannot fsync");
    assert_int_equal(markersync.hits, 1);
    expect_previous_intact(root);

    fault zero = {.path_needle = "step_00000200", .op = ZOFF_CKPT_IO_WRITE, .fail_at = -1, .zero = true};
    assert_err(save_under_fault(root, &zero), ZOFF_ERR_IO, "short write to checkpoint file ");
    expect_previous_intact(root);

    /* short (partial) writes are continued: the checkpoint is fine */
    fault shorty = {.path_needle = "step_00000200", .op = ZOFF_CKPT_IO_WRITE, .fail_at = -1, .max_chunk = 1000};
    assert_ok(save_under_fault(root, &shorty));
    zoff_ckpt_reader *r;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    assert_int_equal(zoff_ckpt_reader_step(r), 200);
    assert_ok(zoff_ckpt_verify(r, NULL));
    zoff_ckpt_close(r);
}

static void test_fault_env(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);
    setenv("ZOFF_CKPT_FAULT", "ENOSPC@8192", 1);
    fault none = {.path_needle = "\x01", .fail_at = -1};
    assert_err(save_under_fault(root, &none), ZOFF_ERR_IO, "at offset 8192");
    assert_non_null(strstr(zoff_last_error(), "No space left on device"));
    expect_previous_intact(root);
    setenv("ZOFF_CKPT_FAULT", "bogus", 1);
    zoff_ckpt_writer *w;
    assert_err(zoff_ckpt_writer_open(root, 300, 0, NULL, &w), ZOFF_ERR_INVALID, "ZOFF_CKPT_FAULT='bogus' is invalid");
    unsetenv("ZOFF_CKPT_FAULT");
    expect_previous_intact(root);
}

/* ------------------------------------------------------------------ the aio / O_DIRECT writer */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(mix64(seed + i / 8) >> (8 * (i % 8)));
}

/* Entries of sizes that are not multiples of the alignment, one crossing the writer's pieces,
 * one appended in place (zoff_ckpt_append_space / _done) in uneven slices. */
enum { DX_BIG = (8 << 20) / 4 + 1001, DX_INPLACE = 3 * 1024 * 1024 + 3, DX_ODD = 4097 };
static void write_direct_case(const char *root, uint8_t *big, uint8_t *inplace, uint8_t *odd, char *io, size_t iocap) {
    zoff_ckpt_writer *w = NULL;
    assert_ok(zoff_ckpt_writer_open(root, 7, 0, NULL, &w));
    snprintf(io, iocap, "%s", zoff_ckpt_writer_io(w));
    float three[3] = {1.5f, -2.0f, 3.25f};
    assert_ok(zoff_ckpt_add(w, "three", ZOFF_F32, 1, (int64_t[]){3}, three, sizeof three));
    assert_ok(zoff_ckpt_add(w, "big", ZOFF_F32, 2, (int64_t[]){DX_BIG, 1}, big, (size_t)DX_BIG * 4));
    assert_ok(zoff_ckpt_begin_entry(w, "inplace", ZOFF_F32, 1, (int64_t[]){DX_INPLACE}));
    size_t done = 0, total = (size_t)DX_INPLACE * 4, k = 0;
    while (done < total) {
        void *dst = NULL;
        size_t cap = 0;
        assert_ok(zoff_ckpt_append_space(w, &dst, &cap));
        assert_true(cap > 0 && cap % 4 == 0 && cap <= total - done);
        assert_true((uintptr_t)dst % 4 == 0);
        size_t want = (size_t)(mix64(k++) % 300000) * 4 + 4, c = want < cap ? want : cap;
        memcpy(dst, inplace + done, c);
        assert_ok(zoff_ckpt_append_done(w, c));
        done += c;
    }
    void *dst = NULL;
    size_t cap = 1;
    assert_ok(zoff_ckpt_append_space(w, &dst, &cap));
    assert_int_equal(cap, 0); /* the shape is full */
    assert_ok(zoff_ckpt_end_entry(w));
    assert_ok(zoff_ckpt_add_blob(w, "odd", odd, DX_ODD));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(root, 7, 1, NULL));
}

static void read_direct_case(const char *root, const uint8_t *big, const uint8_t *inplace, const uint8_t *odd) {
    zoff_ckpt_reader *r = NULL;
    assert_ok(zoff_ckpt_open(root, 0, &r));
    assert_ok(zoff_ckpt_verify(r, NULL));
    assert_int_equal(zoff_ckpt_num_entries(r), 4);
    float three[3];
    assert_ok(zoff_ckpt_read(r, "three", three, sizeof three));
    assert_true(three[0] == 1.5f && three[1] == -2.0f && three[2] == 3.25f);
    uint8_t *got = malloc((size_t)DX_INPLACE * 4); /* the largest */
    assert_ok(zoff_ckpt_read(r, "big", got, (size_t)DX_BIG * 4));
    assert_memory_equal(got, big, (size_t)DX_BIG * 4);
    assert_ok(zoff_ckpt_read(r, "inplace", got, (size_t)DX_INPLACE * 4));
    assert_memory_equal(got, inplace, (size_t)DX_INPLACE * 4);
    assert_ok(zoff_ckpt_read(r, "odd", got, DX_ODD));
    assert_memory_equal(got, odd, DX_ODD);
    /* the file is exactly as long as its index ends (the padded last piece was cut back) */
    const zoff_ckpt_entry *last = zoff_ckpt_entry_at(r, 0);
    int64_t data_end = 0;
    for (size_t i = 0; i < zoff_ckpt_num_entries(r); i++) {
        last = zoff_ckpt_entry_at(r, i);
        assert_int_equal(last->offset % ZOFF_CKPT_ALIGN, 0);
        if (last->offset + last->bytes > data_end) data_end = last->offset + last->bytes;
    }
    struct stat st;
    assert_int_equal(stat(zoff_ckpt_reader_path(r), &st), 0);
    int64_t index_at = (data_end + ZOFF_CKPT_ALIGN - 1) / ZOFF_CKPT_ALIGN * ZOFF_CKPT_ALIGN;
    assert_int_equal((int64_t)st.st_size, index_at + 4 * 256);
    zoff_ckpt_close(r);
    free(got);
}

/* A checkpoint written through src/aio (O_DIRECT where the file system allows) reads back
 * bit-exactly, with zoff's reader and with the independent Python one (scripts/zckpt.py), and
 * is byte for byte the file the pwrite path (ZOFF_CKPT_IO=buffered) writes. */
static void test_direct_writer_roundtrip(void **state) {
    const char *root = *state;
    uint8_t *big = malloc((size_t)DX_BIG * 4), *inplace = malloc((size_t)DX_INPLACE * 4), odd[DX_ODD];
    fill_bytes(big, (size_t)DX_BIG * 4, 1);
    fill_bytes(inplace, (size_t)DX_INPLACE * 4, 2);
    fill_bytes(odd, DX_ODD, 3);
    char a[4096], b[4096], io[512], iob[512];
    join(a, sizeof a, root, "aio");
    join(b, sizeof b, root, "buffered");
    write_direct_case(a, big, inplace, odd, io, sizeof io);
    printf("aio writer: %s\n", io);
    assert_null(strstr(io, "pwrite from")); /* the aio engine (io_uring or its thread pool) was used */
    /* on io_uring, through its three 8 MiB pieces registered as fixed buffers (or the kernel's reason why not) */
    if (strstr(io, "io_uring"))
        assert_true(strstr(io, "3 registered buffers of 24.00 MiB") || strstr(io, "not registered"));
    read_direct_case(a, big, inplace, odd);
    setenv("ZOFF_CKPT_IO", "buffered", 1);
    write_direct_case(b, big, inplace, odd, iob, sizeof iob);
    unsetenv("ZOFF_CKPT_IO");
    assert_non_null(strstr(iob, "ZOFF_CKPT_IO=buffered"));
    read_direct_case(b, big, inplace, odd);
    char fa[4096], fb[4096], cmd[9000];
    rank_file(a, 7, 0, fa, sizeof fa);
    rank_file(b, 7, 0, fb, sizeof fb);
    snprintf(cmd, sizeof cmd, "cmp %s %s", fa, fb);
    assert_int_equal(system(cmd), 0);
    if (system("python3 -c 'import struct' >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd, "python3 %s/../scripts/zckpt.py verify %s >/dev/null", ZOFF_TEST_DIR, a);
        assert_int_equal(system(cmd), 0);
    } else {
        printf("python3 not found: scripts/zckpt.py not run\n");
    }
    setenv("ZOFF_CKPT_IO", "fast", 1);
    zoff_ckpt_writer *w = NULL;
    assert_err(zoff_ckpt_writer_open(root, 8, 0, NULL, &w), ZOFF_ERR_INVALID, "ZOFF_CKPT_IO='fast' is invalid");
    unsetenv("ZOFF_CKPT_IO");
    free(big);
    free(inplace);
}

/* zoff_ckpt_append_external: aligned memory at an aligned position goes to the disk in place
 * (zoff_ckpt_writer_in_place counts it), anything else is copied; either way the file is byte for
 * byte zoff_ckpt_add's of the same bytes, and every release comes exactly once with its pointer (by
 * commit, or by abort). With ZOFF_CKPT_IO=buffered (no aio) everything is copied. */
enum { EXT_SMALL = ZOFF_CKPT_EXTERNAL_IN_FLIGHT + 2, EXT_LOG = EXT_SMALL + 8 }; /* 64 KiB runs: more than in flight */
typedef struct ext_log {
    int n;
    const void *seen[EXT_LOG];
} ext_log;
static void ext_release(void *ctx, const void *data) {
    ext_log *l = ctx;
    if (l->n < EXT_LOG) l->seen[l->n] = data;
    l->n++;
}
enum { EXT_MIB = 1 << 20, EXT_TOTAL = 10 * EXT_MIB + 4096 + EXT_SMALL * 65536 + 12 };
static void write_external_case(const char *root, const uint8_t *src, bool external, int64_t *in_place, ext_log *l) {
    zoff_ckpt_writer *w = NULL;
    assert_ok(zoff_ckpt_writer_open(root, 9, 0, NULL, &w));
    assert_ok(zoff_ckpt_add_blob(w, "first", "abc", 3));
    if (!external) {
        assert_ok(zoff_ckpt_add(w, "e", ZOFF_F32, 1, (int64_t[]){EXT_TOTAL / 4}, src, EXT_TOTAL));
    } else {
        assert_ok(zoff_ckpt_begin_entry(w, "e", ZOFF_F32, 1, (int64_t[]){EXT_TOTAL / 4}));
        size_t at = 0;
        const void *want[EXT_LOG];
        int nw = 0;
#define EXT(len)                                                                              \
    do {                                                                                      \
        want[nw++] = src + at;                                                                \
        assert_ok(zoff_ckpt_append_external(w, src + at, (len), ext_release, l));             \
        at += (len);                                                                          \
    } while (0)
        EXT(EXT_MIB);                              /* in place: the entry starts aligned */
        assert_ok(zoff_ckpt_append(w, src + at, 100)); /* copied: the position is no longer aligned */
        at += 100;
        EXT(4096 - 100);                           /* copied (unaligned memory and size), the position aligned again */
        EXT(9 * EXT_MIB);                          /* in place, more than one piece */
        for (int k = 0; k < EXT_SMALL; k++) EXT(65536); /* in place, more than the writer keeps in flight */
        EXT(12);                                   /* copied: the tail */
#undef EXT
        assert_int_equal(at, EXT_TOTAL);
        *in_place = zoff_ckpt_writer_in_place(w);
        assert_ok(zoff_ckpt_end_entry(w));
        assert_ok(zoff_ckpt_add_blob(w, "last", "xyz", 3));
        assert_ok(zoff_ckpt_commit(w));
        assert_int_equal(l->n, nw); /* each released once, with its own pointer */
        for (int k = 0; k < nw; k++) {
            int found = 0;
            for (int q = 0; q < l->n; q++) found += l->seen[q] == want[k];
            assert_int_equal(found, 1);
        }
        assert_ok(zoff_ckpt_finalize(root, 9, 1, NULL));
        return;
    }
    assert_ok(zoff_ckpt_add_blob(w, "last", "xyz", 3));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(root, 9, 1, NULL));
}

static void test_append_external(void **state) {
    const char *root = *state;
    uint8_t *src = aligned_alloc(4096, (size_t)EXT_TOTAL / 4096 * 4096 + 4096);
    fill_bytes(src, EXT_TOTAL, 5);
    char ref[4096], ext[4096], buf[4096], fr[4096], fe[4096], fb[4096], cmd[4 * 4096 + 64];
    join(ref, sizeof ref, root, "ref");
    join(ext, sizeof ext, root, "ext");
    join(buf, sizeof buf, root, "buffered");
    int64_t in_place = -1;
    ext_log l = {0};
    write_external_case(ref, src, false, NULL, NULL);
    write_external_case(ext, src, true, &in_place, &l);
    assert_int_equal(in_place, 10 * EXT_MIB + EXT_SMALL * 65536);
    setenv("ZOFF_CKPT_IO", "buffered", 1);
    ext_log lb = {0};
    write_external_case(buf, src, true, &in_place, &lb);
    unsetenv("ZOFF_CKPT_IO");
    assert_int_equal(in_place, 0);
    rank_file(ref, 9, 0, fr, sizeof fr);
    rank_file(ext, 9, 0, fe, sizeof fe);
    rank_file(buf, 9, 0, fb, sizeof fb);
    snprintf(cmd, sizeof cmd, "cmp %s %s && cmp %s %s", fr, fe, fr, fb);
    assert_int_equal(system(cmd), 0);
    zoff_ckpt_reader *r = NULL;
    assert_ok(zoff_ckpt_open(ext, 0, &r));
    assert_ok(zoff_ckpt_verify(r, NULL));
    zoff_ckpt_close(r);
    /* aborted with writes in flight: each released, nothing left behind */
    zoff_ckpt_writer *w = NULL;
    ext_log la = {0};
    assert_ok(zoff_ckpt_writer_open(root, 10, 0, NULL, &w));
    assert_ok(zoff_ckpt_begin_entry(w, "e", ZOFF_F32, 1, (int64_t[]){EXT_TOTAL / 4}));
    for (int k = 0; k < 3; k++) assert_ok(zoff_ckpt_append_external(w, src + (size_t)k * EXT_MIB, EXT_MIB, ext_release, &la));
    /* the file's blocks are allocated ahead of the writes (16 MiB at first), where the filesystem can */
    char tmp[4096 + 64], probe[4096 + 16];
    snprintf(tmp, sizeof tmp, "%s/step_00000010.tmp-%d/rank_00000.zckpt", root, (int)getpid());
    snprintf(probe, sizeof probe, "%s/probe", root);
    int pfd = open(probe, O_CREAT | O_WRONLY, 0644);
    const bool can = pfd >= 0 && fallocate(pfd, 0, 0, 1 << 20) == 0;
    if (pfd >= 0) close(pfd);
    unlink(probe);
    struct stat sb;
    assert_int_equal(stat(tmp, &sb), 0);
    if (can && zoff_ckpt_writer_in_place(w) > 0) assert_true(sb.st_size >= (16 << 20) && (int64_t)sb.st_blocks * 512 >= (16 << 20));
    else print_message("fallocate unsupported here (or no aio): not checked\n");
    /* finished writes are given back by zoff_ckpt_reap_external before the commit or abort (within 10 s) */
    for (int k = 0; k < 10000 && la.n < 3; k++) {
        assert_ok(zoff_ckpt_reap_external(w));
        if (la.n < 3) usleep(1000);
    }
    assert_int_equal(la.n, 3);
    assert_ok(zoff_ckpt_append_external(w, src + 3 * (size_t)EXT_MIB, EXT_MIB, ext_release, &la));
    zoff_ckpt_abort(w);
    assert_int_equal(la.n, 4);
    int64_t latest = -1;
    assert_ok(zoff_ckpt_latest(root, &latest));
    assert_int_equal(latest, -1);
    free(src);
}

/* ZOFF_CKPT_FAULT in the middle of the aio writes (a later piece): the bytes before it are
 * written, the save fails naming the file and the offset, no COMPLETE, nothing left behind. */
static void test_direct_writer_fault(void **state) {
    const char *root = *state;
    save_small(root, 100, 1, NULL);
    uint8_t *big = calloc((size_t)DX_BIG * 4, 1), *inplace = calloc((size_t)DX_INPLACE * 4, 1), odd[DX_ODD] = {0};
    const char *faults[] = {"ENOSPC@9000000", "EIO@12587008", "ENOSPC@4096"};
    for (int i = 0; i < 3; i++) {
        setenv("ZOFF_CKPT_FAULT", faults[i], 1);
        zoff_ckpt_writer *w = NULL;
        assert_ok(zoff_ckpt_writer_open(root, 200, 0, NULL, &w));
        zoff_status s = zoff_ckpt_add(w, "big", ZOFF_F32, 1, (int64_t[]){DX_BIG}, big, (size_t)DX_BIG * 4);
        if (s == ZOFF_OK) s = zoff_ckpt_add(w, "inplace", ZOFF_F32, 1, (int64_t[]){DX_INPLACE}, inplace, (size_t)DX_INPLACE * 4);
        if (s == ZOFF_OK) s = zoff_ckpt_add_blob(w, "odd", odd, DX_ODD);
        if (s == ZOFF_OK) s = zoff_ckpt_commit(w);
        else zoff_ckpt_abort(w);
        unsetenv("ZOFF_CKPT_FAULT");
        assert_int_equal(s, ZOFF_ERR_IO);
        char want[64];
        snprintf(want, sizeof want, "at offset %s", strchr(faults[i], '@') + 1);
        assert_non_null(strstr(zoff_last_error(), want));
        assert_non_null(strstr(zoff_last_error(), "rank_00000.zckpt"));
        assert_non_null(strstr(zoff_last_error(), i == 1 ? "Input/output error" : "No space left on device"));
        expect_previous_intact(root);
    }
    free(big);
    free(inplace);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_all_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latest_skips_incomplete_and_tmp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_data_names_entry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_direct_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_header_index_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_up_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shape_dtype_size_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_argument_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_keeps_previous, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multi_rank_finalize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_injected_write_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_env, setup, teardown),
        cmocka_unit_test_setup_teardown(test_direct_writer_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_direct_writer_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_external, setup, teardown),
    };
    zoff_log_set_level(ZOFF_LOG_ERROR); /* the ignored-directory lines are expected here */
    return cmocka_run_group_tests_name("ckpt", tests, NULL, NULL);
}
