/* One decoding step of a whole model in one call: a list of operations (a plan), run in order.
 *
 * gptzoo.inference.decode_plan builds the plan once per generation from each component's lowering
 * (gptzoo.inference.lowerings): every pointer in it (weights, the KV cache, the activation buffers)
 * stays valid for the whole generation, so a step costs one call from Python, not the ~50 torch
 * operations per layer of the eager forward. Only the position and the token ids change between
 * steps; the few tables that depend on the position (rotary cos/sin, a position embedding) are
 * written into their buffers by Python before the call, with the position encoding's own code.
 *
 * Each operation works on B rows (one token of each sequence) and rounds where the eager forward in
 * the activations' dtype rounds (float32 or bfloat16), so that a step computes what the eager step
 * computes, up to the order of the sums. Products go to gemv (gemv.c), with its threads; everything
 * else runs on the calling thread (it is small next to the weights).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

/* The codes (OP_, RMS_, ACT_, ATTEND_, ERR_) and one operation, op_t: its p pointers, n sizes and f
 * parameters, whose meaning per code is written at each case below; kind the activations' dtype
 * (F32 or BF16), wkind a weight's (F32, BF16, I8 or Q4). They come from gptzoo/inference/native/abi.py,
 * written as ops_generated.h (included by kernels.h) when the library is built. */

/* act(x) computed in float32, rounded once by the caller; quick_gelu rounds as its three torch
 * operations do in the activations' dtype (1.702 x, its sigmoid, the product). */
static float activate(int code, int kind, float x) {
    switch (code) {
    case ACT_QUICK_GELU: {
        float t = round_to(kind, 1.702f * x);
        return x * round_to(kind, 1.0f / (1.0f + expf(-t)));
    }
    case ACT_GELU:
        return x * 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
    case ACT_GELU_TANH: {
        const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
        float inner = beta * (x + kappa * (x * x * x));
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    case ACT_RELU:
        return x > 0.0f || x != x ? x : 0.0f;
    default: /* ACT_SILU */
        return x / (1.0f + expf(-x));
    }
}

static float dot_f32(const float *a, const void *b, int kind, long n) {
    long i = 0;
    float s = 0.0f;
#if VW > 1
    vf acc = vzero();
    for (; i + VW <= n; i += VW)
        acc = vfma(load_f32(a + i), kind == BF16 ? load_bf16((const uint16_t *)b + i) : load_f32((const float *)b + i),
                   acc);
    s = vsum(acc);
#endif
    for (; i < n; i++) s += a[i] * load_act(kind, b, i);
    return s;
}

/* n0 dim, n1 vectors per row, n2/n3 the source/destination row strides; p0 src, p1 dst, p2 weight;
 * f0 eps. Normalized in float32: x / sqrt(mean(x^2) + eps), then scaled as ``mode`` says. */
static void rmsnorm(const op_t *o, long B) {
    long dim = o->n[0];
    float eps = o->f[0];
    for (long r = 0; r < B; r++)
        for (long v = 0; v < o->n[1]; v++) {
            const char *src = (const char *)o->p[0];
            long at = r * o->n[2] + v * dim, to = r * o->n[3] + v * dim;
            float ss = 0.0f;
            for (long i = 0; i < dim; i++) {
                float x = load_act(o->kind, src, at + i);
                ss += x * x;
            }
            float inv = 1.0f / sqrtf(ss / (float)dim + eps);
            for (long i = 0; i < dim; i++) {
                float h = load_act(o->kind, src, at + i) * inv, w = load_act(o->wkind, o->p[2], i), y;
                if (o->mode == RMS_PLAIN) y = w * round_to(o->kind, h);
                else if (o->mode == RMS_SCALE_IN_FLOAT32) y = w * h;
                else y = h * (1.0f + w);
                store_act(o->kind, o->p[1], to + i, y);
            }
        }
}

/* n0 dim, n1 vectors per row, n2/n3 row strides; p0 src, p1 dst, p2 weight, p3 bias (or NULL); f0 eps. */
static void layernorm(const op_t *o, long B) {
    long dim = o->n[0];
    for (long r = 0; r < B; r++)
        for (long v = 0; v < o->n[1]; v++) {
            long at = r * o->n[2] + v * dim, to = r * o->n[3] + v * dim;
            float sum = 0.0f, var = 0.0f;
            for (long i = 0; i < dim; i++) sum += load_act(o->kind, o->p[0], at + i);
            float mean = sum / (float)dim;
            for (long i = 0; i < dim; i++) {
                float d = load_act(o->kind, o->p[0], at + i) - mean;
                var += d * d;
            }
            float rstd = 1.0f / sqrtf(var / (float)dim + o->f[0]);
            for (long i = 0; i < dim; i++) {
                float y = (load_act(o->kind, o->p[0], at + i) - mean) * rstd * load_act(o->wkind, o->p[2], i);
                if (o->p[3] != NULL) y += load_act(o->wkind, o->p[3], i);
                store_act(o->kind, o->p[1], to + i, y);
            }
        }
}

/* p0 the first head's features of row 0, n0 row stride, n1 heads, n2 head size, n3 rotary
 * features (the first ones of each head; the rest pass through); p1/p2 cos/sin (float32, n3 per
 * row, rows n4 apart: each row has its own position when prompts were left-padded).
 * Rotate-half: x cos + (-x2, x1) sin, rounded per product and sum in the activations' dtype, or
 * (mode 1) computed in float32 and rounded once. */
static void rope(const op_t *o, long B) {
    long hs = o->n[2], dim = o->n[3], half = dim / 2;
    float xs[dim > 0 ? dim : 1];
    for (long r = 0; r < B; r++)
        for (long h = 0; h < o->n[1]; h++) {
            const float *cos = (const float *)o->p[1] + r * o->n[4], *sin = (const float *)o->p[2] + r * o->n[4];
            long at = r * o->n[0] + h * hs;
            for (long i = 0; i < dim; i++) xs[i] = load_act(o->kind, o->p[0], at + i);
            for (long i = 0; i < dim; i++) {
                float rot = i < half ? -xs[i + half] : xs[i - half], y;
                if (o->mode == 1) {
                    float a = xs[i] * cos[i], b = rot * sin[i];
                    y = a + b;
                } else {
                    float a = round_to(o->kind, xs[i] * round_to(o->kind, cos[i]));
                    float b = round_to(o->kind, rot * round_to(o->kind, sin[i]));
                    y = a + b;
                }
                store_act(o->kind, o->p[0], at + i, y);
            }
        }
}

/* One query per head over the cached keys. p0 the q/k/v buffer (row 0), n0 its row stride, n1/n2/n3
 * the offsets of q, k and v in a row, n4 heads, n5 kv heads, n6 head size; p1/p2 the cache's keys
 * and values (B, n5, n7 slots, n6), key i in slot i % n7; n8 the window (0: every key); p3 out
 * (B, n4 * n6); p4 float32 scratch for the scores (n9 of them); p5 NULL, or which keys are real
 * tokens (bool, B rows n10 apart: left padding is not attended to); p6 NULL, or a sink logit per head
 * (wkind; explicit mode: a key column of its own in the softmax, whose value is dropped); f0 scale,
 * f1 softcap (0: none).
 * This token's k and v are written to the cache first. Mode ATTEND_EXPLICIT rounds as torch's
 * operations do one by one (scores, scaled, capped; probabilities before the product with V);
 * ATTEND_FUSED as scaled_dot_product_attention's CPU kernel: scores in float32, the unnormalized
 * weights rounded for the product with V, times the reciprocal of their float32 sum at the end. */
#define SUM_VECTORS 4 /* vectors of the output kept in registers across the keys */

/* acc[i] = sum over keys j < n (in order) of w[j] * V_j[i], i < hs, skipping w[j] == 0; V_j (``kind``) at
 * V + ((head + (first + j) % slots) * hs) elements. Each term a product rounded, then a sum rounded, as
 * a scalar loop would; SUM_VECTORS vectors of acc stay in registers over all the keys. */
static void weighted_sum(float *acc, const float *w, const char *V, int kind, size_t head, long first, long n,
                         long slots, long hs) {
    int size = kind == BF16 ? 2 : 4;
    long i0 = 0;
#if VW > 1
    for (; i0 + SUM_VECTORS * VW <= hs; i0 += SUM_VECTORS * VW) {
        vf sum[SUM_VECTORS];
        for (int k = 0; k < SUM_VECTORS; k++) sum[k] = vzero();
        for (long j = 0; j < n; j++) {
            if (w[j] == 0.0f) continue;
            vf p = vset1(w[j]);
            const char *v = V + ((head + (first + j) % slots) * hs + i0) * size;
            for (int k = 0; k < SUM_VECTORS; k++)
                sum[k] = vadd(sum[k], vmul(p, kind == BF16 ? load_bf16((const uint16_t *)v + k * VW)
                                                          : load_f32((const float *)v + k * VW)));
        }
        for (int k = 0; k < SUM_VECTORS; k++) vstore(acc + i0 + k * VW, sum[k]);
    }
#endif
    for (long i = i0; i < hs; i++) acc[i] = 0.0f;
    for (long j = 0; j < n && i0 < hs; j++) {
        if (w[j] == 0.0f) continue;
        const char *v = V + (head + (first + j) % slots) * hs * size;
        for (long i = i0; i < hs; i++) acc[i] += w[j] * load_act(kind, v, i);
    }
}

static int attend(const op_t *o, long B, long pos) {
    long nh = o->n[4], nkv = o->n[5], hs = o->n[6], slots = o->n[7], window = o->n[8];
    long first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    long n_keys = pos - first + 1, group = nh / nkv;
    if (n_keys > slots || n_keys > o->n[9]) return ERR_CACHE;
    int size = o->kind == BF16 ? 2 : 4;
    char *K = (char *)o->p[1], *V = (char *)o->p[2];
    float *scores = (float *)o->p[4], q[hs > 0 ? hs : 1], acc[hs > 0 ? hs : 1];
    for (long r = 0; r < B; r++) {
        const char *row = (const char *)o->p[0] + (size_t)(r * o->n[0]) * size;
        for (long g = 0; g < nkv; g++) {
            size_t head = (size_t)((r * nkv + g) * slots), at = (head + pos % slots) * hs * size;
            memcpy(K + at, row + (o->n[2] + g * hs) * size, hs * size);
            memcpy(V + at, row + (o->n[3] + g * hs) * size, hs * size);
        }
        for (long h = 0; h < nh; h++) {
            size_t head = (size_t)((r * nkv + h / group) * slots);
            for (long i = 0; i < hs; i++) q[i] = load_act(o->kind, row, o->n[1] + h * hs + i);
            float sink = o->p[6] != NULL ? round_to(o->kind, load_act(o->wkind, o->p[6], h)) : -INFINITY;
            float top = sink;
            const uint8_t *real = o->p[5] != NULL ? (const uint8_t *)o->p[5] + r * o->n[10] + first : NULL;
            for (long j = 0; j < n_keys; j++) {
                if (real != NULL && !real[j]) {
                    scores[j] = -INFINITY;
                    continue;
                }
                float s = dot_f32(q, K + (head + (first + j) % slots) * hs * size, o->kind, hs);
                if (o->mode == ATTEND_FUSED) {
                    s *= o->f[0];
                } else {
                    s = round_to(o->kind, round_to(o->kind, s) * o->f[0]);
                    if (o->f[1] != 0.0f) s = round_to(o->kind, round_to(o->kind, tanhf(round_to(o->kind, s / o->f[1]))) * o->f[1]);
                }
                scores[j] = s;
                top = s > top ? s : top;
            }
            float total = 0.0f;
            for (long j = 0; j < n_keys; j++) total += scores[j] = expf(scores[j] - top);
            if (o->p[6] != NULL) total += expf(sink - top);
            /* explicit: the probability rounded; fused: the unnormalized weight rounded, the sum divided out last */
            for (long j = 0; j < n_keys; j++)
                scores[j] = round_to(o->kind, o->mode == ATTEND_FUSED ? scores[j] : scores[j] / total);
            weighted_sum(acc, scores, V, o->kind, head, first, n_keys, slots, hs);
            if (o->mode == ATTEND_FUSED) {
                float reciprocal = 1.0f / total;
                for (long i = 0; i < hs; i++) acc[i] *= reciprocal;
            }
            for (long i = 0; i < hs; i++) store_act(o->kind, o->p[3], r * nh * hs + h * hs + i, acc[i]);
        }
    }
    return 0;
}

#if VW == 16
/* exp(x) for 16 floats: 2^n p(r), n = round(x log2 e), r = x - n ln 2 in two parts, p Cephes's
 * degree-7 polynomial of expf (within 2 ulp of the exact value), 2^n by vscalefps (so overflow gives
 * infinity and underflow 0). NaN stays NaN (the clamps take x as their second operand). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* silu and gelu_tanh of 16 floats (tanh u = 1 - 2 / (exp(2u) + 1)); 0: an activation done one by one. */
static inline int activate16(int code, const float *in, float *out) {
    __m512 x = _mm512_loadu_ps(in), one = _mm512_set1_ps(1.0f), y;
    if (code == ACT_SILU) {
        y = _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    } else if (code == ACT_GELU_TANH) {
        const __m512 beta = _mm512_set1_ps((float)(M_SQRT2 * M_2_SQRTPI * 0.5)), kappa = _mm512_set1_ps(0.044715f);
        __m512 inner = _mm512_mul_ps(beta, _mm512_fmadd_ps(kappa, _mm512_mul_ps(_mm512_mul_ps(x, x), x), x));
        __m512 e = exp16(_mm512_add_ps(inner, inner));
        __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
        y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(one, t));
    } else {
        return 0;
    }
    _mm512_storeu_ps(out, y);
    return 1;
}
#endif

/* n0 features, n1/n2 source/destination row strides; n3 1: gated, act(x[:n0]) * x[n0:2 n0], 0:
 * act(x); p0 src, p1 dst; mode the activation (silu and gelu_tanh 16 at a time where AVX-512 is). */
static void activate_rows(const op_t *o, long B) {
    long width = o->n[0];
    float in[16], out[16];
    for (long r = 0; r < B; r++)
        for (long i0 = 0; i0 < width; i0 += 16) {
            long n = width - i0 < 16 ? width - i0 : 16;
            for (long i = 0; i < n; i++) in[i] = load_act(o->kind, o->p[0], r * o->n[1] + i0 + i);
#if VW == 16
            if (n < 16 || !activate16(o->mode, in, out))
#endif
                for (long i = 0; i < n; i++) out[i] = activate(o->mode, o->kind, in[i]);
            for (long i = 0; i < n; i++) {
                float a = round_to(o->kind, out[i]);
                if (o->n[3]) a *= load_act(o->kind, o->p[0], r * o->n[1] + width + i0 + i);
                store_act(o->kind, o->p[1], r * o->n[2] + i0 + i, a);
            }
        }
}

/* p0 the first feature of row 0, n0 features, n1 row stride: x = clamp(x, f0, f1) + f2, rounded (the
 * sum; a clamp is exact). */
static void clamp_rows(const op_t *o, long B) {
    for (long r = 0; r < B; r++)
        for (long i = 0; i < o->n[0]; i++) {
            float x = load_act(o->kind, o->p[0], r * o->n[1] + i);
            x = x < o->f[0] ? o->f[0] : x > o->f[1] ? o->f[1] : x;
            store_act(o->kind, o->p[0], r * o->n[1] + i, o->f[2] != 0.0f ? x + o->f[2] : x);
        }
}

/* p0 (B rows n1 apart) one gate per row, or with n2 one per column, p1 src, p2 dst (B, n0):
 * dst = sigmoid(gate), rounded, * src. */
static void sigmoid_scale(const op_t *o, long B) {
    for (long r = 0; r < B; r++)
        for (long i = 0; i < o->n[0]; i++) {
            float g = load_act(o->kind, o->p[0], r * o->n[1] + (o->n[2] ? i : 0));
            g = round_to(o->kind, 1.0f / (1.0f + expf(-g)));
            store_act(o->kind, o->p[2], r * o->n[0] + i, g * load_act(o->kind, o->p[1], r * o->n[0] + i));
        }
}

/* The index of the largest of n values not yet taken, the first of equal ones (torch.topk leaves the
 * order of ties unspecified: experts tied at the k-th place may be chosen otherwise than by the eager forward). */
static long argmax_free(const float *x, const uint8_t *taken, long n) {
    long best = -1;
    for (long i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* A router's choice of experts (gptzoo_plugins._moe.Router), in float32. p0 the logits (B rows n0 apart,
 * the activations' dtype), p1 NULL or a score bias per expert (float32, for choosing only), p2 the
 * chosen experts (int64, B x n2, in ascending order), p3 their weights (float32, B x n2); n1 experts,
 * n2 top_k, n3 groups, n4 groups kept, n5 1: weights divided by their sum (+1e-20); mode the scoring
 * (SCORE_), n6 the group score (GROUP_); f0 the routed scale. */
static void route(const op_t *o, long B) {
    long E = o->n[1], k = o->n[2], groups = o->n[3], size = E / groups;
    float scores[E], choice[E], group_score[groups > 0 ? groups : 1], w[k];
    uint8_t taken[E], kept[groups > 0 ? groups : 1];
    long pick[k];
    for (long r = 0; r < B; r++) {
        for (long e = 0; e < E; e++) scores[e] = load_act(o->kind, o->p[0], r * o->n[0] + e);
        if (o->mode == SCORE_SOFTMAX) {
            float top = -INFINITY, total = 0.0f;
            for (long e = 0; e < E; e++) top = scores[e] > top ? scores[e] : top;
            for (long e = 0; e < E; e++) total += scores[e] = expf(scores[e] - top);
            for (long e = 0; e < E; e++) scores[e] /= total;
        } else if (o->mode == SCORE_SIGMOID) {
            for (long e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
        }
        for (long e = 0; e < E; e++) {
            choice[e] = o->p[1] != NULL ? scores[e] + ((const float *)o->p[1])[e] : scores[e];
            taken[e] = 0;
        }
        if (groups > 1) {
            for (long g = 0; g < groups; g++) {
                long first = argmax_free(choice + g * size, taken + g * size, size);
                group_score[g] = choice[g * size + first];
                if (o->n[6] == GROUP_TOP2) {
                    taken[g * size + first] = 1;
                    group_score[g] += choice[g * size + argmax_free(choice + g * size, taken + g * size, size)];
                    taken[g * size + first] = 0;
                }
            }
            for (long e = 0; e < E; e++) taken[e] = 0;
            for (long g = 0; g < groups; g++) kept[g] = 0;
            for (long i = 0; i < o->n[4]; i++) kept[argmax_free(group_score, kept, groups)] = 1;
            for (long e = 0; e < E; e++) taken[e] = !kept[e / size]; /* outside the kept groups: never chosen */
        }
        for (long i = 0; i < k; i++) taken[pick[i] = argmax_free(choice, taken, E)] = 1;
        if (o->mode == SCORE_TOPK_SOFTMAX) { /* the softmax of the chosen logits */
            float top = -INFINITY, total = 0.0f;
            for (long i = 0; i < k; i++) top = scores[pick[i]] > top ? scores[pick[i]] : top;
            for (long i = 0; i < k; i++) total += w[i] = expf(scores[pick[i]] - top);
            for (long i = 0; i < k; i++) w[i] /= total;
        } else {
            for (long i = 0; i < k; i++) w[i] = scores[pick[i]];
        }
        if (o->n[5]) {
            float total = 0.0f;
            for (long i = 0; i < k; i++) total += w[i];
            for (long i = 0; i < k; i++) w[i] /= total + 1e-20f;
        }
        if (o->f[0] != 1.0f)
            for (long i = 0; i < k; i++) w[i] *= o->f[0];
        for (long i = 1; i < k; i++) /* ascending experts: the order the eager forward adds them in */
            for (long j = i; j > 0 && pick[j - 1] > pick[j]; j--) {
                long e = pick[j];
                float v = w[j];
                pick[j] = pick[j - 1], w[j] = w[j - 1];
                pick[j - 1] = e, w[j - 1] = v;
            }
        for (long i = 0; i < k; i++) {
            ((int64_t *)o->p[2])[r * k + i] = pick[i];
            ((float *)o->p[3])[r * k + i] = w[i];
        }
    }
}

int decode_step(const op_t *ops, long n_ops, long B, long pos, const int64_t *tokens, int threads, long *failed);

/* The experts a route chose, each on the rows that chose it. p0 src, p1 dst (B, n0); p2/p3 the route's
 * experts (ascending) and weights (B x n1); p4 each of the n2 experts' operations (int64 pairs: the
 * address of its op_t array, its length), written for p5 (its input, B rows of n0) to p6 (its output);
 * p7 float32 scratch (B, n0). Expert by expert in ascending order, the rows that chose it are gathered
 * into p5's first rows and its operations run on them; each row adds weight * output, rounded, to its
 * sum, rounded, as the eager forward's index_add_ does. */
static int mixture(const op_t *o, long B, long pos, const int64_t *tokens, int threads) {
    long d = o->n[0], k = o->n[1], E = o->n[2], rows[B], slots[B];
    const int64_t *chosen = (const int64_t *)o->p[2], *table = (const int64_t *)o->p[4];
    const float *weights = (const float *)o->p[3];
    float *sum = (float *)o->p[7];
    int size = o->kind == BF16 ? 2 : 4;
    for (long i = 0; i < B * d; i++) sum[i] = 0.0f;
    for (long e = 0; e < E; e++) {
        long m = 0;
        for (long r = 0; r < B; r++)
            for (long i = 0; i < k; i++)
                if (chosen[r * k + i] == e) {
                    memcpy((char *)o->p[5] + m * d * size, (const char *)o->p[0] + r * d * size, d * size);
                    rows[m] = r, slots[m++] = i;
                }
        if (m == 0) continue;
        long inner;
        int code = decode_step((const op_t *)(intptr_t)table[2 * e], table[2 * e + 1], m, pos, tokens, threads, &inner);
        if (code != 0) return code;
        for (long j = 0; j < m; j++) {
            float w = weights[rows[j] * k + slots[j]];
            for (long i = 0; i < d; i++) {
                float y = round_to(o->kind, load_act(o->kind, o->p[6], j * d + i) * w);
                sum[rows[j] * d + i] = round_to(o->kind, sum[rows[j] * d + i] + y);
            }
        }
    }
    for (long i = 0; i < B * d; i++) store_act(o->kind, o->p[1], i, sum[i]);
    return 0;
}

/* Per head: dst's n1 columns from h * n5 = src's n1 columns from h * n3, for n0 heads; n2/n4 the
 * src/dst row strides; p0 src, p1 dst (they may be the same columns). Mode 1 de-interleaves: the pairs
 * (x0, x1), (x2, x3), ... become (x0, x2, ..., x1, x3, ...), the rotate-half order of rotary features
 * stored interleaved (DeepSeek's). A copy: nothing is rounded. */
static void slice_heads(const op_t *o, long B) {
    long width = o->n[1], half = width / 2;
    float xs[width > 0 ? width : 1];
    for (long r = 0; r < B; r++)
        for (long h = 0; h < o->n[0]; h++) {
            long at = r * o->n[2] + h * o->n[3], to = r * o->n[4] + h * o->n[5];
            for (long i = 0; i < width; i++) xs[i] = load_act(o->kind, o->p[0], at + i);
            for (long i = 0; i < width; i++)
                store_act(o->kind, o->p[1], to + i, o->mode == 1 ? xs[i < half ? 2 * i : 2 * (i - half) + 1] : xs[i]);
        }
}

/* Per head, a product of its own weight: for each of n0 heads h, dst's n1 columns from h * n7 =
 * W[h] (n1, n2; row-major, heads n3 elements apart, wkind) times src's n2 columns from h * n5; n4/n6
 * the src/dst row strides; p0 W, p1 src, p2 dst. Each head is one gemv (threaded, rounded once), its
 * rows of src gathered into a contiguous block first when B > 1. Returns 0 or ERR_MEMORY. */
static int heads_linear(const op_t *o, long B, int threads) {
    long heads = o->n[0], out = o->n[1], in = o->n[2];
    size_t size = o->kind == BF16 ? 2 : 4, wsize = o->wkind == BF16 ? 2 : 4;
    char *x = NULL, *y = NULL;
    if (B > 1) {
        x = malloc(size * (size_t)(B * in));
        y = malloc(size * (size_t)(B * out));
        if (x == NULL || y == NULL) {
            free(x), free(y);
            return ERR_MEMORY;
        }
    }
    int code = 0;
    for (long h = 0; h < heads && code == 0; h++) {
        const char *W = (const char *)o->p[0] + (size_t)(h * o->n[3]) * wsize;
        const char *src = (const char *)o->p[1] + (size_t)(h * o->n[5]) * size;
        char *dst = (char *)o->p[2] + (size_t)(h * o->n[7]) * size;
        if (B == 1) {
            code = gemv(o->wkind, W, NULL, NULL, o->kind, src, o->kind, dst, 1, out, in, threads);
            continue;
        }
        for (long r = 0; r < B; r++) memcpy(x + (size_t)(r * in) * size, src + (size_t)(r * o->n[4]) * size, in * size);
        code = gemv(o->wkind, W, NULL, NULL, o->kind, x, o->kind, y, B, out, in, threads);
        for (long r = 0; r < B; r++) memcpy(dst + (size_t)(r * o->n[6]) * size, y + (size_t)(r * out) * size, out * size);
    }
    free(x), free(y);
    return code != 0 ? ERR_MEMORY : 0;
}

/* VW elements of an activation tensor of ``kind`` from element i, as float32. */
static inline vf load_kind(int kind, const void *x, long i) {
    return kind == BF16 ? load_bf16((const uint16_t *)x + i) : load_f32((const float *)x + i);
}

#define HEADS 4 /* heads per pass over a cached latent: independent accumulators */
#define KEY_BLOCK 64 /* cached latents per pass of the weighted sum (in L1 for every head) */

/* out[k] = dot(q + k * stride, x) over n features for k < nq <= HEADS (q float32, x of ``kind``). */
static void head_dots(const float *q, long stride, int nq, const void *x, int kind, long n, float *out) {
    vf acc[HEADS];
    const float *qs[HEADS];
    for (int k = 0; k < HEADS; k++) {
        acc[k] = vzero();
        qs[k] = q + (k < nq ? k : 0) * stride;
    }
    long i = 0;
    for (; i + VW <= n; i += VW) {
        vf xv = load_kind(kind, x, i);
        for (int k = 0; k < HEADS; k++) acc[k] = vfma(load_f32(qs[k] + i), xv, acc[k]);
    }
    for (int k = 0; k < nq; k++) {
        float s = vsum(acc[k]);
        for (long t = i; t < n; t++) s += qs[k][t] * load_act(kind, x, t);
        out[k] = s;
    }
}

/* Multi-head latent attention's absorbed step (plugins/_mla.py, LatentAttention.absorbed), one query
 * per head over the cached latents. p0 the queries (row 0; n0 its row stride): per head its n3 rotated
 * rotary features, then its n2 latent query (W_k^T q_nope); p1 this token's normalized latent (n2) and
 * rotated key (n3) (row 0, n1 its row stride), written into the cache first: p2 the latents (B, n5
 * slots, n2), p3 the rotary keys (B, 1, n5, n3); p4 out (B, n4 heads x n2); p5 NULL, or which keys are
 * real tokens (bool, B rows n6 apart); f0 the scale. Per head: scores q_lat . latent_j + q_rope .
 * k_rope_j, times the scale, softmax in float32 over the real keys, out = the weighted sum of the
 * latents; rounded where the eager step rounds in the activations' dtype (each product, their sum, the
 * scaled scores, the probabilities, the weighted sum). Each cached latent is read once for the scores
 * of HEADS heads, and the weighted sums go KEY_BLOCK latents at a time, HEADS heads at a time, so the
 * latents are read from memory about once. Returns 0, ERR_CACHE or ERR_MEMORY. */
static int latent_attend(const op_t *o, long B, long pos) {
    long c = o->n[2], rd = o->n[3], nh = o->n[4], slots = o->n[5], n_keys = pos + 1, hw = rd + c;
    if (n_keys > slots) return ERR_CACHE;
    int kind = o->kind;
    size_t size = kind == BF16 ? 2 : 4;
    float *scores = malloc(sizeof(float) * (size_t)(nh * n_keys)), *acc = malloc(sizeof(float) * (size_t)(nh * c));
    float *q = malloc(sizeof(float) * (size_t)(nh * hw));
    if (scores == NULL || acc == NULL || q == NULL) {
        free(scores), free(acc), free(q);
        return ERR_MEMORY;
    }
    for (long r = 0; r < B; r++) {
        char *L = (char *)o->p[2] + (size_t)(r * slots * c) * size, *K = (char *)o->p[3] + (size_t)(r * slots * rd) * size;
        const char *kv = (const char *)o->p[1] + (size_t)(r * o->n[1]) * size;
        memcpy(L + (size_t)(pos * c) * size, kv, c * size);
        memcpy(K + (size_t)(pos * rd) * size, kv + c * size, rd * size);
        for (long i = 0; i < nh * hw; i++) q[i] = load_act(kind, o->p[0], r * o->n[0] + i);
        const uint8_t *real = o->p[5] != NULL ? (const uint8_t *)o->p[5] + r * o->n[6] : NULL;
        for (long j = 0; j < n_keys; j++) {
            const char *latent = L + (size_t)(j * c) * size, *key = K + (size_t)(j * rd) * size;
            for (long h = 0; h < nh; h += HEADS) {
                int nq = nh - h < HEADS ? (int)(nh - h) : HEADS;
                float a[HEADS], b[HEADS];
                if (real == NULL || real[j]) {
                    head_dots(q + h * hw + rd, hw, nq, latent, kind, c, a);
                    head_dots(q + h * hw, hw, nq, key, kind, rd, b);
                }
                for (int k = 0; k < nq; k++)
                    scores[(h + k) * n_keys + j] = real != NULL && !real[j]
                        ? -INFINITY
                        : round_to(kind, round_to(kind, round_to(kind, a[k]) + round_to(kind, b[k])) * o->f[0]);
            }
        }
        for (long h = 0; h < nh; h++) {
            float *s = scores + h * n_keys, top = -INFINITY, total = 0.0f;
            for (long j = 0; j < n_keys; j++) top = s[j] > top ? s[j] : top;
            for (long j = 0; j < n_keys; j++) total += s[j] = expf(s[j] - top);
            for (long j = 0; j < n_keys; j++) s[j] = round_to(kind, s[j] / total);
        }
        for (long i = 0; i < nh * c; i++) acc[i] = 0.0f;
        long full = c - c % VW;
        for (long j0 = 0; j0 < n_keys; j0 += KEY_BLOCK) {
            long j1 = j0 + KEY_BLOCK < n_keys ? j0 + KEY_BLOCK : n_keys;
            for (long i = 0; i < full; i += VW)
                for (long h = 0; h < nh; h += HEADS) {
                    int nq = nh - h < HEADS ? (int)(nh - h) : HEADS;
                    const float *p[HEADS];
                    vf sum[HEADS];
                    for (int k = 0; k < HEADS; k++) {
                        p[k] = scores + (h + (k < nq ? k : 0)) * n_keys;
                        sum[k] = load_f32(acc + (h + (k < nq ? k : 0)) * c + i);
                    }
                    for (long j = j0; j < j1; j++) {
                        vf x = load_kind(kind, L + (size_t)(j * c) * size, i);
                        for (int k = 0; k < HEADS; k++) sum[k] = vfma(vset1(p[k][j]), x, sum[k]);
                    }
                    for (int k = 0; k < nq; k++) vstore(acc + (h + k) * c + i, sum[k]);
                }
            for (long h = 0; h < nh; h++)
                for (long j = j0; j < j1; j++)
                    for (long i = full; i < c; i++)
                        acc[h * c + i] += scores[h * n_keys + j] * load_act(kind, L + (size_t)(j * c) * size, i);
        }
        for (long i = 0; i < nh * c; i++) store_act(kind, o->p[4], r * nh * c + i, acc[i]);
    }
    free(scores), free(acc), free(q);
    return 0;
}

/* Runs ``n_ops`` operations for B rows at position ``pos`` with token ids ``tokens`` (B), the
 * products on ``threads`` threads. Returns 0, or a negative ERR_ code; *failed is the operation. */
int decode_step(const op_t *ops, long n_ops, long B, long pos, const int64_t *tokens, int threads, long *failed) {
    for (long k = 0; k < n_ops; k++) {
        const op_t *o = &ops[k];
        int code = 0;
        *failed = k;
        switch (o->code) {
        case OP_EMBED: /* p0 table (n1 rows of n0, wkind), p1 out; f0 the scale (0: none) */
            for (long r = 0; r < B; r++) {
                if (tokens[r] < 0 || tokens[r] >= o->n[1]) return ERR_TOKEN;
                for (long i = 0; i < o->n[0]; i++) {
                    float x = load_act(o->wkind, o->p[0], tokens[r] * o->n[0] + i);
                    store_act(o->kind, o->p[1], r * o->n[0] + i, o->f[0] != 0.0f ? x * o->f[0] : x);
                }
            }
            break;
        case OP_ADD: /* p2 (B, n0) = p0 (B, n0) + p1 (B, n0) */
            for (long i = 0; i < B * o->n[0]; i++)
                store_act(o->kind, o->p[2], i, load_act(o->kind, o->p[0], i) + load_act(o->kind, o->p[1], i));
            break;
        case OP_RMSNORM:
            rmsnorm(o, B);
            break;
        case OP_LAYERNORM:
            layernorm(o, B);
            break;
        case OP_LINEAR: /* p0 W (n0, n1), p1 scale, p2 bias, p3 x (B, n1), p4 y (B, n0) */
            if (gemv(o->wkind, o->p[0], o->p[1], o->p[2], o->kind, o->p[3], o->kind, o->p[4], B,
                     o->n[0], o->n[1], threads) != 0)
                return ERR_MEMORY;
            break;
        case OP_ROPE:
            rope(o, B);
            break;
        case OP_ATTEND:
            code = attend(o, B, pos);
            break;
        case OP_ACTIVATE:
            activate_rows(o, B);
            break;
        case OP_SOFTCAP: /* p0 (B, n0) = tanh(x / f0) * f0, rounded at each operation */
            for (long i = 0; i < B * o->n[0]; i++) {
                float t = round_to(o->kind, tanhf(round_to(o->kind, load_act(o->kind, o->p[0], i) / o->f[0])));
                store_act(o->kind, o->p[0], i, t * o->f[0]);
            }
            break;
        case OP_CLAMP:
            clamp_rows(o, B);
            break;
        case OP_SCALE: /* p1 (B, n0) = p0 * f0, or p0 / f0 when n1, rounded once (a torch op with a number) */
            for (long i = 0; i < B * o->n[0]; i++) {
                float v = load_act(o->kind, o->p[0], i);
                store_act(o->kind, o->p[1], i, o->n[1] ? v / o->f[0] : v * o->f[0]);
            }
            break;
        case OP_SIGMOID_SCALE:
            sigmoid_scale(o, B);
            break;
        case OP_ROUTE:
            route(o, B);
            break;
        case OP_MIXTURE:
            code = mixture(o, B, pos, tokens, threads);
            break;
        case OP_COPY: /* p1 (B, n0) = p0 (B, n0) */
            if (o->p[1] != o->p[0]) memmove(o->p[1], o->p[0], (size_t)(B * o->n[0]) * (o->kind == BF16 ? 2 : 4));
            break;
        case OP_SLICE_HEADS:
            slice_heads(o, B);
            break;
        case OP_HEADS_LINEAR:
            code = heads_linear(o, B, threads);
            break;
        case OP_LATENT_ATTEND:
            code = latent_attend(o, B, pos);
            break;
        default:
            return ERR_UNKNOWN;
        }
        if (code != 0) return code;
    }
    return 0;
}
