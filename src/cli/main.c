/* The zoff command: subcommand dispatch. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "zoff/core.h"

static void usage(FILE *f) {
    fprintf(f,
            "zoff %s: train GPT-2-family models with ZeRO-Offload-style memory savings\n"
            "\n"
            "usage: zoff <command> [options]     (zoff <command> --help, or zoff help <command>: its options;\n"
            "                                    zoff help bench <benchmark>: a benchmark's)\n"
            "\n"
            "commands:\n"
            "  train      train a model (default: small GPT-2 on the bundled corpus)\n"
            "  sample     generate text from a checkpoint\n"
            "  eval       loss and perplexity of a checkpoint or GPT-2 weights on token shards\n"
            "  tokenize   write token shards (.bin) from text files\n"
            "  export     write a checkpoint's weights as safetensors (Hugging Face GPT-2 or fp32)\n"
            "  bench      measure against the machine's limits and peers (adam, step, nvme, ckpt)\n"
            "  plan       what fits where (device, pinned, host, disk) and the fastest setting that fits\n"
            "  version    print the version and build features\n"
            "\n"
            "exit status: 0 success; 1 the run failed (I/O error, out of memory, a diverged or killed\n"
            "peer, ...); 2 the command line, the config (--config missing, a directory, malformed or\n"
            "invalid) or a path given is wrong (an input missing or malformed, an output folder that\n"
            "is not there or not writable): fix it and run again.\n",
            ZOFF_VERSION);
}

/* zoff runs OpenMP teams on several threads at once (each device stream of the
 * CPU backend, the host optimizer, BLAS). With OpenMP's default spin-waiting,
 * idle teams burn the cores the busy one needs: measured 2.2x slower steps on
 * this project's 2-core machine. libgomp reads OMP_WAIT_POLICY when it loads,
 * before main, so when the user has not chosen a policy zoff sets "passive"
 * and re-executes itself once. Set OMP_WAIT_POLICY yourself to override. */
static void set_omp_wait_policy(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv); /* returns only on failure: run on with the default policy */
}

static void version_usage(void) {
    printf("usage: zoff version   (or zoff --version): the version and build features; no options\n");
}

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
} command;
static const command commands[] = {
    {"train", zoff_cmd_train},   {"sample", zoff_cmd_sample}, {"tokenize", zoff_cmd_tokenize},
    {"export", zoff_cmd_export}, {"bench", zoff_cmd_bench},   {"plan", zoff_cmd_plan},
    {"eval", zoff_cmd_eval},
};

static const command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(name, commands[i].name)) return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    set_omp_wait_policy(argv);
    /* A write past the file size limit (ulimit -f, RLIMIT_FSIZE: set by some batch systems) fails
     * with EFBIG, which every writer reports (the file named, its temp file removed, exit 1),
     * instead of SIGXFSZ killing the process mid-write with its temp files left behind. */
    signal(SIGXFSZ, SIG_IGN);
    zoff_temp_cleanup_on_signals(); /* Ctrl-C in tokenize, export, bench: their temp files removed */
    if (argc < 2) { /* a command is required: `zoff train` is the default job, asked for by name */
        usage(stderr);
        fprintf(stderr, "\nzoff: no command given; `zoff train` trains the default small GPT-2 on the bundled corpus\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") && argc >= 3) { /* zoff help train, zoff help bench adam: as CMD [WHAT] --help */
        if (argc > 4) {
            fprintf(stderr, "zoff help: unexpected argument '%s' (zoff help <command> [benchmark])\n", argv[4]);
            return 2;
        }
        if (find_command(argv[2]) != NULL) {
            char *help_argv[] = {argv[2], argc > 3 ? argv[3] : "--help", "--help", NULL};
            return find_command(argv[2])->run(argc > 3 ? 3 : 2, help_argv);
        }
        if (!strcmp(argv[2], "version")) {
            if (argc > 3) {
                fprintf(stderr, "zoff help version: unexpected argument '%s' (zoff version has no subcommands)\n",
                        argv[3]);
                return 2;
            }
            version_usage();
            return 0;
        }
        cmd = argv[2]; /* an unknown command: said below, as for zoff CMD */
    } else if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (argc > 2 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"))) {
            version_usage();
            return 0;
        }
        if (argc > 2) {
            fprintf(stderr, "zoff %s: unexpected argument '%s': it takes none (it prints the version and build "
                            "features as text)\n", cmd, argv[2]);
            return 2;
        }
        const zoff_cpu_features *f = zoff_cpu_features_get();
        printf("zoff %s\ncuda: %s\nmpi: %s\nio_uring: %s\ncpu: %d logical cores, avx2=%d avx512f=%d avx512_bf16=%d avx512_fp16=%d\n",
               ZOFF_VERSION,
#ifdef ZOFF_HAVE_CUDA
               "built",
#else
               "not built",
#endif
#ifdef ZOFF_HAVE_MPI
               "built",
#else
               "not built",
#endif
#ifdef ZOFF_HAVE_URING
               "built",
#else
               "not built",
#endif
               f->logical_cores, f->avx2, f->avx512f, f->avx512_bf16, f->avx512_fp16);
        return 0;
    }
    const command *c = find_command(cmd);
    if (c != NULL) return c->run(argc - 1, argv + 1);
    const char *names[sizeof commands / sizeof *commands];
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) names[i] = commands[i].name;
    const char *near = cli_nearest_name(cmd, names, sizeof names / sizeof *names, 2);
    if (near != NULL) fprintf(stderr, "zoff: unknown command '%s' (did you mean zoff %s?)\n", cmd, near);
    else fprintf(stderr, "zoff: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
