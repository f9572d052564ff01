/* What gemv.c and step.c share: the dtype codes (from ops_generated.h), bfloat16 rounding, the
 * vector helpers of the instruction set the compiler targets (AVX-512, AVX2, or plain C), and gemv itself. */
#ifndef GPTZOO_KERNELS_H
#define GPTZOO_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "ops_generated.h" /* generated from abi.py: the codes and op_t that Python shares */
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

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

/* A float16 (IEEE half) as float32: a 4-bit weight block's scale or minimum. */
static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 31) u = sign | 0x7f800000u | man << 13; /* infinity, NaN */
    else if (exp != 0) u = sign | (exp + 112) << 23 | man << 13;
    else if (man == 0) u = sign;
    else { /* subnormal: normalize */
        exp = 113;
        while (!(man & 0x400u)) man <<= 1, exp--;
        u = sign | exp << 23 | (man & 0x3ffu) << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* Element i of an activation tensor of kind F32 or BF16, as float32. */
static inline float load_act(int kind, const void *p, long i) {
    return kind == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* v stored at element i, rounded to nearest even for BF16. */
static inline void store_act(int kind, void *p, long i, float v) {
    if (kind == BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

/* v as the kind holds it: what a torch operation in that dtype returns. */
static inline float round_to(int kind, float v) { return kind == BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define VW 16
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline vf load_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline vf load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline vf load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* The 4-bit codes (0..15) in VW bytes: lo from the low halves, hi from the high (a table lookup:
 * vpermps reads the low 4 bits of each index) */
static inline void load_q4(const uint8_t *p, vf *lo, vf *hi) {
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_permutexvar_ps(b, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vf;
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
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
static inline void load_q4(const uint8_t *p, vf *lo, vf *hi) {
    int64_t bytes;
    memcpy(&bytes, p, 8);
    __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#else
#define VW 1
typedef float vf;
static inline vf vzero(void) { return 0.0f; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vmul(vf a, vf b) { return a * b; }
static inline vf vset1(float x) { return x; }
static inline void vstore(float *p, vf v) { *p = v; }
static inline float vsum(vf v) { return v; }
static inline vf load_f32(const float *p) { return *p; }
static inline vf load_bf16(const uint16_t *p) { return bf16_to_f32(*p); }
static inline vf load_i8(const int8_t *p) { return (float)*p; }
static inline void load_q4(const uint8_t *p, vf *lo, vf *hi) {
    *lo = (float)(*p & 15);
    *hi = (float)(*p >> 4);
}
#endif

static inline float scalar_f32(const float *p) { return *p; }
static inline float scalar_bf16(const uint16_t *p) { return bf16_to_f32(*p); }
static inline float scalar_i8(const int8_t *p) { return (float)*p; }

/* y (M, out) = scale * (W x) + bias for x (M, in); see gemv.c. */
int gemv(int wkind, const void *W, const void *scale, const void *bias, int xkind, const void *x, int ykind,
         void *y, long M, long out, long in, int threads);

#endif
