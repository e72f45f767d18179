// Stand-in for NCCL (include/nccl.h) over MPI, for the CUDA emulator: device
// memory is host memory, so a collective is MPI on the device buffers.
// Development tool (run.sh, EMU_ONLY=nccl); it knows nothing of zoff.
//
// Semantics kept from NCCL:
//   - a collective is asynchronous on its stream: it is queued on the stream
//     (emu_stream_enqueue) and runs on the stream's worker thread while the
//     caller goes on; events recorded after it complete when it has run;
//   - calls between ncclGroupStart and ncclGroupEnd are queued and issued at the
//     outermost ncclGroupEnd as one unit: all of their MPI operations are
//     started (in issue order, which NCCL requires to be the same on every rank)
//     and then waited together, so grouped ncclReduce / ncclBroadcast from
//     different roots cannot deadlock;
//   - layouts: counts are per rank where NCCL says so (ncclReduceScatter's
//     recvcount, ncclAllGather's sendcount); in-place is recvbuff == sendbuff
//     (all-reduce, reduce, broadcast), recvbuff == sendbuff + rank * recvcount
//     (reduce-scatter), sendbuff == recvbuff + rank * sendcount (all-gather);
//     any other overlap, a buffer outside device memory, a bad type, op, root
//     or communicator is refused (ncclInvalidArgument, a message on stderr);
//   - reductions run in the type's own arithmetic, one rank after another in
//     rank order (the same result on every rank): fp16/bf16 sums are rounded
//     to 16 bits at every step, as NCCL's kernels do; ncclAvg divides the sum;
//   - a collective waits for its peers forever; ncclCommAbort (from any
//     thread) makes a pending one return at once without a result;
//     ncclCommGetAsyncError reports an MPI failure seen by a collective;
//   - using a communicator after ncclCommDestroy / ncclCommAbort stops the
//     process with a message (in NCCL it is a use after free).
//
// Each communicator has its own MPI communicator (a dup of MPI_COMM_WORLD, split
// so that its ranks are NCCL's), so its traffic never mixes with the caller's.
// The unique id carries a magic, the creating rank and a counter; every rank
// checks at init that all ranks passed the same id.
#define OMPI_SKIP_MPICXX 1 /* the C API only */
#define MPICH_SKIP_MPICXX 1
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "include/nccl.h"

namespace {

const char ID_MAGIC[16] = "zoff-emu-nccl-1";

struct emu_id {
    char magic[16];
    int32_t creator; // world rank that called ncclGetUniqueId
    int32_t pid;
    uint64_t counter;
};
static_assert(sizeof(emu_id) <= NCCL_UNIQUE_ID_BYTES, "id too large");

struct comm_state {
    MPI_Comm mc = MPI_COMM_NULL;
    int rank = 0, nranks = 1;
    std::atomic<bool> aborted{false};
    std::atomic<int> async{ncclSuccess};
    std::mutex mu;
    std::condition_variable cv;
    int queued = 0;  // collectives issued and not finished
    int running = 0; // collectives whose MPI operations are in progress
};

} // namespace

struct ncclComm {
    std::shared_ptr<comm_state> st;
};

namespace {

std::mutex g_live_mu;
std::set<ncclComm *> g_live;
std::atomic<uint64_t> g_counter{0};

[[noreturn]] void fatal(const char *fn, const char *what) {
    fprintf(stderr, "NCCL emulator: %s: %s\n", fn, what);
    abort();
}

ncclResult_t invalid(const char *fn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t invalid(const char *fn, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "NCCL emulator: %s: %s\n", fn, msg);
    return ncclInvalidArgument;
}

// The state of a live communicator; a dead one stops the process.
std::shared_ptr<comm_state> live(ncclComm_t comm, const char *fn) {
    if (!comm) fatal(fn, "communicator is NULL");
    std::lock_guard<std::mutex> g(g_live_mu);
    if (!g_live.count(comm)) fatal(fn, "communicator is not live (already destroyed or aborted): a use after free in NCCL");
    return comm->st;
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

float half_to_f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400), (int)e - 25);
    uint32_t u;
    memcpy(&u, &v, 4);
    u |= sign;
    memcpy(&v, &u, 4);
    return v;
}
uint16_t f_to_half(float f) { // round to nearest even
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const float a = fabsf(f);
    if (a != a) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < ldexpf(1.0f, -14)) return (uint16_t)(sign | (uint16_t)nearbyintf(a * ldexpf(1.0f, 24)));
    int e;
    const float fr = frexpf(a, &e);                          // a = fr * 2^e, fr in [0.5, 1)
    float m = nearbyintf(ldexpf(fr, 11));                    // 11 significant bits
    if (m == 2048.0f) m = 1024.0f, e++;
    if (e - 1 > 15) return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | ((uint16_t)m & 0x3ffu));
}
float bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}
uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class T> T combine(T a, T b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return (T)(a + b); // ncclSum, ncclAvg
    }
}
template <class T> T avg_of(T sum, int n) { return (T)(sum / (T)n); }

// acc[i] = acc[i] op blk[i], in the type's arithmetic (unsigned for integer sums: no overflow UB).
void combine_into(void *acc, const void *blk, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
#define CASE(NT, T)                                                                 \
    case NT: {                                                                      \
        T a, b;                                                                     \
        memcpy(&a, (char *)acc + i * sizeof(T), sizeof(T));                         \
        memcpy(&b, (const char *)blk + i * sizeof(T), sizeof(T));                   \
        a = combine<T>(a, b, op);                                                   \
        memcpy((char *)acc + i * sizeof(T), &a, sizeof(T));                         \
        break;                                                                      \
    }
            CASE(ncclUint8, uint8_t)
            CASE(ncclUint32, uint32_t)
            CASE(ncclUint64, uint64_t)
            CASE(ncclFloat32, float)
            CASE(ncclFloat64, double)
#undef CASE
        case ncclInt8: case ncclInt32: case ncclInt64: {
            const size_t es = type_size(t);
            int64_t a = 0, b = 0;
            if (es == 1) a = ((int8_t *)acc)[i], b = ((const int8_t *)blk)[i];
            else if (es == 4) a = ((int32_t *)acc)[i], b = ((const int32_t *)blk)[i];
            else a = ((int64_t *)acc)[i], b = ((const int64_t *)blk)[i];
            int64_t r = op == ncclMax ? (a > b ? a : b)
                      : op == ncclMin ? (a < b ? a : b)
                      : op == ncclProd ? (int64_t)((uint64_t)a * (uint64_t)b)
                                       : (int64_t)((uint64_t)a + (uint64_t)b);
            if (es == 1) ((int8_t *)acc)[i] = (int8_t)r;
            else if (es == 4) ((int32_t *)acc)[i] = (int32_t)r;
            else ((int64_t *)acc)[i] = r;
            break;
        }
        case ncclFloat16: case ncclBfloat16: {
            const bool h = t == ncclFloat16;
            uint16_t *pa = (uint16_t *)acc + i;
            const uint16_t pb = ((const uint16_t *)blk)[i];
            float a = h ? half_to_f(*pa) : bf16_to_f(*pa), b = h ? half_to_f(pb) : bf16_to_f(pb);
            float r = combine<float>(a, b, op);
            *pa = h ? f_to_half(r) : f_to_bf16(r); // rounded at every step
            break;
        }
        default: break;
        }
    }
}

void average(void *acc, size_t n, ncclDataType_t t, int nranks) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ncclFloat32: ((float *)acc)[i] = avg_of(((float *)acc)[i], nranks); break;
        case ncclFloat64: ((double *)acc)[i] = avg_of(((double *)acc)[i], nranks); break;
        case ncclFloat16: ((uint16_t *)acc)[i] = f_to_half(half_to_f(((uint16_t *)acc)[i]) / (float)nranks); break;
        case ncclBfloat16: ((uint16_t *)acc)[i] = f_to_bf16(bf16_to_f(((uint16_t *)acc)[i]) / (float)nranks); break;
        case ncclInt8: ((int8_t *)acc)[i] = (int8_t)(((int8_t *)acc)[i] / nranks); break;
        case ncclUint8: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] / nranks); break;
        case ncclInt32: ((int32_t *)acc)[i] = ((int32_t *)acc)[i] / nranks; break;
        case ncclUint32: ((uint32_t *)acc)[i] = ((uint32_t *)acc)[i] / (uint32_t)nranks; break;
        case ncclInt64: ((int64_t *)acc)[i] = ((int64_t *)acc)[i] / nranks; break;
        case ncclUint64: ((uint64_t *)acc)[i] = ((uint64_t *)acc)[i] / (uint64_t)nranks; break;
        default: break;
        }
    }
}

// out = blocks[0] op blocks[1] op ... (rank order), each `bytes` long.
void reduce_blocks(void *out, const std::vector<char> &blocks, size_t count, ncclDataType_t t, ncclRedOp_t op,
                   int nranks) {
    const size_t bytes = count * type_size(t);
    std::vector<char> acc(blocks.begin(), blocks.begin() + (ptrdiff_t)bytes);
    for (int r = 1; r < nranks; r++) combine_into(acc.data(), blocks.data() + (size_t)r * bytes, count, t, op);
    if (op == ncclAvg) average(acc.data(), count, t, nranks);
    if (bytes) memcpy(out, acc.data(), bytes);
}

enum kind { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_REDUCE, K_BROADCAST };

struct op_t {
    kind k;
    const void *send;
    void *recv;
    size_t count; // NCCL's count: per rank for reduce-scatter (recvcount) and all-gather (sendcount)
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root;
    std::shared_ptr<comm_state> c;
    cudaStream_t stream;
    std::vector<char> in, out;
    MPI_Request req = MPI_REQUEST_NULL;
};

int start(op_t &o) {
    comm_state &c = *o.c;
    const size_t bytes = o.count * type_size(o.dt), n = (size_t)c.nranks;
    const int b = (int)bytes;
    switch (o.k) {
    case K_ALLREDUCE:
        o.in.assign((const char *)o.send, (const char *)o.send + bytes);
        o.out.resize(n * bytes);
        return MPI_Iallgather(o.in.data(), b, MPI_BYTE, o.out.data(), b, MPI_BYTE, c.mc, &o.req);
    case K_REDUCE_SCATTER:
        o.in.assign((const char *)o.send, (const char *)o.send + n * bytes);
        o.out.resize(n * bytes);
        return MPI_Ialltoall(o.in.data(), b, MPI_BYTE, o.out.data(), b, MPI_BYTE, c.mc, &o.req);
    case K_ALLGATHER:
        o.in.assign((const char *)o.send, (const char *)o.send + bytes);
        o.out.resize(n * bytes);
        return MPI_Iallgather(o.in.data(), b, MPI_BYTE, o.out.data(), b, MPI_BYTE, c.mc, &o.req);
    case K_REDUCE:
        o.in.assign((const char *)o.send, (const char *)o.send + bytes);
        o.out.resize(c.rank == o.root ? n * bytes : 0);
        return MPI_Igather(o.in.data(), b, MPI_BYTE, o.out.data(), b, MPI_BYTE, o.root, c.mc, &o.req);
    case K_BROADCAST:
        if (c.rank == o.root) o.in.assign((const char *)o.send, (const char *)o.send + bytes);
        else o.in.resize(bytes);
        return MPI_Ibcast(o.in.data(), b, MPI_BYTE, o.root, c.mc, &o.req);
    }
    return MPI_ERR_OTHER;
}

void finish(op_t &o) {
    comm_state &c = *o.c;
    const size_t bytes = o.count * type_size(o.dt), n = (size_t)c.nranks;
    switch (o.k) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER: reduce_blocks(o.recv, o.out, o.count, o.dt, o.op, c.nranks); break;
    case K_ALLGATHER:
        if (bytes) memcpy(o.recv, o.out.data(), n * bytes);
        break;
    case K_REDUCE:
        if (c.rank == o.root) reduce_blocks(o.recv, o.out, o.count, o.dt, o.op, c.nranks);
        break;
    case K_BROADCAST:
        if (bytes) memcpy(o.recv, o.in.data(), bytes);
        break;
    }
}

typedef std::vector<std::shared_ptr<op_t>> group_t;

bool any_aborted(const group_t &g) {
    for (auto &o : g)
        if (o->c->aborted.load()) return true;
    return false;
}

// On the stream's worker thread.
void run_group(const group_t &g) {
    for (auto &o : g) {
        std::lock_guard<std::mutex> l(o->c->mu);
        o->c->running++;
    }
    bool ok = !any_aborted(g);
    for (size_t i = 0; ok && i < g.size(); i++) {
        int rc = start(*g[i]);
        if (rc != MPI_SUCCESS) {
            g[i]->c->async = ncclSystemError;
            ok = false;
        }
    }
    long sleep_ns = 1000;
    while (ok) {
        bool all = true;
        for (auto &o : g) {
            int done = 1;
            if (o->req != MPI_REQUEST_NULL && MPI_Test(&o->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                o->c->async = ncclRemoteError;
                ok = false;
            }
            all = all && done;
        }
        if (!ok || all) break;
        if (any_aborted(g)) { // requests stay pending: the MPI communicator is never freed
            ok = false;
            break;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, nullptr);
        if (sleep_ns < 500000) sleep_ns *= 2;
    }
    if (ok)
        for (auto &o : g) finish(*o);
    for (auto &o : g) {
        std::lock_guard<std::mutex> l(o->c->mu);
        o->c->running--;
        o->c->queued--;
        o->c->cv.notify_all();
    }
}

void issue(group_t g) {
    for (auto &o : g) {
        std::lock_guard<std::mutex> l(o->c->mu);
        o->c->queued++;
    }
    cudaStream_t s = g[0]->stream;
    emu_stream_enqueue(s, [g]() { run_group(g); });
}

thread_local int t_depth = 0;
thread_local group_t t_group;
thread_local ncclResult_t t_group_err = ncclSuccess;

bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *p = (const char *)a, *q = (const char *)b;
    return na && nb && p < q + nb && q < p + na;
}

ncclResult_t submit(const char *fn, kind k, const void *send, void *recv, size_t count, ncclDataType_t dt,
                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    std::shared_ptr<comm_state> c = live(comm, fn);
    ncclResult_t r = ncclSuccess;
    const size_t es = type_size(dt), n = (size_t)c->nranks, bytes = count * es;
    const bool reduces = k == K_ALLREDUCE || k == K_REDUCE_SCATTER || k == K_REDUCE;
    const bool rooted = k == K_REDUCE || k == K_BROADCAST, is_root = rooted && c->rank == root;
    // what each buffer must hold on this rank
    size_t sbytes = k == K_REDUCE_SCATTER ? n * bytes : bytes, rbytes = k == K_ALLGATHER ? n * bytes : bytes;
    if (k == K_BROADCAST && !is_root) sbytes = 0; // only the root's sendbuff is read
    if (k == K_REDUCE && !is_root) rbytes = 0;    // only the root's recvbuff is written
    if (c->aborted) r = invalid(fn, "the communicator was aborted");
    else if (!stream) r = invalid(fn, "stream is NULL (the legacy default stream is not emulated)");
    else if (es == 0) r = invalid(fn, "data type %d is not an NCCL type", (int)dt);
    else if (reduces && ((int)op < 0 || op >= ncclNumOps)) r = invalid(fn, "reduction op %d is not an NCCL op", (int)op);
    else if (rooted && (root < 0 || root >= c->nranks)) r = invalid(fn, "root %d is not a rank of %d", root, c->nranks);
    else if (count > (size_t)INT_MAX / es / n) r = invalid(fn, "count %zu is beyond the emulator's INT_MAX bytes", count);
    else if (sbytes && !emu_device_range(send, sbytes))
        r = invalid(fn, "sendbuff %p (%zu bytes on rank %d) is not inside one device allocation", send, sbytes, c->rank);
    else if (rbytes && !emu_device_range(recv, rbytes))
        r = invalid(fn, "recvbuff %p (%zu bytes on rank %d) is not inside one device allocation", recv, rbytes, c->rank);
    else if (sbytes && rbytes) {
        const void *in_place = k == K_REDUCE_SCATTER ? (const char *)send + (size_t)c->rank * bytes : send;
        bool ok = k == K_ALLGATHER ? send == (const char *)recv + (size_t)c->rank * bytes || !overlap(send, sbytes, recv, rbytes)
                                   : recv == in_place || !overlap(send, sbytes, recv, rbytes);
        if (!ok)
            r = invalid(fn, "sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap but are not NCCL's in-place "
                            "layout on rank %d",
                        send, sbytes, recv, rbytes, c->rank);
    }
    if (r != ncclSuccess) {
        if (t_depth > 0) t_group_err = r;
        return r;
    }
    auto o = std::make_shared<op_t>();
    o->k = k;
    o->send = send;
    o->recv = recv;
    o->count = count;
    o->dt = dt;
    o->op = op;
    o->root = root;
    o->c = c;
    o->stream = stream;
    if (t_depth > 0) t_group.push_back(o);
    else issue(group_t{o});
    return ncclSuccess;
}

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!uniqueId) return invalid("ncclGetUniqueId", "uniqueId is NULL");
    if (!inited) {
        fprintf(stderr, "NCCL emulator: ncclGetUniqueId: MPI is not initialised (the emulator runs over MPI)\n");
        return ncclInvalidUsage;
    }
    emu_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.magic, ID_MAGIC, sizeof id.magic);
    MPI_Comm_rank(MPI_COMM_WORLD, &id.creator);
    id.pid = (int32_t)getpid();
    id.counter = ++g_counter;
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    const char *fn = "ncclCommInitRank";
    if (!comm) return invalid(fn, "comm is NULL");
    *comm = nullptr;
    int inited = 0, level = 0, world = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        fprintf(stderr, "NCCL emulator: %s: MPI is not initialised (the emulator runs over MPI)\n", fn);
        return ncclInvalidUsage;
    }
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "NCCL emulator: %s: MPI gives thread level %d; the emulator needs MPI_THREAD_MULTIPLE "
                        "(collectives run on the streams' worker threads)\n", fn, level);
        return ncclInvalidUsage;
    }
    emu_id id;
    memcpy(&id, commId.internal, sizeof id);
    if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0) return invalid(fn, "commId is not from ncclGetUniqueId");
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (nranks != world) {
        fprintf(stderr, "NCCL emulator: %s: nranks %d; the emulator's communicators span all %d MPI ranks\n", fn,
                nranks, world);
        return ncclInvalidUsage;
    }
    if (rank < 0 || rank >= nranks) return invalid(fn, "rank %d is not in [0, %d)", rank, nranks);
    // every world rank calls this in the same order (the emulator's rule): a dup, renumbered as NCCL's ranks
    MPI_Comm dup = MPI_COMM_NULL, mc = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) return ncclSystemError;
    int rc = MPI_Comm_split(dup, 0, rank, &mc);
    MPI_Comm_free(&dup);
    if (rc != MPI_SUCCESS) return ncclSystemError;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    std::vector<emu_id> all((size_t)nranks);
    std::vector<int> ranks((size_t)nranks);
    if (MPI_Allgather(&id, (int)sizeof id, MPI_BYTE, all.data(), (int)sizeof id, MPI_BYTE, mc) != MPI_SUCCESS ||
        MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, mc) != MPI_SUCCESS) {
        MPI_Comm_free(&mc);
        return ncclSystemError;
    }
    for (int r = 0; r < nranks; r++) {
        if (memcmp(&all[(size_t)r], &id, sizeof id) != 0) {
            fprintf(stderr, "NCCL emulator: %s: rank %d passed the id of rank %d's call %llu, rank %d that of rank "
                            "%d's call %llu: ranks are initialising different communicators\n",
                    fn, rank, id.creator, (unsigned long long)id.counter, ranks[(size_t)r], all[(size_t)r].creator,
                    (unsigned long long)all[(size_t)r].counter);
            MPI_Comm_free(&mc);
            return ncclInvalidUsage;
        }
        if (ranks[(size_t)r] != r) {
            fprintf(stderr, "NCCL emulator: %s: two processes claim rank %d\n", fn, ranks[(size_t)r]);
            MPI_Comm_free(&mc);
            return ncclInvalidUsage;
        }
    }
    ncclComm *c = new ncclComm;
    c->st = std::make_shared<comm_state>();
    c->st->mc = mc;
    c->st->rank = rank;
    c->st->nranks = nranks;
    std::lock_guard<std::mutex> g(g_live_mu);
    g_live.insert(c);
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    std::shared_ptr<comm_state> st = live(comm, "ncclCommDestroy");
    {
        std::lock_guard<std::mutex> g(g_live_mu);
        g_live.erase(comm);
    }
    { // what was issued completes first
        std::unique_lock<std::mutex> l(st->mu);
        st->cv.wait(l, [&] { return st->queued == 0; });
    }
    if (!st->aborted) MPI_Comm_free(&st->mc);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    std::shared_ptr<comm_state> st = live(comm, "ncclCommAbort");
    {
        std::lock_guard<std::mutex> g(g_live_mu);
        g_live.erase(comm);
    }
    st->aborted = true; // pending collectives return; queued ones will not start
    {
        std::unique_lock<std::mutex> l(st->mu);
        st->cv.wait(l, [&] { return st->running == 0; });
    }
    delete comm; // the MPI communicator may have requests pending: it is left as it is
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    std::shared_ptr<comm_state> st = live(comm, "ncclCommGetAsyncError");
    if (!asyncError) return invalid("ncclCommGetAsyncError", "asyncError is NULL");
    *asyncError = (ncclResult_t)st->async.load();
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    t_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (t_depth == 0) {
        fprintf(stderr, "NCCL emulator: ncclGroupEnd without ncclGroupStart\n");
        return ncclInvalidUsage;
    }
    if (--t_depth > 0) return ncclSuccess;
    group_t g;
    g.swap(t_group);
    ncclResult_t err = t_group_err;
    t_group_err = ncclSuccess;
    if (err != ncclSuccess) return err; // a call of the group failed: none of them runs
    if (g.empty()) return ncclSuccess;
    for (auto &o : g)
        if (o->stream != g[0]->stream) {
            fprintf(stderr, "NCCL emulator: ncclGroupEnd: the group's calls are on different streams (not emulated)\n");
            return ncclInvalidUsage;
        }
    issue(g);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit("ncclAllReduce", K_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit("ncclReduceScatter", K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit("ncclAllGather", K_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return submit("ncclReduce", K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit("ncclBroadcast", K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

} // extern "C"
