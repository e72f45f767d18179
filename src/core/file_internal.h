/* Internal to src: the pieces of an atomic file write (temp name, rename, directory fsync) that
 * the writers of whole files (core/file.c), of safetensors files and of shards share. */
#ifndef ZOFF_FILE_INTERNAL_H
#define ZOFF_FILE_INTERNAL_H

#include "zoff/core.h"

/* The temporary name a file is written under before the rename over `path`: "PATH.tmp-PID",
 * malloc'd (the caller frees it); NULL when out of host memory. */
char *zoff_tmp_path(const char *path);

/* fsync the directory that holds `path` (dirname), so that a rename into it is durable. */
zoff_status zoff_fsync_dir_of(const char *path);

#endif
