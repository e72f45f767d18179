/* Internal to src: the pieces of an atomic file write (temp name, rename, directory fsync) that
 * the writers of whole files (core/file.c), of safetensors files and of shards share; the listing
 * of a directory's files that the shard reader and zoff tokenize share. */
#ifndef ZOFF_FILE_INTERNAL_H
#define ZOFF_FILE_INTERNAL_H

#include "zoff/core.h"

/* The temporary name a file is written under before the rename over `path`: "PATH.tmp-PID",
 * malloc'd (the caller frees it); NULL when out of host memory. */
char *zoff_tmp_path(const char *path);

/* fsync the directory that holds `path` (dirname), so that a rename into it is durable. */
zoff_status zoff_fsync_dir_of(const char *path);

/* The regular files directly in `dir` (not its subdirectories, not names beginning with '.')
 * for which keep(name) holds (keep NULL: all), as "dir/name" paths sorted bytewise: *paths is
 * malloc'd, each path too (zoff_free_paths frees them); *n may be 0. A name keep() accepts
 * that cannot be read (a link to a file that is gone) is an error (ZOFF_ERR_INVALID) naming it and
 * its target, as the same name given alone would be; with keep NULL such entries are skipped. */
zoff_status zoff_dir_files(const char *dir, bool (*keep)(const char *name), char ***paths, size_t *n);
void zoff_free_paths(char **paths, size_t n);
/* Append a copy of `path` to the list (*paths, *n of *cap, grown as needed); false when out of
 * memory (the list stays as it was, still the caller's to free). */
bool zoff_paths_add(char ***paths, size_t *n, size_t *cap, const char *path);
/* Whether `name` ends in `suffix`. */
bool zoff_ends_with(const char *name, const char *suffix);
/* `path` with a leading "~" or "~/" replaced by $HOME, as the shell does for a word it sees (a
 * quoted glob, or the second path of a comma-separated list, reaches zoff unexpanded): a new
 * string (the caller frees it), a copy when there is nothing to expand; NULL when out of memory. */
char *zoff_expand_home(const char *path);

#endif
