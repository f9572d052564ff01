/* Matrix-vector products for CPU decoding: y[m, o] = scale[o] * dot(W[o, :], x[m, :]) + bias[o].
 *
 * W is (out, in), row-major, float32, bfloat16 or int8 (int8 with a float32 scale per row), or in 4-bit
 * blocks (Q4, below); x is
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
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"

#define ROWS 4 /* rows of W per pass over x: independent accumulators */
#define PREFETCH_ROWS 8 /* how far ahead, in rows of W, the products ask for what they will read */

/* Ask for the bytes PREFETCH_ROWS rows after p (rows of row_bytes): a thread alone streams at about
 * the machine's bandwidth only with more reads in flight than the hardware prefetchers start. */
static inline void prefetch_ahead(const void *p, long row_bytes) {
    __builtin_prefetch((const char *)p + PREFETCH_ROWS * row_bytes, 0, 3);
}

/* dots[m * CHUNK + o - o0] = dot(W[o, :], x[m, :]) for o0 <= o < o1 and m < nx <= XR (x rows `in`
 * apart): each row of W read once for XR rows of x. Every dot is summed in the same order whatever
 * XR and nx, so the rows of a batch get the numbers each would get alone. */
#define DEFINE_DOTS(NAME, T, LOAD, SCALAR, XR)                                                    \
    static void NAME(const T *W, const float *x, long nx, float *dots, long o0, long o1, long in) { \
        long full = in - in % VW;                                                                 \
        for (long o = o0; o < o1; o += ROWS) {                                                    \
            int r = o1 - o < ROWS ? (int)(o1 - o) : ROWS;                                         \
            const T *w[ROWS];                                                                     \
            const float *xr[XR];                                                                  \
            vf acc[ROWS][XR];                                                                     \
            for (int m = 0; m < XR; m++) xr[m] = x + (m < nx ? m : 0) * in;                       \
            for (int k = 0; k < ROWS; k++) {                                                      \
                w[k] = W + (o + (k < r ? k : 0)) * in;                                            \
                for (int m = 0; m < XR; m++) acc[k][m] = vzero();                                 \
            }                                                                                     \
            for (long i = 0; i < full; i += VW) {                                                 \
                vf xv[XR];                                                                        \
                for (int m = 0; m < XR; m++) xv[m] = load_f32(xr[m] + i);                         \
                for (int k = 0; k < ROWS; k++) {                                                  \
                    if (i % (64 / sizeof(T)) == 0) prefetch_ahead(w[k] + i, in * sizeof(T));      \
                    vf wv = LOAD(w[k] + i);                                                       \
                    for (int m = 0; m < XR; m++) acc[k][m] = vfma(wv, xv[m], acc[k][m]);          \
                }                                                                                 \
            }                                                                                     \
            for (int k = 0; k < r; k++)                                                           \
                for (int m = 0; m < nx; m++) {                                                    \
                    float s = vsum(acc[k][m]);                                                    \
                    for (long i = full; i < in; i++) s += SCALAR(w[k] + i) * xr[m][i];            \
                    dots[m * CHUNK + o - o0 + k] = s;                                             \
                }                                                                                 \
        }                                                                                         \
    }

#define CHUNK 64 /* the most rows of W per unit of work */
#define CHUNKS_PER_THREAD 8 /* units of work per thread, at least, where CHUNK-row ones would be fewer */
#define XROWS 4       /* rows of x per pass over rows of W */
#define BATCH_ROWS 32 /* rows of x per pass over a chunk of W */

DEFINE_DOTS(dots_f32, float, load_f32, scalar_f32, 1)
DEFINE_DOTS(dots_bf16, uint16_t, load_bf16, scalar_bf16, 1)
DEFINE_DOTS(dots_i8, int8_t, load_i8, scalar_i8, 1)
DEFINE_DOTS(dots_f32_rows, float, load_f32, scalar_f32, XROWS)
DEFINE_DOTS(dots_bf16_rows, uint16_t, load_bf16, scalar_bf16, XROWS)
DEFINE_DOTS(dots_i8_rows, int8_t, load_i8, scalar_i8, XROWS)

#define QK 32 /* weights per 4-bit block */
/* The codes and the scales-then-minimums of rows o .. o + ROWS - 1 of a Q4 weight (rows past r repeat
 * row o). */
static inline void q4_rows(const uint8_t *W, const uint16_t *S, long o, int r, long in, const uint8_t **w,
                           const uint16_t **s) {
    for (int k = 0; k < ROWS; k++) {
        long row = o + (k < r ? k : 0);
        w[k] = W + row * (in / 2), s[k] = S + row * 2 * (in / QK);
    }
}

/* Q4, llama.cpp's Q4_1 blocks: a row of W is in / QK blocks of QK / 2 bytes, byte j of a block holding
 * the codes q (0..15) of its weights j (low 4 bits) and j + QK / 2 (high); weight = q * d + m, d and m
 * the block's float16 scale and minimum (S, a row's in / QK scales then its in / QK minimums).
 * dots[m * CHUNK + o - o0] = dot(W[o, :], x[m, :]) for m < nx: per block d sum(q x) + m sum(x), added
 * in the same order whatever nx. */
static void dots_q4(const uint8_t *W, const uint16_t *S, const float *x, long nx, float *dots, long o0, long o1,
                    long in) {
    long blocks = in / QK, row_bytes = in / 2;
    for (long m = 0; m < nx; m++, x += in)
        for (long o = o0; o < o1; o += ROWS) {
            int r = o1 - o < ROWS ? (int)(o1 - o) : ROWS;
            const uint8_t *w[ROWS];
            const uint16_t *s[ROWS];
            vf acc[ROWS];
            q4_rows(W, S, o, r, in, w, s);
            for (int k = 0; k < ROWS; k++) acc[k] = vzero();
            for (long b = 0; b < blocks; b++) {
                const float *xb = x + b * QK;
                vf sum = vzero();
                for (int h = 0; h < QK; h += VW) sum = vadd(sum, load_f32(xb + h));
                for (int k = 0; k < ROWS; k++) {
                    const uint8_t *q = w[k] + b * (QK / 2);
                    if (b % 4 == 0) prefetch_ahead(q, row_bytes);
                    vf part = vzero(), lo, hi;
                    for (int h = 0; h < QK / 2; h += VW) {
                        load_q4(q + h, &lo, &hi);
                        part = vfma(lo, load_f32(xb + h), part);
                        part = vfma(hi, load_f32(xb + QK / 2 + h), part);
                    }
                    acc[k] = vfma(vset1(f16_to_f32(s[k][b])), part, acc[k]);
                    acc[k] = vfma(vset1(f16_to_f32(s[k][blocks + b])), sum, acc[k]);
                }
            }
            for (int k = 0; k < r; k++) dots[m * CHUNK + o - o0 + k] = vsum(acc[k]);
        }
}

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
            for (int k = 0; k < ROWS; k++) {
                prefetch_ahead(w[k] + i, in * sizeof(*w[k]));
                acc[k] = _mm512_dpbf16_ps(acc[k], (__m512bh)_mm512_loadu_si512(w[k] + i), xv);
            }
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

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define QBLOCK 64 /* inputs per float32 scale of their int16 copy */
/* int8 weights and x as int16 in blocks of QBLOCK (xq, with scale xs per block): vpdpwssd sums
 * pairs of exact int8 x int16 products in int32 (at most 4 per lane per block: no overflow), each
 * block's sums go to float32 times its scale. The int16 copy of x (15 bits per block) is finer than
 * bfloat16 (8 bits per element) for every element within 1/128 of its block's largest. */
static void dots_i8_q16(const int8_t *W, const int16_t *xq, const float *xs, float *dots, long o0, long o1, long in) {
    for (long o = o0; o < o1; o += ROWS) {
        int r = o1 - o < ROWS ? (int)(o1 - o) : ROWS;
        const int8_t *w[ROWS];
        __m512 acc[ROWS];
        for (int k = 0; k < ROWS; k++) {
            w[k] = W + (o + (k < r ? k : 0)) * in;
            acc[k] = _mm512_setzero_ps();
        }
        for (long b = 0; b < in; b += QBLOCK) {
            __m512i lo = _mm512_loadu_si512(xq + b), hi = _mm512_loadu_si512(xq + b + 32);
            __m512 scale = _mm512_set1_ps(xs[b / QBLOCK]);
            for (int k = 0; k < ROWS; k++) {
                prefetch_ahead(w[k] + b, in);
                __m512i sums = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                                   _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w[k] + b))), lo);
                sums = _mm512_dpwssd_epi32(sums, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w[k] + b + 32))), hi);
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[k]);
            }
        }
        for (int k = 0; k < r; k++) dots[o - o0 + k] = _mm512_reduce_add_ps(acc[k]);
    }
}

/* x (M, in) -> int16 per block of QBLOCK (the largest magnitude of a block to 32767, to nearest, ties to
 * even) and the scales. */
static void quantize_q16(const float *x, long n, int16_t *xq, float *xs) {
    for (long b = 0; b < n; b += QBLOCK) {
        __m512 v[QBLOCK / 16], top = _mm512_setzero_ps();
        for (int i = 0; i < QBLOCK / 16; i++) {
            v[i] = _mm512_loadu_ps(x + b + 16 * i);
            top = _mm512_max_ps(top, _mm512_abs_ps(v[i]));
        }
        float most = _mm512_reduce_max_ps(top);
        __m512 inv = _mm512_set1_ps(most > 0.0f ? 32767.0f / most : 0.0f);
        xs[b / QBLOCK] = most / 32767.0f;
        for (int i = 0; i < QBLOCK / 16; i++)
            _mm256_storeu_si256((__m256i *)(xq + b + 16 * i), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv))));
    }
}
#define HAVE_Q16 1

/* 4-bit weights against x in int8 per block of QK (scale dx = its largest magnitude / 127, as
 * llama.cpp's Q8_0 rounds it), two blocks at a time: vpdpbusd sums pairs of exact code x int8
 * products in int32, which go to float32 times the blocks' dw * dx; the blocks' minimums add
 * m dx sum(x) per block, 16 blocks at a time.
 * x's layout (xq, per row of x, QK * PAIRS bytes) follows the codes as the nibbles of two blocks' 32
 * bytes come out, low halves then high: for blocks 2p and 2p + 1, x(2p)[0..15], x(2p+1)[0..15],
 * x(2p)[16..31], x(2p+1)[16..31] (an odd last block's partner all zeros); xd per block dx, xo per
 * block dx sum(x). */
#define PAIRS(in) (((in) / QK + 1) / 2)
static void quantize_q8_pairs(const float *x, long in, int8_t *xq, float *xd, float *xo) {
    long blocks = in / QK;
    for (long p = 0; p < PAIRS(in); p++)
        for (int h = 0; h < 2; h++) {
            long b = 2 * p + h;
            int8_t *lo = xq + p * 2 * QK + h * (QK / 2), *hi = lo + QK;
            if (b < blocks) { /* to nearest, ties to even (llama.cpp's SIMD quantize_row_q8_0) */
                __m512 a = _mm512_loadu_ps(x + b * QK), c = _mm512_loadu_ps(x + b * QK + QK / 2);
                float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
                float d = top / 127.0f;
                __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
                __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qc = _mm512_cvtps_epi32(_mm512_mul_ps(c, inv));
                _mm_storeu_si128((__m128i *)lo, _mm512_cvtepi32_epi8(qa));
                _mm_storeu_si128((__m128i *)hi, _mm512_cvtepi32_epi8(qc));
                xo[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
                xd[b] = d;
            } else {
                memset(lo, 0, QK / 2), memset(hi, 0, QK / 2);
            }
        }
}

static void dots_q4_q8(const uint8_t *W, const uint16_t *S, const int8_t *xq, const float *xd, const float *xo,
                       float *dots, long o0, long o1, long in) {
    long blocks = in / QK, full = blocks / 2, row_bytes = in / 2;
    /* the pair's 32 bytes twice, the second copy shifted by 4 bits: low halves, then high halves */
    const __m512i shifts = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4), nibble = _mm512_set1_epi8(15);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    for (long o = o0; o < o1; o += ROWS) {
        int r = o1 - o < ROWS ? (int)(o1 - o) : ROWS;
        const uint8_t *w[ROWS];
        const uint16_t *s[ROWS];
        __m512 acc[ROWS];
        q4_rows(W, S, o, r, in, w, s);
        for (int k = 0; k < ROWS; k++) acc[k] = _mm512_setzero_ps();
        for (long g = 0; g < full; g += 8) { /* 8 pairs: their 16 scales in one vector a row */
            long n = full - g < 8 ? full - g : 8;
            __m512 scales[ROWS]; /* dw dx, a lane a block */
            __mmask16 m = (__mmask16)((1u << (2 * n)) - 1);
            __m512 xsum = _mm512_maskz_loadu_ps(m, xo + 2 * g), dx = _mm512_maskz_loadu_ps(m, xd + 2 * g);
            for (int k = 0; k < ROWS; k++) { /* the minimums: m dx sum(x) a block */
                scales[k] = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s[k] + 2 * g)), dx);
                acc[k] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s[k] + blocks + 2 * g)), xsum, acc[k]);
            }
            for (long j = 0; j < n; j++) {
                long p = g + j;
                __m512i xv = _mm512_loadu_si512(xq + p * 2 * QK);
                __m512i pick = _mm512_add_epi32(spread, _mm512_set1_epi32(2 * (int)j));
                for (int k = 0; k < ROWS; k++) {
                    const uint8_t *q = w[k] + p * QK;
                    if (p % 2 == 0) prefetch_ahead(q, row_bytes);
                    __m512i codes = _mm512_and_si512(
                        _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q)), shifts), nibble);
                    __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv);
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(pick, scales[k]), acc[k]);
                }
            }
        }
        if (blocks % 2) { /* the odd last block: its 16 bytes and its scale (its partner's x is zero) */
            __m512i xv = _mm512_loadu_si512(xq + full * 2 * QK);
            for (int k = 0; k < ROWS; k++) {
                __m256i half = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(w[k] + full * QK)));
                __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(half), half, 1);
                __m512i codes = _mm512_and_si512(_mm512_srlv_epi64(v, shifts), nibble);
                __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv);
                __m512 scale = _mm512_set1_ps(f16_to_f32(s[k][blocks - 1]) * xd[blocks - 1]);
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[k]);
                acc[k] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(f16_to_f32(s[k][2 * blocks - 1])),
                                               _mm512_set1_ps(xo[blocks - 1]), acc[k], 1);
            }
        }
        for (int k = 0; k < r; k++) dots[o - o0 + k] = _mm512_reduce_add_ps(acc[k]);
    }
}
#else
#define QBLOCK 1
#define HAVE_Q16 0
#endif

typedef struct {
    int wkind, xkind, ykind;
    const void *W, *bias, *x;
    const float *scale, *xf; /* scale: int8 weights' per row, or NULL */
    const uint16_t *qscale;  /* Q4 weights: their blocks' scales and minimums */
    const int16_t *xq; /* int8 weights: x in int16 per block, or NULL */
    const float *xs;   /* and the blocks' scales */
    const int8_t *xq8; /* Q4 weights: x in int8 per block, as quantize_q8_pairs lays it out, or NULL */
    const float *xd, *xo; /* and its scales and its blocks' sums */
    void *y;
    long M, out, in, rows, chunks; /* rows of W per chunk, and how many chunks */
} job_t;

/* the products of a chunk of W with x rows m .. m + nx - 1 (nx <= BATCH_ROWS), into dots */
static void float_dots(const job_t *j, long m, long nx, float *dots, long o0, long o1) {
    const float *x = j->xf + m * j->in;
    if (j->wkind == Q4) {
        dots_q4((const uint8_t *)j->W, j->qscale, x, nx, dots, o0, o1, j->in);
        return;
    }
    if (nx == 1) {
        if (j->wkind == F32) dots_f32((const float *)j->W, x, 1, dots, o0, o1, j->in);
        else if (j->wkind == BF16) dots_bf16((const uint16_t *)j->W, x, 1, dots, o0, o1, j->in);
        else dots_i8((const int8_t *)j->W, x, 1, dots, o0, o1, j->in);
        return;
    }
    /* ROWS rows of W at a time (in L1) against every x row, XROWS at a time */
    for (long o = o0; o < o1; o += ROWS) {
        long end = o + ROWS < o1 ? o + ROWS : o1;
        for (long t = 0; t < nx; t += XROWS) {
            long n = nx - t < XROWS ? nx - t : XROWS;
            float *at = dots + t * CHUNK + (o - o0);
            if (j->wkind == F32) dots_f32_rows((const float *)j->W, x + t * j->in, n, at, o, end, j->in);
            else if (j->wkind == BF16) dots_bf16_rows((const uint16_t *)j->W, x + t * j->in, n, at, o, end, j->in);
            else dots_i8_rows((const int8_t *)j->W, x + t * j->in, n, at, o, end, j->in);
        }
    }
}

static void run_chunk(const job_t *j, long c) {
    long o0 = c * j->rows, o1 = o0 + j->rows < j->out ? o0 + j->rows : j->out;
    float dots[BATCH_ROWS * CHUNK];
    for (long m = 0; m < j->M;) {
        long nx = 1;
        if (j->xf == NULL) { /* bfloat16 pairs: x as it is */
#if HAVE_PAIRS
            dots_bf16_pairs((const uint16_t *)j->W, (const uint16_t *)j->x + m * j->in, dots, o0, o1, j->in);
#endif
        } else if (j->xq != NULL) {
#if HAVE_Q16
            dots_i8_q16((const int8_t *)j->W, j->xq + m * j->in, j->xs + m * (j->in / QBLOCK), dots, o0, o1, j->in);
#endif
        } else if (j->xq8 != NULL) {
#if HAVE_Q16
            long pairs = PAIRS(j->in);
            dots_q4_q8((const uint8_t *)j->W, j->qscale, j->xq8 + m * pairs * 2 * QK, j->xd + m * (j->in / QK),
                       j->xo + m * (j->in / QK), dots, o0, o1, j->in);
#endif
        } else {
            nx = j->M - m < BATCH_ROWS ? j->M - m : BATCH_ROWS;
            float_dots(j, m, nx, dots, o0, o1);
        }
        for (long t = 0; t < nx; t++, m++)
            for (long o = o0; o < o1; o++) {
                float v = dots[t * CHUNK + o - o0];
                if (j->scale != NULL) v *= j->scale[o];
                if (j->bias != NULL) v += load_act(j->ykind, j->bias, o);
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

/* scale: int8 weights' float32 per row, Q4 weights' float16 scales then minimums per block, a row's
 * 2 in / QK (in must be a multiple of QK), else NULL. Returns 0, or -1 when memory for the float32
 * copy of x cannot be allocated. */
int gemv(int wkind, const void *W, const void *scale, const void *bias, int xkind, const void *x, int ykind,
         void *y, long M, long out, long in, int threads) {
    float *xf = NULL; /* x in float32, which every product but bfloat16 pairs reads */
    if (!(HAVE_PAIRS && wkind == BF16 && xkind == BF16)) {
        xf = malloc(sizeof(float) * (size_t)(M * in > 0 ? M * in : 1));
        if (xf == NULL) return -1;
        for (long k = 0; k < M * in; k++) xf[k] = load_act(xkind, x, k);
    }
    int16_t *xq = NULL;
    float *xs = NULL;
    int8_t *xq8 = NULL;
    float *xd = NULL, *xo = NULL;
    if (HAVE_Q16 && wkind == Q4 && in > 0) {
#if HAVE_Q16
        long pairs = PAIRS(in);
        xq8 = malloc((size_t)(M * pairs * 2 * QK));
        xd = malloc(sizeof(float) * (size_t)(M * (in / QK)));
        xo = malloc(sizeof(float) * (size_t)(M * (in / QK)));
        if (xq8 == NULL || xd == NULL || xo == NULL) {
            free(xq8), free(xd), free(xo), free(xf);
            return -1;
        }
        for (long m = 0; m < M; m++)
            quantize_q8_pairs(xf + m * in, in, xq8 + m * pairs * 2 * QK, xd + m * (in / QK), xo + m * (in / QK));
#endif
    }
    if (HAVE_Q16 && wkind == I8 && in % QBLOCK == 0 && in > 0) {
        xq = malloc(sizeof(int16_t) * (size_t)(M * in));
        xs = malloc(sizeof(float) * (size_t)(M * in / QBLOCK));
        if (xq == NULL || xs == NULL) {
            free(xq), free(xs), free(xf);
            return -1;
        }
#if HAVE_Q16
        quantize_q16(xf, M * in, xq, xs);
#endif
    }
    /* chunks of ROWS to CHUNK rows, CHUNKS_PER_THREAD a thread where W has the rows: a product of a few
     * hundred rows in 64-row chunks would leave one thread with a chunk more than the other */
    long units = (threads > 1 ? threads : 1) * (long)CHUNKS_PER_THREAD;
    long rows = (out + units - 1) / units;
    rows = rows < ROWS ? ROWS : rows > CHUNK ? CHUNK : (rows + ROWS - 1) / ROWS * ROWS;
    const float *row_scale = wkind == I8 ? scale : NULL;
    const uint16_t *qscale = wkind == Q4 ? scale : NULL;
    job_t j = {wkind, xkind, ykind, W, bias, x, row_scale, xf, qscale, xq, xs, xq8, xd, xo, y, M, out, in, rows,
               (out + rows - 1) / rows};
    int want = threads - 1 < j.chunks - 1 ? threads - 1 : (int)(j.chunks - 1);
    if (want <= 0 || pthread_mutex_trylock(&call_lock) != 0) { /* alone, or another thread's job runs */
        for (long c = 0; c < j.chunks; c++) run_chunk(&j, c);
        free(xf), free(xq), free(xs), free(xq8), free(xd), free(xo);
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
    free(xf), free(xq), free(xs), free(xq8), free(xd), free(xo);
    return 0;
}
