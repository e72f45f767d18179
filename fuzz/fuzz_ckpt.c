/* Fuzz the checkpoint reader: the input (after one flag byte) is written as
 * DIR/step_00000001/rank_00000.zckpt with a COMPLETE marker, then opened with
 * zoff_ckpt_open and every entry read (whole, as a blob, as a tensor of its own shape, in
 * ranges, and verified).
 *
 * Flag byte: bit 0 recomputes the header CRC, bit 1 the index CRC, bit 2 every in-bounds
 * entry's data CRC, bit 3 sets file_bytes to the real size. Without these fix-ups nearly
 * every mutation would stop at a checksum; with them the fuzzer reaches the field checks
 * behind the checksums (which a corrupt or hostile file can also reach, since a CRC is no
 * protection against a file written on purpose).
 *
 * Checks: no crash / UB / leak / unbounded allocation; every error has a message naming the
 * file; a file that opens is written again through the writer (entries, dtypes, shapes, data)
 * and reads back identical. The consolidated reader of `zoff export` (zoff_ckpt_gather_*)
 * then reads the same checkpoint (its piece names and partition blob come from the file too). */
#include <sys/stat.h>

#include "fuzz_util.h"
#include "zoff/ckpt.h"
#include "zoff/safetensors.h" /* zoff_ckpt_gather_*: the consolidated reader of zoff export */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CKPT_MAX_ENTRY_READ ((int64_t)1 << 20)

/* Checkpoint I/O without fsync: the harness does not need durability, and fsync would make
 * each input take milliseconds. */
static int64_t ckpt_no_fsync(void *user, zoff_ckpt_io_op op, const char *path, int fd, const void *buf, size_t bytes,
                        int64_t offset) {
    if (op == ZOFF_CKPT_IO_FSYNC) return 0;
    return zoff_ckpt_io_default(op, fd, buf, bytes, offset);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    zoff_log_set_level(ZOFF_LOG_ERROR);
    zoff_ckpt_set_io_hook(ckpt_no_fsync, NULL);
    unsetenv("ZOFF_CKPT_FAULT");
    return 0;
}

static void ckpt_fixup(uint8_t *b, size_t n, unsigned flags) {
    if (n < 128) return;
    if (flags & 8) {
        uint64_t sz = n;
        for (int i = 0; i < 8; i++) b[64 + i] = (uint8_t)(sz >> (8 * i));
    }
    uint64_t count = fuzz_u64(b + 40), ioff = fuzz_u64(b + 48);
    bool index_ok = ioff <= n && count <= (n - ioff) / 256;
    if ((flags & 4) && index_ok) {
        for (uint64_t i = 0; i < count; i++) {
            uint8_t *rec = b + ioff + i * 256;
            uint64_t off = fuzz_u64(rec + 200), bytes = fuzz_u64(rec + 208);
            if (off <= n && bytes <= n - off) fuzz_put_u32(rec + 216, zoff_crc32c(0, b + off, (size_t)bytes));
        }
    }
    if ((flags & 2) && index_ok) fuzz_put_u32(b + 72, zoff_crc32c(0, b + ioff, (size_t)(count * 256)));
    if (flags & 1) fuzz_put_u32(b + 124, zoff_crc32c(0, b, 124));
}

static size_t ckpt_elem_size(zoff_dtype dt) {
    switch ((int)dt) {
    case ZOFF_F32:
    case ZOFF_I32: return 4;
    case ZOFF_BF16:
    case ZOFF_F16: return 2;
    default: return 1;
    }
}

/* Write every entry of r (all read into bufs) to DIR2 with the writer and read it back. */
static void ckpt_roundtrip(zoff_ckpt_reader *r, uint8_t **bufs, const char *dir2) {
    size_t n = zoff_ckpt_num_entries(r);
    zoff_ckpt_writer *w = NULL;
    zoff_status s = zoff_ckpt_writer_open(dir2, 1, 0, NULL, &w);
    FUZZ_CHECK(s == ZOFF_OK, "writer_open: %s", zoff_last_error());
    for (size_t i = 0; i < n; i++) {
        const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, i);
        if (e->dtype == ZOFF_CKPT_RAW && e->ndim == 0) s = zoff_ckpt_add_blob(w, e->name, bufs[i], (size_t)e->bytes);
        else s = zoff_ckpt_add(w, e->name, e->dtype, e->ndim, e->shape, bufs[i], (size_t)e->bytes);
        FUZZ_CHECK(s == ZOFF_OK, "re-adding entry '%s' that the reader accepted: %s", e->name, zoff_last_error());
    }
    s = zoff_ckpt_commit(w);
    FUZZ_CHECK(s == ZOFF_OK, "commit: %s", zoff_last_error());
    s = zoff_ckpt_finalize(dir2, 1, 1, NULL);
    FUZZ_CHECK(s == ZOFF_OK, "finalize: %s", zoff_last_error());
    zoff_ckpt_reader *r2 = NULL;
    s = zoff_ckpt_open(dir2, 0, &r2);
    FUZZ_CHECK(s == ZOFF_OK, "reopen of a rewritten checkpoint: %s", zoff_last_error());
    FUZZ_CHECK(zoff_ckpt_num_entries(r2) == n, "entry count changed");
    for (size_t i = 0; i < n; i++) {
        const zoff_ckpt_entry *a = zoff_ckpt_entry_at(r, i), *b = zoff_ckpt_entry_at(r2, i);
        FUZZ_CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
                       a->bytes == b->bytes && a->crc32c == b->crc32c,
                   "entry %zu differs after rewrite", i);
        for (int k = 0; k < a->ndim; k++) FUZZ_CHECK(a->shape[k] == b->shape[k], "shape differs");
        uint8_t *x = malloc((size_t)b->bytes + 1);
        s = zoff_ckpt_read(r2, b->name, x, (size_t)b->bytes);
        FUZZ_CHECK(s == ZOFF_OK && memcmp(x, bufs[i], (size_t)b->bytes) == 0, "data of '%s' differs", b->name);
        free(x);
    }
    zoff_ckpt_close(r2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 20)) return 0;
    unsigned flags = data[0];
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    memcpy(file, data + 1, n);
    ckpt_fixup(file, n, flags);

    char root[512], stepdir[600], path[700], marker[700], root2[600];
    snprintf(root, sizeof root, "%s/ck", fuzz_dir());
    snprintf(root2, sizeof root2, "%s/ck2", fuzz_dir());
    fuzz_rmtree(root);
    fuzz_rmtree(root2);
    snprintf(stepdir, sizeof stepdir, "%s/step_00000001", root);
    snprintf(path, sizeof path, "%s/rank_00000.zckpt", stepdir);
    snprintf(marker, sizeof marker, "%s/COMPLETE", stepdir);
    if (mkdir(root, 0755) || mkdir(stepdir, 0755)) abort();
    fuzz_write_file(path, file, n);
    static const char mk[] = "zoff-checkpoint 1\nstep 1\nranks 1\n";
    fuzz_write_file(marker, mk, sizeof mk - 1);
    free(file);

    zoff_ckpt_reader *r = NULL;
    zoff_status s = zoff_ckpt_open(root, 0, &r);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, path);
        FUZZ_CHECK(r == NULL, "failed open returned a reader");
        return 0;
    }
    size_t ne = zoff_ckpt_num_entries(r);
    FUZZ_CHECK(zoff_ckpt_reader_step(r) == 1, "step");
    uint8_t **bufs = calloc(ne ? ne : 1, sizeof *bufs);
    bool all_ok = true;
    for (size_t i = 0; i < ne; i++) {
        const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, i);
        FUZZ_CHECK(e && zoff_ckpt_find(r, e->name) == e, "find('%s') does not return entry %zu", e ? e->name : "", i);
        FUZZ_CHECK(e->bytes >= 0 && e->offset >= 4096 && e->offset + e->bytes <= (int64_t)n,
                   "entry '%s' accepted outside the file: offset %lld bytes %lld file %zu", e->name,
                   (long long)e->offset, (long long)e->bytes, n);
        if (e->bytes > CKPT_MAX_ENTRY_READ) {
            all_ok = false;
            continue;
        }
        bufs[i] = malloc((size_t)e->bytes + 1);
        s = zoff_ckpt_read(r, e->name, bufs[i], (size_t)e->bytes);
        if (s != ZOFF_OK) {
            fuzz_check_error(s, path);
            all_ok = false;
            continue;
        }
        /* a range read after a whole read: same bytes */
        if (e->bytes > 2) {
            uint8_t mid[2];
            s = zoff_ckpt_read_range(r, e->name, e->bytes / 2, mid, 2);
            FUZZ_CHECK(s == ZOFF_OK && memcmp(mid, bufs[i] + e->bytes / 2, 2) == 0, "range read differs: %s",
                       zoff_last_error());
        }
        /* out-of-range requests are refused */
        uint8_t one;
        s = zoff_ckpt_read_range(r, e->name, e->bytes, &one, 1);
        fuzz_check_error(s, e->name);
        if (e->dtype != ZOFF_CKPT_RAW || e->ndim > 0) {
            s = zoff_ckpt_read_tensor(r, e->name, e->dtype, e->ndim, e->shape, bufs[i], (size_t)e->bytes);
            FUZZ_CHECK(s == ZOFF_OK, "read_tensor with the entry's own shape: %s", zoff_last_error());
            FUZZ_CHECK((size_t)e->bytes % ckpt_elem_size(e->dtype) == 0, "size not a multiple of the element size");
        }
        char *blob = NULL;
        size_t bl = 0;
        s = zoff_ckpt_read_blob(r, e->name, &blob, &bl);
        FUZZ_CHECK(s == ZOFF_OK && bl == (size_t)e->bytes && blob[bl] == 0, "read_blob: %s", zoff_last_error());
        free(blob);
    }
    s = zoff_ckpt_verify(r, NULL);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, path);
        all_ok = false;
    }
    char longname[200]; /* longer than any stored name */
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    FUZZ_CHECK(zoff_ckpt_find(r, longname) == NULL, "find of a name that cannot exist");
    if (all_ok) ckpt_roundtrip(r, bufs, root2);

    /* the consolidated reader (zoff export): parses "NAME@START/D0xD1" piece names and the
     * "partition" blob of the same file */
    zoff_ckpt_gather *g = NULL;
    s = zoff_ckpt_gather_open(root, &g);
    if (s != ZOFF_OK) fuzz_check_error(s, NULL);
    else {
        for (size_t i = 0; i < zoff_ckpt_gather_num_tensors(g); i++) {
            const zoff_ckpt_gathered *t = zoff_ckpt_gather_tensor_at(g, i);
            FUZZ_CHECK(t && zoff_ckpt_gather_find(g, t->name) == t, "gather find");
            if (t->bytes < 0 || t->bytes > CKPT_MAX_ENTRY_READ) continue;
            uint8_t *x = malloc((size_t)t->bytes + 1);
            s = zoff_ckpt_gather_read(g, t->name, x, (size_t)t->bytes);
            if (s != ZOFF_OK) fuzz_check_error(s, NULL);
            free(x);
        }
        zoff_ckpt_gather_close(g);
    }
    for (size_t i = 0; i < ne; i++) free(bufs[i]);
    free(bufs);
    zoff_ckpt_close(r);
    return 0;
}
