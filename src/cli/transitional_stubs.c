/* TEMPORARY: weak placeholders so the command links while the subcommands are
 * being written in parallel. Each real definition overrides its stub. This
 * file is deleted once every subcommand exists. */
#include <stdio.h>

#include "cli/commands.h"

#define STUB(fn)                                                       \
    __attribute__((weak)) int fn(int argc, char **argv) {              \
        (void)argc; (void)argv;                                        \
        fprintf(stderr, "zoff: %s is not built yet\n", #fn);           \
        return 1;                                                      \
    }
STUB(zoff_cmd_tokenize)
STUB(zoff_cmd_bench_adam)
