/* DeepSpeed JSON config -> one validated zoff_config.
 *
 * The accepted keys are tables (one line per key, below). A generic walker
 * checks every JSON object against its table: unknown keys, wrong JSON types,
 * non-integral integers and out-of-range values are errors that name the source,
 * the key path, the value given and what is allowed. Checks that involve more
 * than one key (batch relation, fp16 + bf16, nvme without a path, ...) follow
 * the walk in validate_config().
 *
 * Each key is in one of three classes (docs/config.md is the full list):
 * - implemented: stored in zoff_config and honoured;
 * - accepted, no effect (F_NO_EFFECT, .note = why): the key concerns something
 *   zoff does not have or does another way, so its value cannot change training;
 *   the value is still type-checked, and the key is listed in cfg->no_effect and
 *   logged once at load;
 * - valid DeepSpeed, not implemented (F_DEFAULT_ONLY with .dflt = DeepSpeed's
 *   default as JSON, or K_FEATURE for a whole feature section with an on switch):
 *   at the default / off it has no effect (listed like the above); any other value
 *   is recorded in cfg->unsupported and refused by zoff_config_check_supported
 *   with the key, the value and .note as a hint.
 * Anything else is an unknown key: an error with the allowed keys and a "did you
 * mean". "auto" (the Hugging Face Trainer's placeholder) is an error naming every
 * key that holds it, except for keys that implement "auto" (F_AUTO_OK).
 *
 * Defaults are DeepSpeed 0.19.8's (deepspeed/runtime/constants.py,
 * zero/config.py, zero/offload_config.py, swap_tensor/constants.py,
 * precision_config.py, lr_schedules.py, and the optimizers' constructors). */
#include "zoff/config.h"

#include <jansson.h>

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------ key tables */

typedef enum key_kind {
    K_BOOL,    /* bool field; JSON true/false only */
    K_INT,     /* int field; JSON integer, or a real with integral value (5e8) */
    K_I64,     /* int64_t field; same */
    K_NUM,     /* double field; any JSON number */
    K_STR,     /* char[] field; JSON string that fits */
    K_ENUM,    /* enum field; JSON string from a list */
    K_SECTION, /* nested object with its own table */
    K_CUSTOM,  /* handled by a function */
    K_ALIAS,   /* another name for a key of the same table */
    K_ANY,     /* any JSON value (with F_UNSTORED: nothing is stored) */
    K_FEATURE  /* object of a DeepSpeed feature zoff does not implement: accepted while off (.sw) */
} key_kind;

enum {
    F_LO_OPEN = 1u << 0,      /* K_NUM: lower bound excluded */
    F_HI_OPEN = 1u << 1,      /* K_NUM: upper bound excluded */
    F_REQUIRED = 1u << 2,     /* the key must be present in its object */
    F_NO_EFFECT = 1u << 3,    /* accepted, no effect in zoff by design; .note says why */
    F_DEFAULT_ONLY = 1u << 4, /* not implemented: only DeepSpeed's default .dflt is accepted; .note is a hint */
    F_UNSTORED = 1u << 5,     /* no field: the value is checked, not kept */
    F_AUTO_OK = 1u << 6,      /* "auto" is a value this key implements */
    F_NULL_OK = 1u << 7,      /* null means "not given" (DeepSpeed's Optional[...] = None) */
    F_NOCASE = 1u << 8,       /* K_ENUM: matched case-insensitively (DeepSpeed lowercases / uppercases it) */
    F_EMPTY_OK = 1u << 9,     /* K_STR: "" is a value (DeepSpeed's default of the key) */
};

typedef struct enum_name {
    const char *name;
    int value;
} enum_name;

typedef struct walk walk;
typedef struct key_spec key_spec;
/* A custom handler gets the JSON value, the key path and the section's struct. */
typedef zoff_status (*custom_fn)(walk *w, const key_spec *k, json_t *v, const char *path, char *base);

typedef struct section {
    const key_spec *keys;
    size_t n;
    /* Per-type key sets (optimizer.params, scheduler.params): the bit of the
     * current type, matched against key_spec.mask; NULL = every key. */
    unsigned (*mask_of)(const zoff_config *cfg);
    const char *(*mask_name)(const zoff_config *cfg);
} section;

struct key_spec {
    const char *name;
    key_kind kind;
    size_t offset;         /* of the field (K_SECTION: of the nested struct) in the section's struct */
    size_t size;           /* K_STR: capacity of the char array */
    int64_t ilo, ihi;      /* K_INT, K_I64: allowed range */
    double dlo, dhi;       /* K_NUM: allowed range */
    unsigned flags;
    const enum_name *enums; /* K_ENUM, terminated by a NULL name */
    const section *sub;    /* K_SECTION */
    custom_fn custom;      /* K_CUSTOM */
    const char *alias_of;  /* K_ALIAS: the key this is another name for */
    unsigned mask;         /* 0: always allowed; else the types (section.mask_of) that allow it */
    const char *note;      /* extra words for messages; F_NO_EFFECT: why; F_DEFAULT_ONLY, K_FEATURE: a hint */
    const char *dflt;      /* F_DEFAULT_ONLY: DeepSpeed's default as JSON text ("false", "1", "\"mean\"", "null") */
    const char *sw;        /* K_FEATURE: the key that turns the feature on ("enabled"); NULL: any non-empty object */
    const char *allowed;   /* K_CUSTOM, K_ANY: what is allowed, in words, for messages */
};

#define FIELD(T, f) (((T *)0)->f)
#define INT_KIND(T, f) _Generic(FIELD(T, f), int: K_INT, int64_t: K_I64)

/* One line per key. Trailing arguments are extra designated initializers (.mask, .flags, .note). */
#define KB(nm, T, f, ...) {.name = (nm), .kind = K_BOOL, .offset = offsetof(T, f), __VA_ARGS__}
#define KI(nm, T, f, ...) KI_(nm, T, f, __VA_ARGS__) /* lets the range be NONNEG / POSITIVE */
#define KI_(nm, T, f, lo, hi, ...) \
    {.name = (nm), .kind = INT_KIND(T, f), .offset = offsetof(T, f), .ilo = (lo), .ihi = (hi), __VA_ARGS__}
#define KN(nm, T, f, lo, hi, ...) \
    {.name = (nm), .kind = K_NUM, .offset = offsetof(T, f), .dlo = (lo), .dhi = (hi), __VA_ARGS__}
#define KS(nm, T, f, ...) \
    {.name = (nm), .kind = K_STR, .offset = offsetof(T, f), .size = sizeof(FIELD(T, f)), __VA_ARGS__}
#define KE(nm, T, f, list, ...) {.name = (nm), .kind = K_ENUM, .offset = offsetof(T, f), .enums = (list), __VA_ARGS__}
#define KSEC(nm, T, f, sec, ...) {.name = (nm), .kind = K_SECTION, .offset = offsetof(T, f), .sub = (sec), __VA_ARGS__}
/* A nested object whose keys live in the same struct as its parent's. */
#define KSEC_SAME(nm, sec, ...) {.name = (nm), .kind = K_SECTION, .offset = 0, .sub = (sec), __VA_ARGS__}
#define KC(nm, fn, ...) {.name = (nm), .kind = K_CUSTOM, .custom = (fn), __VA_ARGS__}
#define KA(nm, target) {.name = (nm), .kind = K_ALIAS, .alias_of = (target)}
#define SECTION(table, ...) {(table), sizeof(table) / sizeof((table)[0]), __VA_ARGS__}
/* Appended to a stored key's line: accepted, kept in the struct, no effect in zoff (why). */
#define NOEFF(why) .flags = F_NO_EFFECT, .note = (why)

/* Accepted, no effect in zoff, nothing stored: the value is type-checked (null allowed). */
#define XU_ (F_NO_EFFECT | F_UNSTORED | F_NULL_OK)
#define XB(nm, why) {.name = (nm), .kind = K_BOOL, .flags = XU_, .note = (why)}
#define XI(nm, ...) XI_(nm, __VA_ARGS__) /* lets the range be NONNEG */
#define XI_(nm, lo, hi, why) {.name = (nm), .kind = K_I64, .ilo = (lo), .ihi = (hi), .flags = XU_, .note = (why)}
#define XN(nm, lo, hi, why) {.name = (nm), .kind = K_NUM, .dlo = (lo), .dhi = (hi), .flags = XU_, .note = (why)}
#define XS(nm, why) {.name = (nm), .kind = K_STR, .flags = XU_, .note = (why)}
#define XE(nm, list, why) {.name = (nm), .kind = K_ENUM, .enums = (list), .flags = XU_ | F_NOCASE, .note = (why)}
#define XANY(nm, words, why) {.name = (nm), .kind = K_ANY, .allowed = (words), .flags = XU_, .note = (why)}
/* Valid DeepSpeed, not implemented: accepted only at DeepSpeed's default `dj` (JSON text; null = not given). */
#define DU_ (F_DEFAULT_ONLY | F_UNSTORED | F_NULL_OK)
#define DB(nm, dj, hint) {.name = (nm), .kind = K_BOOL, .dflt = (dj), .flags = DU_, .note = (hint)}
#define DI(nm, ...) DI_(nm, __VA_ARGS__)
#define DI_(nm, lo, hi, dj, hint) \
    {.name = (nm), .kind = K_I64, .ilo = (lo), .ihi = (hi), .dflt = (dj), .flags = DU_, .note = (hint)}
#define DE(nm, list, dj, hint) \
    {.name = (nm), .kind = K_ENUM, .enums = (list), .dflt = (dj), .flags = DU_ | F_NOCASE, .note = (hint)}
#define DANY(nm, words, dj, hint) \
    {.name = (nm), .kind = K_ANY, .allowed = (words), .dflt = (dj), .flags = DU_, .note = (hint)}
/* A DeepSpeed feature's object, not implemented: accepted while `onkey` is absent or false
 * (onkey NULL: while the object is empty); its other keys are then not checked. */
#define KF(nm, onkey, hint) {.name = (nm), .kind = K_FEATURE, .sw = (onkey), .note = (hint)}

#define ANY_INT INT64_MIN, INT64_MAX
#define NONNEG 0, INT64_MAX
#define POSITIVE 1, INT64_MAX

_Static_assert(sizeof(zoff_optimizer_type) == sizeof(int) && sizeof(zoff_scheduler_type) == sizeof(int) &&
                   sizeof(zoff_warmup_type) == sizeof(int) && sizeof(zoff_offload_device) == sizeof(int),
               "K_ENUM stores enums as int");

static const enum_name k_devices[] = {
    {"none", ZOFF_OFFLOAD_NONE}, {"cpu", ZOFF_OFFLOAD_CPU}, {"nvme", ZOFF_OFFLOAD_NVME}, {NULL, 0}};
static const enum_name k_warmup_types[] = {{"log", ZOFF_WARMUP_LOG}, {"linear", ZOFF_WARMUP_LINEAR}, {NULL, 0}};
/* DeepSpeed's optimizer names, matched case-insensitively as DeepSpeed does. */
static const enum_name k_optimizers[] = {{"Adam", ZOFF_OPTIM_ADAM},
                                         {"AdamW", ZOFF_OPTIM_ADAMW},
                                         {"Adagrad", ZOFF_OPTIM_ADAGRAD},
                                         {"Lion", ZOFF_OPTIM_LION},
                                         {NULL, 0}};
/* DeepSpeed's scheduler names are class names: matched exactly. */
static const enum_name k_schedulers[] = {{"WarmupLR", ZOFF_SCHED_WARMUP_LR},
                                         {"WarmupDecayLR", ZOFF_SCHED_WARMUP_DECAY_LR},
                                         {"WarmupCosineLR", ZOFF_SCHED_WARMUP_COSINE_LR},
                                         {"OneCycle", ZOFF_SCHED_ONE_CYCLE},
                                         {"LRRangeTest", ZOFF_SCHED_LR_RANGE_TEST},
                                         {NULL, 0}};
/* Value lists of keys zoff checks but does not store (the numbers are unused). */
static const enum_name k_comm_dtypes[] = {{"fp16", 0}, {"bf16", 1}, {"fp32", 2}, {NULL, 0}};
static const enum_name k_allreduce_ops[] = {{"mean", 0}, {"sum", 1}, {NULL, 0}};
static const enum_name k_tag_validation[] = {{"Ignore", 0}, {"Warn", 1}, {"Fail", 2}, {NULL, 0}};
/* DeepSpeed's DtypeEnum names for data_types.grad_accum_dtype; value: 0 fp32, 1 fp16, 2 bf16. */
static const enum_name k_dtype_names[] = {
    {"fp32", 0},          {"fp16", 1},          {"bf16", 2},          {"float32", 0}, {"float", 0},
    {"torch.float32", 0}, {"float16", 1},       {"half", 1},          {"torch.float16", 1},
    {"bfloat16", 2},      {"torch.bfloat16", 2}, {NULL, 0}};

/* Optimizer and scheduler types as key-mask bits. */
#define M_ADAM (1u << ZOFF_OPTIM_ADAM)
#define M_ADAMW (1u << ZOFF_OPTIM_ADAMW)
#define M_ADAGRAD (1u << ZOFF_OPTIM_ADAGRAD)
#define M_LION (1u << ZOFF_OPTIM_LION)
#define M_WLR (1u << ZOFF_SCHED_WARMUP_LR)
#define M_WDECAY (1u << ZOFF_SCHED_WARMUP_DECAY_LR)
#define M_WCOS (1u << ZOFF_SCHED_WARMUP_COSINE_LR)
#define M_1CYC (1u << ZOFF_SCHED_ONE_CYCLE)
#define M_LRRT (1u << ZOFF_SCHED_LR_RANGE_TEST)

static zoff_status h_optimizer_type(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static zoff_status h_betas(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static zoff_status h_bool_checked(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static zoff_status h_last_batch_iteration(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static zoff_status h_ratio(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static zoff_status h_grad_buckets(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static zoff_status h_grad_accum_dtype(walk *w, const key_spec *k, json_t *v, const char *path, char *base);
static unsigned optimizer_mask(const zoff_config *cfg);
static const char *optimizer_name(const zoff_config *cfg);
static unsigned scheduler_mask(const zoff_config *cfg);
static const char *scheduler_name(const zoff_config *cfg);

/* Reasons and hints shared by several lines. */
#define ST3 "a DeepSpeed stage 3 tuning setting zoff does not use: its stage 3 gathers one parameter group at a time, " \
            "prefetching up to stage3_prefetch_bucket_size elements (no effect in stages 0-2 either)"
#define PROF "a flops profiler setting; the profiler is off"
#define MON "a setting of a monitor that is off"
#define MON_HINT "zoff writes loss, lr, grad norm and step times to DIR/metrics.jsonl every step, and DeepSpeed's tensorboard and csv_monitor"
#define COMMS "a communication logger setting; the logger is off"
#define ZPP "ZeRO++ (stage 3) is not implemented"
#define MICS "MiCS (a stage 3 variant) is not implemented"

/* optimizer.params: which keys each optimizer takes follows the constructors
 * DeepSpeed calls (FusedAdam/DeepSpeedCPUAdam, Adagrad, FusedLion). */
static const key_spec k_optimizer_params[] = {
    KN("lr", zoff_optimizer_config, lr, 0, INFINITY),
    KC("betas", h_betas, .mask = M_ADAM | M_ADAMW | M_LION, .allowed = "an array of two numbers, each in [0, 1)"),
    KN("eps", zoff_optimizer_config, eps, 0, INFINITY, .mask = M_ADAM | M_ADAMW | M_ADAGRAD),
    KN("weight_decay", zoff_optimizer_config, weight_decay, 0, INFINITY),
    KB("adam_w_mode", zoff_optimizer_config, adam_w_mode, .mask = M_ADAM | M_ADAMW),
    KB("bias_correction", zoff_optimizer_config, bias_correction, .mask = M_ADAM | M_ADAMW),
    KB("torch_adam", zoff_optimizer_config, torch_adam, .mask = M_ADAM | M_ADAMW),
    {.name = "fp32_optimizer_states", .kind = K_BOOL, .flags = XU_, .mask = M_ADAM | M_ADAMW | M_ADAGRAD | M_LION,
     .note = "DeepSpeed's CPU optimizers keep m and v in the dtype of the parameters they update when false; "
             "those are zoff's fp32 master weights either way (bf16 state: bf16.bf16_optimizer_states)"},
    /* true is refused after the walk (validate_config): the reason depends on torch_adam */
    KC("amsgrad", h_bool_checked, .mask = M_ADAM | M_ADAMW | M_ADAGRAD, .allowed = "false"),
    {.name = "foreach", .kind = K_BOOL, .flags = XU_, .mask = M_ADAM | M_ADAMW | M_ADAGRAD,
     .note = "chooses torch's multi-tensor implementation of the same update (torch_adam's torch.optim.AdamW and "
             "torch's Adagrad take it); zoff's CPU optimizer has its own kernels"},
    {.name = "set_grad_none", .kind = K_BOOL, .flags = XU_, .mask = M_ADAM | M_ADAMW | M_LION,
     .note = "whether DeepSpeed's fused Adam and Lion set the gradients to None or to zeros in zero_grad (memory, "
             "not values); zoff clears its own gradient buffer before each step's accumulation"},
    KN("initial_accumulator_value", zoff_optimizer_config, initial_accumulator_value, 0, INFINITY,
       .mask = M_ADAGRAD),
};
static const section s_optimizer_params = SECTION(k_optimizer_params, optimizer_mask, optimizer_name);

static const key_spec k_optimizer[] = {
    KC("type", h_optimizer_type, .flags = F_REQUIRED, /* first: params are checked against it */
       .allowed = "\"Adam\", \"AdamW\", \"Adagrad\" or \"Lion\""),
    KSEC_SAME("params", &s_optimizer_params),
    XB("legacy_fusion", "chooses between two DeepSpeed fp16 optimizer implementations; zoff has one"),
};
static const section s_optimizer = SECTION(k_optimizer, NULL, NULL);

/* scheduler.params: the constructor arguments of DeepSpeed's WarmupLR,
 * WarmupDecayLR, WarmupCosineLR, OneCycle and LRRangeTest. */
static const key_spec k_scheduler_params[] = {
    KN("warmup_min_lr", zoff_scheduler_config, warmup_min_lr, 0, INFINITY, .mask = M_WLR | M_WDECAY),
    KN("warmup_max_lr", zoff_scheduler_config, warmup_max_lr, 0, INFINITY, .mask = M_WLR | M_WDECAY),
    KI("warmup_num_steps", zoff_scheduler_config, warmup_num_steps, POSITIVE),
    KE("warmup_type", zoff_scheduler_config, warmup_type, k_warmup_types),
    KI("total_num_steps", zoff_scheduler_config, total_num_steps, POSITIVE, .mask = M_WDECAY | M_WCOS),
    KN("warmup_min_ratio", zoff_scheduler_config, warmup_min_ratio, 0, 1, .mask = M_WCOS),
    KN("cos_min_ratio", zoff_scheduler_config, cos_min_ratio, 0, 1, .mask = M_WCOS),
    KN("cycle_min_lr", zoff_scheduler_config, cycle_min_lr, 0, INFINITY, .mask = M_1CYC),
    KN("cycle_max_lr", zoff_scheduler_config, cycle_max_lr, 0, INFINITY, .mask = M_1CYC),
    KN("decay_lr_rate", zoff_scheduler_config, decay_lr_rate, 0, INFINITY, .mask = M_1CYC),
    KI("cycle_first_step_size", zoff_scheduler_config, cycle_first_step_size, POSITIVE, .mask = M_1CYC),
    KI("cycle_second_step_size", zoff_scheduler_config, cycle_second_step_size, NONNEG, .mask = M_1CYC,
       .flags = F_NULL_OK),
    KI("cycle_first_stair_count", zoff_scheduler_config, cycle_first_stair_count, NONNEG, .mask = M_1CYC,
       .flags = F_NULL_OK),
    KI("cycle_second_stair_count", zoff_scheduler_config, cycle_second_stair_count, NONNEG, .mask = M_1CYC,
       .flags = F_NULL_OK),
    KI("decay_step_size", zoff_scheduler_config, decay_step_size, NONNEG, .mask = M_1CYC),
    KB("cycle_momentum", zoff_scheduler_config, cycle_momentum, .mask = M_1CYC),
    KN("cycle_min_mom", zoff_scheduler_config, cycle_min_mom, 0, 1, .flags = F_HI_OPEN, .mask = M_1CYC),
    KN("cycle_max_mom", zoff_scheduler_config, cycle_max_mom, 0, 1, .flags = F_HI_OPEN, .mask = M_1CYC),
    KN("decay_mom_rate", zoff_scheduler_config, decay_mom_rate, 0, INFINITY, .mask = M_1CYC),
    KN("lr_range_test_min_lr", zoff_scheduler_config, lr_range_test_min_lr, 0, INFINITY, .mask = M_LRRT),
    KI("lr_range_test_step_size", zoff_scheduler_config, lr_range_test_step_size, POSITIVE, .mask = M_LRRT),
    KN("lr_range_test_step_rate", zoff_scheduler_config, lr_range_test_step_rate, 0, INFINITY, .mask = M_LRRT),
    KB("lr_range_test_staircase", zoff_scheduler_config, lr_range_test_staircase, .mask = M_LRRT),
    KC("last_batch_iteration", h_last_batch_iteration, .allowed = "-1"),
};
static const section s_scheduler_params = SECTION(k_scheduler_params, scheduler_mask, scheduler_name);

static const key_spec k_scheduler[] = {
    KE("type", zoff_scheduler_config, type, k_schedulers, .flags = F_REQUIRED,
       .note = " (DeepSpeed's own schedules; the torch.optim.lr_scheduler classes DeepSpeed also builds by name, "
               "such as StepLR or CosineAnnealingLR, are not implemented in zoff)"),
    KSEC_SAME("params", &s_scheduler_params),
};
static const section s_scheduler = SECTION(k_scheduler, NULL, NULL);

/* A loss scale (static, or the dynamic one's floor) is at most fp32's largest: the scale multiplies the
 * fp32 loss gradient (gpt2_forward). */
#define LOSS_SCALE_MAX FLT_MAX

static const key_spec k_fp16[] = {
    KB("enabled", zoff_fp16_config, enabled),
    XB("auto_cast", "casts floating-point model inputs to fp16; zoff's model input is token ids, which it leaves alone"),
    KN("loss_scale", zoff_fp16_config, loss_scale, 0, LOSS_SCALE_MAX),
    KI("initial_scale_power", zoff_fp16_config, initial_scale_power, 0, 127),
    KI("loss_scale_window", zoff_fp16_config, loss_scale_window, 1, INT_MAX),
    KI("hysteresis", zoff_fp16_config, hysteresis, 1, INT_MAX),
    KB("consecutive_hysteresis", zoff_fp16_config, consecutive_hysteresis),
    KN("min_loss_scale", zoff_fp16_config, min_loss_scale, 0, LOSS_SCALE_MAX, .flags = F_LO_OPEN),
    DB("fp16_master_weights_and_grads", "false", "16-bit master weights are not implemented: zoff keeps fp32 ones"),
};
static const section s_fp16 = SECTION(k_fp16, NULL, NULL);

static const key_spec k_bf16[] = {
    KB("enabled", zoff_config, bf16_enabled),
    XB("immediate_grad_update", "when DeepSpeed's bf16 optimizer folds 16-bit gradients into fp32 ones; zoff "
                                "accumulates on the device and has no fp32 gradient buffer"),
    XB("check_grad_overflow", "zoff always checks the gradients for inf/NaN and skips such a step, in every precision"),
    DB("bf16_master_weights_and_grads", "false", "16-bit master weights are not implemented: zoff keeps fp32 ones"),
    KB("bf16_optimizer_states", zoff_config, bf16_optimizer_states),
};
static const section s_bf16 = SECTION(k_bf16, NULL, NULL);

static const key_spec k_offload_optimizer[] = {
    KE("device", zoff_offload_optimizer_config, device, k_devices),
    KS("nvme_path", zoff_offload_optimizer_config, nvme_path, .flags = F_NULL_OK),
    KB("pin_memory", zoff_offload_optimizer_config, pin_memory),
    KI("buffer_count", zoff_offload_optimizer_config, buffer_count, NONNEG),
    KB("pipeline_read", zoff_offload_optimizer_config, pipeline_read),
    KB("pipeline_write", zoff_offload_optimizer_config, pipeline_write),
    KB("fast_init", zoff_offload_optimizer_config, fast_init),
    KC("ratio", h_ratio, .flags = F_AUTO_OK, .allowed = "a number in [0, 1] or \"auto\""),
    KB("super_offload", zoff_offload_optimizer_config, super_offload),
    XB("convert_grad_on_cpu", "where 16-bit gradients are widened to fp32; zoff widens them inside its CPU "
                              "optimizer (the same values)"),
    KN("cpuadam_cores_perc", zoff_offload_optimizer_config, cpuadam_cores_perc, 0, 1),
};
static const section s_offload_optimizer = SECTION(k_offload_optimizer, NULL, NULL);

static const key_spec k_offload_param[] = {
    KE("device", zoff_offload_param_config, device, k_devices),
    KS("nvme_path", zoff_offload_param_config, nvme_path, .flags = F_NULL_OK),
    KB("pin_memory", zoff_offload_param_config, pin_memory),
    KI("buffer_count", zoff_offload_param_config, buffer_count, NONNEG),
    KI("buffer_size", zoff_offload_param_config, buffer_size, NONNEG),
    KI("max_in_cpu", zoff_offload_param_config, max_in_cpu, NONNEG),
};
static const section s_offload_param = SECTION(k_offload_param, NULL, NULL);

static const key_spec k_zero[] = {
    KI("stage", zoff_zero_config, stage, 0, 3,
       .note = "0, 1, 2 and 3 (3 also partitions the 16-bit weights, gathered group by group; docs/multinode.md)"),
    KB("contiguous_gradients", zoff_zero_config, contiguous_gradients,
       NOEFF("zoff's gradients always live in one flat buffer")),
    KB("overlap_comm", zoff_zero_config, overlap_comm,
       NOEFF("zoff always overlaps gradient copies and reductions with backward (zoff plan's time estimate "
             "reads it)")),
    KB("reduce_scatter", zoff_zero_config, reduce_scatter,
       NOEFF("zoff reduce-scatters in stage 2 and all-reduces in stages 0-1: the same sums")),
    KB("allgather_partitions", zoff_zero_config, allgather_partitions,
       NOEFF("zoff always all-gathers the updated weights (DeepSpeed's alternative, broadcasts, gives the same)")),
    KI("reduce_bucket_size", zoff_zero_config, reduce_bucket_size, POSITIVE),
    KI("allgather_bucket_size", zoff_zero_config, allgather_bucket_size, NONNEG,
       NOEFF("zoff all-gathers in place in one collective (in reduce_bucket_size pieces with round_robin_gradients)")),
    KI("sub_group_size", zoff_zero_config, sub_group_size, NONNEG),
    KB("round_robin_gradients", zoff_zero_config, round_robin_gradients),
    KB("cpu_offload", zoff_zero_config, cpu_offload, .flags = F_NULL_OK),
    DB("cpu_offload_param", "false", "deprecated; give offload_param.device \"cpu\" (stage 3) instead"),
    XB("cpu_offload_use_pin_memory", "deprecated; sets nothing in DeepSpeed either (use offload_optimizer.pin_memory)"),
    DB("load_from_fp32_weights", "true", "zoff always restores the fp32 master weights from its checkpoint"),
    XB("ignore_unused_parameters", "zoff's GPT-2 uses every parameter in every step"),
    XB("legacy_stage1", "selects DeepSpeed's old stage 1 code; zoff has one implementation"),
    XB("use_multi_rank_bucket_allreduce", "chooses how DeepSpeed groups its reductions; zoff's collectives give the "
                                          "same sums"),
    XB("compute_grad_norm", "zoff always computes the global gradient norm (metrics report it); skipping it changes "
                            "no values"),
    XB("parameter_alignment", "pads DeepSpeed's flat buffers for aligned parameters; zoff's flat layout is its own"),
    XB("enable_sanity_checks", "DeepSpeed's internal debugging checks"),
    KB("elastic_checkpoint", zoff_zero_config, elastic_checkpoint,
       NOEFF("a DeepSpeed checkpoint layout option; zoff's checkpoints reshard to any number of ranks on resume")),
    KI("stage3_prefetch_bucket_size", zoff_zero_config, stage3_prefetch_bucket_size, NONNEG),
    KA("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
    KI("stage3_param_persistence_threshold", zoff_zero_config, stage3_param_persistence_threshold, NONNEG),
    KA("param_persistence_threshold", "stage3_param_persistence_threshold"),
    XI("stage3_model_persistence_threshold", NONNEG, ST3),
    KA("model_persistence_threshold", "stage3_model_persistence_threshold"),
    KI("stage3_max_live_parameters", zoff_zero_config, stage3_max_live_parameters, NONNEG, NOEFF(ST3)),
    KA("max_live_parameters", "stage3_max_live_parameters"),
    KI("stage3_max_reuse_distance", zoff_zero_config, stage3_max_reuse_distance, NONNEG, NOEFF(ST3)),
    KA("max_reuse_distance", "stage3_max_reuse_distance"),
    KB("stage3_gather_16bit_weights_on_model_save", zoff_zero_config, stage3_gather_16bit_weights_on_model_save,
       NOEFF("zoff's checkpoints always hold the whole model (rank 0 gathers it); zoff export writes 16-bit "
             "safetensors")),
    KA("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"),
    KA("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"),
    XI("stage3_module_granularity_threshold", ANY_INT, ST3),
    KA("module_granularity_threshold", "stage3_module_granularity_threshold"),
    XB("stage3_use_all_reduce_for_fetch_params", ST3),
    KA("use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"),
    XB("stage3_allgather_sequential", ST3),
    KA("allgather_sequential", "stage3_allgather_sequential"),
    XI("stage3_partition_stream_chunk_size", NONNEG, ST3),
    KA("partition_stream_chunk_size", "stage3_partition_stream_chunk_size"),
    XB("memory_efficient_linear", ST3),
    XB("pipeline_loading_checkpoint", ST3),
    XB("override_module_apply", ST3),
    XB("log_trace_cache_warnings", ST3),
    DI("zero_hpz_partition_size", NONNEG, "1", ZPP),
    DB("zero_quantized_weights", "false", ZPP),
    DB("zero_quantized_nontrainable_weights", "false", ZPP),
    DB("zero_quantized_gradients", "false", ZPP),
    DANY("zeropp_loco_param", "an object or null", "null", ZPP),
    DI("mics_shard_size", ANY_INT, "-1", MICS),
    DB("mics_hierarchical_params_gather", "false", MICS),
    KF("zenflow", NULL, "ZenFlow (stall-free offload) is not implemented"),
    KB("zoff_delayed_param_update", zoff_zero_config, delayed_param_update),
    KC("zoff_grad_buckets", h_grad_buckets, .allowed = "true, false or \"always\""),
    KI("zoff_delayed_param_update_warmup", zoff_zero_config, delayed_param_update_warmup, NONNEG),
    KSEC("offload_optimizer", zoff_zero_config, offload_optimizer, &s_offload_optimizer),
    KSEC("offload_param", zoff_zero_config, offload_param, &s_offload_param),
};
static const section s_zero = SECTION(k_zero, NULL, NULL);

static const key_spec k_aio[] = {
    KI("block_size", zoff_aio_config, block_size, POSITIVE),
    KI("queue_depth", zoff_aio_config, queue_depth, POSITIVE),
    KI("intra_op_parallelism", zoff_aio_config, intra_op_parallelism, POSITIVE),
    KA("thread_count", "intra_op_parallelism"),
    KB("single_submit", zoff_aio_config, single_submit),
    KB("overlap_events", zoff_aio_config, overlap_events),
    DB("use_gds", "false", "GPUDirect Storage is not implemented: zoff's swap I/O goes through pinned host memory"),
};
static const section s_aio = SECTION(k_aio, NULL, NULL);

static const key_spec k_model[] = {
    KI("num_layers", zoff_model_config, num_layers, POSITIVE),
    KI("hidden_size", zoff_model_config, hidden_size, POSITIVE),
    KI("num_attention_heads", zoff_model_config, num_attention_heads, POSITIVE),
    KI("seq_length", zoff_model_config, seq_length, POSITIVE),
    KI("vocab_size", zoff_model_config, vocab_size, POSITIVE),
    KI("max_position_embeddings", zoff_model_config, max_position_embeddings, POSITIVE),
};
static const section s_model = SECTION(k_model, NULL, NULL);

/* activation_checkpointing configures deepspeed.checkpointing, which a model calls;
 * zoff's GPT-2 checkpoints activations with `zoff train --checkpoint-activations`. */
static const key_spec k_act_ckpt[] = {
    DB("partition_activations", "false", "partitioning activations over model-parallel ranks is not implemented; "
                                         "zoff recomputes activations with `zoff train --checkpoint-activations`"),
    DB("cpu_checkpointing", "false", "moving checkpointed activations to the host is not implemented; `zoff train "
                                     "--checkpoint-activations` recomputes them"),
    XB("contiguous_memory_optimization", "arranges PyTorch's activation buffers against allocator fragmentation; "
                                         "zoff has no PyTorch allocator"),
    XI("number_checkpoints", NONNEG, "sizes the buffer of contiguous_memory_optimization"),
    XB("synchronize_checkpoint_boundary", "a device synchronisation at each checkpoint, for debugging"),
    DB("profile", "false", "timing each checkpointed function is not implemented; metrics.jsonl has the forward "
                           "and backward time of every step"),
};
static const section s_act_ckpt = SECTION(k_act_ckpt, NULL, NULL);

static const key_spec k_flops_profiler[] = {
    DB("enabled", "false", "the flops profiler is not implemented; metrics.jsonl and `zoff bench step` report step "
                           "times and tokens/s"),
    XN("recompute_fwd_factor", 0, INFINITY, PROF),
    XI("profile_step", ANY_INT, PROF),
    XI("module_depth", ANY_INT, PROF),
    XI("top_modules", ANY_INT, PROF),
    XB("detailed", PROF),
    XS("output_file", PROF),
};
static const section s_flops_profiler = SECTION(k_flops_profiler, NULL, NULL);

/* tensorboard, csv_monitor: DeepSpeed's monitors, written by src/train/monitor.c */
static const key_spec k_monitor[] = {
    KB("enabled", zoff_monitor_config, enabled),
    KS("output_path", zoff_monitor_config, output_path, .flags = F_EMPTY_OK),
    KS("job_name", zoff_monitor_config, job_name, .flags = F_EMPTY_OK),
};
static const section s_monitor = SECTION(k_monitor, NULL, NULL);

static const key_spec k_wandb[] = {
    DB("enabled", "false", "Weights & Biases logging is not implemented; " MON_HINT),
    XS("group", MON),
    XS("team", MON),
    XS("project", MON),
};
static const section s_wandb = SECTION(k_wandb, NULL, NULL);


static const key_spec k_comet[] = {
    DB("enabled", "false", "Comet logging is not implemented; " MON_HINT),
    XI("samples_log_interval", ANY_INT, MON),
    XS("project", MON),
    XS("workspace", MON),
    XS("api_key", MON),
    XS("experiment_name", MON),
    XS("experiment_key", MON),
    XB("online", MON),
    XS("mode", MON),
};
static const section s_comet = SECTION(k_comet, NULL, NULL);

static const key_spec k_trackio[] = {
    DB("enabled", "false", "Trackio logging is not implemented; " MON_HINT),
    XS("project", MON),
};
static const section s_trackio = SECTION(k_trackio, NULL, NULL);

static const key_spec k_comms_logger[] = {
    DB("enabled", "false", "communication logging is not implemented"),
    XB("verbose", COMMS),
    XB("prof_all", COMMS),
    XB("debug", COMMS),
    XANY("prof_ops", "a list of operation names", COMMS),
};
static const section s_comms_logger = SECTION(k_comms_logger, NULL, NULL);

static const key_spec k_ckpt_parallel_write[] = {
    XB("pipeline_stage", "writes checkpoints in parallel by pipeline stage; zoff has no pipeline parallelism"),
};
static const section s_ckpt_parallel_write = SECTION(k_ckpt_parallel_write, NULL, NULL);

static const key_spec k_checkpoint[] = {
    XE("tag_validation", k_tag_validation, "checks that ranks agree on DeepSpeed's checkpoint tag; zoff names "
                                           "checkpoints by step and commits one only when every rank has written"),
    DB("load_universal", "false", "DeepSpeed's universal checkpoints are not implemented (zoff's own checkpoints "
                                  "reshard to any number of ranks on resume)"),
    DB("use_node_local_storage", "false", "node-local checkpoint storage is not implemented: every rank writes "
                                          "under --save"),
    KSEC_SAME("parallel_write", &s_ckpt_parallel_write),
};
static const section s_checkpoint = SECTION(k_checkpoint, NULL, NULL);

static const key_spec k_data_types[] = {
    KC("grad_accum_dtype", h_grad_accum_dtype, .allowed = "\"fp32\", \"fp16\" or \"bf16\" (or null)",
       .note = "implemented when it is the training dtype (null: DeepSpeed's default, the same except bf16 at "
               "stage 0, where DeepSpeed's is fp32); another dtype is refused as not implemented"),
    DE("param_dtype", k_dtype_names, "null", "zoff's parameter dtype is set by fp16.enabled / bf16.enabled"),
    XE("buffer_dtype", k_dtype_names, "the dtype of the model's non-parameter buffers; zoff's GPT-2 has none"),
};
static const section s_data_types = SECTION(k_data_types, NULL, NULL);

static const key_spec k_top[] = {
    KI("train_batch_size", zoff_config, train_batch_size, POSITIVE, .flags = F_NULL_OK),
    KI("train_micro_batch_size_per_gpu", zoff_config, train_micro_batch_size_per_gpu, POSITIVE, .flags = F_NULL_OK),
    KI("gradient_accumulation_steps", zoff_config, gradient_accumulation_steps, POSITIVE, .flags = F_NULL_OK),
    DB("managed_gradient_accumulation", "true", "zoff's training loop always owns the accumulation boundary"),
    KSEC("optimizer", zoff_config, optimizer, &s_optimizer),
    KSEC("scheduler", zoff_config, scheduler, &s_scheduler),
    KN("gradient_clipping", zoff_config, gradient_clipping, 0, INFINITY),
    KSEC("fp16", zoff_config, fp16, &s_fp16),
    KSEC_SAME("bf16", &s_bf16),
    KA("bfloat16", "bf16"),
    KSEC_SAME("data_types", &s_data_types), /* after fp16 and bf16: compared with the training dtype */
    KI("steps_per_print", zoff_config, steps_per_print, POSITIVE),
    KB("wall_clock_breakdown", zoff_config, wall_clock_breakdown),
    KB("prescale_gradients", zoff_config, prescale_gradients,
       NOEFF("where DeepSpeed divides by the rank count; zoff pre-divides the loss gradient and sums in fp32")),
    KN("gradient_predivide_factor", zoff_config, gradient_predivide_factor, 0, INFINITY, .flags = F_LO_OPEN | F_NO_EFFECT,
       .note = "splits DeepSpeed's division by the rank count in two; zoff pre-divides the loss gradient and sums in "
               "fp32"),
    /* "fp32" is what zoff does: 16-bit gradients are widened to fp32 for the collective (comm.h) */
    DE("communication_data_type", k_comm_dtypes, "\"fp32\"",
       "zoff communicates gradients in fp32 whatever the training dtype (16-bit gradients are widened for the sum, "
       "which is rounded once): give \"fp32\" or null"),
    DE("gradient_allreduce_op", k_allreduce_ops, "\"mean\"", "zoff averages gradients over ranks"),
    XB("disable_allgather", "chooses an all-gather or broadcasts for the updated weights: the same values"),
    XB("sparse_gradients", "concerns torch's sparse embedding gradients; zoff's gradients are dense"),
    XB("zero_allow_untested_optimizer", "zoff runs only its own optimizers, each tested with every stage"),
    XB("zero_force_ds_cpu_optimizer", "zoff always runs its own CPU optimizer on offloaded state"),
    XB("memory_breakdown", "prints PyTorch allocator statistics; zoff has no PyTorch allocator (zoff plan shows "
                           "memory by place)"),
    XB("dump_state", "prints DeepSpeed's engine object after initialisation; zoff has no such object"),
    XB("dataloader_drop_last", "for the loader DeepSpeed builds from a torch Dataset; zoff's loader always skips an "
                               "epoch's tail shorter than a batch"),
    XB("graph_harvesting", "captures PyTorch kernel sequences in CUDA graphs; zoff launches its own kernels"),
    XB("disable_python_gc", "Python's garbage collector; zoff has no Python"),
    XI("vocabulary_size", NONNEG, "DeepSpeed only warns when it is not a multiple of 8; zoff's vocabulary is "
                                  "model.vocab_size"),
    KSEC("zero_optimization", zoff_config, zero, &s_zero),
    KSEC("aio", zoff_config, aio, &s_aio),
    KSEC("model", zoff_config, model, &s_model),
    KSEC_SAME("activation_checkpointing", &s_act_ckpt),
    KSEC_SAME("flops_profiler", &s_flops_profiler),
    KSEC("tensorboard", zoff_config, tensorboard, &s_monitor),
    KSEC_SAME("wandb", &s_wandb),
    KSEC("csv_monitor", zoff_config, csv_monitor, &s_monitor),
    KSEC_SAME("comet", &s_comet),
    KSEC_SAME("trackio", &s_trackio),
    KSEC_SAME("comms_logger", &s_comms_logger),
    KSEC_SAME("checkpoint", &s_checkpoint),
    KF("amp", "enabled", "NVIDIA Apex AMP is not implemented; use fp16 or bf16"),
    KF("torch_autocast", "enabled", "torch.autocast is not implemented; use fp16 or bf16"),
    KF("autotuning", "enabled", "the autotuner is not implemented; zoff plan and zoff bench size a run"),
    KF("elasticity", "enabled", "elastic training is not implemented"),
    KF("data_efficiency", "enabled", "the data efficiency library is not implemented"),
    KF("curriculum_learning", "enabled", "curriculum learning is not implemented"),
    KF("progressive_layer_drop", "enabled", "progressive layer drop is not implemented"),
    KF("quantize_training", "enabled", "quantization-aware training (MoQ) is not implemented"),
    KF("hybrid_engine", "enabled", "the hybrid (RLHF) engine is not implemented"),
    KF("expert_parallel", "enabled", "expert parallelism is not implemented"),
    KF("nebula", "enabled", "Nebula checkpointing is not implemented"),
    KF("compile", "deepcompile", "DeepCompile is not implemented"),
    KF("sparse_attention", NULL, "sparse attention is not implemented"),
    KF("pipeline", NULL, "pipeline parallelism is not implemented; zoff trains data parallel with mpirun -np N"),
    KF("tensor_parallel", NULL, "tensor parallelism is not implemented"),
    KF("compression_training", NULL, "compression training is not implemented"),
    KF("weight_quantization", NULL, "weight quantization is not implemented"),
};
static const section s_top = SECTION(k_top, NULL, NULL);

/* ------------------------------------------------------------------ messages */

/* A growing list of items joined by a separator (heap text, NULL while empty). */
typedef struct strlist {
    char *s;
    size_t len, cap;
} strlist;

struct walk {
    const char *src; /* source name for messages */
    zoff_config *cfg;
    strlist no_effect;   /* keys given that have no effect in zoff -> cfg->no_effect */
    strlist unsupported; /* "key value (hint)" not implemented -> cfg->unsupported */
    strlist autos;       /* "key (allowed)" holding the Trainer's "auto" -> one error after the walk */
    bool oom;            /* a list could not grow */
};

static void list_add(walk *w, strlist *l, const char *sep, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void list_add(walk *w, strlist *l, const char *sep, const char *fmt, ...) {
    char item[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    size_t add = (l->len ? strlen(sep) : 0) + strlen(item);
    if (l->len + add + 1 > l->cap) {
        size_t cap = l->cap ? l->cap : 256;
        while (cap < l->len + add + 1) cap *= 2;
        char *p = realloc(l->s, cap);
        if (p == NULL) {
            w->oom = true;
            return;
        }
        l->s = p;
        l->cap = cap;
    }
    snprintf(l->s + l->len, l->cap - l->len, "%s%s", l->len ? sep : "", item);
    l->len += add;
}

static void list_free(strlist *l) {
    free(l->s);
    *l = (strlist){0};
}

/* A JSON value as the user wrote it, shortened for a message. */
static const char *show(const json_t *v, char *buf, size_t n) {
    if (v == NULL) {
        snprintf(buf, n, "(nothing)");
    } else if (json_is_real(v)) {
        snprintf(buf, n, "%.15g", json_real_value(v));
        if (strpbrk(buf, ".eEn") == NULL && strlen(buf) + 2 < n) strcat(buf, ".0");
    } else {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
        if (s == NULL) {
            snprintf(buf, n, "(value)");
        } else {
            if (strlen(s) > 60) snprintf(buf, n, "%.57s...", s);
            else snprintf(buf, n, "%s", s);
            free(s);
        }
    }
    return buf;
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "a JSON"; /* followed by the value: "got a JSON null" */
    }
    return "a value";
}

/* "<source>: <path>: <message>" as ZOFF_ERR_CONFIG. */
static zoff_status cfg_error(const walk *w, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static zoff_status cfg_error(const walk *w, const char *path, const char *fmt, ...) {
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zoff_error(ZOFF_ERR_CONFIG, "%s: %s: %s", w->src, path, msg);
}

static void join_path(char *out, size_t n, const char *parent, const char *key) {
    if (parent[0] == '\0') snprintf(out, n, "%s", key);
    else snprintf(out, n, "%s.%s", parent, key);
}

/* Range of an integer key in words: "an integer >= 1", "an integer in [0, 3]". */
static void int_range_words(const key_spec *k, char *buf, size_t n) {
    if (k->ilo == INT64_MIN && k->ihi == INT64_MAX) snprintf(buf, n, "an integer");
    else if (k->ihi == INT64_MAX || (k->kind == K_INT && k->ihi == INT_MAX))
        snprintf(buf, n, "an integer >= %lld", (long long)k->ilo);
    else snprintf(buf, n, "an integer in [%lld, %lld]", (long long)k->ilo, (long long)k->ihi);
}

static void num_range_words(const key_spec *k, char *buf, size_t n) {
    bool lo_open = (k->flags & F_LO_OPEN) != 0, hi_open = (k->flags & F_HI_OPEN) != 0;
    if (isinf(k->dhi)) snprintf(buf, n, "a number %s %g", lo_open ? ">" : ">=", k->dlo);
    else snprintf(buf, n, "a number in %c%g, %g%c", lo_open ? '(' : '[', k->dlo, k->dhi, hi_open ? ')' : ']');
}

static void enum_words(const enum_name *e, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (; e->name != NULL; e++) {
        int m = snprintf(buf + used, n - used, "%s\"%s\"", used ? ", " : "", e->name);
        if (m < 0 || (size_t)m >= n - used) break;
        used += (size_t)m;
    }
}

/* ------------------------------------------------------------------ value readers */

/* An integer from a JSON integer or an integral JSON real (DeepSpeed users write 5e8). */
static zoff_status read_int(walk *w, json_t *v, const char *path, const char *allowed, int64_t *out) {
    char val[96];
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return ZOFF_OK;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
            *out = (int64_t)d;
            return ZOFF_OK;
        }
        return cfg_error(w, path, "%s is not an integer; allowed: %s", show(v, val, sizeof val), allowed);
    }
    return cfg_error(w, path, "expected %s, got %s %s", allowed, json_type_name(v), show(v, val, sizeof val));
}

static zoff_status read_bool(walk *w, json_t *v, const char *path, bool *out) {
    char val[96];
    if (!json_is_boolean(v))
        return cfg_error(w, path, "expected true or false (a JSON boolean, without quotes), got %s %s",
                         json_type_name(v), show(v, val, sizeof val));
    *out = json_is_true(v);
    return ZOFF_OK;
}

static zoff_status read_number(walk *w, json_t *v, const char *path, const char *allowed, double *out) {
    char val[96];
    if (!json_is_number(v))
        return cfg_error(w, path, "expected %s, got %s %s", allowed, json_type_name(v), show(v, val, sizeof val));
    *out = json_number_value(v);
    return ZOFF_OK;
}

static bool num_in_range(const key_spec *k, double d) {
    if (!isfinite(d)) return false;
    if ((k->flags & F_LO_OPEN) ? !(d > k->dlo) : !(d >= k->dlo)) return false;
    if ((k->flags & F_HI_OPEN) ? !(d < k->dhi) : !(d <= k->dhi)) return false;
    return true;
}

/* ------------------------------------------------------------------ the walker */

static zoff_status walk_section(walk *w, const section *sec, json_t *obj, const char *path, char *base);

static const key_spec *find_key(const section *sec, const char *name) {
    for (size_t i = 0; i < sec->n; i++)
        if (strcmp(sec->keys[i].name, name) == 0) return &sec->keys[i];
    return NULL;
}

static bool key_allowed(const key_spec *k, unsigned mask) { return k->mask == 0 || (k->mask & mask) != 0; }

/* The class of a key (of a section: implemented if any key in it is). */
static zoff_config_key_class key_class(const section *sec, const key_spec *k) {
    if (k->kind == K_ALIAS) {
        const key_spec *t = find_key(sec, k->alias_of);
        return t != NULL && t->kind != K_ALIAS ? key_class(sec, t) : ZOFF_KEY_IMPLEMENTED;
    }
    if (k->flags & F_NO_EFFECT) return ZOFF_KEY_NO_EFFECT;
    if ((k->flags & F_DEFAULT_ONLY) || k->kind == K_FEATURE) return ZOFF_KEY_NOT_IMPLEMENTED;
    if (k->kind == K_SECTION) {
        zoff_config_key_class c = ZOFF_KEY_NO_EFFECT;
        for (size_t i = 0; i < k->sub->n; i++) {
            zoff_config_key_class ci = key_class(k->sub, &k->sub->keys[i]);
            if (ci == ZOFF_KEY_IMPLEMENTED) return ci;
            if (ci == ZOFF_KEY_NOT_IMPLEMENTED) c = ci;
        }
        return c;
    }
    return ZOFF_KEY_IMPLEMENTED;
}

/* Appends ", name" to buf if it fits; else marks it cut with ", ..." once. */
static void append_name(char *buf, size_t n, size_t *used, bool *cut, const char *name) {
    if (*cut) return;
    int m = snprintf(buf + *used, n - *used, "%s%s", *used ? ", " : "", name);
    if (m < 0 || (size_t)m >= n - *used - 6) {
        snprintf(buf + *used, n - *used, ", ...");
        *cut = true;
        return;
    }
    *used += (size_t)m;
}

static zoff_status unknown_key(walk *w, const section *sec, unsigned mask, const char *path, const char *key,
                               bool other_type) {
    /* Keys zoff implements are listed first; the others it accepts (no effect, or only at
     * DeepSpeed's default) after them. */
    char full[512], list[900], more[640], hint[160] = "";
    size_t used = 0, used_more = 0, best = 3; /* suggest only close matches */
    bool cut = false, cut_more = false;
    list[0] = more[0] = '\0';
    /* or, without a close match, the shortest key the given one begins (gradient_clip) */
    const char *longer = NULL;
    const size_t klen = strlen(key);
    for (size_t i = 0; i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        if (!key_allowed(k, mask)) continue;
        size_t d = zoff_edit_distance(key, k->name);
        if (!other_type && d < best) {
            best = d;
            snprintf(hint, sizeof hint, " (did you mean \"%s\"?)", k->name);
        }
        if (!other_type && klen >= 5 && !strncmp(k->name, key, klen) && (!longer || strlen(k->name) < strlen(longer)))
            longer = k->name;
        if (key_class(sec, k) == ZOFF_KEY_IMPLEMENTED) append_name(list, sizeof list, &used, &cut, k->name);
        else if (k->kind != K_ALIAS) append_name(more, sizeof more, &used_more, &cut_more, k->name);
    }
    if (!hint[0] && longer) snprintf(hint, sizeof hint, " (did you mean \"%s\"?)", longer);
    if (!used) snprintf(list, sizeof list, "none that zoff implements"); /* a section of accepted keys only */
    char extra[760] = "";
    if (used_more)
        snprintf(extra, sizeof extra, "; also accepted (no effect in zoff, or only at DeepSpeed's default; see "
                                      "docs/config.md): %s", more);
    join_path(full, sizeof full, path, key);
    const char *where = path[0] ? path : "the top level";
    if (other_type) {
        const char *tname = sec->mask_name(w->cfg);
        return zoff_error(ZOFF_ERR_CONFIG,
                          "%s: %s: unknown key: \"%s\" is not a parameter of %s; allowed keys at %s for %s: %s%s",
                          w->src, full, key, tname, where, tname, list, extra);
    }
    return zoff_error(ZOFF_ERR_CONFIG, "%s: %s: unknown key \"%s\"%s; allowed keys at %s: %s%s", w->src, full, key,
                      hint, where, list, extra);
}

/* What a key allows, in words (for the "auto" message). */
static void allowed_words(const key_spec *k, char *buf, size_t n) {
    char list[256];
    switch (k->kind) {
    case K_BOOL: snprintf(buf, n, "true or false"); return;
    case K_INT:
    case K_I64: int_range_words(k, buf, n); return;
    case K_NUM: num_range_words(k, buf, n); return;
    case K_STR: snprintf(buf, n, "a string"); return;
    case K_ENUM:
        enum_words(k->enums, list, sizeof list);
        snprintf(buf, n, "one of %s", list);
        return;
    case K_SECTION:
    case K_FEATURE: snprintf(buf, n, "an object {...}"); return;
    case K_CUSTOM:
    case K_ANY:
    case K_ALIAS: break;
    }
    snprintf(buf, n, "%s", k->allowed ? k->allowed : "a value");
}

/* "auto" where the key does not implement it: the Hugging Face Trainer's placeholder. */
static bool refuses_auto(const key_spec *k, json_t *v) {
    if (!json_is_string(v) || strcmp(json_string_value(v), "auto") != 0) return false;
    if ((k->flags & F_AUTO_OK) || k->kind == K_STR || k->kind == K_ANY || k->kind == K_SECTION ||
        k->kind == K_FEATURE)
        return false;
    if (k->kind == K_ENUM)
        for (const enum_name *e = k->enums; e->name != NULL; e++)
            if (strcmp(e->name, "auto") == 0) return false;
    return true;
}

static void note_no_effect(walk *w, const char *path) { list_add(w, &w->no_effect, ", ", "%s", path); }

/* A valid DeepSpeed setting zoff does not implement: recorded for zoff_config_check_supported. */
static void note_unsupported(walk *w, const char *path, const json_t *v, const char *hint) {
    char val[96];
    if (hint != NULL) list_add(w, &w->unsupported, "; ", "%s %s (%s)", path, show(v, val, sizeof val), hint);
    else list_add(w, &w->unsupported, "; ", "%s %s", path, show(v, val, sizeof val));
}

/* Is v DeepSpeed's default of an F_DEFAULT_ONLY key (numbers compared by value)? */
static zoff_status is_default(const key_spec *k, json_t *v, bool *out) {
    json_error_t jerr;
    json_t *d = json_loads(k->dflt ? k->dflt : "", JSON_DECODE_ANY, &jerr);
    if (d == NULL) return zoff_error(ZOFF_ERR_INTERNAL, "config: key \"%s\" has a bad default", k->name);
    if (json_is_number(d) && json_is_number(v)) *out = json_number_value(d) == json_number_value(v);
    else if (json_is_string(d) && json_is_string(v) && (k->flags & F_NOCASE))
        *out = strcasecmp(json_string_value(d), json_string_value(v)) == 0;
    else *out = json_equal(d, v);
    json_decref(d);
    return ZOFF_OK;
}

/* Reads v into the field at base + k->offset, checking its JSON type and range. */
static zoff_status store_value(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    char val[96], allowed[256];
    char *field = base + k->offset;
    switch (k->kind) {
    case K_BOOL:
        return read_bool(w, v, path, (bool *)field);
    case K_INT:
    case K_I64: {
        int64_t x = 0;
        int_range_words(k, allowed, sizeof allowed);
        ZOFF_TRY(read_int(w, v, path, allowed, &x));
        if (x < k->ilo || x > k->ihi)
            return cfg_error(w, path, "%s is out of range; allowed: %s", show(v, val, sizeof val), allowed);
        if (k->kind == K_INT) *(int *)field = (int)x;
        else *(int64_t *)field = x;
        return ZOFF_OK;
    }
    case K_NUM: {
        double d = 0.0;
        num_range_words(k, allowed, sizeof allowed);
        ZOFF_TRY(read_number(w, v, path, allowed, &d));
        if (!num_in_range(k, d))
            return cfg_error(w, path, "%s is out of range; allowed: %s", show(v, val, sizeof val), allowed);
        *(double *)field = d;
        return ZOFF_OK;
    }
    case K_STR: {
        if (!json_is_string(v))
            return cfg_error(w, path, "expected a string, got %s %s", json_type_name(v), show(v, val, sizeof val));
        size_t len = json_string_length(v);
        if (k->flags & F_UNSTORED) return ZOFF_OK;
        if (len == 0 && !(k->flags & F_EMPTY_OK)) return cfg_error(w, path, "is empty; allowed: a non-empty string");
        if (len >= k->size || strlen(json_string_value(v)) != len)
            return cfg_error(w, path, "%s is too long or contains a NUL byte; allowed: at most %zu bytes",
                             show(v, val, sizeof val), k->size - 1);
        memcpy(field, json_string_value(v), len + 1);
        return ZOFF_OK;
    }
    case K_ENUM: {
        enum_words(k->enums, allowed, sizeof allowed);
        if (!json_is_string(v))
            return cfg_error(w, path, "expected one of %s, got %s %s", allowed, json_type_name(v),
                             show(v, val, sizeof val));
        const char *s = json_string_value(v);
        for (const enum_name *e = k->enums; e->name != NULL; e++) {
            if ((k->flags & F_NOCASE) ? strcasecmp(s, e->name) == 0 : strcmp(s, e->name) == 0) {
                *(int *)field = e->value;
                return ZOFF_OK;
            }
        }
        return cfg_error(w, path, "%s is not allowed; allowed: %s%s%s", show(v, val, sizeof val), allowed,
                         (k->flags & F_NOCASE) ? " (any case)" : "",
                         (k->flags & (F_NO_EFFECT | F_DEFAULT_ONLY)) == 0 && k->note ? k->note : "");
    }
    case K_ANY:
        return ZOFF_OK;
    case K_SECTION:
    case K_FEATURE:
    case K_CUSTOM:
    case K_ALIAS:
        break;
    }
    return zoff_error(ZOFF_ERR_INTERNAL, "config: key table entry \"%s\" has no reader", k->name);
}

/* A key without a field: checked, then classed (no effect / default / not implemented). */
static zoff_status handle_unstored(walk *w, const key_spec *k, json_t *v, const char *path) {
    if (json_is_null(v) && (k->flags & F_NULL_OK)) {
        note_no_effect(w, path); /* DeepSpeed's None: not given */
        return ZOFF_OK;
    }
    union {
        bool b;
        int i;
        int64_t l;
        double d;
    } scratch;
    ZOFF_TRY(store_value(w, k, v, path, (char *)&scratch)); /* unstored keys have offset 0 */
    if (k->flags & F_DEFAULT_ONLY) {
        bool dflt = false;
        ZOFF_TRY(is_default(k, v, &dflt));
        if (!dflt) {
            note_unsupported(w, path, v, k->note);
            return ZOFF_OK;
        }
    }
    note_no_effect(w, path);
    return ZOFF_OK;
}

/* The object of a DeepSpeed feature zoff does not implement: accepted while off. */
static zoff_status handle_feature(walk *w, const key_spec *k, json_t *v, const char *path) {
    char val[96], sub[600];
    if (!json_is_object(v))
        return cfg_error(w, path, "expected an object {...}, got %s %s", json_type_name(v), show(v, val, sizeof val));
    if (k->sw == NULL) { /* on as soon as it says anything */
        if (json_object_size(v) == 0) note_no_effect(w, path);
        else note_unsupported(w, path, v, k->note);
        return ZOFF_OK;
    }
    json_t *on = json_object_get(v, k->sw);
    join_path(sub, sizeof sub, path, k->sw);
    if (on == NULL || json_is_null(on)) {
        /* Off (DeepSpeed's default). A near miss of the switch is a typo, not "off". */
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            if (strcmp(key, k->sw) != 0 && zoff_edit_distance(key, k->sw) <= 2) {
                char full[600];
                join_path(full, sizeof full, path, key);
                return zoff_error(ZOFF_ERR_CONFIG,
                                  "%s: %s: unknown key \"%s\" (did you mean \"%s\"?); %s is a DeepSpeed feature "
                                  "zoff does not implement, accepted while \"%s\" is false or absent",
                                  w->src, full, key, k->sw, path, k->sw);
            }
        }
        note_no_effect(w, path);
        return ZOFF_OK;
    }
    bool b = false;
    ZOFF_TRY(read_bool(w, on, sub, &b));
    if (b) note_unsupported(w, sub, on, k->note);
    else note_no_effect(w, path);
    return ZOFF_OK;
}

static zoff_status handle_key(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    char val[96];
    switch (k->kind) {
    case K_SECTION:
        if (json_is_null(v)) return ZOFF_OK; /* DeepSpeed: a null section means "not given" */
        if (!json_is_object(v))
            return cfg_error(w, path, "expected an object {...}, got %s %s", json_type_name(v),
                             show(v, val, sizeof val));
        return walk_section(w, k->sub, v, path, base + k->offset);
    case K_FEATURE:
        if (json_is_null(v)) return ZOFF_OK;
        return handle_feature(w, k, v, path);
    case K_CUSTOM:
        return k->custom(w, k, v, path, base);
    default:
        break;
    }
    if (k->flags & F_UNSTORED) return handle_unstored(w, k, v, path);
    if (json_is_null(v) && (k->flags & F_NULL_OK)) return ZOFF_OK; /* DeepSpeed's None: the default stays */
    ZOFF_TRY(store_value(w, k, v, path, base));
    if (k->flags & F_NO_EFFECT) note_no_effect(w, path);
    return ZOFF_OK;
}

static zoff_status walk_section(walk *w, const section *sec, json_t *obj, const char *path, char *base) {
    unsigned mask = sec->mask_of ? sec->mask_of(w->cfg) : ~0u;
    char child[512];
    const char *key;
    json_t *v;

    /* Unknown keys first: a misspelt key is the likeliest mistake. */
    json_object_foreach(obj, key, v) {
        const key_spec *k = find_key(sec, key);
        if (k == NULL) return unknown_key(w, sec, mask, path, key, false);
        if (!key_allowed(k, mask)) return unknown_key(w, sec, mask, path, key, true);
    }
    for (size_t i = 0; i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        if ((k->flags & F_REQUIRED) && json_object_get(obj, k->name) == NULL) {
            join_path(child, sizeof child, path, k->name);
            char allowed[256] = "";
            if (k->enums) enum_words(k->enums, allowed, sizeof allowed);
            else if (k->custom == h_optimizer_type) enum_words(k_optimizers, allowed, sizeof allowed);
            return cfg_error(w, child, "is required%s%s", allowed[0] ? "; allowed: " : "", allowed);
        }
    }
    /* Then every key in table order (so that e.g. optimizer.type precedes optimizer.params). */
    for (size_t i = 0; i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        v = json_object_get(obj, k->name);
        if (v == NULL) continue;
        join_path(child, sizeof child, path, k->name);
        if (k->kind == K_ALIAS) {
            const key_spec *target = find_key(sec, k->alias_of);
            if (target == NULL || target->kind == K_ALIAS)
                return zoff_error(ZOFF_ERR_INTERNAL, "config: alias \"%s\" has no target", k->name);
            json_t *canon = json_object_get(obj, k->alias_of);
            if (canon != NULL) {
                if (json_equal(canon, v)) continue;
                char a[96], b[96];
                return cfg_error(w, child,
                                 "%s contradicts %s.%s = %s; \"%s\" is another name for \"%s\": give only \"%s\"",
                                 show(v, a, sizeof a), path[0] ? path : "(top level)", k->alias_of,
                                 show(canon, b, sizeof b), k->name, k->alias_of, k->alias_of);
            }
            k = target;
        }
        if (refuses_auto(k, v)) { /* all of them are named in one error after the walk */
            char words[300];
            allowed_words(k, words, sizeof words);
            list_add(w, &w->autos, "; ", "%s (%s)", child, words);
            continue;
        }
        ZOFF_TRY(handle_key(w, k, v, child, base));
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ custom keys */

static unsigned optimizer_mask(const zoff_config *cfg) { return 1u << cfg->optimizer.type; }
static const char *enum_text(const enum_name *list, int value, const char *none) {
    for (const enum_name *e = list; e->name; e++)
        if (e->value == value) return e->name;
    return none;
}
const char *zoff_optimizer_name(zoff_optimizer_type t) { return enum_text(k_optimizers, (int)t, "?"); }
const char *zoff_scheduler_name(zoff_scheduler_type t) { return enum_text(k_schedulers, (int)t, "none"); }
static const char *optimizer_name(const zoff_config *cfg) { return zoff_optimizer_name(cfg->optimizer.type); }
static unsigned scheduler_mask(const zoff_config *cfg) { return 1u << cfg->scheduler.type; }
static const char *scheduler_name(const zoff_config *cfg) { return zoff_scheduler_name(cfg->scheduler.type); }

/* Defaults of the optimizer DeepSpeed builds for each type (FusedAdam /
 * DeepSpeedCPUAdam, torch Adagrad / DeepSpeedCPUAdagrad, FusedLion). */
static void optimizer_defaults(zoff_optimizer_config *o, zoff_optimizer_type type) {
    o->type = type;
    o->lr = type == ZOFF_OPTIM_ADAGRAD ? 1e-2 : 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = type == ZOFF_OPTIM_ADAGRAD ? 1e-10 : 1e-8;
    o->weight_decay = 0.0;
    o->adam_w_mode = true;
    o->bias_correction = true;
    o->torch_adam = false;
    o->initial_accumulator_value = 0.0;
}

static zoff_status h_optimizer_type(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    char val[96], allowed[256];
    enum_words(k_optimizers, allowed, sizeof allowed);
    if (json_is_string(v)) {
        for (const enum_name *e = k_optimizers; e->name; e++) {
            if (strcasecmp(json_string_value(v), e->name) == 0) {
                optimizer_defaults((zoff_optimizer_config *)base, (zoff_optimizer_type)e->value);
                return ZOFF_OK;
            }
        }
        /* DeepSpeed's other optimizers (deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS) */
        static const char *const ds_only[] = {"Lamb",   "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam",
                                              "MuAdamW", "MuSGD",     "Muon",        NULL};
        for (const char *const *n = ds_only; *n; n++)
            if (strcasecmp(json_string_value(v), *n) == 0)
                return cfg_error(w, path,
                                 "%s is not supported: a DeepSpeed optimizer zoff does not implement yet; allowed "
                                 "(case-insensitive): %s",
                                 show(v, val, sizeof val), allowed);
        return cfg_error(w, path, "%s is not supported; allowed (case-insensitive): %s", show(v, val, sizeof val),
                         allowed);
    }
    return cfg_error(w, path, "expected one of %s, got %s %s", allowed, json_type_name(v), show(v, val, sizeof val));
}

static zoff_status h_betas(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    zoff_optimizer_config *o = (zoff_optimizer_config *)base;
    const char *allowed = "an array of two numbers, each in [0, 1)";
    char val[96], elem[560];
    if (!json_is_array(v) || json_array_size(v) != 2)
        return cfg_error(w, path, "%s is not allowed; allowed: %s", show(v, val, sizeof val), allowed);
    double b[2];
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(v, i);
        snprintf(elem, sizeof elem, "%s[%zu]", path, i);
        if (!json_is_number(e))
            return cfg_error(w, elem, "expected a number in [0, 1), got %s %s", json_type_name(e),
                             show(e, val, sizeof val));
        b[i] = json_number_value(e);
        if (!(b[i] >= 0.0 && b[i] < 1.0))
            return cfg_error(w, elem, "%s is out of range; allowed: a number in [0, 1)", show(e, val, sizeof val));
    }
    o->beta1 = b[0];
    o->beta2 = b[1];
    return ZOFF_OK;
}

/* A bool checked for its type only; its value is judged after the walk (validate_config). */
static zoff_status h_bool_checked(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    bool b = false;
    return read_bool(w, v, path, &b);
}

static zoff_status h_last_batch_iteration(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    int64_t x = 0;
    char val[96];
    ZOFF_TRY(read_int(w, v, path, "-1", &x));
    if (x != -1)
        return cfg_error(w, path,
                         "%s is unsupported; allowed: -1 (start the schedule from the beginning; a resumed run "
                         "takes its step count from the checkpoint)",
                         show(v, val, sizeof val));
    return ZOFF_OK;
}

static zoff_status h_grad_buckets(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    zoff_zero_config *z = (zoff_zero_config *)base;
    char val[96];
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "always") != 0)
            return cfg_error(w, path, "%s is not allowed; allowed: %s", show(v, val, sizeof val), k->allowed);
        z->grad_buckets = ZOFF_GRAD_BUCKETS_ALWAYS;
        return ZOFF_OK;
    }
    if (!json_is_boolean(v))
        return cfg_error(w, path, "expected %s, got %s %s", k->allowed, json_type_name(v), show(v, val, sizeof val));
    z->grad_buckets = json_is_true(v) ? ZOFF_GRAD_BUCKETS_ON : ZOFF_GRAD_BUCKETS_OFF;
    return ZOFF_OK;
}

static zoff_status h_ratio(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    zoff_offload_optimizer_config *o = (zoff_offload_optimizer_config *)base;
    const char *allowed = "a number in [0, 1] or \"auto\"";
    char val[96];
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "auto") != 0)
            return cfg_error(w, path, "%s is not allowed; allowed: %s", show(v, val, sizeof val), allowed);
        o->ratio_auto = true;
        o->ratio = 1.0;
        return ZOFF_OK;
    }
    double d = 0.0;
    ZOFF_TRY(read_number(w, v, path, allowed, &d));
    if (!(d >= 0.0 && d <= 1.0))
        return cfg_error(w, path, "%s is out of range; allowed: %s", show(v, val, sizeof val), allowed);
    o->ratio = d;
    o->ratio_auto = false;
    return ZOFF_OK;
}

/* data_types.grad_accum_dtype: zoff accumulates gradients in the training dtype, which is
 * also DeepSpeed's default (null), except with bf16 at ZeRO stage 0, where DeepSpeed's default is
 * fp32 (its BF16_Optimizer; the trainer notes it, trainer_load_config). Runs after fp16 and bf16
 * (table order). */
static zoff_status h_grad_accum_dtype(walk *w, const key_spec *k, json_t *v, const char *path, char *base) {
    char val[96], allowed[300];
    if (json_is_null(v)) return ZOFF_OK;
    enum_words(k_dtype_names, allowed, sizeof allowed);
    if (!json_is_string(v))
        return cfg_error(w, path, "expected one of %s (or null), got %s %s", allowed, json_type_name(v),
                         show(v, val, sizeof val));
    const enum_name *e = k_dtype_names;
    while (e->name != NULL && strcmp(e->name, json_string_value(v)) != 0) e++;
    if (e->name == NULL)
        return cfg_error(w, path, "%s is not allowed; allowed: %s (or null)", show(v, val, sizeof val), allowed);
    const zoff_config *c = w->cfg;
    int train = c->bf16_enabled ? 2 : c->fp16.enabled ? 1 : 0;
    static const char *const names[] = {"fp32", "fp16", "bf16"};
    if (e->value != train) {
        char hint[160];
        snprintf(hint, sizeof hint, "zoff accumulates gradients in the training dtype, here %s", names[train]);
        note_unsupported(w, path, v, hint);
    }
    w->cfg->grad_accum_dtype_given = true;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ cross-key checks */

static json_t *json_path(json_t *root, const char *a, const char *b, const char *c) {
    json_t *v = json_object_get(root, a);
    if (v != NULL && b != NULL) v = json_is_object(v) ? json_object_get(v, b) : NULL;
    if (v != NULL && c != NULL) v = json_is_object(v) ? json_object_get(v, c) : NULL;
    return v;
}

static const char *device_name(zoff_offload_device d) {
    return d == ZOFF_OFFLOAD_CPU ? "cpu" : d == ZOFF_OFFLOAD_NVME ? "nvme" : "none";
}

/* optimizer.params.amsgrad: only false. Why depends on what DeepSpeed would build: with torch_adam,
 * torch.optim.AdamW / Adam, which has AMSGrad; else its fused or CPU Adam, which refuse it. */
static zoff_status check_amsgrad(walk *w, json_t *root) {
    const zoff_optimizer_config *o = &w->cfg->optimizer;
    if (!json_is_true(json_path(root, "optimizer", "params", "amsgrad"))) return ZOFF_OK;
    const char *why = o->type == ZOFF_OPTIM_ADAGRAD ? "AMSGrad (an Adam variant) is not implemented in zoff's Adagrad"
                      : o->torch_adam ? "AMSGrad is not implemented in zoff; with torch_adam true DeepSpeed builds "
                                        "torch.optim.AdamW (or Adam), which has it, but zoff's Adam does not, so this "
                                        "run would train differently"
                                      : "AMSGrad is not implemented, as in DeepSpeed's fused and CPU Adam (which refuse "
                                        "it)";
    return cfg_error(w, "optimizer.params.amsgrad", "true is unsupported: %s; allowed: false", why);
}

static zoff_status validate_config(walk *w, json_t *root) {
    zoff_config *cfg = w->cfg;
    zoff_zero_config *z = &cfg->zero;

    /* optimizer */
    cfg->optimizer_given = json_object_get(root, "optimizer") != NULL && !json_is_null(json_object_get(root, "optimizer"));
    if (cfg->optimizer.type == ZOFF_OPTIM_ADAMW) {
        json_t *m = json_path(root, "optimizer", "params", "adam_w_mode");
        if (m != NULL && json_is_false(m))
            return cfg_error(w, "optimizer.params.adam_w_mode",
                             "false contradicts optimizer.type \"AdamW\" (always decoupled weight decay); "
                             "for L2-style weight decay use type \"Adam\" with adam_w_mode false");
        cfg->optimizer.adam_w_mode = true;
    }
    /* torch_adam: DeepSpeed builds torch.optim.AdamW (or Adam) from the params as given (the same
     * update as its fused and CPU Adam), so a weight_decay not given is torch's: AdamW's is 0.01 */
    if (cfg->optimizer.torch_adam && cfg->optimizer.adam_w_mode &&
        json_path(root, "optimizer", "params", "weight_decay") == NULL)
        cfg->optimizer.weight_decay = 0.01;
    ZOFF_TRY(check_amsgrad(w, root));

    /* scheduler */
    zoff_scheduler_config *s = &cfg->scheduler;
    s->warmup_max_lr_given = json_path(root, "scheduler", "params", "warmup_max_lr") != NULL;
    if ((s->type == ZOFF_SCHED_WARMUP_DECAY_LR || s->type == ZOFF_SCHED_WARMUP_COSINE_LR) && s->total_num_steps == 0)
        return cfg_error(w, "scheduler.params.total_num_steps", "is required by %s; allowed: an integer >= 1",
                         scheduler_name(cfg));
    for (int i = 0; s->type == ZOFF_SCHED_ONE_CYCLE && i < 2; i++) {
        const char *key = i ? "cycle_max_lr" : "cycle_min_lr";
        if (json_path(root, "scheduler", "params", key) == NULL)
            return cfg_error(w, i ? "scheduler.params.cycle_max_lr" : "scheduler.params.cycle_min_lr",
                             "is required by OneCycle; allowed: a number >= 0");
    }
    if (s->type == ZOFF_SCHED_ONE_CYCLE && s->cycle_momentum && cfg->optimizer.type == ZOFF_OPTIM_ADAGRAD)
        zoff_log(ZOFF_LOG_WARN,
                 "%s: scheduler.params.cycle_momentum: Adagrad has no betas, so the momentum is not cycled "
                 "(as DeepSpeed does)", w->src);
    if ((s->type == ZOFF_SCHED_WARMUP_DECAY_LR || s->type == ZOFF_SCHED_WARMUP_COSINE_LR) &&
        s->total_num_steps < s->warmup_num_steps)
        zoff_log(ZOFF_LOG_WARN,
                 "%s: scheduler.params.total_num_steps %lld is less than warmup_num_steps %lld "
                 "(accepted, as DeepSpeed does: the lr stays at the end-of-schedule value after warmup)",
                 w->src, (long long)s->total_num_steps, (long long)s->warmup_num_steps);

    /* precision */
    if (cfg->fp16.enabled && cfg->bf16_enabled)
        return cfg_error(w, "fp16.enabled", "true together with bf16.enabled true; allowed: at most one of them");
    if (cfg->bf16_optimizer_states && !cfg->bf16_enabled)
        return cfg_error(w, "bf16.bf16_optimizer_states",
                         "true needs bf16 training (bf16.enabled true): bf16 optimizer state is a bf16-training "
                         "memory saving; allowed here: false");

    /* ZeRO */
    if (z->cpu_offload || json_path(root, "zero_optimization", "cpu_offload", NULL) != NULL) {
        /* (a null cpu_offload too: DeepSpeed refuses a deprecated key given beside its replacement) */
        json_t *oo = json_path(root, "zero_optimization", "offload_optimizer", NULL);
        if (oo != NULL && !json_is_null(oo))
            return cfg_error(w, "zero_optimization.cpu_offload",
                             "given together with zero_optimization.offload_optimizer; cpu_offload is the "
                             "deprecated form of offload_optimizer: give only offload_optimizer");
        if (z->cpu_offload) z->offload_optimizer.device = ZOFF_OFFLOAD_CPU;
    }
    if (json_path(root, "zero_optimization", "overlap_comm", NULL) == NULL) z->overlap_comm = z->stage == 3;
    if (z->offload_optimizer.device == ZOFF_OFFLOAD_NVME && z->offload_optimizer.nvme_path[0] == '\0')
        return cfg_error(w, "zero_optimization.offload_optimizer.nvme_path",
                         "is required when device is \"nvme\"; allowed: a directory on the NVMe file system");
    if (z->offload_param.device == ZOFF_OFFLOAD_NVME && z->offload_param.nvme_path[0] == '\0')
        return cfg_error(w, "zero_optimization.offload_param.nvme_path",
                         "is required when device is \"nvme\"; allowed: a directory on the NVMe file system");
    if (z->offload_param.device != ZOFF_OFFLOAD_NONE && z->stage != 3)
        return cfg_error(w, "zero_optimization.offload_param.device",
                         "\"%s\" needs zero_optimization.stage 3 (parameters are partitioned only in stage 3), "
                         "but stage is %d; allowed with stage %d: \"none\"",
                         device_name(z->offload_param.device), z->stage, z->stage);
    if (z->offload_optimizer.device != ZOFF_OFFLOAD_NONE && z->stage == 0)
        return cfg_error(w, "zero_optimization.offload_optimizer.device",
                         "\"%s\" needs zero_optimization.stage 1, 2 or 3 (as in DeepSpeed), but stage is 0; "
                         "set \"stage\": 2, or offload \"none\"",
                         device_name(z->offload_optimizer.device));
    if (z->offload_optimizer.device == ZOFF_OFFLOAD_NONE &&
        (z->offload_optimizer.ratio_auto || z->offload_optimizer.ratio < 1.0)) {
        char rv[32];
        if (z->offload_optimizer.ratio_auto) snprintf(rv, sizeof rv, "\"auto\"");
        else snprintf(rv, sizeof rv, "%g", z->offload_optimizer.ratio);
        return cfg_error(w, "zero_optimization.offload_optimizer.ratio",
                         "%s needs an offload device, but offload_optimizer.device is \"none\"; allowed: set "
                         "device \"cpu\" (the ratio is the fraction of the update on the host), or drop ratio",
                         rv);
    }
    if (z->delayed_param_update && z->offload_optimizer.device == ZOFF_OFFLOAD_NONE)
        return cfg_error(w, "zero_optimization.zoff_delayed_param_update",
                         "true needs the optimizer on the host (offload_optimizer.device \"cpu\" or \"nvme\"), "
                         "but offload_optimizer.device is \"none\"");
    if (cfg->bf16_optimizer_states && z->offload_optimizer.device == ZOFF_OFFLOAD_NONE)
        return cfg_error(w, "bf16.bf16_optimizer_states",
                         "true applies to the host optimizer's state (offload_optimizer.device \"cpu\" or "
                         "\"nvme\"), but offload_optimizer.device is \"none\" (the device optimizer keeps fp32 "
                         "state); allowed here: false");

    /* model */
    zoff_model_config *m = &cfg->model;
    if (m->hidden_size > 0 && m->num_attention_heads > 0 && m->hidden_size % m->num_attention_heads != 0)
        return cfg_error(w, "model.hidden_size",
                         "%lld is not divisible by model.num_attention_heads %lld; allowed: a multiple of the "
                         "number of heads",
                         (long long)m->hidden_size, (long long)m->num_attention_heads);
    if (m->seq_length > 0 && m->max_position_embeddings > 0 && m->seq_length > m->max_position_embeddings)
        return cfg_error(w, "model.seq_length", "%lld exceeds model.max_position_embeddings %lld",
                         (long long)m->seq_length, (long long)m->max_position_embeddings);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ public API */

void zoff_config_defaults(zoff_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    /* batch: 0 = not given; resolved by zoff_config_resolve_batch */
    optimizer_defaults(&cfg->optimizer, ZOFF_OPTIM_ADAM);
    cfg->optimizer_given = false;

    zoff_scheduler_config *s = &cfg->scheduler;
    s->type = ZOFF_SCHED_NONE;
    s->warmup_min_lr = 0.0;
    s->warmup_max_lr = 0.001;
    s->warmup_max_lr_given = false;
    s->warmup_num_steps = 1000;
    s->warmup_type = ZOFF_WARMUP_LOG;
    s->total_num_steps = 0;
    s->warmup_min_ratio = 0.0;
    s->cos_min_ratio = 0.0001;
    s->cycle_first_step_size = 2000;
    s->cycle_second_step_size = -1;
    s->cycle_first_stair_count = 0;
    s->cycle_second_stair_count = -1;
    s->cycle_momentum = true;
    s->cycle_min_mom = 0.8;
    s->cycle_max_mom = 0.9;
    s->lr_range_test_min_lr = 0.001;
    s->lr_range_test_step_size = 2000;
    s->lr_range_test_step_rate = 1.0;
    snprintf(cfg->tensorboard.job_name, sizeof cfg->tensorboard.job_name, "DeepSpeedJobName");
    snprintf(cfg->csv_monitor.job_name, sizeof cfg->csv_monitor.job_name, "DeepSpeedJobName");

    cfg->gradient_clipping = 1.0;
    cfg->fp16.enabled = false;
    cfg->fp16.loss_scale = 0.0;
    cfg->fp16.initial_scale_power = 16;
    cfg->fp16.loss_scale_window = 1000;
    cfg->fp16.hysteresis = 2;
    cfg->fp16.consecutive_hysteresis = false;
    cfg->fp16.min_loss_scale = 1.0;
    cfg->bf16_enabled = false;
    cfg->steps_per_print = 10;
    cfg->wall_clock_breakdown = false;
    cfg->prescale_gradients = false;
    cfg->gradient_predivide_factor = 1.0;

    zoff_zero_config *z = &cfg->zero;
    z->stage = 0;
    z->contiguous_gradients = true;
    z->overlap_comm = false;
    z->reduce_scatter = true;
    z->allgather_partitions = true;
    z->reduce_bucket_size = 500000000;
    z->allgather_bucket_size = 500000000;
    z->sub_group_size = 1000000000;
    z->round_robin_gradients = false;
    z->cpu_offload = false;
    z->stage3_prefetch_bucket_size = 50000000;
    z->stage3_param_persistence_threshold = 100000;
    z->stage3_max_live_parameters = 1000000000;
    z->stage3_max_reuse_distance = 1000000000;
    z->stage3_gather_16bit_weights_on_model_save = false;
    z->elastic_checkpoint = false;
    z->delayed_param_update = false;
    z->grad_buckets = ZOFF_GRAD_BUCKETS_ON;
    z->delayed_param_update_warmup = 10;
    z->offload_optimizer.device = ZOFF_OFFLOAD_NONE;
    z->offload_optimizer.pin_memory = true;
    z->offload_optimizer.buffer_count = 4;
    z->offload_optimizer.pipeline_read = false;
    z->offload_optimizer.pipeline_write = false;
    z->offload_optimizer.fast_init = false;
    z->offload_optimizer.ratio = 1.0;
    z->offload_optimizer.ratio_auto = false;
    z->offload_optimizer.cpuadam_cores_perc = -1.0;
    z->offload_param.device = ZOFF_OFFLOAD_NONE;
    z->offload_param.pin_memory = true;
    z->offload_param.buffer_count = 5;
    z->offload_param.buffer_size = 100000000;
    z->offload_param.max_in_cpu = 1000000000;

    cfg->aio.block_size = 1048576;
    cfg->aio.queue_depth = 8;
    cfg->aio.intra_op_parallelism = 1;
    cfg->aio.single_submit = false;
    cfg->aio.overlap_events = true;
    /* model: 0 = unset */
    cfg->source = NULL;
    cfg->source_name = NULL;
    cfg->no_effect = NULL;
    cfg->unsupported = NULL;
}

void zoff_config_free(zoff_config *cfg) {
    if (cfg == NULL) return;
    free(cfg->source);
    free(cfg->source_name);
    free(cfg->no_effect);
    free(cfg->unsupported);
    zoff_config_defaults(cfg);
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static zoff_status load_buffer(const char *text, size_t len, const char *name, zoff_config *cfg) {
    zoff_config_defaults(cfg);
    if (name == NULL) name = "<string>";
    json_error_t jerr;
    size_t blank = 0;
    while (blank < len && (text[blank] == ' ' || text[blank] == '\t' || text[blank] == '\n' || text[blank] == '\r'))
        blank++;
    if (blank == len)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "%s is empty: a DeepSpeed config is one JSON object, e.g. "
                          "{\"train_micro_batch_size_per_gpu\": 8, \"zero_optimization\": {\"stage\": 2}}",
                          name);
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) /* the position once, as file:line:column */
        return zoff_error(ZOFF_ERR_CONFIG, "%s:%d:%d: JSON syntax error: %s", name, jerr.line, jerr.column, jerr.text);
    walk w = {.src = name, .cfg = cfg};
    zoff_status st;
    if (!json_is_object(root)) {
        char val[96];
        st = zoff_error(ZOFF_ERR_CONFIG, "%s: the top level must be an object {...}, got %s %s", name,
                        json_type_name(root), show(root, val, sizeof val));
    } else {
        st = walk_section(&w, &s_top, root, "", (char *)cfg);
        if (st == ZOFF_OK && w.oom) st = zoff_error(ZOFF_ERR_NOMEM, "%s: out of memory reading the config", name);
        if (st == ZOFF_OK && w.autos.len > 0)
            st = zoff_error(ZOFF_ERR_CONFIG,
                            "%s: \"auto\" at %s. \"auto\" is filled in by the Hugging Face Trainer before DeepSpeed "
                            "reads the file; DeepSpeed does not compute it (it fails on it, or in some sections "
                            "quietly uses its default), and zoff reads the file as it is: give a value for each "
                            "(zoff implements \"auto\" only for zero_optimization.offload_optimizer.ratio)",
                            name, w.autos.s);
        if (st == ZOFF_OK) st = validate_config(&w, root);
    }
    json_decref(root);
    list_free(&w.autos);
    if (st != ZOFF_OK) {
        list_free(&w.no_effect);
        list_free(&w.unsupported);
        zoff_config_defaults(cfg);
        return st;
    }
    cfg->no_effect = w.no_effect.s; /* owned by cfg from here */
    cfg->unsupported = w.unsupported.s;
    cfg->source = dup_bytes(text, len);
    cfg->source_name = dup_bytes(name, strlen(name));
    if (cfg->source == NULL || cfg->source_name == NULL) {
        zoff_config_free(cfg);
        return zoff_error(ZOFF_ERR_NOMEM, "%s: out of memory keeping the config text (%zu bytes)", name, len);
    }
    if (cfg->no_effect != NULL)
        zoff_log(ZOFF_LOG_INFO, "%s: accepted, no effect in zoff (see docs/config.md): %s", name, cfg->no_effect);
    return ZOFF_OK;
}

zoff_status zoff_config_load_string(const char *json, const char *source_name, zoff_config *cfg) {
    if (cfg == NULL || json == NULL)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_config_load_string: %s is NULL", cfg == NULL ? "cfg" : "json");
    return load_buffer(json, strlen(json), source_name, cfg);
}

#define ZOFF_CONFIG_MAX_BYTES (16 << 20)

zoff_status zoff_config_load_file(const char *path, zoff_config *cfg) {
    if (cfg == NULL || path == NULL)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_config_load_file: %s is NULL", cfg == NULL ? "cfg" : "path");
    zoff_config_defaults(cfg);
    /* A --config that is missing, a directory or unreadable is a wrong config (ZOFF_ERR_CONFIG:
     * exit 2, like every other config error); only a failing read of an open file is I/O. */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return zoff_error(ZOFF_ERR_CONFIG, "config file %s is a directory: give the path of a JSON file", path);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return zoff_error(ZOFF_ERR_CONFIG, "cannot open config file %s: %s%s", path, strerror(errno),
                          errno == ENOENT ? " (check the path)" : "");
    size_t cap = 8192, len = 0;
    char *buf = malloc(cap);
    zoff_status st = ZOFF_OK;
    while (buf != NULL) {
        if (len == cap) {
            if (cap >= ZOFF_CONFIG_MAX_BYTES) {
                st = zoff_error(ZOFF_ERR_CONFIG, "%s: config file is larger than %d bytes; is it a config file?", path,
                                ZOFF_CONFIG_MAX_BYTES);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) st = zoff_error(ZOFF_ERR_IO, "cannot read config file %s: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (buf == NULL) return zoff_error(ZOFF_ERR_NOMEM, "out of memory reading config file %s", path);
    if (st == ZOFF_OK) st = load_buffer(buf, len, path, cfg);
    free(buf);
    return st;
}

static bool mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }

zoff_status zoff_config_resolve_batch(zoff_config *cfg, int world_size) {
    if (cfg == NULL) return zoff_error(ZOFF_ERR_INVALID, "zoff_config_resolve_batch: cfg is NULL");
    if (world_size < 1)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_config_resolve_batch: world size %d; allowed: >= 1", world_size);
    const char *src = cfg->source_name ? cfg->source_name : "config";
    int64_t tb = cfg->train_batch_size, mb = cfg->train_micro_batch_size_per_gpu,
            ga = cfg->gradient_accumulation_steps, ws = world_size, prod;
    if (tb < 0 || mb < 0 || ga < 0)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "%s: batch sizes must be >= 1 (train_batch_size %lld, train_micro_batch_size_per_gpu %lld, "
                          "gradient_accumulation_steps %lld)",
                          src, (long long)tb, (long long)mb, (long long)ga);
    if (tb > 0 && mb > 0 && ga > 0) {
        if (!mul_ok(mb, ga, &prod) || !mul_ok(prod, ws, &prod) || prod != tb)
            return zoff_error(ZOFF_ERR_CONFIG,
                              "%s: batch sizes contradict each other: train_batch_size %lld != "
                              "train_micro_batch_size_per_gpu %lld * gradient_accumulation_steps %lld * world size %d; "
                              "give any two of the three and zoff derives the third",
                              src, (long long)tb, (long long)mb, (long long)ga, world_size);
    } else if (tb > 0 && mb > 0) {
        if (!mul_ok(mb, ws, &prod) || tb % prod != 0)
            return zoff_error(ZOFF_ERR_CONFIG,
                              "%s: train_batch_size %lld is not divisible by train_micro_batch_size_per_gpu %lld * "
                              "world size %d, so gradient_accumulation_steps would not be an integer",
                              src, (long long)tb, (long long)mb, world_size);
        cfg->gradient_accumulation_steps = tb / prod;
    } else if (tb > 0 && ga > 0) {
        if (!mul_ok(ga, ws, &prod) || tb % prod != 0)
            return zoff_error(ZOFF_ERR_CONFIG,
                              "%s: train_batch_size %lld is not divisible by gradient_accumulation_steps %lld * "
                              "world size %d, so train_micro_batch_size_per_gpu would not be an integer",
                              src, (long long)tb, (long long)ga, world_size);
        cfg->train_micro_batch_size_per_gpu = tb / prod;
    } else if (mb > 0 && ga > 0) {
        if (!mul_ok(mb, ga, &prod) || !mul_ok(prod, ws, &prod))
            return zoff_error(ZOFF_ERR_CONFIG,
                              "%s: train_micro_batch_size_per_gpu %lld * gradient_accumulation_steps %lld * world "
                              "size %d overflows",
                              src, (long long)mb, (long long)ga, world_size);
        cfg->train_batch_size = prod;
    } else if (tb > 0) {
        if (tb % ws != 0)
            return zoff_error(ZOFF_ERR_CONFIG,
                              "%s: train_batch_size %lld is not divisible by world size %d (with "
                              "gradient_accumulation_steps 1, each rank takes train_batch_size / world size)",
                              src, (long long)tb, world_size);
        cfg->gradient_accumulation_steps = 1;
        cfg->train_micro_batch_size_per_gpu = tb / ws;
    } else if (mb > 0) {
        if (!mul_ok(mb, ws, &prod))
            return zoff_error(ZOFF_ERR_CONFIG, "%s: train_micro_batch_size_per_gpu %lld * world size %d overflows",
                              src, (long long)mb, world_size);
        cfg->gradient_accumulation_steps = 1;
        cfg->train_batch_size = prod;
    } else {
        return zoff_error(ZOFF_ERR_CONFIG,
                          "%s: no batch size given: set train_batch_size or train_micro_batch_size_per_gpu%s, or give "
                          "--micro-batch-size",
                          src, ga > 0 ? " (gradient_accumulation_steps alone is not enough)" : "");
    }
    return ZOFF_OK;
}

/* What parses and validates but this version does not implement yet. One line
 * per missing feature: delete the line when the feature lands. */
zoff_status zoff_config_check_supported(const zoff_config *cfg) {
    if (cfg == NULL) return zoff_error(ZOFF_ERR_INVALID, "zoff_config_check_supported: cfg is NULL");
    char list[1800];
    size_t used = 0;
    list[0] = '\0';
#define UNSUPPORTED(cond, ...)                                                                         \
    do {                                                                                               \
        if ((cond) && used < sizeof list) {                                                            \
            int m_ = snprintf(list + used, sizeof list - used, "%s", used ? "; " : "");                \
            if (m_ > 0) used += (size_t)m_;                                                            \
            if (used < sizeof list) {                                                                  \
                m_ = snprintf(list + used, sizeof list - used, __VA_ARGS__);                           \
                if (m_ > 0) used += (size_t)m_;                                                        \
            }                                                                                          \
        }                                                                                              \
    } while (0)
    const zoff_zero_config *z = &cfg->zero;
    UNSUPPORTED(z->stage == 3 && z->delayed_param_update,
                "zero_optimization.zoff_delayed_param_update with stage 3");
    size_t core_used = used;
    UNSUPPORTED(cfg->unsupported != NULL, "%s", cfg->unsupported); /* valid DeepSpeed keys, recorded at load */
#undef UNSUPPORTED
    if (used == 0) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: not implemented yet in zoff %s: %s%s",
                      cfg->source_name ? cfg->source_name : "config", ZOFF_VERSION, list,
                      core_used ? " (this version trains with zero_optimization.stage 0-3, "
                                  "offload_optimizer.device none, cpu or nvme, offload_param.device none, cpu or nvme, "
                                  "fp32, bf16 or fp16)"
                                : "");
}

/* ------------------------------------------------------------------ the key tables, listed */

static void foreach_in(const section *sec, const char *prefix, void (*fn)(const zoff_config_key *, void *),
                       void *ctx) {
    char path[512];
    for (size_t i = 0; i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        join_path(path, sizeof path, prefix, k->name);
        if (k->kind == K_SECTION) {
            foreach_in(k->sub, path, fn, ctx);
            continue;
        }
        const key_spec *t = k->kind == K_ALIAS ? find_key(sec, k->alias_of) : k;
        zoff_config_key info = {.path = path,
                                .cls = key_class(sec, k),
                                .alias_of = k->kind == K_ALIAS ? k->alias_of : NULL,
                                .note = t != NULL ? t->note : NULL,
                                .dflt = t != NULL ? t->dflt : NULL,
                                .on_key = t != NULL ? t->sw : NULL};
        fn(&info, ctx);
    }
}

void zoff_config_foreach_key(void (*fn)(const zoff_config_key *key, void *ctx), void *ctx) {
    if (fn != NULL) foreach_in(&s_top, "", fn, ctx);
}
