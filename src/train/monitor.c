/* DeepSpeed's monitors: "tensorboard" (a TensorFlow event file: TFRecord framing, each record an
 * Event protobuf with one scalar Summary value) and "csv_monitor" (OUTPUT_PATH/JOB_NAME/NAME.csv,
 * "step,<last part of NAME>" then one "samples,value" row per event). Rank 0 writes both, under
 * DeepSpeed's event names and x axis (samples trained). A resumed run appends its rows from its
 * checkpoint's step: those an earlier start wrote past it stay (docs/config.md, csv_monitor). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train/trainer_internal.h"
#include "zoff/iofault.h"

enum { MAX_CSV = 16 };

struct trainer_monitor {
    int tb;               /* the event file (-1: no tensorboard) */
    char tb_path[4400];
    char csv_dir[4400];   /* "" : no csv_monitor */
    char csv_names[MAX_CSV][96]; /* the csv files this run has written to */
    int ncsv;
};

/* Append one whole record (an event, a csv row) to fd, the file `path`, or none of it: a write
 * that fails part way (a full disk) is cut off again, so that the file never ends in half a row
 * that the next run's rows would be appended to. */
static zoff_status append_whole(int fd, const char *path, const char *what, const void *buf, size_t n) {
    struct stat st;
    if (fstat(fd, &st) != 0) return zoff_error(ZOFF_ERR_IO, "%s: cannot stat %s: %s", what, path, strerror(errno));
    for (size_t done = 0; done < n;) {
        ssize_t w = zoff_io_write(fd, (const char *)buf + done, n - done, path); /* or an injected fault (tests) */
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC; /* a write of 0 bytes: nothing more fits */
            bool cut = ftruncate(fd, st.st_size) == 0;
            return zoff_error(ZOFF_ERR_IO, "%s: cannot write %s: %s%s%s", what, path, strerror(e), zoff_write_hint(e),
                              cut ? " (the file keeps its whole records)" : "");
        }
        done += (size_t)w;
    }
    return ZOFF_OK;
}

/* ---- protobuf and TFRecord encoding ---- */

typedef struct pbuf {
    uint8_t b[512];
    size_t n;
} pbuf;

static void pb_bytes(pbuf *p, const void *d, size_t n) {
    memcpy(p->b + p->n, d, n); /* tb_record bounds the one variable part, the tag */
    p->n += n;
}
static void pb_varint(pbuf *p, uint64_t v) {
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        pb_bytes(p, &c, 1);
    } while (v);
}
static void pb_tag(pbuf *p, unsigned field, unsigned wire) { pb_varint(p, (uint64_t)(field << 3 | wire)); }
static void pb_le(pbuf *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        pb_bytes(p, &c, 1);
    }
}
static void pb_len(pbuf *p, unsigned field, const void *d, size_t n) {
    pb_tag(p, field, 2);
    pb_varint(p, n);
    pb_bytes(p, d, n);
}

static uint32_t masked_crc(const void *d, size_t n) {
    uint32_t c = zoff_crc32c(0, d, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One Event (wall_time = 1, step = 2, file_version = 3, summary = 5, session_log = 7 { status = 1: START 1 }) as a
 * TFRecord. */
static zoff_status tb_record(trainer_monitor *m, int64_t step, const char *version, const char *tag, float value,
                             bool start) {
    pbuf ev = {.n = 0}, sum = {.n = 0}, val = {.n = 0};
    uint64_t wt;
    double w = wall_time();
    memcpy(&wt, &w, sizeof wt);
    pb_tag(&ev, 1, 1);
    pb_le(&ev, wt, 8);
    pb_tag(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)step);
    if (version) pb_len(&ev, 3, version, strlen(version));
    if (start) {
        pbuf sl = {.n = 0};
        pb_tag(&sl, 1, 0);
        pb_varint(&sl, 1);
        pb_len(&ev, 7, sl.b, sl.n);
    }
    if (tag && strlen(tag) > 256) return zoff_error(ZOFF_ERR_INTERNAL, "tensorboard tag %.40s... too long", tag);
    if (tag) { /* Summary { repeated Value value = 1 { string tag = 1; float simple_value = 2 } } */
        uint32_t fv;
        memcpy(&fv, &value, sizeof fv);
        pb_len(&val, 1, tag, strlen(tag));
        pb_tag(&val, 2, 5);
        pb_le(&val, fv, 4);
        pb_len(&sum, 1, val.b, val.n);
        pb_len(&ev, 5, sum.b, sum.n);
    } /* (a tag of <= 256 bytes keeps each message well inside its 512-byte buffer) */
    uint8_t rec[12 + sizeof ev.b + 4]; /* length, its masked CRC, the event, the event's masked CRC */
    uint64_t len = ev.n;
    for (int i = 0; i < 8; i++) rec[i] = (uint8_t)(len >> (8 * i));
    uint32_t hc = masked_crc(rec, 8), dc = masked_crc(ev.b, ev.n);
    for (int i = 0; i < 4; i++) rec[8 + i] = (uint8_t)(hc >> (8 * i));
    memcpy(rec + 12, ev.b, ev.n);
    for (int i = 0; i < 4; i++) rec[12 + ev.n + (size_t)i] = (uint8_t)(dc >> (8 * i));
    return append_whole(m->tb, m->tb_path, "tensorboard", rec, 12 + ev.n + 4);
}

/* ---- csv ---- */

/* The shortest text that reads back as v (Python's repr of a float, but for the ".0" of integers). */
static void shortest(double v, char *buf, size_t n) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static zoff_status csv_row(trainer_monitor *m, const char *name, double value, int64_t samples) {
    char file[96], path[4600], num[40];
    snprintf(file, sizeof file, "%s", name);
    for (char *c = file; *c; c++)
        if (*c == '/' || *c == ' ') *c = '_';
    snprintf(path, sizeof path, "%s/%s.csv", m->csv_dir, file);
    bool known = false;
    for (int i = 0; i < m->ncsv && !known; i++) known = !strcmp(m->csv_names[i], file);
    struct stat st;
    /* the header once per file (DeepSpeed writes it again in every process that appends; a resumed run
     * does not here) */
    bool header = !known && (stat(path, &st) != 0 || st.st_size == 0);
    if (!known && m->ncsv < MAX_CSV) snprintf(m->csv_names[m->ncsv++], sizeof m->csv_names[0], "%s", file);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "csv_monitor: cannot write %s: %s", path, strerror(errno));
    const char *last = strrchr(name, '/');
    char row[256];
    shortest(value, num, sizeof num);
    int k = header ? snprintf(row, sizeof row, "step,%s\r\n", last ? last + 1 : name) : 0;
    k += snprintf(row + k, sizeof row - (size_t)k, "%lld,%s\r\n", (long long)samples, num);
    zoff_status s = append_whole(fd, path, "csv_monitor", row, (size_t)k); /* the header and its first row together */
    if (close(fd) != 0 && s == ZOFF_OK) {
        int e = errno;
        s = zoff_error(ZOFF_ERR_IO, "csv_monitor: cannot write %s: %s%s", path, strerror(e), zoff_write_hint(e));
    }
    return s;
}

/* ---- the monitor ---- */

static zoff_status log_dir(const zoff_monitor_config *c, const char *what, char *out, size_t n) {
    int k = c->output_path[0] ? snprintf(out, n, "%s/%s", c->output_path, c->job_name)
                              : snprintf(out, n, "%s", c->job_name);
    if (k < 0 || (size_t)k >= n) return zoff_error(ZOFF_ERR_CONFIG, "%s.output_path is too long", what);
    if (!out[0]) snprintf(out, n, ".");
    char made[4096];
    zoff_status s = zoff_train_mkdir_p(out, made, sizeof made);
    if (s != ZOFF_OK)
        return zoff_error_context(s, "%s: cannot create %s (its output_path and job_name; choose another)", what, out);
    return ZOFF_OK;
}

zoff_status trainer_monitor_open(const zoff_config *cfg, int64_t restart_samples, trainer_monitor **out) {
    *out = NULL;
    if (!cfg->tensorboard.enabled && !cfg->csv_monitor.enabled) return ZOFF_OK;
    trainer_monitor *m = calloc(1, sizeof *m);
    if (!m) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    m->tb = -1;
    zoff_status s = ZOFF_OK;
    if (cfg->csv_monitor.enabled) s = log_dir(&cfg->csv_monitor, "csv_monitor", m->csv_dir, sizeof m->csv_dir);
    if (s == ZOFF_OK && cfg->tensorboard.enabled) {
        char dir[4096], host[256] = "localhost";
        s = log_dir(&cfg->tensorboard, "tensorboard", dir, sizeof dir);
        gethostname(host, sizeof host - 1);
        /* torch's SummaryWriter's name: events.out.tfevents.TIME.HOST.PID.N. A name taken (an earlier start in
         * the same second with the same pid: zoff as pid 1 in a container, restarted) is kept: the next N */
        const long long now = (long long)time(NULL);
        for (int n = 0; s == ZOFF_OK && m->tb < 0; n++) {
            snprintf(m->tb_path, sizeof m->tb_path, "%s/events.out.tfevents.%010lld.%s.%d.%d", dir, now, host,
                     (int)getpid(), n);
            m->tb = open(m->tb_path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
            if (m->tb < 0 && (errno != EEXIST || n >= 999))
                s = zoff_error(ZOFF_ERR_IO, "tensorboard: cannot create %s: %s", m->tb_path, strerror(errno));
        }
        if (s == ZOFF_OK) s = tb_record(m, 0, "brain.Event:2", NULL, 0, false);
        if (s == ZOFF_OK && restart_samples >= 0) s = tb_record(m, restart_samples, NULL, NULL, 0, true);
    }
    if (s != ZOFF_OK) {
        trainer_monitor_close(m);
        return s;
    }
    *out = m;
    return ZOFF_OK;
}

zoff_status trainer_monitor_event(trainer_monitor *m, const char *name, double value, int64_t samples) {
    if (!m) return ZOFF_OK;
    if (m->tb >= 0) ZOFF_TRY(tb_record(m, samples, NULL, name, (float)value, false));
    if (m->csv_dir[0]) ZOFF_TRY(csv_row(m, name, value, samples));
    return ZOFF_OK;
}

void trainer_monitor_close(trainer_monitor *m) {
    if (!m) return;
    if (m->tb >= 0) close(m->tb);
    free(m);
}
