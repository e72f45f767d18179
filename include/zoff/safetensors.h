/* zoff safetensors: reading and writing .safetensors files, GPT-2 import/export in Hugging
 * Face's layout, and consolidating a checkpoint's rank files (the zero_to_fp32 step).
 *
 * ==== The safetensors format (as read and written here) ====
 *
 *   bytes [0, 8)         N: uint64, little-endian: the length of the JSON header
 *   bytes [8, 8 + N)     a JSON object, UTF-8, possibly padded at the end with spaces:
 *                          "NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
 *                          "__metadata__": {"key": "value", ...}         (optional; string values only)
 *   bytes [8 + N, EOF)   the data buffer. begin/end are relative to its start; each tensor is
 *                        product(shape) * dtype size bytes, row-major, little-endian.
 *
 * dtypes: BOOL U8 I8 F8_E4M3 F8_E5M2 I16 U16 F16 BF16 I32 U32 F32 I64 U64 F64.
 *
 * The reader checks, before it trusts a byte of data: the file is at least 8 bytes; N is at
 * most ZOFF_ST_MAX_HEADER and fits in the file; the header is valid UTF-8 JSON whose top level
 * is an object without duplicate keys; every tensor entry has exactly the keys dtype, shape and
 * data_offsets, a known dtype, 0..ZOFF_ST_MAX_DIMS non-negative integer dimensions whose byte
 * size does not overflow, and begin <= end with end - begin == its byte size; the tensors,
 * sorted by begin, do not overlap and leave no hole, and the last one ends exactly at the end
 * of the file (as the reference implementation requires: a file is entirely indexed);
 * __metadata__ is an object of strings. Every error names the file, the tensor and what is wrong
 * (ZOFF_ERR_FORMAT), or the system call that failed (ZOFF_ERR_IO).
 *
 * The writer puts the tensors' data in the order they were declared, pads the header with
 * spaces to a multiple of 8 bytes (so that every tensor of 8-byte elements is aligned, like
 * the Python writer does), and writes atomically: PATH.tmp-<pid> in the same directory, fsync,
 * rename over PATH, fsync of the directory. A failure at any point removes the temp file and
 * leaves an existing PATH as it was. For shell-level tests the environment variable
 * ZOFF_CKPT_FAULT=<ENOSPC|EIO>@<offset> (see ckpt.h) applies to safetensors files as well.
 *
 * ==== GPT-2 in Hugging Face's layout (ZOFF_GPT2_LAYOUT_HF) ====
 *
 * The tensors of transformers.GPT2Model, with the bare names of the original
 * openai-community/gpt2 file (GPT2LMHeadModel.from_pretrained accepts them):
 *   wte.weight (V, C)          zoff's wte has Vp >= V rows: rows V..Vp-1 (padding) are dropped
 *                              on export and zero on import
 *   wpe.weight (maxT, C)
 *   h.l.ln_1.weight (C), h.l.ln_1.bias (C), h.l.ln_2.*, ln_f.* (C)
 *   h.l.attn.c_attn.weight (C, 3C)   Conv1D: (in, out), the transpose of zoff's (out, in)
 *   h.l.attn.c_proj.weight (C, C)    transposed
 *   h.l.mlp.c_fc.weight (C, 4C)      transposed
 *   h.l.mlp.c_proj.weight (4C, C)    transposed
 *   h.l.attn.c_attn.bias (3C), h.l.attn.c_proj.bias (C), h.l.mlp.c_fc.bias (4C), h.l.mlp.c_proj.bias (C)
 * The LM head is tied to wte and not stored. __metadata__ has "format": "pt" (what
 * safetensors.torch and transformers expect) and zoff's own keys ("zoff.layout": "hf", ...).
 *
 * Import also accepts: names with a "transformer." prefix (GPT2LMHeadModel.save_pretrained);
 * a "lm_head.weight" of wte's shape (ignored: zoff ties it to wte; a warning is logged when it
 * differs from wte); the h.l.attn.bias / h.l.attn.masked_bias buffers of older files (ignored);
 * F32, F16, BF16 and F64 data (converted to fp32). Any other tensor, a missing tensor or a shape
 * that does not match the model is an error naming the tensor, both shapes and the flags to use.
 *
 * ==== GPT-2 in zoff's layout (ZOFF_GPT2_LAYOUT_ZOFF: `zoff export --format fp32`) ====
 *
 * The fp32 weights exactly as training holds them: the same Hugging Face names, zoff's shapes
 * (Linear weights (out, in); wte with all Vp rows, padding included), F32 only. __metadata__ has
 * "zoff.layout": "zoff"; that key is how import tells the two layouts apart.
 *
 * ==== Partitioned checkpoints (the zero_to_fp32 step) ====
 *
 * A checkpoint DIR/step_X/ has one rank_%05d.zckpt per rank (see ckpt.h). zoff_ckpt_gather_*
 * reads all of them as one set of whole tensors. In a rank file, an entry is either
 *   - a whole tensor: entry "NAME" with the tensor's own dtype and shape. Several ranks may hold
 *     the same whole tensor (replicated state); they must agree on dtype, shape and data CRC,
 *     and the lowest rank's copy is read; or
 *   - in a file with a "partition" blob (what `zoff train` writes with several ranks; format in
 *     ckpt.h, "Partitioned entries"): an entry "optimizer.*" holds the model elements of the
 *     blob's runs laid end to end; the gathered tensor is 1-D with the blob's num_params
 *     elements (every file's blob must give the same num_params); or
 *   - a piece of a partitioned tensor: entry "NAME@START/D0xD1x...", 1-D with COUNT elements,
 *     holding elements [START, START + COUNT) of the tensor flattened row-major; D0xD1x... is the
 *     whole tensor's shape (decimal, 'x'-separated, at least one dimension). Example: rank 1 of
 *     a stage-2 run owning flat elements that start inside h.0.attn.c_attn.weight (384 x 128)
 *     writes "h.0.attn.c_attn.weight@40960/384x128" with 8192 elements, and the flat optimizer
 *     state as "optimizer.exp_avg@1048576/4194304". Pieces of one tensor may sit in any rank
 *     files, in any order; they must have one dtype and one shape string and together cover
 *     [0, numel) exactly once (no gap, no overlap). Empty pieces are allowed and ignored.
 * A name may not be both whole and pieced. Entries of dtype ZOFF_CKPT_RAW (meta, config) are not
 * tensors; read them through zoff_ckpt_gather_reader(g, rank). */
#ifndef ZOFF_SAFETENSORS_H
#define ZOFF_SAFETENSORS_H

#include "zoff/ckpt.h"
#include "zoff/core.h"
#include "zoff/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZOFF_ST_MAX_DIMS 8
#define ZOFF_ST_MAX_SHARDS 4096 /* shard files of one sharded model (zoff_st_open of an index) */
#define ZOFF_ST_MAX_HEADER ((uint64_t)100000000) /* bytes of JSON header (the reference's limit) */

typedef enum zoff_st_dtype {
    ZOFF_ST_BOOL = 0,
    ZOFF_ST_U8,
    ZOFF_ST_I8,
    ZOFF_ST_F8_E4M3,
    ZOFF_ST_F8_E5M2,
    ZOFF_ST_I16,
    ZOFF_ST_U16,
    ZOFF_ST_F16,
    ZOFF_ST_BF16,
    ZOFF_ST_I32,
    ZOFF_ST_U32,
    ZOFF_ST_F32,
    ZOFF_ST_I64,
    ZOFF_ST_U64,
    ZOFF_ST_F64,
    ZOFF_ST_DTYPE_COUNT
} zoff_st_dtype;

const char *zoff_st_dtype_name(zoff_st_dtype dt); /* "F32"; "?" for an invalid value */
size_t zoff_st_dtype_size(zoff_st_dtype dt);      /* bytes per element; 0 for an invalid value */
/* Parse "F32", "BF16", ... (exact, upper case). */
zoff_status zoff_st_dtype_parse(const char *text, zoff_st_dtype *out);

/* ---- reader ---- */

typedef struct zoff_st_tensor {
    const char *name;  /* valid while the file is open */
    zoff_st_dtype dtype;
    int ndim;
    int64_t shape[ZOFF_ST_MAX_DIMS];
    int64_t numel;
    int64_t offset;    /* absolute file offset of the first byte */
    int64_t bytes;
    int part;          /* a sharded model (zoff_st_open of an index): the shard file that holds it */
} zoff_st_tensor;

typedef struct zoff_st_file zoff_st_file;

/* Open and validate a file (header and index only; data is read on demand). A PATH ending in
 * ".index.json" is a sharded model as Hugging Face saves one (model.safetensors.index.json:
 * "weight_map" of tensor name -> shard file beside it): every shard is opened and checked, each
 * tensor must be in the shard the map names and every mapped tensor present; the handle then
 * reads like one file (its metadata: the first shard's). */
zoff_status zoff_st_open(const char *path, zoff_st_file **out);
/* The same checks on a file held in memory (tests, fuzzing). `data` is not copied and must
 * outlive the handle; `name` is used in messages. */
zoff_status zoff_st_open_memory(const void *data, size_t size, const char *name, zoff_st_file **out);
void zoff_st_close(zoff_st_file *f); /* NULL is allowed */

const char *zoff_st_path(const zoff_st_file *f);
int64_t zoff_st_file_bytes(const zoff_st_file *f);
/* Tensors in data order (by offset); lookup by exact name (NULL when absent). */
size_t zoff_st_num_tensors(const zoff_st_file *f);
const zoff_st_tensor *zoff_st_tensor_at(const zoff_st_file *f, size_t i);
const zoff_st_tensor *zoff_st_find(const zoff_st_file *f, const char *name);
/* __metadata__: value of a key (NULL when absent); all pairs by index. */
const char *zoff_st_metadata(const zoff_st_file *f, const char *key);
size_t zoff_st_num_metadata(const zoff_st_file *f);
void zoff_st_metadata_at(const zoff_st_file *f, size_t i, const char **key, const char **value);

/* Read a tensor's raw bytes; `bytes` must equal its size. */
zoff_status zoff_st_read(zoff_st_file *f, const zoff_st_tensor *t, void *dst, size_t bytes);
/* Read a F32/F16/BF16/F64 tensor converted to fp32; numel must equal the tensor's. */
zoff_status zoff_st_read_f32(zoff_st_file *f, const zoff_st_tensor *t, float *dst, int64_t numel);
/* Elements [first, first + count) of a float tensor, converted to fp32 (the same values as
 * zoff_st_read_f32's): a piece of a tensor without reading the rest. */
zoff_status zoff_st_read_f32_range(zoff_st_file *f, const zoff_st_tensor *t, int64_t first, int64_t count, float *dst);

/* ---- writer ---- */

typedef struct zoff_st_writer zoff_st_writer;

/* Start writing PATH (atomically, see the top of this file). Nothing is created until the
 * first zoff_st_writer_append or zoff_st_writer_commit. */
zoff_status zoff_st_writer_open(const char *path, zoff_st_writer **out);
/* A __metadata__ pair (unique key, UTF-8). Before the first append. */
zoff_status zoff_st_writer_metadata(zoff_st_writer *w, const char *key, const char *value);
/* Declare a tensor (unique name, UTF-8, not "__metadata__"); all before the first append. */
zoff_status zoff_st_writer_declare(zoff_st_writer *w, const char *name, zoff_st_dtype dtype, int ndim,
                                   const int64_t *shape);
/* Append data bytes: the tensors' contents in declaration order, in pieces of any size. They are
 * copied into 8 MiB buffers, each written O_DIRECT through src/aio (io_uring) while the caller goes
 * on (64 MiB in flight), where the file system allows it and ZOFF_CKPT_IO is not "buffered";
 * else through the page cache by pwrite. ZOFF_CKPT_FAULT fails the writes from its offset on. */
zoff_status zoff_st_writer_append(zoff_st_writer *w, const void *data, size_t bytes);
/* Check that exactly the declared bytes were appended, fsync, rename into place, fsync the
 * directory. Always frees the writer; on failure the temp file is gone and PATH untouched. */
zoff_status zoff_st_writer_commit(zoff_st_writer *w);
/* Give up: remove the temp file, free the writer. NULL is allowed. */
void zoff_st_writer_abort(zoff_st_writer *w);
/* How the file is being written, once the first append has started it ("" before): "O_DIRECT, ..."
 * or "pwrite, buffered (why)". */
const char *zoff_st_writer_io(const zoff_st_writer *w);

/* ---- GPT-2 ---- */

typedef enum zoff_gpt2_layout {
    ZOFF_GPT2_LAYOUT_HF = 0,   /* Hugging Face GPT2Model names and Conv1D shapes, wte without padding */
    ZOFF_GPT2_LAYOUT_ZOFF = 1  /* zoff's own shapes, fp32 (`--format fp32`) */
} zoff_gpt2_layout;

/* Supplies tensor t (zoff's layout: t->numel floats, shape t->shape) of the weights to export. */
typedef zoff_status (*zoff_gpt2_fetch_fn)(void *user, const zoff_tensor_info *t, float *dst);

typedef struct zoff_gpt2_export_options {
    zoff_gpt2_layout layout;
    zoff_st_dtype dtype;        /* F32, BF16 or F16 (HF layout); F32 only for the zoff layout */
    const char *const *metadata; /* extra __metadata__ pairs: key0, value0, key1, value1, ...; may be NULL */
    size_t metadata_pairs;
} zoff_gpt2_export_options;

/* Write the GPT-2 weights described by `tensors` (zoff's names and shapes; any order; each
 * must be a GPT-2 parameter of `shape`, padded_vocab_size resolved, and every parameter must be
 * present exactly once) to PATH in the chosen layout and dtype. Data comes from `fetch`, one
 * tensor at a time (memory: the largest tensor twice). 16-bit output is rounded to nearest even. */
zoff_status zoff_gpt2_st_export(const char *path, const zoff_gpt2_shape *shape, const zoff_tensor_info *tensors,
                                int ntensors, zoff_gpt2_fetch_fn fetch, void *user,
                                const zoff_gpt2_export_options *opts);

/* Whether `name` is a parameter of a GPT-2 with num_layers blocks ("wte.weight", "h.3.ln_1.bias", ...). */
bool zoff_gpt2_st_is_param(const char *name, int64_t num_layers);

/* The layout of an open file: ZOFF_GPT2_LAYOUT_ZOFF when its metadata says "zoff.layout": "zoff". */
zoff_gpt2_layout zoff_gpt2_st_layout(const zoff_st_file *f);

/* What GPT-2 an open file holds, as far as its tensors tell: layers, width, positions and
 * vocabulary (num_heads is taken from metadata "zoff.num_heads" when present, else from the
 * n_head of a config.json beside the file that gives the same layers and width (a Hugging Face
 * model folder), else 0). Fails when it does not look like GPT-2 (no wte/wpe). */
zoff_status zoff_gpt2_st_infer_shape(const zoff_st_file *f, zoff_gpt2_shape *out);

/* The safetensors file a path given for GPT-2 weights names: a folder's model.safetensors (what
 * zoff export --output DIR/ writes, a Hugging Face model folder) or, sharded, its
 * model.safetensors.index.json, or the path itself. Returns 1 for a folder holding either (*file:
 * that file), 0 when the path is not a folder (*file: the path; zoff_st_open says what is wrong
 * with it), -1 for a folder with neither. */
int zoff_gpt2_st_resolve(const char *path, char *file, size_t cap);

/* For a folder without model.safetensors: what it holds instead (shards without their index,
 * another .safetensors file, PyTorch's pytorch_model.bin that zoff does not read) and what to do,
 * into buf; "" when nothing known. */
void zoff_gpt2_st_folder_hint(const char *dir, char *buf, size_t cap);

/* Check an open file against a model shape without reading data: every GPT-2 tensor present once
 * with the right shape and a float dtype, nothing unexpected. shape->padded_vocab_size may be 0
 * (round V up to 128) for the HF layout. Errors name the tensor, both shapes, and the flags that
 * would match the file. */
zoff_status zoff_gpt2_st_check(const zoff_st_file *f, const zoff_gpt2_shape *shape);

/* Check, then read the weights into host_params (the flat fp32 buffer described by `tensors`,
 * zoff's layout). wte rows V..Vp-1 are set to zero for the HF layout. */
zoff_status zoff_gpt2_st_load(zoff_st_file *f, const zoff_gpt2_shape *shape, const zoff_tensor_info *tensors,
                              int ntensors, float *host_params);

/* The same weights a range at a time ([lo, hi) of the flat buffer `tensors` describes, in any
 * order and split: the values zoff_gpt2_st_load puts there), so that an importer writes each
 * piece straight into its final place. The loader checks like zoff_gpt2_st_load at open, keeps
 * the file and the tensor table (both must outlive it), and holds at most
 * zoff_gpt2_st_loader_floats(shape) floats (the Hugging Face layout's transposed matrices). */
typedef struct zoff_gpt2_st_loader zoff_gpt2_st_loader;
zoff_status zoff_gpt2_st_loader_open(zoff_st_file *f, const zoff_gpt2_shape *shape, const zoff_tensor_info *tensors,
                                     int ntensors, zoff_gpt2_st_loader **out);
zoff_status zoff_gpt2_st_loader_read(zoff_gpt2_st_loader *l, int64_t lo, int64_t hi, float *dst);
void zoff_gpt2_st_loader_close(zoff_gpt2_st_loader *l); /* NULL is allowed */
int64_t zoff_gpt2_st_loader_floats(const zoff_gpt2_shape *shape);

/* ---- consolidated reading of a checkpoint's rank files ---- */

typedef struct zoff_ckpt_gathered {
    char name[ZOFF_CKPT_MAX_NAME + 1]; /* the tensor's name (without any @START/SHAPE suffix) */
    zoff_dtype dtype;
    int ndim;
    int64_t shape[ZOFF_CKPT_MAX_DIMS];
    int64_t numel;
    int64_t bytes;
    int pieces;                        /* 0: whole in one (or several identical) rank files */
} zoff_ckpt_gathered;

typedef struct zoff_ckpt_gather zoff_ckpt_gather;

/* Open every rank file of the checkpoint at `path` (a root: its newest complete step, or a step
 * directory) and index its tensors (rules at the top of this file). */
zoff_status zoff_ckpt_gather_open(const char *path, zoff_ckpt_gather **out);
void zoff_ckpt_gather_close(zoff_ckpt_gather *g); /* NULL is allowed */

int64_t zoff_ckpt_gather_step(const zoff_ckpt_gather *g);
int zoff_ckpt_gather_nranks(const zoff_ckpt_gather *g);
/* The reader of one rank file (owned by g), for RAW entries such as "meta". */
zoff_ckpt_reader *zoff_ckpt_gather_reader(zoff_ckpt_gather *g, int rank);
/* Tensors in order of first appearance (rank 0's entries first). */
size_t zoff_ckpt_gather_num_tensors(const zoff_ckpt_gather *g);
const zoff_ckpt_gathered *zoff_ckpt_gather_tensor_at(const zoff_ckpt_gather *g, size_t i);
const zoff_ckpt_gathered *zoff_ckpt_gather_find(const zoff_ckpt_gather *g, const char *name);
/* Read a whole tensor (pieces assembled, every piece's CRC checked); bytes must equal its size. */
zoff_status zoff_ckpt_gather_read(zoff_ckpt_gather *g, const char *name, void *dst, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
