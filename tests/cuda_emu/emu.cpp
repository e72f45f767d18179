// CPU emulation of the CUDA runtime, device execution and cuBLASLt subset used by
// src/backend/cuda (see emu_runtime.h, emu_device.hpp and run.sh). Development
// tool: it checks the backend's indexing, barriers, layouts and error paths on a
// machine without a GPU. It says nothing about speed, the memory model, or
// behaviour of the real cuBLASLt / CUB.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "emu_device.hpp"
#include "include/cublasLt.h"

// ------------------------------------------------------------------ runtime

static thread_local cudaError_t g_last = cudaSuccess;
static std::mutex g_alloc_mu;
static std::map<void *, std::pair<size_t, bool>> g_allocs; // base -> (bytes, device memory)
static void device_ready(); // waits for all asynchronous work ("asynchronous work" below)

[[noreturn]] static void emu_fatal(const char *fmt, const char *what) {
    fprintf(stderr, "cuda emulator: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    abort();
}

extern "C" void emu_set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last = e;
}

static cudaError_t ret(cudaError_t e) {
    emu_set_error(e);
    return e;
}

extern "C" size_t emu_live_allocations(void) {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    return g_allocs.size();
}

extern "C" cudaError_t cudaGetDeviceCount(int *count) {
    if (getenv("EMU_NO_DEVICE")) {
        *count = 0;
        return ret(cudaErrorNoDevice);
    }
    *count = 1;
    return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : ret(cudaErrorInvalidValue); }
extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return ret(cudaErrorInvalidValue);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CUDA emulator (CPU)");
    prop->totalGlobalMem = (size_t)80 << 30;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (device != 0) return ret(cudaErrorInvalidValue);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; return cudaSuccess;
    }
    return ret(cudaErrorInvalidValue);
}
extern "C" cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
extern "C" cudaError_t cudaPeekAtLastError(void) { return g_last; }
extern "C" const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "emulated error";
    }
}
extern "C" const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
    }
}
extern "C" cudaError_t cudaDeviceSynchronize(void) {
    device_ready();
    return cudaSuccess;
}

static void *emu_alloc(size_t bytes, size_t align, bool device) {
    size_t n = (bytes + align - 1) / align * align;
    void *p = aligned_alloc(align, n ? n : align);
    if (!p) return nullptr;
    memset(p, 0xff, n ? n : align); // uninitialised device memory reads as NaN
    std::lock_guard<std::mutex> g(g_alloc_mu);
    g_allocs[p] = {bytes, device};
    return p;
}
static cudaError_t emu_free(void *p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(g_alloc_mu);
        if (!g_allocs.erase(p)) emu_fatal("free of %s: not a live allocation", "a pointer");
    }
    free(p);
    return cudaSuccess;
}

extern "C" int emu_device_range(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    auto it = g_allocs.upper_bound(const_cast<void *>(p));
    if (it == g_allocs.begin()) return 0;
    --it;
    const char *base = (const char *)it->first, *q = (const char *)p;
    return it->second.second && q >= base && (size_t)(q - base) <= it->second.first &&
           bytes <= it->second.first - (size_t)(q - base);
}

// ------------------------------------------------------------------ asynchronous work
//
// Every operation above and below runs when it is issued, except work handed to
// emu_stream_enqueue (the NCCL stand-in, nccl_emu.cpp: a collective waits for
// other processes, as an NCCL kernel does on a GPU while the host goes on). Such
// work runs on the stream's worker thread, in issue order. So that the schedule
// stays one CUDA allows:
//   - every other operation on a stream first waits for the stream's queued work
//     and for the events the stream was told to wait for (cudaStreamWaitEvent is
//     recorded, and honoured by the stream's next operation);
//   - an event recorded on a stream completes when the work queued there so far
//     (and what the stream waits for) is done: cudaEventQuery says cudaErrorNotReady
//     until then, cudaEventSynchronize blocks;
//   - cudaStreamSynchronize waits for the stream, cudaDeviceSynchronize, cudaFree
//     and cudaFreeHost for all queued work (cudaFree synchronises the device).
namespace {
struct emu_queue;
struct emu_dep {
    std::shared_ptr<emu_queue> q;
    uint64_t ticket; // done when q->done >= ticket
};
struct emu_queue {
    uint64_t issued = 0, done = 0;
    std::deque<std::pair<std::function<void()>, std::vector<emu_dep>>> items;
    std::thread worker;
    bool quit = false;
};
// never destroyed: a process may exit with streams alive (their workers wait on g_acv)
std::mutex &g_amu = *new std::mutex; // guards all of the asynchronous state
std::condition_variable &g_acv = *new std::condition_variable;
uint64_t g_aissued = 0, g_adone = 0;

bool deps_done(const std::vector<emu_dep> &d) {
    for (const emu_dep &x : d)
        if (x.q->done < x.ticket) return false;
    return true;
}

void worker_main(std::shared_ptr<emu_queue> q) {
    std::unique_lock<std::mutex> l(g_amu);
    for (;;) {
        g_acv.wait(l, [&] { return q->quit || !q->items.empty(); });
        if (q->items.empty()) return;
        auto &it = q->items.front(); // references into a deque survive push_back
        g_acv.wait(l, [&] { return deps_done(it.second); });
        std::function<void()> fn = std::move(it.first);
        q->items.pop_front();
        l.unlock();
        fn();
        l.lock();
        q->done++;
        g_adone++;
        g_acv.notify_all();
    }
}
} // namespace

struct emu_stream {
    int magic;
    std::shared_ptr<emu_queue> q; // created by the first emu_stream_enqueue
    std::vector<emu_dep> waits;   // from cudaStreamWaitEvent, not yet honoured
};
struct emu_event {
    int magic;
    std::vector<emu_dep> deps; // what the recorded point waits for (empty: complete)
    bool timing;               // created without cudaEventDisableTiming
    bool recorded;
    std::chrono::steady_clock::time_point t; // when recorded (cudaEventElapsedTime)
};

// Before a synchronous operation on s: its queued work and its waits are done.
static void stream_ready(cudaStream_t s) {
    std::unique_lock<std::mutex> l(g_amu);
    g_acv.wait(l, [&] { return (!s->q || s->q->done == s->q->issued) && deps_done(s->waits); });
    s->waits.clear();
}

static void device_ready() {
    std::unique_lock<std::mutex> l(g_amu);
    g_acv.wait(l, [&] { return g_adone == g_aissued; });
}

void emu_stream_enqueue(cudaStream_t s, std::function<void()> fn) {
    if (!s || s->magic != 0x5eed) emu_fatal("%s on an invalid stream", "asynchronous work");
    std::lock_guard<std::mutex> l(g_amu);
    if (!s->q) {
        s->q = std::make_shared<emu_queue>();
        s->q->worker = std::thread(worker_main, s->q);
    }
    s->q->items.emplace_back(std::move(fn), std::move(s->waits));
    s->waits.clear();
    s->q->issued++;
    g_aissued++;
    g_acv.notify_all();
}

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = emu_alloc(bytes, 256, true);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
extern "C" cudaError_t cudaFree(void *p) {
    device_ready();
    return emu_free(p);
}
extern "C" cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    *p = emu_alloc(bytes, 4096, false);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
extern "C" cudaError_t cudaFreeHost(void *p) {
    device_ready();
    return emu_free(p);
}
extern "C" cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
    (void)flags;
    *dev = host;
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    *free_b = (size_t)40 << 30;
    *total_b = (size_t)80 << 30;
    return cudaSuccess;
}
extern "C" cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    if (!s) emu_fatal("%s on the legacy default stream", "cudaMallocAsync");
    stream_ready(s);
    return cudaMalloc(p, bytes);
}
extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    if (!s) emu_fatal("%s on the legacy default stream", "cudaFreeAsync");
    stream_ready(s);
    return emu_free(p);
}
extern "C" cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    memset(p, value, bytes);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    if (!s) emu_fatal("%s on the legacy default stream", "cudaMemsetAsync");
    stream_ready(s);
    memset(p, value, bytes);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                                       cudaStream_t s) {
    (void)kind;
    if (!s) emu_fatal("%s on the legacy default stream", "cudaMemcpyAsync");
    stream_ready(s);
    const char *d = (const char *)dst, *q = (const char *)src;
    if (bytes && d < q + bytes && q < d + bytes && d != q)
        emu_fatal("%s: overlapping source and destination (undefined in CUDA)", "cudaMemcpyAsync");
    memmove(dst, src, bytes);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    *s = new emu_stream{0x5eed, nullptr, {}};
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || s->magic != 0x5eed) emu_fatal("%s of an invalid stream", "cudaStreamDestroy");
    stream_ready(s);
    if (s->q) {
        {
            std::lock_guard<std::mutex> l(g_amu);
            s->q->quit = true;
            g_acv.notify_all();
        }
        s->q->worker.join();
    }
    s->magic = 0;
    delete s;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!s || s->magic != 0x5eed) emu_fatal("%s of an invalid stream", "cudaStreamSynchronize");
    stream_ready(s);
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)flags;
    if (!s || !e) emu_fatal("%s with a NULL handle", "cudaStreamWaitEvent");
    std::lock_guard<std::mutex> l(g_amu);
    for (const emu_dep &d : e->deps)
        if (d.q->done < d.ticket) s->waits.push_back(d);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    (void)flags;
    *e = new emu_event{0xe7e7, {}, !(flags & cudaEventDisableTiming), false, {}};
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e || e->magic != 0xe7e7) emu_fatal("%s of an invalid event", "cudaEventDestroy");
    e->magic = 0;
    delete e;
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e || !s) emu_fatal("%s with a NULL handle", "cudaEventRecord");
    std::lock_guard<std::mutex> l(g_amu);
    e->deps.clear();
    for (const emu_dep &d : s->waits)
        if (d.q->done < d.ticket) e->deps.push_back(d);
    if (s->q && s->q->done < s->q->issued) e->deps.push_back(emu_dep{s->q, s->q->issued});
    e->recorded = true;
    e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) emu_fatal("%s with a NULL handle", "cudaEventSynchronize");
    std::unique_lock<std::mutex> l(g_amu);
    g_acv.wait(l, [&] { return deps_done(e->deps); });
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) emu_fatal("%s with a NULL handle", "cudaEventQuery");
    std::lock_guard<std::mutex> l(g_amu);
    return deps_done(e->deps) ? cudaSuccess : cudaErrorNotReady; // not ready is not an error: no last error
}
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) emu_fatal("%s with a NULL argument", "cudaEventElapsedTime");
    if (!a->timing || !b->timing || !a->recorded || !b->recorded) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(g_amu);
    if (!deps_done(a->deps) || !deps_done(b->deps)) return cudaErrorNotReady; // not an error: no last error
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}
extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
    if (!s) emu_fatal("%s on the legacy default stream", "cudaLaunchHostFunc");
    stream_ready(s);
    fn(arg);
    return cudaSuccess;
}

// ------------------------------------------------------------------ device execution

emu_fiber_state *emu_cur = nullptr;
uint3 emu_block_idx;
dim3 emu_block_dim, emu_grid_dim;

namespace {

enum { F_RUN, F_BAR_BLOCK, F_BAR_WARP, F_DONE };
constexpr size_t STACK = 256 * 1024;
constexpr int MAX_THREADS = 1024;

struct Fiber {
    ucontext_t ctx;
    emu_fiber_state st;
    int state;
    int lin;
};

ucontext_t g_sched;
Fiber g_fibers[MAX_THREADS];
int g_nf = 0;
Fiber *g_curf = nullptr;
char *g_stacks = nullptr;
const std::function<void()> *g_body = nullptr;
std::vector<unsigned char> g_dyn;
unsigned char g_slots[MAX_THREADS / 32][32][8];
bool g_reverse = false;
bool g_in_launch = false;

void fiber_entry() {
    (*g_body)();
    g_curf->state = F_DONE;
    // returning resumes g_sched (uc_link)
}

void yield_to_scheduler(int state) {
    if (!g_in_launch) emu_fatal("%s outside a kernel", "a barrier");
    g_curf->state = state;
    swapcontext(&g_curf->ctx, &g_sched);
}

void dump_states(const char *why) {
    fprintf(stderr, "cuda emulator: %s in block (%u,%u,%u); thread states:", why, emu_block_idx.x, emu_block_idx.y,
            emu_block_idx.z);
    for (int i = 0; i < g_nf; i++) {
        static const char *names[] = {"run", "syncthreads", "warp-sync", "done"};
        if (i % 8 == 0) fprintf(stderr, "\n  ");
        fprintf(stderr, "%4d:%-12s", i, names[g_fibers[i].state]);
    }
    fprintf(stderr, "\n");
    abort();
}

void run_block() {
    for (int i = 0; i < g_nf; i++) {
        Fiber &f = g_fibers[i];
        f.state = F_RUN;
        f.lin = i;
        f.st.tid.x = (unsigned int)i % emu_block_dim.x;
        f.st.tid.y = ((unsigned int)i / emu_block_dim.x) % emu_block_dim.y;
        f.st.tid.z = (unsigned int)i / (emu_block_dim.x * emu_block_dim.y);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_stacks + (size_t)i * STACK;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &g_sched;
        makecontext(&f.ctx, fiber_entry, 0);
    }
    for (;;) {
        bool ran = false;
        for (int k = 0; k < g_nf; k++) {
            Fiber &f = g_fibers[g_reverse ? g_nf - 1 - k : k];
            if (f.state != F_RUN) continue;
            g_curf = &f;
            emu_cur = &f.st;
            swapcontext(&g_sched, &f.ctx);
            ran = true;
        }
        int live = 0, at_block = 0;
        for (int i = 0; i < g_nf; i++) {
            if (g_fibers[i].state != F_DONE) live++;
            if (g_fibers[i].state == F_BAR_BLOCK) at_block++;
        }
        if (live == 0) return;
        bool released = false;
        if (at_block == live) {
            for (int i = 0; i < g_nf; i++)
                if (g_fibers[i].state == F_BAR_BLOCK) g_fibers[i].state = F_RUN;
            released = true;
        } else {
            for (int w0 = 0; w0 < g_nf; w0 += 32) {
                const int w1 = w0 + 32 < g_nf ? w0 + 32 : g_nf;
                int wl = 0, ww = 0, wd = 0;
                for (int i = w0; i < w1; i++) {
                    if (g_fibers[i].state == F_DONE) wd++;
                    else wl++;
                    if (g_fibers[i].state == F_BAR_WARP) ww++;
                }
                if (ww > 0 && ww == wl) {
                    if (wd > 0) dump_states("warp-level barrier or shuffle (full mask) with exited lanes");
                    for (int i = w0; i < w1; i++)
                        if (g_fibers[i].state == F_BAR_WARP) g_fibers[i].state = F_RUN;
                    released = true;
                }
            }
        }
        if (!released && !ran) dump_states("deadlock (divergent barrier)");
        if (!released && ran) {
            // every fiber ran and blocked, but no barrier is complete: a mix of block and warp barriers
            bool any_run = false;
            for (int i = 0; i < g_nf; i++) any_run |= g_fibers[i].state == F_RUN;
            if (!any_run) dump_states("deadlock (threads wait at different barriers)");
        }
    }
}

} // namespace

void __syncthreads() { yield_to_scheduler(F_BAR_BLOCK); }
void __syncwarp(unsigned int mask) {
    (void)mask;
    yield_to_scheduler(F_BAR_WARP);
}

void emu_warp_exchange(const void *in, void *out, int src_lane, size_t size) {
    const int lin = g_curf->lin, warp = lin / 32, lane = lin % 32;
    memcpy(g_slots[warp][lane], in, size);
    yield_to_scheduler(F_BAR_WARP);
    const int wsize = g_nf - warp * 32 < 32 ? g_nf - warp * 32 : 32;
    if (src_lane >= 0 && src_lane < wsize) memcpy(out, g_slots[warp][src_lane], size);
    else memcpy(out, in, size);
    yield_to_scheduler(F_BAR_WARP);
}

// Every lane of the calling warp deposits size bytes; each receives all 32 deposits (lane order).
// The warp-collective PTX models (emu_ptx.cpp) build on this; a warp with fewer than 32 threads,
// or with exited lanes, is an error (mma.sync / ldmatrix are .aligned: all 32 lanes execute them).
static unsigned char g_gather[MAX_THREADS / 32][32][EMU_GATHER_MAX];
void emu_warp_allgather(const void *in, void *all, size_t size) {
    if (size > EMU_GATHER_MAX) emu_fatal("%s: more than EMU_GATHER_MAX bytes per lane", "emu_warp_allgather");
    const int lin = g_curf->lin, warp = lin / 32, lane = lin % 32;
    if (g_nf - warp * 32 < 32) emu_fatal("%s in a warp of fewer than 32 threads (undefined in PTX)", "a warp-wide instruction");
    memcpy(g_gather[warp][lane], in, size);
    yield_to_scheduler(F_BAR_WARP);
    for (int l = 0; l < 32; l++) memcpy((unsigned char *)all + (size_t)l * size, g_gather[warp][l], size);
    yield_to_scheduler(F_BAR_WARP);
}

static unsigned long long g_block_serial = 0;
unsigned long long emu_block_serial() { return g_block_serial; }
int emu_thread_linear() {
    if (!g_in_launch) emu_fatal("%s outside a kernel", "a device instruction");
    return g_curf->lin;
}

void *emu_dyn_smem() { return g_dyn.data(); }

void emu_run_grid(const emu_cfg_t &cfg, const std::function<void()> &body) {
    const dim3 g = cfg.grid, b = cfg.block;
    const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 || threads == 0 ||
        threads > 1024 || b.z > 64 || cfg.smem > 227 * 1024) {
        fprintf(stderr, "cuda emulator: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", g.x,
                g.y, g.z, b.x, b.y, b.z, cfg.smem);
        emu_set_error(cudaErrorInvalidConfiguration);
        return;
    }
    if (!cfg.stream) emu_fatal("%s on the legacy default stream", "kernel launch");
    stream_ready(cfg.stream);
    if (g_in_launch) emu_fatal("%s from inside a kernel", "kernel launch");
    if (!g_stacks) {
        g_stacks = (char *)mmap(nullptr, STACK * MAX_THREADS, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g_stacks == MAP_FAILED) emu_fatal("%s", "cannot map fiber stacks");
    }
    g_reverse = getenv("EMU_ORDER") && !strcmp(getenv("EMU_ORDER"), "reverse");
    g_in_launch = true;
    g_body = &body;
    g_nf = (int)threads;
    emu_block_dim = b;
    emu_grid_dim = g;
    g_dyn.assign(cfg.smem ? cfg.smem : 16, 0xff); // uninitialised shared memory reads as NaN
    for (unsigned int z = 0; z < g.z; z++)
        for (unsigned int y = 0; y < g.y; y++)
            for (unsigned int x = 0; x < g.x; x++) {
                emu_block_idx = uint3{x, y, z};
                g_block_serial++;
                memset(g_dyn.data(), 0xff, g_dyn.size());
                run_block();
            }
    g_in_launch = false;
    emu_cur = nullptr;
}

// ------------------------------------------------------------------ cuBLASLt (reference)

struct emu_lt_handle {
    int magic;
};
struct emu_lt_desc {
    int transa = 0, transb = 0, epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr, *aux = nullptr;
    int bias_type = -1;
    int64_t aux_ld = 0;
};
struct emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct emu_lt_pref {
    uint64_t max_ws = 0;
    uint32_t align[4] = {256, 256, 256, 256};
};

static float lt_load(const void *p, cudaDataType_t t, int64_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (t == CUDA_R_16BF) return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}
static void lt_store(void *p, cudaDataType_t t, int64_t i, float v) {
    if (t == CUDA_R_32F) {
        ((float *)p)[i] = v;
    } else if (t == CUDA_R_16BF) {
        const uint32_t u = __float_as_uint(v);
        ((uint16_t *)p)[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                                              : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    } else {
        ((uint16_t *)p)[i] = __half_as_ushort(__float2half_rn(v));
    }
}

static uint32_t ptr_align(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0) a >>= 1;
    return a;
}

// ---- epilogues, modelled from NVIDIA's cublasLt.h (cublasLtEpilogue_t, cublasLtMatmulDescAttributes_t):
// BIAS           D = AB + bias, bias of length m (rows of D), packed
// GELU_AUX_BIAS  x = AB + bias; aux = x (the GELU input, stored in D's type, ld aux_ld); D = GELU(x)
// DGELU_BGRAD    x = AB; D = x * GELU'(aux); bias = sums of D over its columns (length m, "bias gradient
//                vector elements are the same type as the output elements")
// BGRADB         D = AB; bias = sums of op(B) over the GEMM's k, one per column of D (length n)
// The aux ld must be divisible by 8 and no less than the rows of D; the bias type, unset (-1), is D's.
// NVIDIA does not write the GELU formula down; this model takes the tanh approximation (GPT-2's), and the
// CUDA backend's start-up comparison on a GPU is what tells whether cuBLASLt does the same. Whether the
// bias gradient of DGELU_BGRAD sums D before or after its rounding is not documented either: here, before.
// Everything else (other epilogues, attributes, bias types) is refused by emu_fatal.
// EMU_LT_GELU=erf: the exact (erf) GELU instead, a cuBLASLt that the backend's start-up comparison must
// catch (test cuda_emu_epilogue_fallback).
static bool lt_gelu_erf() {
    const char *v = getenv("EMU_LT_GELU");
    return v && !strcmp(v, "erf");
}
static double lt_gelu(double x) {
    if (lt_gelu_erf()) return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
    const double k = 0.7978845608028654; // sqrt(2 / pi)
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
static double lt_dgelu(double x) { // d/dx of lt_gelu
    if (lt_gelu_erf()) return 0.5 * (1.0 + erf(x * 0.7071067811865476)) + x * exp(-0.5 * x * x) * 0.3989422804014327;
    const double k = 0.7978845608028654, t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
static bool lt_epi_aux(int e) { return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
static cublasStatus_t lt_check_epilogue(const emu_lt_desc *op, const emu_lt_layout *d) {
    if (op->bias_type != -1 && op->bias_type != (int)d->type) {
        char msg[160];
        snprintf(msg, sizeof msg, "bias data type %d with D of type %d", op->bias_type, (int)d->type);
        emu_fatal("cublasLt: %s is not modelled", msg);
    }
    if (op->epilogue != CUBLASLT_EPILOGUE_DEFAULT && !op->bias) {
        fprintf(stderr, "cuda emulator: cublasLt epilogue %d without CUBLASLT_MATMUL_DESC_BIAS_POINTER\n", op->epilogue);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (lt_epi_aux(op->epilogue) && (!op->aux || op->aux_ld < (int64_t)d->rows || op->aux_ld % 8 != 0)) {
        fprintf(stderr,
                "cuda emulator: cublasLt epilogue %d: aux pointer %p, ld %lld (must be set, divisible by 8 and >= "
                "the %llu rows of D)\n",
                op->epilogue, op->aux, (long long)op->aux_ld, (unsigned long long)d->rows);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// Checks the layouts against each other: op(A) is m x k, op(B) k x n, C = D are m x n.
static cublasStatus_t lt_check(const emu_lt_desc *op, const emu_lt_layout *a, const emu_lt_layout *b,
                               const emu_lt_layout *c, const emu_lt_layout *d) {
    const uint64_t m = d->rows, n = d->cols;
    const uint64_t am = op->transa ? a->cols : a->rows, ak = op->transa ? a->rows : a->cols;
    const uint64_t bk = op->transb ? b->cols : b->rows, bn = op->transb ? b->rows : b->cols;
    if (am != m || bn != n || ak != bk || c->rows != m || c->cols != n || c->ld != d->ld) {
        fprintf(stderr,
                "cuda emulator: cublasLt layouts disagree: D %llux%llu, op(A) %llux%llu, op(B) %llux%llu, C %llux%llu\n",
                (unsigned long long)m, (unsigned long long)n, (unsigned long long)am, (unsigned long long)ak,
                (unsigned long long)bk, (unsigned long long)bn, (unsigned long long)c->rows,
                (unsigned long long)c->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a->ld < (int64_t)a->rows || b->ld < (int64_t)b->rows || d->ld < (int64_t)d->rows) {
        fprintf(stderr, "cuda emulator: cublasLt leading dimension smaller than the rows\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a->type != d->type || b->type != d->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasLtGetStatusName(cublasStatus_t s) { return s == 0 ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_ERROR"; }
extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) { return s == 0 ? "success" : "emulated cuBLASLt error"; }
extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new emu_lt_handle{0x17};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                                   cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new emu_lt_desc();
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                         const void *buf, size_t size) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
        const int v = *(const cublasOperation_t *)buf == CUBLAS_OP_T;
        (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        if (size != sizeof(cublasLtEpilogue_t)) return CUBLAS_STATUS_INVALID_VALUE;
        const int e = *(const cublasLtEpilogue_t *)buf;
        if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
            e != CUBLASLT_EPILOGUE_DGELU_BGRAD && e != CUBLASLT_EPILOGUE_BGRADB) {
            char msg[64];
            snprintf(msg, sizeof msg, "%d", e);
            emu_fatal("cublasLt: epilogue %s is not modelled", msg);
        }
        d->epilogue = e;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->aux, buf, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->aux_ld, buf, sizeof(int64_t));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, buf, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        d->bias_type = *(const int32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    char msg[64];
    snprintf(msg, sizeof msg, "%d", (int)a);
    emu_fatal("cublasLt: matmul descriptor attribute %s is not modelled", msg);
}
extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
    *l = new emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new emu_lt_pref();
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t a, const void *buf,
                                                               size_t size) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        p->max_ws = *(const uint64_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = *(const uint32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

// EMU_LT=none: no algorithm for anything (exercises the fallback kernels);
// EMU_LT=aligned16: no algorithm unless every matrix (and the bias) is 16-byte aligned.
extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                         cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t *results, int *count) {
    (void)h;
    *count = 0;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = lt_check(op, a, b, c, d);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_check_epilogue(op, d);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const char *mode = getenv("EMU_LT");
    if (mode && !strcmp(mode, "none")) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (mode && !strcmp(mode, "aligned16")) {
        for (int i = 0; i < 4; i++)
            if (pref->align[i] < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (op->bias && ptr_align(op->bias) < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (lt_epi_aux(op->epilogue) && ptr_align(op->aux) < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 0xa160;
    results[0].algo.data[1] = pref->align[0] | (uint64_t)pref->align[1] << 16 | (uint64_t)pref->align[2] << 32 |
                              (uint64_t)pref->align[3] << 48;
    // the heuristic reads the bias and aux pointers for their alignment only (cublasLt.h): remember it
    results[0].algo.data[2] = (op->bias ? ptr_align(op->bias) : 0) | (uint64_t)(op->aux ? ptr_align(op->aux) : 0) << 16;
    results[0].workspaceSize = pref->max_ws >= (1u << 20) ? (1u << 20) : 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t a, const void *B,
                                         cublasLtMatrixLayout_t b, const void *beta, const void *C,
                                         cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
    (void)h;
    if (!stream) emu_fatal("%s on the legacy default stream", "cublasLtMatmul");
    stream_ready(stream);
    cublasStatus_t s = lt_check(op, a, b, c, d);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!algo || algo->data[0] != 0xa160) emu_fatal("%s: algorithm not from the heuristic", "cublasLtMatmul");
    // the pointers must be as aligned as the preference the algorithm was chosen with
    const uint64_t al = algo->data[1];
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (ptr_align(ptrs[i]) < ((al >> (16 * i)) & 0xffff))
            emu_fatal("%s: a pointer is less aligned than the heuristic was told", "cublasLtMatmul");
    if (workspace_bytes && !workspace) emu_fatal("%s: workspace size without a pointer", "cublasLtMatmul");
    s = lt_check_epilogue(op, d);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const void *eptrs[2] = {op->bias, op->aux};
    for (int i = 0; i < 2; i++)
        if (eptrs[i] && ptr_align(eptrs[i]) < ((algo->data[2] >> (16 * i)) & 0xffff))
            emu_fatal("%s: a bias/aux pointer is less aligned than the heuristic saw", "cublasLtMatmul");
    const float al_ = *(const float *)alpha, be = *(const float *)beta;
    const uint64_t m = d->rows, n = d->cols, k = op->transa ? a->rows : a->cols;
    const cudaDataType_t t = d->type;
    const int epi = op->epilogue;
    auto ldA = [&](uint64_t i, uint64_t kk) {
        return lt_load(A, t, op->transa ? (int64_t)(kk + i * a->ld) : (int64_t)(i + kk * a->ld));
    };
    auto ldB = [&](uint64_t kk, uint64_t j) {
        return lt_load(B, t, op->transb ? (int64_t)(j + kk * b->ld) : (int64_t)(kk + j * b->ld));
    };
    std::vector<float> out((size_t)(m * n));
    std::vector<double> bgrad(epi == CUBLASLT_EPILOGUE_BGRADB ? n : m, 0.0);
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            double acc = 0;
            for (uint64_t kk = 0; kk < k; kk++) acc += (double)ldA(i, kk) * (double)ldB(kk, j);
            float v = al_ * (float)acc;
            if (be != 0.0f) v += be * lt_load(C, t, (int64_t)(i + j * c->ld));
            const int64_t ax = (int64_t)(i + j * (uint64_t)op->aux_ld);
            if (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) v += lt_load(op->bias, t, (int64_t)i);
            if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                lt_store((void *)op->aux, t, ax, v);
                v = (float)lt_gelu(v);
            }
            if (epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
                v = (float)((double)v * lt_dgelu(lt_load(op->aux, t, ax)));
                bgrad[i] += v;
            }
            out[(size_t)(i + j * m)] = v;
        }
    if (epi == CUBLASLT_EPILOGUE_BGRADB)
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t kk = 0; kk < k; kk++) bgrad[j] += ldB(kk, j);
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) lt_store(D, t, (int64_t)(i + j * d->ld), out[(size_t)(i + j * m)]);
    if (epi == CUBLASLT_EPILOGUE_DGELU_BGRAD || epi == CUBLASLT_EPILOGUE_BGRADB)
        for (size_t i = 0; i < bgrad.size(); i++) lt_store((void *)op->bias, t, (int64_t)i, (float)bgrad[i]);
    return CUBLAS_STATUS_SUCCESS;
}
