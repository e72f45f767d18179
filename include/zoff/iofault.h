/* zoff iofault: plain file writes with fault injection for tests.
 *
 * Checkpoints (ZOFF_CKPT_FAULT, zoff_ckpt_set_io_hook) and the NVMe swap file have their own
 * injection points. The other files zoff writes (token shards from zoff tokenize,
 * metrics.jsonl) write through zoff_io_write, which obeys
 *
 *   ZOFF_IO_FAULT=<ENOSPC|EIO>@<offset>[:<path substring>]
 *
 * A write to a file whose path contains the substring (any file when it is omitted) that
 * reaches byte <offset> of the file writes the bytes before <offset> (a short write, as a
 * filling disk does) and the next write fails with that errno. Without the variable
 * zoff_io_write is write(2). docs/reliability.md lists what is tested with it. */
#ifndef ZOFF_IOFAULT_H
#define ZOFF_IOFAULT_H

#include <sys/types.h>

#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* write(2) of up to n bytes to fd (the file `path`), with ZOFF_IO_FAULT applied: returns the
 * bytes written (possibly fewer than n) or -1 with errno set. Callers loop, as for write(2). */
ssize_t zoff_io_write(int fd, const void *buf, size_t n, const char *path);

#ifdef __cplusplus
}
#endif
#endif
