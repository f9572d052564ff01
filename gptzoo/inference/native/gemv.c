/* Matrix-vector products for CPU decoding: y[m, o] = scale[o] * dot(W[o, :], x[m, :]) + bias[o].
 *
 * W is (out, in), row-major, float32, bfloat16 or int8 (int8 with a float32 scale per row); x is
 * (M, in) float32 or bfloat16; y is (M, out) float32 or bfloat16 (rounded to nearest even once, after
 * the bias is added in float32). Each output is one dot product summed by one thread in a fixed
 * order, so the result does not depend on the number of threads. Rows are handed out to threads in
 * chunks as they finish (a thread that the OS deschedules holds up at most one chunk), and each
 * chunk of W is read from memory once for all M inputs.
 *
 * The threads are this file's own pool: a worker spins for a while (SPIN_NS) after its last job, so
 * that the products of one decoding step, a few microseconds apart, start without waking a
 * sleeping thread (tens of microseconds on a virtual machine), and then sleeps on a condition
 * variable: nothing spins between two decoding runs.
 *
 * Compiled at run time for the machine it runs on (-O3 -march=native -pthread) by gptzoo.inference.native;
 * the vector width follows the instruction set the compiler targets (AVX-512, AVX2, or plain C).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { F32 = 0, BF16 = 1, I8 = 2 };

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define VW 16
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline vf load_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline vf load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline vf load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vf;
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline vf load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline vf load_i8(const int8_t *p) {
    int64_t bytes;
    memcpy(&bytes, p, 8);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)));
}
#else
#define VW 1
typedef float vf;
static inline vf vzero(void) { return 0.0f; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline float vsum(vf v) { return v; }
static inline vf load_f32(const float *p) { return *p; }
static inline vf load_bf16(const uint16_t *p) { return bf16_to_f32(*p); }
static inline vf load_i8(const int8_t *p) { return (float)*p; }
#endif

static inline float scalar_f32(const float *p) { return *p; }
static inline float scalar_bf16(const uint16_t *p) { return bf16_to_f32(*p); }
static inline float scalar_i8(const int8_t *p) { return (float)*p; }

#define ROWS 4 /* rows of W per pass over x: independent accumulators */

/* dots[o - o0] = dot(W[o, :], x) for o0 <= o < o1 */
#define DEFINE_DOTS(NAME, T, LOAD, SCALAR)                                                        \
    static void NAME(const T *W, const float *x, float *dots, long o0, long o1, long in) {       \
        long full = in - in % VW;                                                                 \
        for (long o = o0; o < o1; o += ROWS) {                                                    \
            int r = o1 - o < ROWS ? (int)(o1 - o) : ROWS;                                         \
            const T *w[ROWS];                                                                     \
            vf acc[ROWS];                                                                         \
            for (int k = 0; k < ROWS; k++) {                                                      \
                w[k] = W + (o + (k < r ? k : 0)) * in;                                            \
                acc[k] = vzero();                                                                 \
            }                                                                                     \
            for (long i = 0; i < full; i += VW) {                                                 \
                vf xv = load_f32(x + i);                                                          \
                for (int k = 0; k < ROWS; k++) acc[k] = vfma(LOAD(w[k] + i), xv, acc[k]);         \
            }                                                                                     \
            for (int k = 0; k < r; k++) {                                                         \
                float s = vsum(acc[k]);                                                           \
                for (long i = full; i < in; i++) s += SCALAR(w[k] + i) * x[i];                    \
                dots[o - o0 + k] = s;                                                             \
            }                                                                                     \
        }                                                                                         \
    }

DEFINE_DOTS(dots_f32, float, load_f32, scalar_f32)
DEFINE_DOTS(dots_bf16, uint16_t, load_bf16, scalar_bf16)
DEFINE_DOTS(dots_i8, int8_t, load_i8, scalar_i8)

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
/* bfloat16 weights and inputs: vdpbf16ps multiplies pairs exactly and sums them in float32 */
static void dots_bf16_pairs(const uint16_t *W, const uint16_t *x, float *dots, long o0, long o1, long in) {
    long full = in - in % 32;
    for (long o = o0; o < o1; o += ROWS) {
        int r = o1 - o < ROWS ? (int)(o1 - o) : ROWS;
        const uint16_t *w[ROWS];
        __m512 acc[ROWS];
        for (int k = 0; k < ROWS; k++) {
            w[k] = W + (o + (k < r ? k : 0)) * in;
            acc[k] = _mm512_setzero_ps();
        }
        for (long i = 0; i < full; i += 32) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i);
            for (int k = 0; k < ROWS; k++) acc[k] = _mm512_dpbf16_ps(acc[k], (__m512bh)_mm512_loadu_si512(w[k] + i), xv);
        }
        for (int k = 0; k < r; k++) {
            float s = _mm512_reduce_add_ps(acc[k]);
            for (long i = full; i < in; i++) s += bf16_to_f32(w[k][i]) * bf16_to_f32(x[i]);
            dots[o - o0 + k] = s;
        }
    }
}
#define HAVE_PAIRS 1
#else
#define HAVE_PAIRS 0
#endif

#define CHUNK 64 /* rows of W per unit of work */

static float load_any(int kind, const void *p, long i) {
    return kind == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

typedef struct {
    int wkind, xkind, ykind;
    const void *W, *bias, *x;
    const float *scale, *xf;
    void *y;
    long M, out, in, chunks;
} job_t;

static void run_chunk(const job_t *j, long c) {
    long o0 = c * CHUNK, o1 = o0 + CHUNK < j->out ? o0 + CHUNK : j->out;
    float dots[CHUNK];
    for (long m = 0; m < j->M; m++) {
        if (j->xf == NULL) { /* bfloat16 pairs: x as it is */
#if HAVE_PAIRS
            dots_bf16_pairs((const uint16_t *)j->W, (const uint16_t *)j->x + m * j->in, dots, o0, o1, j->in);
#endif
        } else if (j->wkind == F32) {
            dots_f32((const float *)j->W, j->xf + m * j->in, dots, o0, o1, j->in);
        } else if (j->wkind == BF16) {
            dots_bf16((const uint16_t *)j->W, j->xf + m * j->in, dots, o0, o1, j->in);
        } else {
            dots_i8((const int8_t *)j->W, j->xf + m * j->in, dots, o0, o1, j->in);
        }
        for (long o = o0; o < o1; o++) {
            float v = dots[o - o0];
            if (j->scale != NULL) v *= j->scale[o];
            if (j->bias != NULL) v += load_any(j->ykind, j->bias, o);
            if (j->ykind == BF16) ((uint16_t *)j->y)[m * j->out + o] = f32_to_bf16(v);
            else ((float *)j->y)[m * j->out + o] = v;
        }
    }
}

/* ---- the pool ---- */
#define MAX_WORKERS 63
#define SPIN_NS 2000000L /* how long an idle worker spins before it sleeps */

static job_t job;
/* A job's ticket: its generation (one more than the last job's) << 8 | how many workers take part
 * (workers 0..n-1). One atomic word, so that a worker never pairs one job's generation with another
 * job's count; job, next_chunk and pending are written before the ticket is published. */
static atomic_long ticket;
static atomic_long next_chunk; /* the next chunk of the current job to take */
static atomic_int pending;     /* workers still working on the current job */
static int started;            /* workers running */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Waiting for a flag: a short busy spin, then yielding the core at each look, so that a waiting
 * thread that shares a core with the one it waits for (the other cores being busy) lets it run. */
static inline void relax(long *spins) {
    if (++*spins < 1000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

static void take_chunks(const job_t *j) {
    for (long c; (c = atomic_fetch_add(&next_chunk, 1)) < j->chunks;) run_chunk(j, c);
}

static long first_seen[MAX_WORKERS]; /* the generation before a worker's first job */

static long generation_of(long t) { return t >> 8; }

static void *worker(void *arg) {
    int index = (int)(intptr_t)arg;
    long seen = first_seen[index];
    for (;;) {
        long deadline = now_ns() + SPIN_NS, spins = 0;
        while (generation_of(atomic_load_explicit(&ticket, memory_order_acquire)) == seen) {
            relax(&spins);
            if ((spins & 255) == 0 && now_ns() > deadline) {
                pthread_mutex_lock(&lock);
                while (generation_of(atomic_load(&ticket)) == seen) pthread_cond_wait(&wake, &lock);
                pthread_mutex_unlock(&lock);
            }
        }
        /* the newest job: one that needs this worker cannot be followed by another before it helped */
        long t = atomic_load_explicit(&ticket, memory_order_acquire);
        seen = generation_of(t);
        if (index < (t & 255)) {
            take_chunks(&job);
            atomic_fetch_sub_explicit(&pending, 1, memory_order_release);
        }
    }
    return NULL;
}

static void forget_workers(void) { started = 0; } /* a forked child has none of them */

static void start_workers(int n) {
    static int registered;
    if (!registered) {
        pthread_atfork(NULL, NULL, forget_workers);
        registered = 1;
    }
    for (; started < n && started < MAX_WORKERS; started++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        first_seen[started] = generation_of(atomic_load(&ticket));
        int failed = pthread_create(&t, &attr, worker, (void *)(intptr_t)started);
        pthread_attr_destroy(&attr);
        if (failed) break;
    }
}

/* Returns 0, or -1 when memory for the float32 copy of x cannot be allocated. */
int gemv(int wkind, const void *W, const float *scale, const void *bias, int xkind, const void *x, int ykind,
         void *y, long M, long out, long in, int threads) {
    float *xf = NULL; /* x in float32, which every product but bfloat16 pairs reads */
    if (!(HAVE_PAIRS && wkind == BF16 && xkind == BF16)) {
        xf = malloc(sizeof(float) * (size_t)(M * in > 0 ? M * in : 1));
        if (xf == NULL) return -1;
        for (long k = 0; k < M * in; k++) xf[k] = load_any(xkind, x, k);
    }
    job_t j = {wkind, xkind, ykind, W, bias, x, scale, xf, y, M, out, in, (out + CHUNK - 1) / CHUNK};
    int want = threads - 1 < j.chunks - 1 ? threads - 1 : (int)(j.chunks - 1);
    if (want <= 0 || pthread_mutex_trylock(&call_lock) != 0) { /* alone, or another thread's job runs */
        for (long c = 0; c < j.chunks; c++) run_chunk(&j, c);
        free(xf);
        return 0;
    }
    start_workers(want);
    want = want < started ? want : started;
    job = j;
    atomic_store(&next_chunk, 0);
    atomic_store(&pending, want);
    pthread_mutex_lock(&lock);
    atomic_store_explicit(&ticket, ((generation_of(atomic_load(&ticket)) + 1) << 8) | want, memory_order_release);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    take_chunks(&j);
    long spins = 0;
    while (atomic_load_explicit(&pending, memory_order_acquire) > 0) relax(&spins);
    pthread_mutex_unlock(&call_lock);
    free(xf);
    return 0;
}
