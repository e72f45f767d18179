/* The io_uring engine (compiled only where liburing was found): each I/O
 * thread owns a ring and keeps up to queue_depth chunks in flight, taking them
 * from the shared request queue. Partial transfers are resubmitted for the
 * rest; a read that hits the end of the file is reported as short. */
#define _GNU_SOURCE
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio/aio_internal.h"

typedef struct uring_thread {
    zoff_aio *a;
    struct io_uring ring;
    bool ring_ok;
    aio_chunk *slots;
    int *free_slots;
    int nfree;
    int *done_list; /* chunks back from the kernel, not yet verified and completed */
    int *fresh;     /* chunks issued in this round (their write checksums) */
    int ndone;
    int inflight;
    pthread_t th;
    bool started;
} uring_thread;

typedef struct uring_state {
    int n;
    uring_thread *t;
    bool fixed; /* the options' fixed buffers are registered with every ring */
} uring_state;

/* The registered buffer that holds [p, p + n) (-1: none). */
static int fixed_index(const zoff_aio *a, const void *p, size_t n) {
    const uring_state *u = a->uring;
    for (int i = 0; u->fixed && i < a->o.nfixed; i++) {
        const char *b = a->o.fixed_buf[i];
        if ((const char *)p >= b && (const char *)p + n <= b + a->o.fixed_bytes[i]) return i;
    }
    return -1;
}

static void prep(uring_thread *t, aio_chunk *c) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
    while (!sqe) { /* the submission queue is full: hand it to the kernel */
        io_uring_submit(&t->ring);
        sqe = io_uring_get_sqe(&t->ring);
    }
    size_t want = c->len - c->done;
    if (c->limit && want > c->limit - c->done) want = c->limit - c->done;
    int fd = c->r->file->fd;
    void *buf = zoff_aio__chunk_buf(c);
    const uint64_t off = (uint64_t)zoff_aio__chunk_offset(c);
    const int k = fixed_index(t->a, buf, want);
    if (k >= 0) {
        if (c->r->op == ZOFF_AIO_READ) io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)want, off, k);
        else io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)want, off, k);
        __atomic_fetch_add(&t->a->fixed_requests, 1, __ATOMIC_RELAXED);
    } else if (c->r->op == ZOFF_AIO_READ) {
        io_uring_prep_read(sqe, fd, buf, (unsigned)want, off);
    } else {
        io_uring_prep_write(sqe, fd, buf, (unsigned)want, off);
    }
    io_uring_sqe_set_data(sqe, c);
}

/* A chunk left the kernel (or was never issued): verify it later, off the submission path. */
static void finished(uring_thread *t, aio_chunk *c) {
    t->done_list[t->ndone++] = (int)(c - t->slots);
}

/* Handle one completion: partial transfers go back to the kernel for the rest. */
static void handle_cqe(uring_thread *t, struct io_uring_cqe *cqe) {
    aio_chunk *c = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&t->ring, cqe);
    if (res == -EINTR || res == -EAGAIN) {
        prep(t, c);
        io_uring_submit(&t->ring);
        return;
    }
    if (res < 0) {
        c->err = -res;
    } else if (res > 0) {
        c->done += (size_t)res;
        bool limited = c->limit && c->done >= c->limit;
        if (c->done < c->len && !limited) { /* partial transfer: the rest */
            prep(t, c);
            io_uring_submit(&t->ring);
            return;
        }
    } /* res == 0: end of file (read) or nothing written: short */
    t->inflight--;
    finished(t, c);
}

/* Verify (read checksums) and complete the chunks that left the kernel. */
static void drain_finished(uring_thread *t) {
    zoff_aio *a = t->a;
    for (int i = 0; i < t->ndone; i++) zoff_aio__finish_chunk(a, &t->slots[t->done_list[i]]);
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < t->ndone; i++) zoff_aio__complete_chunk(a, &t->slots[t->done_list[i]]);
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < t->ndone; i++) t->free_slots[t->nfree++] = t->done_list[i];
    t->ndone = 0;
}

/* Fill the ring up to queue_depth, submit, then do the CPU work (write
 * checksums of what is in flight, read checksums of what came back) while the
 * disk works, then wait for completions. */
static void *uring_main(void *arg) {
    uring_thread *t = arg;
    zoff_aio *a = t->a;
    int qd = (int)a->o.queue_depth;
    int *fresh = t->fresh;
    for (;;) {
        int prepared = 0, nfresh = 0;
        pthread_mutex_lock(&a->mu);
        while (t->inflight < qd && t->nfree > 0) {
            aio_chunk c;
            if (!zoff_aio__take_chunk(a, &c)) break;
            pthread_mutex_unlock(&a->mu);
            int slot = t->free_slots[--t->nfree];
            t->slots[slot] = c;
            aio_chunk *cp = &t->slots[slot];
            if (!zoff_aio__prepare_chunk(a, cp)) {
                finished(t, cp); /* injected failure: never issued */
            } else {
                prep(t, cp);
                t->inflight++;
                prepared++;
                fresh[nfresh++] = slot;
                if (a->o.single_submit) io_uring_submit(&t->ring);
            }
            pthread_mutex_lock(&a->mu);
        }
        if (t->inflight == 0 && t->ndone == 0) {
            if (a->quit) {
                pthread_mutex_unlock(&a->mu);
                break;
            }
            pthread_cond_wait(&a->cv_work, &a->mu);
            pthread_mutex_unlock(&a->mu);
            continue;
        }
        pthread_mutex_unlock(&a->mu);
        if (prepared && !a->o.single_submit) io_uring_submit(&t->ring);
        for (int i = 0; i < nfresh; i++) zoff_aio__store_crc(&t->slots[fresh[i]]); /* in flight: the buffer is fixed */
        if (t->ndone) drain_finished(t);
        if (t->inflight == 0) continue;
        /* overlap_events: take new chunks after each completion; else drain the batch first */
        do {
            struct io_uring_cqe *cqe = NULL;
            int r = io_uring_wait_cqe(&t->ring, &cqe);
            if (r == -EINTR) continue;
            if (r < 0) { /* the ring itself failed: fail everything in flight */
                for (int i = 0; i < 2 * qd; i++) {
                    bool used = true;
                    for (int k = 0; k < t->nfree; k++) used &= t->free_slots[k] != i;
                    for (int k = 0; k < t->ndone; k++) used &= t->done_list[k] != i;
                    if (used) {
                        t->slots[i].err = -r;
                        t->inflight--;
                        finished(t, &t->slots[i]);
                    }
                }
                break;
            }
            handle_cqe(t, cqe);
            while (io_uring_peek_cqe(&t->ring, &cqe) == 0 && cqe) handle_cqe(t, cqe);
        } while (!a->o.overlap_events && t->inflight > 0);
    }
    return NULL;
}

static void free_state(uring_state *u) {
    for (int i = 0; i < u->n; i++) {
        if (u->t[i].ring_ok) io_uring_queue_exit(&u->t[i].ring);
        free(u->t[i].slots);
        free(u->t[i].free_slots);
        free(u->t[i].done_list);
        free(u->t[i].fresh);
    }
    free(u->t);
    free(u);
}

/* The options' fixed buffers registered with every ring, or with none (then a->fixed_note says why). */
static void register_fixed(zoff_aio *a, uring_state *u) {
    if (a->o.nfixed <= 0) return;
    struct iovec iov[ZOFF_AIO_MAX_FIXED];
    const int n = a->o.nfixed; /* at most ZOFF_AIO_MAX_FIXED (zoff_aio_create) */
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        iov[i] = (struct iovec){.iov_base = a->o.fixed_buf[i], .iov_len = a->o.fixed_bytes[i]};
        bytes += a->o.fixed_bytes[i];
    }
    char b[32];
    zoff_format_bytes(bytes, b, sizeof b);
    for (int i = 0; i < u->n; i++) {
        int r = io_uring_register_buffers(&u->t[i].ring, iov, (unsigned)n);
        if (r < 0) {
            for (int k = 0; k < i; k++) io_uring_unregister_buffers(&u->t[k].ring);
            snprintf(a->fixed_note, sizeof a->fixed_note, "%d buffers of %s not registered (%s): pinned per request",
                     n, b, strerror(-r));
            return;
        }
    }
    u->fixed = true;
    snprintf(a->fixed_note, sizeof a->fixed_note, "%d registered buffers of %s", n, b);
}

zoff_status zoff_aio__uring_start(zoff_aio *a, char *why, size_t whylen) {
    uring_state *u = calloc(1, sizeof *u);
    int n = (int)a->o.threads, qd = (int)a->o.queue_depth;
    if (!u || !(u->t = calloc((size_t)n, sizeof *u->t))) {
        free(u);
        snprintf(why, whylen, "out of host memory");
        return ZOFF_ERR_NOMEM;
    }
    u->n = n;
    for (int i = 0; i < n; i++) {
        uring_thread *t = &u->t[i];
        t->a = a;
        int r = io_uring_queue_init((unsigned)qd, &t->ring, 0);
        if (r < 0) {
            snprintf(why, whylen, "io_uring_queue_init: %s", strerror(-r));
            free_state(u);
            return ZOFF_ERR_UNSUPPORTED;
        }
        t->ring_ok = true;
        /* queue_depth in the kernel, as many more waiting for their checksums */
        t->slots = calloc((size_t)(2 * qd), sizeof *t->slots);
        t->free_slots = calloc((size_t)(2 * qd), sizeof *t->free_slots);
        t->done_list = calloc((size_t)(2 * qd), sizeof *t->done_list);
        t->fresh = calloc((size_t)qd, sizeof *t->fresh);
        if (!t->slots || !t->free_slots || !t->done_list || !t->fresh) {
            snprintf(why, whylen, "out of host memory");
            free_state(u);
            return ZOFF_ERR_NOMEM;
        }
        for (int k = 0; k < 2 * qd; k++) t->free_slots[k] = 2 * qd - 1 - k;
        t->nfree = 2 * qd;
    }
    register_fixed(a, u);
    a->uring = u;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&u->t[i].th, NULL, uring_main, &u->t[i]) != 0) {
            snprintf(why, whylen, "cannot start an I/O thread: %s", strerror(errno));
            pthread_mutex_lock(&a->mu);
            a->quit = true;
            pthread_cond_broadcast(&a->cv_work);
            pthread_mutex_unlock(&a->mu);
            zoff_aio__uring_stop(a);
            a->quit = false;
            return ZOFF_ERR_INTERNAL;
        }
        u->t[i].started = true;
    }
    return ZOFF_OK;
}

void zoff_aio__uring_stop(zoff_aio *a) {
    uring_state *u = a->uring;
    if (!u) return;
    for (int i = 0; i < u->n; i++)
        if (u->t[i].started) pthread_join(u->t[i].th, NULL);
    free_state(u);
    a->uring = NULL;
}
