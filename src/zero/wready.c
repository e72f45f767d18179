/* Weights-arrived events per parameter group: see wready.h. */
#include "zero/wready.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct zoff_wready {
    int n;
    int64_t *goff;       /* model offset where group g starts (increasing) */
    zoff_event **ev;     /* group g's weights are on the device after this */
    bool *pending;       /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zoff_status err;     /* the round's job failed (until the next open) */
    char msg[512];
};

zoff_status zoff_wready_create(zoff_device *dev, const zoff_tensor_info *t, int nt, zoff_wready **out) {
    *out = NULL;
    zoff_wready *w = calloc(1, sizeof *w);
    if (!w) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the weight events");
    w->goff = calloc((size_t)(nt > 0 ? nt : 1), sizeof *w->goff);
    w->ev = calloc((size_t)(nt > 0 ? nt : 1), sizeof *w->ev);
    w->pending = calloc((size_t)(nt > 0 ? nt : 1), sizeof *w->pending);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    zoff_status s = ZOFF_OK;
    if (!w->goff || !w->ev || !w->pending) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the weight events");
    for (int i = 0; s == ZOFF_OK && i < nt; i++)
        if (i == 0 || t[i].layer != t[i - 1].layer) w->goff[w->n++] = t[i].offset;
    for (int g = 0; s == ZOFF_OK && g < w->n; g++) s = zoff_event_create(dev, &w->ev[g]);
    if (s == ZOFF_OK) *out = w;
    else zoff_wready_destroy(w);
    return s;
}

void zoff_wready_destroy(zoff_wready *w) {
    if (!w) return;
    for (int g = 0; g < w->n; g++) zoff_event_destroy(w->ev[g]);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->goff);
    free(w->ev);
    free(w->pending);
    free(w);
}

int zoff_wready_groups(const zoff_wready *w) { return w->n; }

int64_t zoff_wready_group_start(const zoff_wready *w, int g) { return w->goff[g]; }

int zoff_group_find(const int64_t *start, int n, int64_t off) {
    if (n == 0 || off < start[0]) return -1;
    int a = 0, b = n - 1;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (start[mid] <= off) a = mid;
        else b = mid - 1;
    }
    return a;
}

int zoff_wready_group_of(const zoff_wready *w, int64_t off) { return zoff_group_find(w->goff, w->n, off); }

void zoff_wready_open(zoff_wready *w, const bool *need) {
    pthread_mutex_lock(&w->mu);
    for (int g = 0; g < w->n; g++) w->pending[g] = need[g];
    w->err = ZOFF_OK;
    pthread_mutex_unlock(&w->mu);
}

zoff_status zoff_wready_arrive(zoff_wready *w, int g, zoff_stream *copy) {
    zoff_status s = zoff_event_record(w->ev[g], copy);
    pthread_mutex_lock(&w->mu);
    w->pending[g] = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return s;
}

void zoff_wready_fail(zoff_wready *w, zoff_status s, const char *msg) {
    pthread_mutex_lock(&w->mu);
    w->err = s;
    snprintf(w->msg, sizeof w->msg, "%s", msg);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

zoff_status zoff_wready_wait(zoff_wready *w, int g, zoff_stream *s) {
    if (g < 0 || g >= w->n) return ZOFF_OK;
    pthread_mutex_lock(&w->mu);
    while (w->pending[g] && w->err == ZOFF_OK) pthread_cond_wait(&w->cv, &w->mu);
    zoff_status st = w->pending[g] ? w->err : ZOFF_OK;
    if (st != ZOFF_OK) zoff_error(st, "host optimizer: %s", w->msg);
    pthread_mutex_unlock(&w->mu);
    if (st != ZOFF_OK) return st;
    return zoff_stream_wait_event(s, w->ev[g]);
}

zoff_status zoff_wready_wait_all(zoff_wready *w, zoff_stream *s) {
    for (int g = 0; g < w->n; g++) ZOFF_TRY(zoff_wready_wait(w, g, s));
    return ZOFF_OK;
}
