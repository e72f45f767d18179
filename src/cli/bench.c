/* zoff bench: measurements against the machine's limits. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

int zoff_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: zoff bench <what> [options]   (zoff bench <what> --help, or zoff help bench <what>)\n"
                "  adam   host optimizer step vs the machine's in-place memory bandwidth\n"
                "  step   a training step and its components, with and without offload\n"
                "  nvme   the NVMe swapper against fio on one disk, and steps with nvme vs cpu offload\n"
                "  ckpt   checkpoint save/load and safetensors export/import vs the disk's bandwidth\n"
                "  pairs  the statistics of paired rounds read from stdin (for scripts)\n"
                "Every comparison is of pairs measured next to each other, round by round (--rounds):\n"
                "the median of the paired ratios with its min and max; a spread too wide is said.\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "adam")) return zoff_cmd_bench_adam(argc - 1, argv + 1);
    if (!strcmp(argv[1], "step")) return zoff_cmd_bench_step(argc - 1, argv + 1);
    if (!strcmp(argv[1], "nvme")) return zoff_cmd_bench_nvme(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ckpt")) return zoff_cmd_bench_ckpt(argc - 1, argv + 1);
    if (!strcmp(argv[1], "pairs")) return zoff_cmd_bench_pairs(argc - 1, argv + 1);
    static const char *const names[] = {"adam", "step", "nvme", "ckpt", "pairs"};
    const char *near = cli_nearest_name(argv[1], names, sizeof names / sizeof *names, 2);
    if (near) fprintf(stderr, "zoff bench: unknown benchmark '%s' (did you mean zoff bench %s?)\n", argv[1], near);
    else fprintf(stderr, "zoff bench: unknown benchmark '%s' (adam, step, nvme, ckpt, pairs)\n", argv[1]);
    return 2;
}
