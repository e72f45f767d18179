/* The zoff command's subcommands. Each returns the process exit code:
 * 0 success, 1 runtime failure, 2 bad usage / bad config / bad input. */
#ifndef ZOFF_CLI_COMMANDS_H
#define ZOFF_CLI_COMMANDS_H

int zoff_cmd_train(int argc, char **argv);
int zoff_cmd_sample(int argc, char **argv);
int zoff_cmd_eval(int argc, char **argv);
int zoff_cmd_tokenize(int argc, char **argv);
int zoff_cmd_bench(int argc, char **argv);      /* dispatches to the bench_* below */
int zoff_cmd_bench_adam(int argc, char **argv);
int zoff_cmd_bench_step(int argc, char **argv);
int zoff_cmd_bench_ckpt(int argc, char **argv);
int zoff_cmd_bench_nvme(int argc, char **argv);
int zoff_cmd_bench_pairs(int argc, char **argv); /* bench_stats.c */
int zoff_cmd_plan(int argc, char **argv);
int zoff_cmd_export(int argc, char **argv);

#endif
