/* zoff bench ckpt: checkpoint save/load and safetensors export/import throughput against the
 * disk's sequential bandwidth, measured in the same run on the same directory.
 *
 * Each round runs, in this order (interleaved, so that drift of the disk or of the page cache
 * hits bound and zoff alike); the report gives medians over the rounds and, for each comparison
 * with the bound, the median of the rounds' paired ratios with their min and max (bench_stats.h):
 *   bound: O_DIRECT sequential write of S bytes (8 MiB requests) + fsync        (the disk)
 *   bound: buffered sequential write of S bytes + fsync (dd conv=fsync)        (page cache path)
 *   save:  cli_save_checkpoint (engine state -> per-tensor weights + optimizer state + meta,
 *          CRC32C per entry, fsync, rename, COMPLETE): what zoff train does, S bytes
 *   load:  cold page cache (posix_fadvise DONTNEED): open + meta + weights + optimizer state
 *          into the engine, every entry's CRC checked: what zoff train --load does
 *   bound: O_DIRECT sequential read of S bytes; buffered read of it with a cold cache
 *   export: zoff_gpt2_st_export (Hugging Face layout, F32: transposes, drops padding) + fsync
 *   import: cold cache, zoff_gpt2_st_load (what zoff train --init-from does)
 *   crc32c: one core over 256 MiB in memory (the checksum's own ceiling): zoff_crc32c as the
 *          checkpoint code calls it (SSE4.2, three streams, where the CPU has it), then the
 *          portable table path it falls back to, both values checked equal
 * The engine is ZeRO-Offload (bf16 weights, stage 2, optimizer on the CPU), so the checkpoint
 * holds 12 bytes per parameter (fp32 master, exp_avg, exp_avg_sq). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench_stats.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/crc32c_internal.h"
#include "zoff/resources.h"
#include "zoff/safetensors.h"

#define IO_BLOCK ((size_t)8 << 20)
#define MAX_ROUNDS 50 /* <= CLI_BENCH_MAX_ROUNDS */

static void usage(FILE *f) {
    fprintf(f,
            "usage: zoff bench ckpt [options]\n"
            "\n"
            "Checkpoint save/load and safetensors export/import throughput against the disk's\n"
            "sequential bandwidth (O_DIRECT and buffered, measured in the same run, interleaved).\n"
            "\n"
            "  --dir DIR                   an existing folder on the disk to measure (default: the current\n"
            "                              one); all is written in a new folder zoff-bench-ckpt.* there,\n"
            "                              removed afterwards\n"
            "  --num-layers N              GPT-2 shape (default 12: GPT-2 124M)\n"
            "  --hidden-size N             (default 768)\n"
            "  --num-attention-heads N     (default 12)\n"
            "  --vocab-size N              (default 50257)\n"
            "  --max-position-embeddings N (default 1024)\n"
            "  --rounds N                  rounds, medians reported (default 5)\n"
            "  --json                      one JSON object on stdout\n"
            "  -q, --quiet                 no heading on stderr (the model, the checkpoint's size, the rounds)\n"
            "                              nor the library's notes; the table or JSON on stdout, warnings and\n"
            "                              errors still print\n");
}

static int rm_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return type == FTW_DP ? rmdir(p) : unlink(p);
}

static void rmtree(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* Drop a file's (clean) pages from the page cache, so that the next read comes from the disk. */
static zoff_status evict(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    fdatasync(fd);
    int r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (r != 0) return zoff_error(ZOFF_ERR_IO, "posix_fadvise(DONTNEED) on %s: %s", path, strerror(r));
    return ZOFF_OK;
}

static int evict_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if (type == FTW_F) evict(p);
    return 0;
}

static void evict_tree(const char *p) { nftw(p, evict_cb, 16, FTW_PHYS); }

/* Sequential write of `bytes` (rounded up to 4096) in IO_BLOCK requests, then fsync. */
static zoff_status seq_write(const char *path, size_t bytes, bool direct, const void *buf, double *secs) {
    double t0 = zoff_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0)
        return zoff_error(ZOFF_ERR_IO, "cannot create %s%s: %s", path, direct ? " with O_DIRECT" : "", strerror(errno));
    size_t done = 0;
    bytes = (bytes + 4095) / 4096 * 4096;
    zoff_status s = ZOFF_OK;
    while (done < bytes && s == ZOFF_OK) {
        size_t n = bytes - done < IO_BLOCK ? bytes - done : IO_BLOCK;
        ssize_t w = pwrite(fd, buf, n, (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC; /* a write of 0 bytes: nothing more fits */
            s = zoff_error(ZOFF_ERR_IO, "cannot write %s: %s%s", path, strerror(e), zoff_write_hint(e));
        }
        else done += (size_t)w;
    }
    if (s == ZOFF_OK && fsync(fd) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot fsync %s: %s", path, strerror(errno));
    close(fd);
    *secs = zoff_now() - t0;
    return s;
}

static zoff_status seq_read(const char *path, bool direct, void *buf, size_t *bytes, double *secs) {
    double t0 = zoff_now();
    int fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    size_t done = 0;
    zoff_status s = ZOFF_OK;
    for (;;) {
        ssize_t r = pread(fd, buf, IO_BLOCK, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) s = zoff_error(ZOFF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        if (r <= 0) break;
        done += (size_t)r;
    }
    close(fd);
    *secs = zoff_now() - t0;
    *bytes = done;
    return s;
}

static size_t tree_bytes_total;
static int size_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)p;
    (void)ftw;
    if (type == FTW_F) tree_bytes_total += (size_t)sb->st_size;
    return 0;
}

static size_t tree_bytes(const char *p) {
    tree_bytes_total = 0;
    nftw(p, size_cb, 16, FTW_PHYS);
    return tree_bytes_total;
}

static zoff_status fetch_flat(void *user, const zoff_tensor_info *t, float *dst) {
    memcpy(dst, (const float *)user + t->offset, (size_t)t->numel * sizeof(float));
    return ZOFF_OK;
}

/* The imported weights equal the exported ones (wte's padding rows are not exported). */
static bool same_weights(const float *a, const float *b, int64_t n, const zoff_gpt2_shape *sh) {
    int64_t pad0 = sh->vocab_size * sh->hidden_size, pad1 = sh->padded_vocab_size * sh->hidden_size;
    return !memcmp(a, b, (size_t)pad0 * sizeof(float)) &&
           !memcmp(a + pad1, b + pad1, (size_t)(n - pad1) * sizeof(float));
}

enum { M_DWRITE, M_BWRITE, M_SAVE, M_LOAD, M_DREAD, M_BREAD, M_EXPORT, M_IMPORT, M_CRC, M_CRC_TABLE, M_COUNT };

/* Each comparison with the bound: zoff's rate over the bound's rate, paired per round. */
typedef struct ckpt_cmp {
    const char *name, *label;
    int what, bound;
    bool export_bytes;
} ckpt_cmp;

static void report(double t[M_COUNT][MAX_ROUNDS], int rounds, size_t S, size_t SX, int64_t n, bool json) {
    static const ckpt_cmp cmps[] = {
        {"save", "save: zoff train checkpoint (CRC32C, fsync, rename)", M_SAVE, M_DWRITE, false},
        {"load", "load: zoff train --load (cold, CRC-checked, into engine)", M_LOAD, M_DREAD, false},
        {"export", "export: safetensors HF f32 (transpose, fsync, rename)", M_EXPORT, M_DWRITE, true},
        {"import", "import: train --init-from (cold, validate, transpose)", M_IMPORT, M_DREAD, true},
    };
    const double gb = 1e9, Sd = (double)((S + 4095) / 4096 * 4096), crcb = (double)(256 << 20);
    double med[M_COUNT];
    for (int k = 0; k < M_COUNT; k++) med[k] = cli_median(t[k], rounds);
    cli_paired pr[4];
    for (int c = 0; c < 4; c++) {
        double zr[MAX_ROUNDS], br[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) {
            zr[r] = (double)(cmps[c].export_bytes ? SX : S) / t[cmps[c].what][r];
            br[r] = Sd / t[cmps[c].bound][r];
        }
        cli_paired_ratios(zr, br, rounds, &pr[c]);
    }
    char why[400];
    if (json) {
        printf("{\"bench\":\"ckpt\",\"params\":%" PRId64 ",\"checkpoint_bytes\":%zu,\"safetensors_bytes\":%zu,"
               "\"rounds\":%d,\"spread_limit\":%.2f,\"bound\":{\"write_direct_bps\":%.0f,\"write_buffered_bps\":%.0f,"
               "\"read_direct_bps\":%.0f,\"read_buffered_bps\":%.0f},\"crc32c_bps\":%.0f,\"crc32c_table_bps\":%.0f",
               n, S, SX, rounds, CLI_BENCH_SPREAD_LIMIT, Sd / med[M_DWRITE], Sd / med[M_BWRITE], Sd / med[M_DREAD],
               Sd / med[M_BREAD], crcb / med[M_CRC], crcb / med[M_CRC_TABLE]);
        for (int c = 0; c < 4; c++) {
            printf(",\"%s\":{\"seconds\":%.6f,\"bps\":%.0f,\"bound_bps\":%.0f,", cmps[c].name, med[cmps[c].what],
                   pr[c].a_median, pr[c].b_median);
            cli_paired_json(stdout, &pr[c]);
            printf(",\"verdict\":\"%s\"}", cli_paired_verdict(&pr[c], why, sizeof why));
        }
        printf("}\n");
        return;
    }
    printf("checkpoint: %.3f GB (%" PRId64 " parameters x 12 bytes + metadata), safetensors export: %.3f GB\n",
           (double)S / gb, n, (double)SX / gb);
    printf("%-58s %8s %9s %8s %15s\n", "median of rounds", "seconds", "GB/s", "of bound", "(min..max, paired)");
    printf("%-58s %8.3f %9.3f\n", "bound: write O_DIRECT 8 MiB + fsync", med[M_DWRITE], Sd / med[M_DWRITE] / gb);
    printf("%-58s %8.3f %9.3f\n", "bound: write buffered 8 MiB + fsync (dd conv=fsync)", med[M_BWRITE],
           Sd / med[M_BWRITE] / gb);
    printf("%-58s %8.3f %9.3f\n", "bound: read O_DIRECT 8 MiB (cold)", med[M_DREAD], Sd / med[M_DREAD] / gb);
    printf("%-58s %8.3f %9.3f\n", "bound: read buffered 8 MiB (cold)", med[M_BREAD], Sd / med[M_BREAD] / gb);
    for (int c = 0; c < 4; c++)
        printf("%-58s %8.3f %9.3f %7.0f%% (%4.0f..%4.0f%%)%s\n", cmps[c].label, med[cmps[c].what],
               (double)(cmps[c].export_bytes ? SX : S) / med[cmps[c].what] / gb, 100.0 * pr[c].ratio_median,
               100.0 * pr[c].ratio_min, 100.0 * pr[c].ratio_max, pr[c].steady ? "" : "  (*)");
    printf("%-58s %8.3f %9.3f\n",
           zoff_crc32c__have_sse42() ? "crc32c, one core, 256 MiB in memory (SSE4.2, 3 streams)"
                                     : "crc32c, one core, 256 MiB in memory (tables: no SSE4.2)",
           med[M_CRC], crcb / med[M_CRC] / gb);
    printf("%-58s %8.3f %9.3f %7.1fx\n", "crc32c table path (portable fallback; x = speed-up)", med[M_CRC_TABLE],
           crcb / med[M_CRC_TABLE] / gb, med[M_CRC_TABLE] / med[M_CRC]);
    for (int c = 0; c < 4; c++)
        if (!pr[c].steady) printf("(*) %s: %s\n", cmps[c].name, cli_paired_verdict(&pr[c], why, sizeof why));
}

/* 0: go on; -1: --help printed; else the exit code. */
/* A round holds in --dir at once the disk bound's file (the checkpoint's size, whole 4 KiB blocks), the
 * checkpoint (zoff_train_ckpt_bytes: what the save writes, to the byte), then the safetensors export. A
 * --dir with less free than the first two is refused before anything is written, in the benchmark's
 * words (before: the checkpoint writer's, "... earlier checkpoints in D/zoff-bench-ckpt.X/ckpt are
 * untouched", of a folder the benchmark had removed). */
static zoff_status check_room(const char *dir, const zoff_gpt2_shape *sh, const zoff_config *cfg, const char *json,
                              int64_t n) {
    const zoff_train_ckpt_size cks = {.cfg = cfg, .shape = sh, .model_dtype = ZOFF_BF16, .world = 1,
                                      .config_text = json, .step = 1};
    const size_t S = zoff_train_ckpt_bytes(&cks, NULL), need = (S + 4095) / 4096 * 4096 + S;
    size_t free_b = 0;
    if (!zoff_disk_free(dir, &free_b, NULL, 0) || free_b >= need) return ZOFF_OK;
    char b1[32], b2[32], b3[32], np[48];
    return zoff_error(ZOFF_ERR_IO,
                      "--dir %s has %s free, but each round writes at least %s there at once: the checkpoint of "
                      "this model (%s, %s) and a file as large for the disk's bound, then the safetensors export; "
                      "free space in %s, give another --dir, or measure a smaller model (--num-layers, "
                      "--hidden-size, --vocab-size)",
                      dir, zoff_format_bytes(free_b, b1, sizeof b1), zoff_format_bytes(need, b2, sizeof b2),
                      zoff_format_params(n, np, sizeof np), zoff_format_bytes(S, b3, sizeof b3), dir);
}

static int parse_args(int argc, char **argv, const char **dir, int64_t *L, int64_t *C, int64_t *NH, int64_t *V,
                      int64_t *P, int64_t *rounds, bool *json_out, bool *quiet) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t *dst = NULL, lo = 1, hi = 1 << 20;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (cli_quiet_flag(a, quiet)) {
            continue;
        } else if (!strcmp(a, "--dir")) {
            if (!(v = cli_value("bench ckpt", argc, argv, &i))) return 2;
            *dir = v;
            continue;
        } else if (!strcmp(a, "--json")) {
            *json_out = true;
            continue;
        } else if (!strcmp(a, "--num-layers")) dst = L, hi = ZOFF_GPT2_MAX_LAYERS;
        else if (!strcmp(a, "--hidden-size")) dst = C, hi = ZOFF_GPT2_MAX_HIDDEN;
        else if (!strcmp(a, "--num-attention-heads")) dst = NH, hi = ZOFF_GPT2_MAX_HIDDEN;
        else if (!strcmp(a, "--vocab-size")) dst = V, lo = 2, hi = ZOFF_GPT2_MAX_TRAIN_VOCAB;
        else if (!strcmp(a, "--max-position-embeddings")) dst = P, hi = ZOFF_GPT2_MAX_SEQ;
        else if (!strcmp(a, "--rounds")) dst = rounds, hi = MAX_ROUNDS;
        else {
            cli_unknown_option("bench ckpt", a, usage);
            return 2;
        }
        if (!(v = cli_value("bench ckpt", argc, argv, &i)) || !cli_parse_i64("bench ckpt", a, v, lo, hi, dst)) return 2;
    }
    return 0;
}

int zoff_cmd_bench_ckpt(int argc, char **argv) {
    const char *dir = ".";
    int64_t L = 12, C = 768, NH = 12, V = 50257, P = 1024, rounds = 5;
    bool json_out = false, quiet = false;
    int prc = parse_args(argc, argv, &dir, &L, &C, &NH, &V, &P, &rounds, &json_out, &quiet);
    if (prc) return prc < 0 ? 0 : prc;
    if (cli_bench_dir("bench ckpt", dir, "measure a smaller model (--num-layers, --hidden-size, --vocab-size)")) return 2;
    char work[4200]; /* the benchmark's own folder in --dir: the only thing it writes and removes */
    snprintf(work, sizeof work, "%s/zoff-bench-ckpt.XXXXXX", dir);
    if (zoff_temp_create(work, true) != 0) { /* mkdtemp; a Ctrl-C removes the folder too */
        fprintf(stderr, "zoff bench ckpt: cannot create a folder in %s: %s\n", dir, strerror(errno));
        return 1;
    }
    zoff_gpt2_shape shape = {.num_layers = L, .hidden_size = C, .num_heads = NH, .max_seq_len = P, .vocab_size = V};
    const char *json = "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true},"
                       " \"optimizer\": {\"type\": \"AdamW\"},"
                       " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}";
    zoff_config cfg;
    memset(&cfg, 0, sizeof cfg);
    zoff_device *dev = NULL;
    zoff_gpt2 *m = NULL;
    zoff_engine *eng = NULL;
    float *w = NULL, *rd = NULL;
    void *iobuf = NULL;
    char ckdir[4300], bound[4300], stf[4300], step_dir[4400];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", work);
    snprintf(bound, sizeof bound, "%s/bound.bin", work);
    snprintf(stf, sizeof stf, "%s/model.safetensors", work);
    zoff_status s = zoff_config_load_string(json, "bench config", &cfg);
    if (s == ZOFF_OK) s = zoff_config_resolve_batch(&cfg, 1);
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU};
    if (s == ZOFF_OK) s = zoff_device_create(&dopt, &dev);
    zoff_gpt2_options mo = {.shape = shape, .batch_size = 1, .seq_len = 1, .dtype = ZOFF_BF16};
    if (s == ZOFF_OK) s = zoff_gpt2_create(dev, &mo, &m);
    int64_t n = s == ZOFF_OK ? zoff_gpt2_num_params(m) : 0;
    int nt = 0;
    const zoff_tensor_info *tab = s == ZOFF_OK ? zoff_gpt2_tensors(m, &nt) : NULL;
    if (s == ZOFF_OK && (!(w = zoff_aligned_alloc(64, (size_t)n * sizeof(float), "weights")) ||
                         !(rd = zoff_aligned_alloc(64, (size_t)n * sizeof(float), "weights read back")) ||
                         !(iobuf = zoff_aligned_alloc(4096, IO_BLOCK > ((size_t)256 << 20) ? IO_BLOCK : (size_t)256 << 20,
                                                      "I/O buffer"))))
        s = ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK) {
        zoff_gpt2_init_params(m, 1, w);
        for (size_t i = 0; i < ((size_t)256 << 20); i++) ((uint8_t *)iobuf)[i] = (uint8_t)(i * 2654435761u >> 13);
        zoff_engine_options eo = {.dev = dev, .cfg = &cfg, .tensors = tab, .num_tensors = nt, .num_params = n,
                                  .params = zoff_gpt2_params(m), .grads = zoff_gpt2_grads(m), .dtype = ZOFF_BF16,
                                  .init_params = w};
        s = zoff_engine_create(&eo, &eng);
    }
    cli_meta meta = {.step = 1, .shape = *(s == ZOFF_OK ? zoff_gpt2_get_shape(m) : &shape), .seq_len = 1};
    snprintf(meta.tokenizer, sizeof meta.tokenizer, "gpt2");
    double t[M_COUNT][MAX_ROUNDS] = {{0}};
    size_t S = 0, SX = 0;
    if (s == ZOFF_OK) s = check_room(dir, zoff_gpt2_get_shape(m), &cfg, json, n);
    if (s == ZOFF_OK) { /* warm-up save: the checkpoint's size */
        rmtree(ckdir);
        s = cli_save_checkpoint(ckdir, eng, m, &meta, json);
        S = tree_bytes(ckdir);
        rmtree(ckdir);
    }
    if (s == ZOFF_OK && !quiet) {
        char b1[32], nl[32], np[48], nr[32];
        fprintf(stderr, "zoff bench ckpt: GPT-2 %s, width %" PRId64 " (%s): checkpoint %s in %s; %s\n",
                zoff_format_count(L, "layer", nl, sizeof nl), C, zoff_format_params(n, np, sizeof np),
                zoff_format_bytes(S, b1, sizeof b1), dir, zoff_format_count(rounds, "round", nr, sizeof nr));
    }
    snprintf(step_dir, sizeof step_dir, "%s/step_00000001", ckdir);
    for (int64_t r = 0; r < rounds && s == ZOFF_OK; r++) {
        size_t got = 0;
        s = seq_write(bound, S, true, iobuf, &t[M_DWRITE][r]);
        if (s == ZOFF_OK) s = seq_write(bound, S, false, iobuf, &t[M_BWRITE][r]);
        double t0 = zoff_now();
        if (s == ZOFF_OK) s = cli_save_checkpoint(ckdir, eng, m, &meta, json);
        t[M_SAVE][r] = zoff_now() - t0;
        if (s == ZOFF_OK) {
            evict_tree(ckdir);
            t0 = zoff_now();
            zoff_ckpt_reader *rr = NULL;
            cli_meta got_meta;
            s = zoff_ckpt_open(ckdir, 0, &rr);
            if (s == ZOFF_OK) s = cli_read_meta(rr, &got_meta, NULL);
            if (s == ZOFF_OK) s = cli_read_weights(rr, m, rd);
            if (s == ZOFF_OK) s = cli_read_engine_state(rr, eng, n);
            zoff_ckpt_close(rr);
            t[M_LOAD][r] = zoff_now() - t0;
        }
        if (s == ZOFF_OK) s = evict(bound);
        if (s == ZOFF_OK) s = seq_read(bound, true, iobuf, &got, &t[M_DREAD][r]);
        if (s == ZOFF_OK) s = evict(bound);
        if (s == ZOFF_OK) s = seq_read(bound, false, iobuf, &got, &t[M_BREAD][r]);
        zoff_gpt2_export_options xo = {.layout = ZOFF_GPT2_LAYOUT_HF, .dtype = ZOFF_ST_F32};
        t0 = zoff_now();
        if (s == ZOFF_OK) s = zoff_gpt2_st_export(stf, zoff_gpt2_get_shape(m), tab, nt, fetch_flat, rd, &xo);
        t[M_EXPORT][r] = zoff_now() - t0;
        if (s == ZOFF_OK) {
            struct stat st;
            SX = stat(stf, &st) == 0 ? (size_t)st.st_size : 0;
            s = evict(stf);
        }
        t0 = zoff_now();
        zoff_st_file *f = NULL;
        if (s == ZOFF_OK) s = zoff_st_open(stf, &f);
        if (s == ZOFF_OK) s = zoff_gpt2_st_load(f, zoff_gpt2_get_shape(m), tab, nt, w);
        zoff_st_close(f);
        t[M_IMPORT][r] = zoff_now() - t0;
        t0 = zoff_now();
        uint32_t crc = zoff_crc32c(0, iobuf, (size_t)256 << 20);
        t[M_CRC][r] = zoff_now() - t0;
        t0 = zoff_now();
        uint32_t crc_table = zoff_crc32c__table(0, iobuf, (size_t)256 << 20);
        t[M_CRC_TABLE][r] = zoff_now() - t0;
        if (s == ZOFF_OK && crc != crc_table)
            s = zoff_error(ZOFF_ERR_INTERNAL, "bench ckpt: crc32c %08x but the table path gives %08x", crc, crc_table);
        rmtree(ckdir);
        unlink(bound);
        unlink(stf);
        if (s == ZOFF_OK && !same_weights(w, rd, n, zoff_gpt2_get_shape(m)))
            s = zoff_error(ZOFF_ERR_INTERNAL, "bench ckpt: the imported weights differ from the exported ones");
    }
    rmtree(work);
    zoff_temp_forget(work);
    zoff_aligned_free(w);
    zoff_aligned_free(rd);
    zoff_aligned_free(iobuf);
    zoff_engine_destroy(eng);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    zoff_config_free(&cfg);
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff bench ckpt: %s\n", zoff_last_error());
        return 1;
    }
    report(t, (int)rounds, S, SX, n, json_out);
    return 0;
}
