/* 4-bit weight blocks (llama.cpp's Q4_1 layout) searched for the least squared error, each block as
 * gptzoo.inference.quantize.q4_blocks_reference computes it in torch, operation for operation: the
 * same float32 operations in the same order (sums of a block's 32 values as halves added pairwise,
 * 32 -> 16 -> ... -> 1; the scale and minimum rounded to float16 to nearest even; codes rounded half
 * to even), so the blocks are the reference's bit for bit (tests/inference/test_quantize.py). The
 * reference streams a dozen float32 temporaries of the whole matrix through memory per candidate;
 * here a block's candidates are tried while its 32 weights sit in registers.
 *
 * Rows are handed out to threads in chunks as they finish, so a thread that the OS deschedules (another
 * process on the core) holds up at most one chunk.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"

#define QB 32          /* weights per block */
#define CHUNK_BLOCKS 512 /* blocks a thread takes at a time (a multiple of LANES) */
#define MAX_THREADS 64

/* float32 -> float16 bits, rounded to nearest even (as torch's Tensor.half()): subnormals kept, a value
 * of 65520 or more in magnitude infinite. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    if (a < 0x38800000u) { /* below float16's least normal, 2^-14: a multiple of 2^-24 */
        float m;
        memcpy(&m, &a, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(m * 16777216.0f)); /* 1024 is the least normal */
    }
    return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
}

/* LANES blocks are searched at once, block l in lane l of every vector (GCC's and Clang's vector
 * extensions: AVX2's registers, or what the target has), so that a block's sums are plain additions of
 * vectors and every lane takes the same path. bvf and bvi are these block vectors, 8 lanes on every
 * target (kernels.h's vf is the target's widest register: 16 lanes with AVX-512). */
#define LANES 8
typedef float bvf __attribute__((vector_size(4 * LANES)));
typedef int32_t bvi __attribute__((vector_size(4 * LANES)));

#define MAGIC 12582912.0f /* 1.5 * 2^23: x + MAGIC - MAGIC rounds |x| < 2^22 to an integer, half to even */

static inline bvf splat(float f) { return (bvf){0} + f; }
static inline bvf pick(bvi mask, bvf a, bvf b) { return (bvf)((mask & (bvi)a) | (~mask & (bvi)b)); }

/* v[0] + ... + v[31] as the reference sums them: v[j] + v[j + 16], then halves again. */
static inline bvf total(const bvf *v) {
    bvf a[16], b[8], c[4];
    for (int j = 0; j < 16; j++) a[j] = v[j] + v[j + 16];
    for (int j = 0; j < 8; j++) b[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) c[j] = b[j] + b[j + 4];
    bvf d0 = c[0] + c[2], d1 = c[1] + c[3];
    return d0 + d1;
}

/* torch.round(t).clamp(0, 15) of a finite t, as round(clamp(t, 0, 15)): the same code (a zero's sign aside). */
static inline bvf code(bvf t) {
    t = pick(t < splat(0.0f), splat(0.0f), t);
    t = pick(t > splat(15.0f), splat(15.0f), t);
    return (t + MAGIC) - MAGIC;
}

/* The float16 nearest v (to even), as float32: torch's v.half().float() of a finite v. */
static inline bvf half_value(bvf v) {
    bvi u = (bvi)v, a = u & 0x7fffffff, sign = u & (int32_t)0x80000000u;
    bvi normal = (a + 0xfff + ((a >> 13) & 1)) & ~0x1fff;
    bvf small = (((bvf)a * 16777216.0f + MAGIC) - MAGIC) * 5.9604644775390625e-08f; /* multiples of 2^-24 */
    bvi r = ((a < 0x38800000) & (bvi)small) | ((a >= 0x38800000) & normal);
    r = ((a >= 0x477ff000) & 0x7f800000) | ((a < 0x477ff000) & r); /* past 65504: infinity */
    return (bvf)(r | sign);
}

/* The codes of the blocks x for scales d and minimums m (float16 values). */
static inline void codes(const bvf *x, bvf d, bvf m, bvf *q) {
    bvf inv = pick(d != splat(0.0f), 1.0f / d, splat(0.0f));
    for (int j = 0; j < QB; j++) q[j] = code((x[j] - m) * inv);
}

/* The squared errors of the blocks x for scales d and minimums m (float16 values) and their codes. */
static inline bvf error(const bvf *x, bvf d, bvf m) {
    bvf q[QB], e[QB];
    codes(x, d, m, q);
    for (int j = 0; j < QB; j++) {
        bvf r = q[j] * d + m - x[j];
        e[j] = r * r;
    }
    return total(e);
}

/* LANES blocks, w + QB * block[l] for l < count (the others repeat the last): codes packed two to a byte
 * (weight j low, j + 16 high), float16 scales and minimums at d[block] and m[block]. A candidate's codes are
 * not kept: the winner's are taken again from its scale and minimum, as the same arithmetic gives them. */
static void q4_lanes(const float *w, long first, int count, const float *ranges, int nranges, uint8_t *packed,
                     uint16_t *scale, long blocks_per_row) {
    bvf x[QB];
    for (int j = 0; j < QB; j++)
        for (int l = 0; l < LANES; l++) x[j][l] = w[(first + (l < count ? l : count - 1)) * QB + j];
    bvf lo = x[0], hi = x[0];
    for (int j = 1; j < QB; j++) {
        lo = pick(x[j] < lo, x[j], lo);
        hi = pick(x[j] > hi, x[j], hi);
    }
    bvf span = hi - lo, sums = total(x), zero = splat(0.0f);
    bvi spread = span > zero;
    bvf best_d = half_value(span / 15.0f), best_m = half_value(lo), best = error(x, best_d, best_m);
    for (int k = 0; k < nranges; k++) {
        bvf step = pick(spread, ranges[k] / span, zero), q[QB], qq[QB], qx[QB];
        for (int j = 0; j < QB; j++) {
            q[j] = code((x[j] - lo) * step);
            qq[j] = q[j] * q[j];
            qx[j] = q[j] * x[j];
        }
        bvf sq = total(q), sqq = total(qq), sqx = total(qx);
        bvf det = (float)QB * sqq - sq * sq;
        bvi fitted = det > zero;
        bvf d = ((float)QB * sqx - sq * sums) / pick(fitted, det, splat(1.0f));
        d = pick(fitted, d, span / 15.0f);
        bvf m = half_value(pick(fitted, (sums - d * sq) / (float)QB, lo));
        d = half_value(d);
        bvf err = error(x, d, m);
        bvi better = err < best;
        best_d = pick(better, d, best_d), best_m = pick(better, m, best_m), best = pick(better, err, best);
    }
    bvf q[QB];
    codes(x, best_d, best_m, q);
    for (int l = 0; l < count; l++) {
        long b = first + l, row = b / blocks_per_row, at = row * 2 * blocks_per_row + b % blocks_per_row;
        for (int j = 0; j < QB / 2; j++)
            packed[b * (QB / 2) + j] = (uint8_t)((uint8_t)q[j][l] | (uint8_t)q[j + QB / 2][l] << 4);
        scale[at] = f32_to_f16(best_d[l]), scale[at + blocks_per_row] = f32_to_f16(best_m[l]);
    }
}

typedef struct {
    const float *w, *ranges;
    uint8_t *packed;
    uint16_t *scale;
    long blocks, blocks_per_row;
    int nranges;
    atomic_long next; /* the next chunk of blocks to take */
} q4_job_t;

static void *q4_take(void *arg) {
    q4_job_t *j = arg;
    for (long c; (c = atomic_fetch_add(&j->next, 1)) * CHUNK_BLOCKS < j->blocks;) {
        long end = (c + 1) * CHUNK_BLOCKS < j->blocks ? (c + 1) * CHUNK_BLOCKS : j->blocks;
        for (long b = c * CHUNK_BLOCKS; b < end; b += LANES)
            q4_lanes(j->w, b, end - b < LANES ? (int)(end - b) : LANES, j->ranges, j->nranges, j->packed, j->scale,
                     j->blocks_per_row);
    }
    return NULL;
}

/* w (rows, in) float32, finite and at most 65504 in magnitude, in a multiple of 32, into packed (rows, in / 2)
 * codes and scale (rows, 2, in / 32) float16 bits (a row's scales, then its minimums), on up to `threads`
 * threads. Returns 0. */
int q4_quantize(const float *w, long rows, long in, const float *ranges, int nranges, uint8_t *packed,
                uint16_t *scale, int threads) {
    q4_job_t j = {w, ranges, packed, scale, rows * (in / QB), in / QB, nranges, 0};
    pthread_t helpers[MAX_THREADS];
    int n = 0, want = threads < MAX_THREADS ? threads : MAX_THREADS;
    long chunks = (j.blocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
    for (; n < want - 1 && n < chunks - 1; n++)
        if (pthread_create(&helpers[n], NULL, q4_take, &j) != 0) break;
    q4_take(&j);
    for (int k = 0; k < n; k++) pthread_join(helpers[k], NULL);
    return 0;
}
