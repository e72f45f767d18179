/* metrics.jsonl (one JSON object per line: step lines, val_loss lines, the start-up line) and,
 * with several ranks, each rank's gradient-stream timeline. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/trainer_internal.h"
#include "zoff/iofault.h"

/* Before appending on resume: cut a last line that a crash or a full disk left unfinished, so
 * that every line of metrics.jsonl stays whole JSON. */
static zoff_status drop_torn_tail(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? ZOFF_OK : zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    zoff_status s = ZOFF_OK;
    if (fstat(fd, &st) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    off_t end = s == ZOFF_OK ? st.st_size : 0, keep = -1;
    char buf[4096];
    for (off_t pos = end; s == ZOFF_OK && pos > 0 && keep < 0;) { /* back to the last newline */
        size_t n = pos < (off_t)sizeof buf ? (size_t)pos : sizeof buf;
        pos -= (off_t)n;
        if (pread(fd, buf, n, pos) != (ssize_t)n) s = zoff_error(ZOFF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        for (size_t i = n; s == ZOFF_OK && keep < 0 && i-- > 0;)
            if (buf[i] == '\n') keep = pos + (off_t)i + 1;
    }
    if (keep < 0) keep = 0;
    if (s == ZOFF_OK && keep != end) {
        if (ftruncate(fd, keep) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot truncate %s: %s", path, strerror(errno));
        else zoff_log(ZOFF_LOG_WARN, "%s: removed an unfinished last line (%lld bytes) left by an interrupted run",
                      path, (long long)(end - keep));
    }
    close(fd);
    return s;
}

/* A new run (not a resume, no --overwrite) into a --save folder holding an earlier run's file of this
 * rank (`path`, *.jsonl) with lines in it (--no-checkpoint, or killed before its first save): kept
 * beside as *.prev.jsonl, not truncated (one generation: --overwrite or a new run past it drops it). */
static zoff_status set_aside_earlier(const zoff_trainer *t, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0) return ZOFF_OK;
    char prev[4300];
    snprintf(prev, sizeof prev, "%.*s.prev.jsonl", (int)(strlen(path) - strlen(".jsonl")), path);
    if (rename(path, prev) != 0)
        return zoff_error(ZOFF_ERR_IO, "--save: cannot move %s aside to %s: %s", path, prev, strerror(errno));
    trainer_say(t, "an earlier run's %s (no checkpoint of it in --save) is now %s", path, prev);
    return ZOFF_OK;
}

/* A resume on fewer ranks, or a new run into a folder of a run on more (rank 0): the per-rank files of
 * ranks the run does not have (on one rank: every timeline, none is written) would look like part of
 * it; kept beside as *.prev.jsonl (one generation, as metrics.prev.jsonl). */
static zoff_status set_aside_gone_ranks(const zoff_trainer *t) {
    DIR *d = opendir(t->o.save_dir);
    if (!d) return ZOFF_OK; /* nothing to set aside; the open below names a missing folder */
    zoff_status s = ZOFF_OK;
    for (struct dirent *e; s == ZOFF_OK && (e = readdir(d)) != NULL;) {
        static const char *const kind[] = {"metrics_rank_", "grad_timeline_rank_"};
        for (int k = 0; k < 2; k++) {
            size_t pl = strlen(kind[k]);
            int r = -1, end = 0;
            if (strncmp(e->d_name, kind[k], pl) || sscanf(e->d_name + pl, "%5d.jsonl%n", &r, &end) != 1 ||
                end != 11 || e->d_name[pl + (size_t)end] != '\0' || r < (k == 1 && t->info.world == 1 ? 0 : t->info.world))
                continue;
            char from[4300], to[4300];
            snprintf(from, sizeof from, "%s/%s", t->o.save_dir, e->d_name);
            snprintf(to, sizeof to, "%s/%s%05d.prev.jsonl", t->o.save_dir, kind[k], r);
            if (rename(from, to) != 0)
                s = zoff_error(ZOFF_ERR_IO, "--save: cannot move %s aside to %s: %s", from, to, strerror(errno));
            else
                trainer_say(t, "%s on %d rank%s: rank %d's %s is now %s (%s)",
                            t->info.start_step > 0 ? "resume" : "new run", t->info.world,
                            t->info.world == 1 ? "" : "s", r, from, to,
                            r < t->info.world ? "a run on one rank writes no gradient timeline"
                                              : "that rank is not in this run");
        }
    }
    closedir(d);
    return s;
}

zoff_status trainer_open_metrics(zoff_trainer *t) {
    const char *dir = t->o.save_dir;
    bool append = t->info.start_step > 0;
    if (t->info.rank == 0) snprintf(t->metrics_path, sizeof t->metrics_path, "%s/metrics.jsonl", dir);
    else /* each rank's own breakdown */
        snprintf(t->metrics_path, sizeof t->metrics_path, "%s/metrics_rank_%05d.jsonl", dir, t->info.rank);
    t->info.metrics_path = t->metrics_path;
    const bool fresh = !append && !t->o.overwrite; /* earlier files: set aside, not truncated */
    if (t->info.world > 1) {
        char tpath[4200];
        snprintf(tpath, sizeof tpath, "%s/grad_timeline_rank_%05d.jsonl", dir, t->info.rank);
        if (fresh) ZOFF_TRY(set_aside_earlier(t, tpath));
        if (!(t->timeline = fopen(tpath, append ? "a" : "w")))
            return zoff_error(ZOFF_ERR_IO, "--save: cannot write %s: %s", tpath, strerror(errno));
    }
    if (append) ZOFF_TRY(drop_torn_tail(t->metrics_path));
    if ((append || fresh) && t->info.rank == 0) ZOFF_TRY(set_aside_gone_ranks(t));
    if (fresh) ZOFF_TRY(set_aside_earlier(t, t->metrics_path));
    if (!(t->metrics = fopen(t->metrics_path, append ? "a" : "w")))
        return zoff_error(ZOFF_ERR_IO, "--save: cannot write %s: %s", t->metrics_path, strerror(errno));
    return ZOFF_OK;
}

/* One metrics line, written straight to the file (no stdio buffer): a crash (kill -9) loses at
 * most the line being written, never the lines of steps a checkpoint already holds, and a write
 * error (a full disk) stops the run with the file named instead of being dropped. */
zoff_status trainer_metrics_line(zoff_trainer *t, const char *fmt, ...) {
    const char *path = t->metrics_path;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line) return zoff_error(ZOFF_ERR_INTERNAL, "metrics line for %s too long", path);
    /* JSON has no inf/nan (printf's text for an fp16 overflow step's grad_norm): write null */
    for (char *v = line; (v = strchr(v, ':')) != NULL; v++) {
        char *x = v + 1 + (v[1] == '-');
        if ((!strncmp(x, "inf", 3) || !strncmp(x, "nan", 3)) && (x[3] == ',' || x[3] == '}') &&
            (size_t)n + 1 < sizeof line) {
            memmove(v + 5, x + 3, strlen(x + 3) + 1); /* the rest first: "null" may be longer */
            memcpy(v + 1, "null", 4);
            n = (int)strlen(line);
        }
    }
    for (size_t done = 0; done < (size_t)n;) {
        ssize_t w = zoff_io_write(fileno(t->metrics), line + done, (size_t)n - done, path);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            return zoff_error(ZOFF_ERR_IO, "cannot write %s: %s%s", path, strerror(e),
                              e == ENOSPC || e == EDQUOT
                                  ? " (the disk is full: free space, or keep fewer checkpoints with --keep-last)"
                                  : zoff_write_hint(e));
        }
        done += (size_t)w;
    }
    return ZOFF_OK;
}

/* One line per step of this rank's gradient-stream timeline (see zoff_grad_event). */
void trainer_write_timeline(zoff_trainer *t, const zoff_step_info *si, double t_bwd) {
    if (!t->timeline) return;
    const zoff_grad_event *ev;
    int n = zoff_engine_grad_timeline(t->eng, &ev);
    fprintf(t->timeline, "{\"step\":%lld,\"rank\":%d,\"backward\":%.6f,\"wait_grads\":%.6f,\"ranges\":[",
            (long long)t->info.step, t->info.rank, t_bwd, si->t_wait_grads);
    for (int i = 0; i < n; i++)
        fprintf(t->timeline, "%s[%lld,%lld,%.6f,%.6f,%.6f,%.6f,%lld]", i ? "," : "", (long long)ev[i].offset,
                (long long)ev[i].count, ev[i].t_ready, ev[i].t_reduce_start, ev[i].t_reduce_end, ev[i].t_copy_end,
                (long long)ev[i].copy_bytes);
    fprintf(t->timeline, "]}\n");
}
