/* zoff plan: what fits where, and the fastest configuration that fits, before
 * a run. The arithmetic is in src/plan (include/zoff/plan.h); this file reads
 * the flags, finds the machine's sizes and rates, and prints. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "zoff/plan.h"

#ifdef ZOFF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Without --config: DeepSpeed's defaults with the default job's micro-batch and optimizer. */
static const char *PLAN_DEFAULT_CONFIG = "{\"train_micro_batch_size_per_gpu\": 8, \"optimizer\": {\"type\": \"AdamW\"}}";

#define MAX_BENCH 8
#define MAX_RATIOS 16

typedef struct plan_args {
    const char *config_path, *device, *nvme_path, *write_config;
    const char *bench[MAX_BENCH];
    int nbench;
    int64_t num_layers, hidden_size, num_heads, seq_length, vocab_size, max_pos, micro_batch, ranks, ranks_per_node;
    size_t device_memory, host_memory, pinned_limit, disk_free;
    bool have_host, have_pinned, have_disk;
    double margin;
    bool have_margin;
    double ratios[MAX_RATIOS];
    int nratios;
    bool checkpoint_activations, json, no_probe, deepspeed, quiet;
} plan_args;

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: zoff plan [options]\n"
            "\n"
            "Predicts, for every ZeRO stage x offload device x host ratio, the bytes each rank holds on the\n"
            "device, in pinned and pageable host memory and on disk; marks what fits this machine with a\n"
            "margin and which settings this zoff can run; recommends the fastest that fits, with a predicted\n"
            "step time. See docs/plan.md.\n"
            "\n"
            "model and config (as zoff train takes them):\n"
            "  --config FILE               DeepSpeed JSON (batch, precision, optimizer, zero_optimization)\n"
            "  --num-layers N --hidden-size N --num-attention-heads N --seq-length N\n"
            "  --max-position-embeddings N --vocab-size N (default 50257) --micro-batch-size N\n"
            "  --checkpoint-activations\n"
            "machine (detected unless given; SIZE: bytes, or a unit in any case: 80G = 80GiB, 80GB = 8e10):\n"
            "  --device cpu|cuda           backend (default: cuda when available)\n"
            "  --device-memory SIZE        per rank (default: CUDA: free memory of the GPU; CPU: no limit);\n"
            "                              also the budget zoff train --device-memory gives the engine\n"
            "  --host-memory SIZE          per node (default: MemAvailable of /proc/meminfo)\n"
            "  --pinned-limit SIZE|unlimited  per rank (default: ulimit -l)\n"
            "  --disk-free SIZE            free space for nvme offload, one disk for both swap files\n"
            "                              (default: statvfs at each nvme path, per file system)\n"
            "  --nvme-path DIR             (default: the config's nvme_path, else .); --write-config writes it\n"
            "  --ranks N --ranks-per-node N  data-parallel ranks (default 1; per node default: all)\n"
            "  --margin F                  fraction of each capacity kept free (default 0.10)\n"
            "rates:\n"
            "  --bench FILE                output of zoff bench adam|step|nvme --json (repeatable)\n"
            "  --no-probe                  skip the quick built-in probes; use assumed figures\n"
            "output:\n"
            "  --ratios LIST               host ratios to plan, e.g. 0,0.5,1 (default 0,0.25,0.5,0.75,1; auto always)\n"
            "  --json                      one JSON object on stdout\n"
            "  --deepspeed                 also print DeepSpeed's estimate_zero2/zero3 figures for this model\n"
            "  --write-config FILE         write the recommended setting as DeepSpeed JSON (atomically)\n"
            "  -q, --quiet                 no notes on stderr (the library's: a config key with no effect); the\n"
            "                              table or JSON on stdout, warnings and errors still print\n");
}

static bool parse_size_flag(const char *flag, const char *v, size_t *out) {
    if (zoff_parse_size(v, out) != ZOFF_OK) {
        fprintf(stderr, "zoff plan: %s: %s\n", flag, zoff_last_error());
        return false;
    }
    return true;
}

/* A figure the machine would otherwise measure, given on the command line: parse it, mark it given. */
static bool given_size(const char *flag, const char *v, size_t *out, bool *given) {
    if (!parse_size_flag(flag, v, out)) return false;
    *given = true;
    return true;
}

static bool parse_ratios(const char *v, plan_args *a) {
    a->nratios = 0;
    char buf[512];
    if (!cli_check_list("plan", "--ratios", v, sizeof buf)) return false;
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double r;
        if (a->nratios == MAX_RATIOS) {
            fprintf(stderr, "zoff plan: --ratios: at most %d values\n", MAX_RATIOS);
            return false;
        }
        if (!cli_parse_f64("plan", "--ratios", tok, 0.0, 1.0, &r)) return false;
        a->ratios[a->nratios++] = r;
    }
    if (a->nratios == 0) {
        fprintf(stderr, "zoff plan: --ratios: '%s' has no values (e.g. 0,0.5,1)\n", v);
        return false;
    }
    return true;
}

static int parse_args(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    const cli_shape_fields shape = {&a->num_layers, &a->hidden_size, &a->num_heads,   &a->seq_length,
                                    &a->max_pos,    &a->vocab_size,  &a->micro_batch, &a->checkpoint_activations};
    const cli_string_flag strs[] = {
        {"--config", &a->config_path}, {"--nvme-path", &a->nvme_path}, {"--write-config", &a->write_config}};
    const cli_int_flag ints[] = {{"--ranks", 1, 1 << 20, &a->ranks},
                                 {"--ranks-per-node", 1, 1 << 20, &a->ranks_per_node}};
    const cli_bool_flag bools[] = {
        {"--no-probe", &a->no_probe, true}, {"--json", &a->json, true}, {"--deepspeed", &a->deepspeed, true}};
    const cli_flag_tables tables = {&shape, strs, sizeof strs / sizeof *strs, ints, sizeof ints / sizeof *ints,
                                    bools,  sizeof bools / sizeof *bools,       plan_usage};
    static const char *const devices[] = {"cpu", "cuda", NULL};
    /* the flags below that take a value: fetched first, as v */
    static const char *const valued[] = {"--device-memory", "--host-memory", "--pinned-limit", "--disk-free",
                                         "--margin",        "--ratios",      "--bench",        NULL};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        char name[64];
        if (cli_quiet_flag(argv[i], &a->quiet)) continue;
        int took = cli_table_flags("plan", &tables, name, sizeof name, argc, argv, &i);
        if (took == CLI_FLAG_TAKEN) continue;
        if (took != CLI_FLAG_NONE) return took == CLI_FLAG_HELP ? -1 : 2;
        for (const char *const *f = valued; *f; f++)
            if (!strcmp(name, *f) && !(v = cli_value("plan", argc, argv, &i))) return 2;
        if (!strcmp(name, "--device")) {
            if (!(a->device = cli_choice("plan", name, devices, argc, argv, &i))) return 2;
        } else if (!strcmp(name, "--device-memory")) {
            if (!parse_size_flag(name, v, &a->device_memory)) return 2;
            if (a->device_memory == 0) {
                fprintf(stderr, "zoff plan: --device-memory: must be > 0\n");
                return 2;
            }
        } else if (!strcmp(name, "--host-memory")) {
            if (!given_size(name, v, &a->host_memory, &a->have_host)) return 2;
        } else if (!strcmp(name, "--pinned-limit")) {
            if (!strcmp(v, "unlimited")) {
                a->pinned_limit = SIZE_MAX;
                a->have_pinned = true;
            } else if (!given_size(name, v, &a->pinned_limit, &a->have_pinned)) {
                return 2;
            }
        } else if (!strcmp(name, "--disk-free")) {
            if (!given_size(name, v, &a->disk_free, &a->have_disk)) return 2;
        } else if (!strcmp(name, "--margin")) {
            if (!cli_parse_f64("plan", name, v, 0.0, 0.9, &a->margin)) return 2;
            a->have_margin = true;
        } else if (!strcmp(name, "--ratios")) {
            if (!parse_ratios(v, a)) return 2;
        } else if (!strcmp(name, "--bench")) {
            if (a->nbench == MAX_BENCH) {
                fprintf(stderr, "zoff plan: --bench: at most %d files\n", MAX_BENCH);
                return 2;
            }
            a->bench[a->nbench++] = v;
        } else {
            cli_unknown_option("plan", argv[i], plan_usage);
            return 2;
        }
    }
    if (a->ranks_per_node && a->ranks && a->ranks_per_node > a->ranks) {
        fprintf(stderr, "zoff plan: --ranks-per-node %lld exceeds --ranks %lld\n", (long long)a->ranks_per_node,
                (long long)a->ranks);
        return 2;
    }
    return 0;
}

/* "zoff plan: WHAT: the error" (what NULL: the error names its subject itself) */
static int fail(const char *what, zoff_status s) {
    fprintf(stderr, "zoff plan: %s%s%s\n", what ? what : "", what ? ": " : "", zoff_last_error());
    return cli_exit_code(s);
}

/* ------------------------------------------------------------------ output */

static const char *fmt_b(size_t b, char *buf, size_t n) {
    if (b == SIZE_MAX) return "unlimited";
    return zoff_format_bytes(b, buf, n);
}

static void offload_label(const zoff_plan_setting *s, char *buf, size_t n) {
    const char *st = s->bf16_states ? " bf16st" : ""; /* bf16 optimizer states */
    if (s->stage == 3 && s->param_offload != ZOFF_OFFLOAD_NONE)
        snprintf(buf, n, "%s+p:%s%s", zoff_plan_offload_name(s->offload), zoff_plan_offload_name(s->param_offload), st);
    else snprintf(buf, n, "%s%s", zoff_plan_offload_name(s->offload), st);
}

static void ratio_label(const zoff_plan_row *r, char *buf, size_t n) {
    const zoff_plan_setting *s = &r->setting;
    if (s->offload == ZOFF_OFFLOAD_NONE) snprintf(buf, n, "-");
    else if (s->ratio_auto) snprintf(buf, n, "auto");
    else snprintf(buf, n, "%g%s", s->ratio, r->ratio_fitted ? " fit" : "");
}

static void fits_label(const zoff_plan_row *r, char *buf, size_t n) {
    if (r->fits) {
        snprintf(buf, n, "yes");
        return;
    }
    snprintf(buf, n, "no:%s%s%s%s%s%s", !r->fits_device ? "dev," : "", !r->fits_pinned ? "pin," : "",
             !r->fits_host ? "host," : "", !r->fits_disk ? "disk," : "", r->auto_failed ? "auto," : "",
             r->bad_config ? "config," : "");
    size_t l = strlen(buf);
    if (l && buf[l - 1] == ',') buf[l - 1] = '\0';
}


/* How zoff train's periodic saves would run (zoff_plan_row: the snapshot's budget, the rule). */
static void print_saves(const zoff_plan_inputs *in, const zoff_plan_row *r, char b[][32]) {
    const zoff_plan_memory *m = &r->mem;
    if (!r->background_saves) {
        printf("  saves    periodic ones synchronous, training waits for each: %s\n", r->saves_why);
        return;
    }
    if (r->snapshot_budget < 0) {
        printf("  saves    periodic ones in the background, without a snapshot (super_offload): the next update "
               "waits for each\n");
        return;
    }
    char left[48] = "(unknown)";
    if (in->machine.host_bytes)
        fmt_b(in->machine.host_bytes > r->host_use ? in->machine.host_bytes - r->host_use : 0, left, sizeof left);
    printf("  saves    periodic ones in the background, training goes on: a snapshot of up to %s (--save-snapshot-memory "
           "auto: at most half of the %s of host memory this leaves; %s stages everything%s)",
           fmt_b((size_t)r->snapshot_budget, b[0], 32), left, fmt_b(m->snapshot, b[1], 32),
           (size_t)r->snapshot_budget < m->snapshot ? ", with less updates wait for the writer at times" : "");
    if (m->snapshot_copy) printf("; the device's share copied at each save, beside the next forward and backward: %s", fmt_b(m->snapshot_copy, b[2], 32));
    printf("\n");
}
static void print_row_detail(const char *title, const zoff_plan_row *r, const zoff_plan_inputs *in) {
    const zoff_plan_memory *m = &r->mem;
    const zoff_plan_time *t = &r->time;
    char o[32], rt[48], b[12][32];
    offload_label(&r->setting, o, sizeof o);
    ratio_label(r, rt, sizeof rt);
    printf("%s: stage %d, offload %s, ratio %s (host %.1f%% of %lld parameters in %d sub-group%s), pin_memory %s%s%s\n",
           title, r->setting.stage, o, rt, 100.0 * r->host_ratio, (long long)r->partition_params, r->num_subgroups,
           r->num_subgroups == 1 ? "" : "s", r->setting.pin_memory ? "true" : "false",
           r->setting.param_offload != ZOFF_OFFLOAD_NVME ? ""
           : r->setting.param_pin_memory               ? ", offload_param.pin_memory true"
                                                       : ", offload_param.pin_memory false",
           in->cfg->zero.delayed_param_update && r->setting.offload != ZOFF_OFFLOAD_NONE ? ", delayed update" : "");
    printf("  device   %10s = weights %s + gradients %s + activations %s + tokens %s + optimizer %s",
           fmt_b(m->device, b[0], 32), fmt_b(m->params16, b[1], 32), fmt_b(m->grads16, b[2], 32),
           fmt_b(m->activations, b[3], 32), fmt_b(m->tokens, b[4], 32), fmt_b(m->device_optimizer, b[5], 32));
    if (m->comm_buffers) printf(" + reduce-scatter buffers %s", fmt_b(m->comm_buffers, b[8], 32));
    if (m->gathered) printf(" + gathered %s", fmt_b(m->gathered, b[6], 32));
    if (m->runtime_reserve) printf(" + runtime %s", fmt_b(m->runtime_reserve, b[7], 32));
    printf("\n");
    /* the engine's host buffers: pinned, the buffers device copies use (pin_memory: the gradient
     * buffers, the staging, a master the device reads); pageable, the rest */
    const bool pin = r->setting.pin_memory;
    const size_t state_pinned = pin && m->host_pinned > m->host_grads + m->host_staging
                                    ? m->host_pinned - m->host_grads - m->host_staging : 0;
    printf("  pinned   %10s = losses %s", fmt_b(m->pinned, b[0], 32), fmt_b(m->model_pinned, b[1], 32));
    if (m->param_buffers) printf(" + parameter swap buffers %s", fmt_b(m->param_buffers, b[2], 32));
    if (m->swap_pinned) printf(" + NVMe swap buffers %s", fmt_b(m->swap_pinned, b[2], 32));
    if (pin && (m->host_grads || m->host_params))
        printf(" + gradients (and new weights) %s + staging %s%s%s%s%s", fmt_b(m->host_grads, b[4], 32),
               fmt_b(m->host_staging, b[5], 32), state_pinned ? " + fp32 master (the device reads it) " : "",
               state_pinned ? fmt_b(state_pinned, b[3], 32) : "", m->host_params ? " + params " : "",
               m->host_params ? fmt_b(m->host_params, b[6], 32) : "");
    printf("\n  pageable %10s = training loop %s (checkpoint save buffer, tokens)",
           fmt_b(m->pageable, b[0], 32), fmt_b(m->loop_pageable, b[1], 32));
    if (m->swap_buffers > m->swap_pinned)
        printf(" + NVMe swap %s %s", m->swap_pinned ? "header" : "buffers", fmt_b(m->swap_buffers - m->swap_pinned, b[2], 32));
    if (m->host_spec_backup) printf(" + super_offload rollback copy %s", fmt_b(m->host_spec_backup, b[7], 32));
    if (m->host_optimizer > state_pinned)
        printf(" + optimizer state %s", fmt_b(m->host_optimizer - state_pinned, b[3], 32));
    if (!pin && (m->host_grads || m->host_params))
        printf(" + gradients (and new weights) %s + staging %s%s%s", fmt_b(m->host_grads, b[4], 32),
               fmt_b(m->host_staging, b[5], 32), m->host_params ? " + params " : "",
               m->host_params ? fmt_b(m->host_params, b[6], 32) : "");
    printf("\n");
    const zoff_plan_machine *M = &in->machine;
    if (m->disk && M->param_disk_own)
        printf("  disk     %10s = optimizer state %s (at %s, %s free) + params %s (at %s, another file system, %s free)\n",
               fmt_b(m->disk, b[0], 32), fmt_b(m->disk_optimizer, b[1], 32), M->disk_path,
               M->disk_bytes ? fmt_b(M->disk_bytes, b[3], 32) : "unknown", fmt_b(m->disk_params, b[2], 32),
               M->param_disk_path, M->param_disk_bytes ? fmt_b(M->param_disk_bytes, b[4], 32) : "unknown");
    else if (m->disk)
        printf("  disk     %10s = optimizer state %s + params %s\n", fmt_b(m->disk, b[0], 32),
               fmt_b(m->disk_optimizer, b[1], 32), fmt_b(m->disk_params, b[2], 32));
    char nr[32];
    printf("  host use %10s per node (x%s%s)\n", fmt_b(r->host_use, b[0], 32),
           zoff_format_count(in->machine.ranks_per_node, "rank", nr, sizeof nr), in->machine.backend == ZOFF_BACKEND_CPU ? "; CPU backend: device memory is host memory" : "");
    const size_t dfree = in->machine.disk_bytes;
    printf("  checkpoint %8s per save, all ranks (%s%s%zu bytes%s in its rank_NNNNN.zckpt files: fp32 master weights + "
           "optimizer state + metadata; a save with --keep-last N is written beside N of them; zoff train refuses a "
           "--save with less free disk%s%s%s)\n",
           fmt_b(m->checkpoint, b[0], 32), m->checkpoint_bound ? m->checkpoint_bound : "",
           m->checkpoint_bound ? " " : "", m->checkpoint, m->checkpoint_bound ? "" : " exactly",
           dfree && dfree < m->checkpoint ? ": more than the " : "",
           dfree && dfree < m->checkpoint ? fmt_b(dfree, b[1], 32) : "",
           dfree && dfree < m->checkpoint ? " free at the planned disk; save elsewhere or --no-checkpoint" : "");
    print_saves(in, r, b);
    if (in->machine.backend == ZOFF_BACKEND_CPU)
        printf("  step     %.4g s = compute %.4g + gradients out %.4g + comm %.4g + host optimizer %.4g + weights in "
               "%.4g + device optimizer %.4g (CPU backend: one set of cores, nothing overlaps)\n",
               t->step, t->compute, t->grads_out, t->comm, t->host_optim, t->weights_in, t->device_optim);
    else if (in->cfg->zero.delayed_param_update && r->setting.offload != ZOFF_OFFLOAD_NONE)
        printf("  step     %.4g s = max(compute %.4g + gradients out %.4g + comm %.4g + device optimizer %.4g, host "
               "optimizer %.4g + weights in %.4g) (delayed update: the host part overlaps the next step)\n",
               t->step, t->compute, t->grads_out, t->comm, t->device_optim, t->host_optim, t->weights_in);
    else if (t->forward_overlap > 0)
        printf("  step     %.4g s = compute %.4g - next forward %.4g + gradients out %.4g + comm %.4g + max(next forward "
               "%.4g + device optimizer %.4g, host optimizer %.4g + weights in %.4g) (pipelined: the next forward "
               "waits per layer group)\n",
               t->step, t->compute, t->forward_overlap, t->grads_out, t->comm, t->forward_overlap, t->device_optim,
               t->host_optim, t->weights_in);
    else
        printf("  step     %.4g s = compute %.4g + gradients out %.4g + comm %.4g + max(host optimizer %.4g + weights "
               "in %.4g, device optimizer %.4g)\n",
               t->step, t->compute, t->grads_out, t->comm, t->host_optim, t->weights_in, t->device_optim);
    if (r->setting.bf16_states)
        printf("  states   bf16 m and v %s (bf16.bf16_optimizer_states true%s)\n",
               r->setting.offload == ZOFF_OFFLOAD_NVME ? "in the NVMe swap file" : "on the host",
               in->cfg->bf16_optimizer_states ? ", as configured"
                                              : ": a numerics change the config did not ask for; --write-config sets it");
    if (zoff_plan_changes_sub_group_size(in->cfg, &r->setting))
        printf("  sub-groups sub_group_size %lld, not the config's %lld (at least %d sub-groups for the NVMe swap "
               "buffers; --write-config sets it)\n",
               (long long)r->setting.sub_group_size, (long long)in->cfg->zero.sub_group_size, ZOFF_PLAN_MIN_SUBGROUPS);
    if (r->why[0]) printf("  note     %s\n", r->why);
}

/* "Nothing fits": only advice that changes something (not what is already set). When settings fit
 * but none runs here, why instead (ranks > 1 in a build without MPI: every row). */
static void print_nothing_fits(const plan_args *a, const zoff_plan_inputs *in, const zoff_plan *p) {
    const zoff_plan_machine *M = &in->machine;
    if (p->best_any >= 0 && M->ranks > 1 && !zoff_comm_have_mpi()) {
        printf("recommended: none: %d ranks need a build with MPI and this zoff has none, so no setting runs "
               "(the 'runs' column); build zoff with MPI (scripts/deps.sh installs Open MPI, then cmake "
               "-DZOFF_MPI=ON) or plan for one rank (--ranks 1)\n",
               M->ranks);
        return;
    }
    if (p->best_any >= 0) {
        printf("recommended: none: the settings that fit do not run with this zoff (the 'runs' column; the fastest "
               "one's note below says why)\n");
        return;
    }
    char mb[80];
    snprintf(mb, sizeof mb, "lower --micro-batch-size (now %lld)", (long long)in->model.batch_size);
    const char *adv[7];
    int n = 0;
    if (in->model.batch_size > 1) adv[n++] = mb;
    /* (zoff_placement_grad_buckets_for: with accumulation "always" takes the buckets, any ranks, any ratio) */
    if (in->cfg->gradient_accumulation_steps > 1 && in->cfg->zero.grad_buckets == ZOFF_GRAD_BUCKETS_ON)
        adv[n++] = "set zero_optimization.zoff_grad_buckets \"always\" (the accumulation's sum waits on the host: "
                   "no full device gradient buffer)";
    if (!in->model.checkpoint_activations) adv[n++] = "add --checkpoint-activations";
    if (M->ranks_per_node == 1) adv[n++] = "use more ranks on more nodes (ZeRO partitions the state)";
    adv[n++] = "use a smaller model (--num-layers, --hidden-size)";
    adv[n++] = "free host memory";
    if (M->pinned_limit != SIZE_MAX && !a->have_pinned) adv[n++] = "raise ulimit -l";
    printf("recommended: nothing this zoff can run fits (see the 'fits' column); to change that:");
    for (int i = 0; i < n; i++) printf("%s %s", i ? ";" : "", adv[i]);
    printf("\n");
}

static void print_text(const plan_args *a, const zoff_plan_inputs *in, const zoff_plan *p) {
    const zoff_gpt2_options *mo = &in->model;
    const zoff_plan_machine *M = &in->machine;
    const zoff_plan_rates *r = &M->rates;
    char b[8][32];
    char nl[32], nh[32], np[48];
    printf("zoff plan: GPT-2 %s, width %lld, %s, seq %lld, vocab %lld (padded %lld): %s, %s\n",
           zoff_format_count(mo->shape.num_layers, "layer", nl, sizeof nl), (long long)mo->shape.hidden_size,
           zoff_format_count(mo->shape.num_heads, "head", nh, sizeof nh), (long long)mo->seq_len,
           (long long)mo->shape.vocab_size, (long long)p->model.padded_vocab_size,
           zoff_format_params(p->model.num_params, np, sizeof np), zoff_dtype_name(mo->dtype));
    char nr[32];
    printf("  micro-batch %lld x accumulation %lld x %s, activation checkpointing %s, config %s\n",
           (long long)mo->batch_size, (long long)in->cfg->gradient_accumulation_steps,
           zoff_format_count(M->ranks, "rank", nr, sizeof nr),
           mo->checkpoint_activations ? "on" : "off", a->config_path ? a->config_path : "(defaults)");
    printf("machine: %s backend, %d rank%s (%d per node); device %s%s; host %s available per node; pinned limit %s "
           "per rank%s; disk %s free%s%s%s%s%s%s; margin %.0f%%\n",
           M->backend == ZOFF_BACKEND_CUDA ? "cuda" : "cpu", M->ranks, M->ranks == 1 ? "" : "s", M->ranks_per_node,
           M->device_bytes ? fmt_b(M->device_bytes, b[0], 32) : "unlimited",
           M->device_bytes ? (M->device_budget ? " (--device-memory)" : " (free on the GPU)")
                           : " (CPU backend: device memory is host memory)",
           fmt_b(M->host_bytes, b[1], 32), fmt_b(M->pinned_limit, b[2], 32),
           a->have_pinned ? "" : M->backend == ZOFF_BACKEND_CPU ? " (CPU backend: pinned is ordinary memory)" : " (ulimit -l)",
           M->disk_bytes ? fmt_b(M->disk_bytes, b[3], 32) : "unknown", M->disk_path[0] ? " at " : "", M->disk_path,
           M->param_disk_own ? " (optimizer), " : "",
           M->param_disk_own ? (M->param_disk_bytes ? fmt_b(M->param_disk_bytes, b[4], 32) : "unknown") : "",
           M->param_disk_own ? " free at " : "", M->param_disk_own ? M->param_disk_path : "", 100.0 * M->margin);
    printf("rates: compute %.3g GFLOP/s (%s), device Adam %.3g Mparam/s (%s), host Adam %.3g Mparam/s (%.3g with "
           "bf16 states; %s; bound %.3g GB/s),\n  copies H2D %.3g / D2H %.3g GB/s (%s), disk read %.3g / write %.3g GB/s (%s), link %.3g GB/s "
           "(%s)%s%s\n\n",
           r->device_flops / 1e9, zoff_plan_source_name(r->src_compute), r->device_adam / 1e6,
           zoff_plan_source_name(r->src_device_adam), zoff_plan_host_rate(r, in->cfg, in->model.dtype, false) / 1e6,
           zoff_plan_host_rate(r, in->cfg, in->model.dtype, true) / 1e6, zoff_plan_source_name(r->src_host_adam),
           r->host_mem_bw / 1e9, r->h2d / 1e9, r->d2h / 1e9, zoff_plan_source_name(r->src_copy), r->disk_read / 1e9,
           r->disk_write / 1e9, zoff_plan_source_name(r->src_disk), r->link / 1e9, zoff_plan_source_name(r->src_link),
           r->bench_files[0] ? "\n  bench files: " : "", r->bench_files);
    printf("per rank:  %5s %-16s %-10s %6s %3s %11s %11s %11s %11s  %-16s %9s  %s\n", "stage", "offload", "ratio", "host%",
           "pin", "device", "pinned", "pageable", "disk", "fits", "step s", "runs");
    int nsg = 0; /* rows whose sub_group_size is not the config's, and theirs (-1: several) */
    int64_t sg = 0;
    for (int i = 0; i < p->nrows; i++) {
        const zoff_plan_row *w = &p->rows[i];
        char o[32], rt[48], fl[48];
        offload_label(&w->setting, o, sizeof o);
        if (zoff_plan_changes_sub_group_size(in->cfg, &w->setting)) { /* a setting the config does not have */
            strncat(o, "*", sizeof o - strlen(o) - 1);
            if (!nsg++) sg = w->setting.sub_group_size;
            else if (sg != w->setting.sub_group_size) sg = -1;
        }
        ratio_label(w, rt, sizeof rt);
        fits_label(w, fl, sizeof fl);
        printf("%-9s  %5d %-16s %-10s %5.1f%% %3s %11s %11s %11s %11s  %-16s %9.4g  %s\n",
               i == p->best ? "  best ->" : i == p->best_any ? "fastest>" : "", w->setting.stage, o, rt,
               100.0 * w->host_ratio, w->setting.offload == ZOFF_OFFLOAD_NONE ? "-" : w->setting.pin_memory ? "y" : "n",
               fmt_b(w->mem.device, b[0], 32), fmt_b(w->mem.pinned, b[1], 32), fmt_b(w->mem.pageable, b[2], 32),
               fmt_b(w->mem.disk, b[3], 32), fl, w->time.step, w->runnable ? "yes" : "no");
    }
    if (nsg > 0) {
        char sgs[48] = "a finer sub_group_size (per row: --json)";
        if (sg > 0) snprintf(sgs, sizeof sgs, "sub_group_size %lld", (long long)sg);
        printf("  * %s, not the config's %lld: the marked nvme rows (ratio 0 or 1, and the fitted "
               "ratio after them) split the state into at least %d sub-groups (with one, the swap buffers would be as large as the state); a marked row's figures "
               "are for that size, --write-config writes it (the config's own setting, unmarked, keeps its size)\n",
               sgs, (long long)in->cfg->zero.sub_group_size, ZOFF_PLAN_MIN_SUBGROUPS);
    }
    printf("\n");
    if (p->best >= 0) print_row_detail("recommended", &p->rows[p->best], in);
    else print_nothing_fits(a, in, p);
    if (p->best_any >= 0 && p->best_any != p->best) print_row_detail("fastest that fits (not runnable yet)", &p->rows[p->best_any], in);
}

static json_t *row_json_base(const zoff_plan_row *w, int index) {
    const zoff_plan_memory *m = &w->mem;
    const zoff_plan_time *t = &w->time;
    json_t *ratio = w->setting.offload == ZOFF_OFFLOAD_NONE ? json_null()
                    : w->setting.ratio_auto               ? json_string("auto")
                                                          : json_real(w->setting.ratio);
    return json_pack(
        "{s:i,s:i,s:s,s:s,s:o,s:b,s:f,s:b,s:I,s:I,s:I,s:I,s:i,s:b,s:b,s:s,"
        "s:{s:I,s:I,s:I,s:I},"
        "s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I},"
        "s:{s:b,s:b,s:b,s:b,s:b},s:I,"
        "s:{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}}",
        "index", index, "stage", w->setting.stage, "offload", zoff_plan_offload_name(w->setting.offload),
        "param_offload", zoff_plan_offload_name(w->setting.param_offload), "ratio", ratio, "ratio_fitted",
        w->ratio_fitted, "host_ratio", w->host_ratio,
        "pin_memory", w->setting.pin_memory, "sub_group_size", (json_int_t)w->setting.sub_group_size,
        "partition_params", (json_int_t)w->partition_params, "host_params", (json_int_t)w->host_params,
        "device_params", (json_int_t)w->device_params, "num_subgroups", w->num_subgroups, "runnable", w->runnable,
        "fits", w->fits, "why", w->why,
        "per_rank", "device", (json_int_t)m->device, "pinned", (json_int_t)m->pinned, "pageable",
        (json_int_t)m->pageable, "disk", (json_int_t)m->disk,
        "breakdown", "params16", (json_int_t)m->params16, "grads16", (json_int_t)m->grads16, "activations",
        (json_int_t)m->activations, "tokens", (json_int_t)m->tokens, "comm_buffers", (json_int_t)m->comm_buffers,
        "gathered", (json_int_t)m->gathered,
        "device_optimizer", (json_int_t)m->device_optimizer, "runtime_reserve", (json_int_t)m->runtime_reserve,
        "host_optimizer", (json_int_t)m->host_optimizer, "host_grads", (json_int_t)m->host_grads, "host_staging",
        (json_int_t)m->host_staging, "host_pinned", (json_int_t)m->host_pinned, "host_spec_backup", (json_int_t)m->host_spec_backup, "swap_buffers",
        (json_int_t)m->swap_buffers, "swap_pinned", (json_int_t)m->swap_pinned, "param_buffers",
        (json_int_t)m->param_buffers, "host_params",
        (json_int_t)m->host_params, "model_pinned", (json_int_t)m->model_pinned, "loop_pageable",
        (json_int_t)m->loop_pageable, "disk_optimizer", (json_int_t)m->disk_optimizer, "disk_params",
        (json_int_t)m->disk_params, "checkpoint", (json_int_t)m->checkpoint,
        "fits_detail", "device", w->fits_device, "pinned", w->fits_pinned, "host", w->fits_host, "disk", w->fits_disk,
        "auto_failed", w->auto_failed, "host_use_per_node", (json_int_t)w->host_use,
        "time", "step", t->step, "compute", t->compute, "grads_out", t->grads_out, "comm", t->comm, "host_optim",
        t->host_optim, "weights_in", t->weights_in, "device_optim", t->device_optim, "forward_overlap", t->forward_overlap);
}

static json_t *row_json(const zoff_plan_row *w, int index, const zoff_config *cfg) {
    json_t *o = row_json_base(w, index);
    if (o) json_object_set_new(o, "param_pin_memory", json_boolean(w->setting.param_pin_memory));
    if (o) json_object_set_new(o, "sub_group_size_changed", json_boolean(zoff_plan_changes_sub_group_size(cfg, &w->setting)));
    json_t *sv = o ? json_pack("{s:b,s:I,s:I,s:I,s:s}", "background", w->background_saves, "snapshot_budget",
                               (json_int_t)w->snapshot_budget, "snapshot", (json_int_t)w->mem.snapshot,
                               "snapshot_copy", (json_int_t)w->mem.snapshot_copy, "why", w->saves_why)
                   : NULL;
    if (o) json_object_set_new(o, "bf16_optimizer_states", json_boolean(w->setting.bf16_states));
    json_t *bd = o ? json_object_get(o, "breakdown") : NULL; /* breakdown.checkpoint: exact or a bound */
    if (bd) json_object_set_new(bd, "checkpoint_bound", json_string(w->mem.checkpoint_bound ? w->mem.checkpoint_bound : "exact"));
    if (o && sv) json_object_set_new(o, "periodic_saves", sv);
    return o;
}

static json_t *deepspeed_json(const zoff_plan_deepspeed *d) {
    return json_pack("{s:I,s:I,s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f}}", "total_params",
                     (json_int_t)d->total_params, "largest_layer_params", (json_int_t)d->largest_layer_params,
                     "zero2_offload_cpu", "gpu", d->z2_offload_gpu, "cpu", d->z2_offload_cpu, "zero2_none", "gpu",
                     d->z2_none_gpu, "cpu", d->z2_none_cpu, "zero3_offload_param_and_optimizer_cpu", "gpu",
                     d->z3_both_gpu, "cpu", d->z3_both_cpu, "zero3_offload_optimizer_cpu", "gpu", d->z3_opt_gpu, "cpu",
                     d->z3_opt_cpu, "zero3_none", "gpu", d->z3_none_gpu, "cpu", d->z3_none_cpu);
}

static int print_json(const plan_args *a, const zoff_plan_inputs *in, const zoff_plan *p, const zoff_plan_deepspeed *ds,
                      const char *rec_config) {
    const zoff_gpt2_options *mo = &in->model;
    const zoff_plan_machine *M = &in->machine;
    const zoff_plan_rates *r = &M->rates;
    json_t *rows = json_array();
    for (int i = 0; i < p->nrows; i++) json_array_append_new(rows, row_json(&p->rows[i], i, in->cfg));
    json_t *root = json_pack(
        "{s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:b},"
        "s:{s:s,s:i,s:i,s:I,s:b,s:I,s:I,s:I,s:f,s:I,s:I,"
        "s:{s:f,s:s,s:f,s:s,s:f,s:f,s:s,s:f,s:f,s:f,s:s,s:f,s:f,s:s,s:f,s:s,s:s}},"
        "s:o,s:i,s:i}",
        "model", "num_layers", (json_int_t)mo->shape.num_layers, "hidden_size", (json_int_t)mo->shape.hidden_size,
        "num_attention_heads", (json_int_t)mo->shape.num_heads, "seq_length", (json_int_t)mo->seq_len, "vocab_size",
        (json_int_t)mo->shape.vocab_size, "padded_vocab_size", (json_int_t)p->model.padded_vocab_size, "num_params",
        (json_int_t)p->model.num_params, "micro_batch", (json_int_t)mo->batch_size, "accumulation",
        (json_int_t)in->cfg->gradient_accumulation_steps, "dtype", zoff_dtype_name(mo->dtype),
        "checkpoint_activations", mo->checkpoint_activations,
        "machine", "backend", M->backend == ZOFF_BACKEND_CUDA ? "cuda" : "cpu", "ranks", M->ranks, "ranks_per_node",
        M->ranks_per_node, "device_bytes", (json_int_t)M->device_bytes, "device_budget", M->device_budget,
        "host_bytes", (json_int_t)M->host_bytes, "pinned_limit",
        (json_int_t)(M->pinned_limit == SIZE_MAX ? -1 : (json_int_t)M->pinned_limit), "disk_bytes",
        (json_int_t)M->disk_bytes, "margin", M->margin, "runtime_reserve", (json_int_t)M->runtime_reserve,
        "process_baseline", (json_int_t)M->process_baseline,
        "rates", "device_flops", r->device_flops, "device_flops_source", zoff_plan_source_name(r->src_compute),
        "device_adam", r->device_adam, "device_adam_source", zoff_plan_source_name(r->src_device_adam), "host_adam",
        zoff_plan_host_rate(r, in->cfg, mo->dtype, false), "host_adam_bf16_states",
        zoff_plan_host_rate(r, in->cfg, mo->dtype, true), "host_adam_source", zoff_plan_source_name(r->src_host_adam),
        "host_mem_bw", r->host_mem_bw, "h2d",
        r->h2d, "d2h", r->d2h, "copy_source", zoff_plan_source_name(r->src_copy), "disk_read", r->disk_read,
        "disk_write", r->disk_write, "disk_source", zoff_plan_source_name(r->src_disk), "link", r->link,
        "link_source", zoff_plan_source_name(r->src_link), "bench_files", r->bench_files,
        "rows", rows, "best", p->best, "fastest_any", p->best_any);
    if (!root) {
        fprintf(stderr, "zoff plan: cannot encode the JSON output\n");
        return 1;
    }
    json_t *mj = json_object_get(root, "machine"); /* the free space per file system of the swap files */
    if (mj) {
        json_object_set_new(mj, "disk_path", M->disk_path[0] ? json_string(M->disk_path) : json_null());
        json_object_set_new(mj, "param_disk_own", json_boolean(M->param_disk_own));
        json_object_set_new(mj, "param_disk_bytes", json_integer((json_int_t)(M->param_disk_own ? M->param_disk_bytes : M->disk_bytes)));
        json_object_set_new(mj, "param_disk_path", M->param_disk_own ? json_string(M->param_disk_path)
                                                   : M->disk_path[0] ? json_string(M->disk_path) : json_null());
    }
    if (rec_config) {
        json_error_t je;
        json_t *rc = json_loads(rec_config, 0, &je);
        if (rc) json_object_set_new(root, "recommended_config", rc);
    }
    if (ds) json_object_set_new(root, "deepspeed", deepspeed_json(ds));
    (void)a;
    char *txt = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (!txt) return 1;
    printf("%s\n", txt);
    free(txt);
    return 0;
}

static void print_deepspeed(const zoff_plan_deepspeed *d, const zoff_plan_inputs *in) {
    char b[4][32];
    const double G = 1.0 / (1024.0 * 1024.0 * 1024.0);
    printf("\nDeepSpeed's estimators for this model (Hugging Face GPT-2: %.2fM parameters, largest layer %.2fM;\n"
           "model states only, no activations; additional_buffer_factor 1.5; cpu = per node, %d GPU%s per node):\n",
           (double)d->total_params / 1e6, (double)d->largest_layer_params / 1e6, in->machine.ranks_per_node,
           in->machine.ranks_per_node == 1 ? "" : "s");
    printf("  %-44s %12s %12s\n", "option", "per GPU", "per CPU");
    printf("  %-44s %10.2fGB %10.2fGB\n", "zero2 offload_optimizer=cpu", d->z2_offload_gpu * G, d->z2_offload_cpu * G);
    printf("  %-44s %10.2fGB %10.2fGB\n", "zero2 offload_optimizer=none", d->z2_none_gpu * G, d->z2_none_cpu * G);
    printf("  %-44s %10.2fGB %10.2fGB\n", "zero3 offload_param=cpu, offload_optimizer=cpu", d->z3_both_gpu * G,
           d->z3_both_cpu * G);
    printf("  %-44s %10.2fGB %10.2fGB\n", "zero3 offload_param=none, offload_optimizer=cpu", d->z3_opt_gpu * G,
           d->z3_opt_cpu * G);
    printf("  %-44s %10.2fGB %10.2fGB\n", "zero3 offload_param=none, offload_optimizer=none", d->z3_none_gpu * G,
           d->z3_none_cpu * G);
    (void)b;
    printf("(GB = 2^30 bytes, as DeepSpeed prints; docs/plan.md compares them with zoff's figures)\n");
}

/* ------------------------------------------------------------------ main */

#ifdef ZOFF_HAVE_CUDA
static bool cuda_free_memory(size_t *out) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    *out = f;
    return true;
}
#endif

/* zoff_plan_machine_detect at the swap files' folders; returns the nvme path the plan writes into
 * configs that have none. The parameters' swap file goes to offload_param.nvme_path (the run's), else
 * where the optimizer's goes; --nvme-path names one folder for both. */
static const char *detect_machine(const plan_args *a, const zoff_config *cfg, zoff_plan_machine *M) {
    const zoff_zero_config *z = &cfg->zero;
    const char *nvme = a->nvme_path                      ? a->nvme_path
                       : z->offload_optimizer.nvme_path[0] ? z->offload_optimizer.nvme_path
                       : z->offload_param.nvme_path[0]     ? z->offload_param.nvme_path
                                                           : ".";
    zoff_plan_machine_detect(M, nvme, a->nvme_path || !z->offload_param.nvme_path[0] ? nvme : z->offload_param.nvme_path);
    return nvme;
}

int zoff_cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) return 0;
    if (rc) return rc;
    zoff_config cfg;
    zoff_status s;
    if (a.write_config && (s = zoff_check_output_file(a.write_config)) != ZOFF_OK) return fail("--write-config", s);
    if (a.config_path) s = zoff_config_load_file(a.config_path, &cfg);
    else s = zoff_config_load_string(PLAN_DEFAULT_CONFIG, "the default config", &cfg);
    if (s != ZOFF_OK) return fail("config", s);
    int ranks = a.ranks ? (int)a.ranks : 1;
    if (a.micro_batch) {
        cfg.train_micro_batch_size_per_gpu = a.micro_batch;
        if (cfg.train_batch_size && cfg.gradient_accumulation_steps) cfg.gradient_accumulation_steps = 0;
    }
    if ((s = zoff_config_resolve_batch(&cfg, ranks)) != ZOFF_OK) {
        zoff_config_free(&cfg);
        return fail("config", s);
    }
    /* the shape: flags, then the config's model section, then zoff train's defaults */
    const zoff_model_config *mc = &cfg.model;
#define PICK(flag, cfgv, def) ((flag) ? (flag) : (cfgv) ? (cfgv) : (def))
    zoff_plan_inputs in;
    memset(&in, 0, sizeof in);
    in.cfg = &cfg;
    in.model.shape.num_layers = PICK(a.num_layers, mc->num_layers, 4);
    in.model.shape.hidden_size = PICK(a.hidden_size, mc->hidden_size, 128);
    in.model.shape.num_heads = PICK(a.num_heads, mc->num_attention_heads, 4);
    in.model.seq_len = PICK(a.seq_length, mc->seq_length, 64);
    in.model.shape.max_seq_len = PICK(a.max_pos, mc->max_position_embeddings, in.model.seq_len);
    in.model.shape.vocab_size = PICK(a.vocab_size, mc->vocab_size, 50257);
#undef PICK
    in.model.batch_size = cfg.train_micro_batch_size_per_gpu;
    in.model.dtype = cfg.bf16_enabled ? ZOFF_BF16 : cfg.fp16.enabled ? ZOFF_F16 : ZOFF_F32;
    in.model.checkpoint_activations = a.checkpoint_activations;
    zoff_plan_model_bytes mb;
    if ((s = zoff_plan_model_bytes_get(&in.model, &mb)) != ZOFF_OK) {
        zoff_config_free(&cfg);
        return fail(NULL, s); /* "model shape: ..." */
    }

    /* the machine */
    zoff_backend_kind kind = ZOFF_BACKEND_CPU;
    if ((a.device && !strcmp(a.device, "cuda")) || (!a.device && zoff_backend_available(ZOFF_BACKEND_CUDA)))
        kind = ZOFF_BACKEND_CUDA;
    if (kind == ZOFF_BACKEND_CUDA && !zoff_backend_available(ZOFF_BACKEND_CUDA) && !a.device_memory) {
        fprintf(stderr, "zoff plan: --device cuda: no CUDA device here (or not built); give --device-memory to plan "
                        "for a GPU from this machine\n");
        zoff_config_free(&cfg);
        return 2;
    }
    zoff_plan_machine *M = &in.machine;
    zoff_plan_machine_defaults(M, kind);
    M->ranks = ranks;
    M->ranks_per_node = a.ranks_per_node ? (int)a.ranks_per_node : ranks;
    const char *nvme = detect_machine(&a, &cfg, M);
    if (a.device_memory) {
        M->device_bytes = a.device_memory;
        M->device_budget = true;
        if (kind == ZOFF_BACKEND_CUDA) M->runtime_reserve = 0; /* the budget counts zoff's own allocations only */
    }
#ifdef ZOFF_HAVE_CUDA
    else if (kind == ZOFF_BACKEND_CUDA) {
        size_t f;
        if (cuda_free_memory(&f)) M->device_bytes = f;
    }
#endif
    if (a.have_host) M->host_bytes = a.host_memory;
    if (a.have_pinned) M->pinned_limit = a.pinned_limit;
    if (a.have_disk) M->disk_bytes = a.disk_free, M->disk_path[0] = 0, M->param_disk_own = false; /* one disk for both */
    if (a.have_margin) M->margin = a.margin;

    /* rates: bench files, then the probes, then the assumed figures */
    for (int i = 0; i < a.nbench; i++) {
        if ((s = zoff_plan_read_bench(a.bench[i], in.model.dtype, M)) != ZOFF_OK) {
            zoff_config_free(&cfg);
            return fail("--bench", s);
        }
    }
    if (!a.no_probe && zoff_backend_available(kind)) {
        zoff_device *dev = NULL;
        zoff_device_options dopt = {.kind = kind};
        s = zoff_device_create(&dopt, &dev);
        if (s == ZOFF_OK) s = zoff_plan_probe(dev, &cfg, &in.model, M);
        zoff_device_destroy(dev);
        if (s != ZOFF_OK)
            fprintf(stderr, "zoff plan: warning: %s; using assumed rates where the probe did not finish\n",
                    zoff_last_error());
    }

    zoff_plan plan;
    s = zoff_plan_build(&in, a.nratios ? a.ratios : NULL, a.nratios, &plan);
    if (s != ZOFF_OK) {
        zoff_config_free(&cfg);
        return fail("plan", s);
    }
    char *rec = NULL;
    if (plan.best >= 0 && (s = zoff_plan_config_json(&cfg, &plan.rows[plan.best], nvme, a.nvme_path != NULL, &rec)) != ZOFF_OK) {
        zoff_plan_free(&plan);
        zoff_config_free(&cfg);
        return fail("recommended config", s);
    }
    zoff_plan_deepspeed ds;
    zoff_plan_deepspeed_estimate(&in.model.shape, M->ranks_per_node, (M->ranks + M->ranks_per_node - 1) / M->ranks_per_node,
                                 &ds);
    rc = 0;
    if (a.json) {
        rc = print_json(&a, &in, &plan, a.deepspeed ? &ds : NULL, rec);
    } else {
        print_text(&a, &in, &plan);
        if (a.deepspeed) print_deepspeed(&ds, &in);
    }
    if (a.write_config && rc == 0) {
        if (!rec) {
            fprintf(stderr, "zoff plan: --write-config %s: nothing this zoff can run fits; no config written\n",
                    a.write_config);
            rc = 1;
        } else if ((s = zoff_plan_write_file_atomic(a.write_config, rec)) != ZOFF_OK) {
            rc = fail("--write-config", s);
        } else if (!a.json) {
            printf("\nwrote %s: zoff train --config %s", a.write_config, a.write_config);
            printf(" --num-layers %lld --hidden-size %lld --num-attention-heads %lld --seq-length %lld --vocab-size "
                   "%lld%s",
                   (long long)in.model.shape.num_layers, (long long)in.model.shape.hidden_size,
                   (long long)in.model.shape.num_heads, (long long)in.model.seq_len,
                   (long long)in.model.shape.vocab_size, in.model.checkpoint_activations ? " --checkpoint-activations" : "");
            /* what the plan took from flags and the written config does not hold: train takes them the same way */
            if (in.model.shape.max_seq_len != in.model.seq_len)
                printf(" --max-position-embeddings %lld", (long long)in.model.shape.max_seq_len);
            if (a.micro_batch) printf(" --micro-batch-size %lld", (long long)a.micro_batch);
            if (M->device_budget) printf(" --device-memory %zu", M->device_bytes);
            printf("\n");
        }
    }
    free(rec);
    zoff_plan_free(&plan);
    zoff_config_free(&cfg);
    return rc;
}
