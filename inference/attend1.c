/* Attention for one query per row (a decode step) on bfloat16 keys and values, in float32.
 *
 * torch's version (inference/attention.py's fallback) is ten calls a layer, each converting or
 * allocating, and on a slow CPU the calls cost more than the arithmetic (bench/README.md).
 * Here the same arithmetic is one call: per row and key head, every score (the query's dot
 * product with a key, times the scale, plus an additive mask), the softmax over the keys the
 * row attends (float32, against the largest score), and the weighted sum of the values,
 * rounded once to bfloat16.
 *
 * Each row's result is computed on its own, key after key in order, so it does not depend on
 * the other rows, the number of threads, or keys that are masked out (a masked key is skipped:
 * the same bits as if it were absent). Compiled with the 4-bit kernel (inference/q4mm.py). */
#include <immintrin.h>
#include <math.h> /* INFINITY */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* e^x in each lane: Cephes' expf, within 1 ulp of e^x over [-87.3, 0] (the range used here:
 * a score minus the largest), 0 below it, NaN kept. The same bits for a value whatever its
 * lane, so a key's weight does not depend on where it falls in a vector. */
static inline __m256 exp8(__m256 x) {
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), given = x;
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                               _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
    return _mm256_blendv_ps(y, given, nan); /* NaN stays NaN, as in torch's softmax */
}

/* s[t] = e^(s[t] - top) for t < T, 8 at a time (the last few through a padded copy). */
static inline void exp_shifted(float *s, int T, float top) {
    const __m256 shift = _mm256_set1_ps(top);
    int t = 0;
    for (; t + 8 <= T; t += 8)
        _mm256_storeu_ps(s + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift)));
    if (t < T) {
        float pad[8] = {0};
        memcpy(pad, s + t, sizeof(float) * (size_t)(T - t));
        _mm256_storeu_ps(pad, exp8(_mm256_sub_ps(_mm256_loadu_ps(pad), shift)));
        memcpy(s + t, pad, sizeof(float) * (size_t)(T - t));
    }
}

#define MAX_GROUP 8 /* query heads per key head done together; more go in several passes */

/* One (row, key head): its `group` (<= MAX_GROUP) query heads [group, dim] (float32) against
 * T keys. Each key is read once for all of them; `scores` has room for group * T. */
static inline __attribute__((always_inline)) void attend_heads(
                         const float *q, const int group, int dim, const uint16_t *k, long k_st,
                         const uint16_t *v, long v_st, const uint8_t *keep, long keep_st,
                         const float *add, long add_st, int T, float scaling, float *scores,
                         uint16_t *out) {
    float top[MAX_GROUP], total[MAX_GROUP];
    for (int h = 0; h < group; h++) top[h] = -INFINITY, total[h] = 0.0f;
    for (int t = 0; t < T; t++) {
        if (keep && !keep[t * keep_st]) {
            for (int h = 0; h < group; h++) scores[(size_t)h * T + t] = -INFINITY;
            continue;
        }
        const uint16_t *kt = k + t * k_st;
        __m256 acc[MAX_GROUP];
        for (int h = 0; h < group; h++) acc[h] = _mm256_setzero_ps();
        for (int d = 0; d < dim; d += 8) {
            const __m256 kd = load_bf16x8(kt + d);
            for (int h = 0; h < group; h++)
                acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * dim + d), kd, acc[h]);
        }
        for (int h = 0; h < group; h++) {
            float x = hsum(acc[h]) * scaling;
            if (add) x += add[t * add_st];
            scores[(size_t)h * T + t] = x;
            top[h] = x > top[h] ? x : top[h];
        }
    }
    for (int h = 0; h < group; h++) {
        float *s = scores + (size_t)h * T;
        /* a masked key's -inf gives 0: adding it changes no sum, and the values skip it */
        exp_shifted(s, T, top[h]);
        for (int t = 0; t < T; t++) total[h] += s[t];
        for (int t = 0; t < T; t++) s[t] = s[t] / total[h];
    }
    /* the values in slices of 32 dims (16 for more than two heads), so every head's
     * accumulators stay in registers */
    const int width = group <= 2 ? 32 : 16;
    for (int d0 = 0; d0 < dim; d0 += width) {
        const int n = (dim - d0 < width ? dim - d0 : width) / 8;
        __m256 o[MAX_GROUP][4];
        for (int h = 0; h < group; h++)
            for (int j = 0; j < n; j++) o[h][j] = _mm256_setzero_ps();
        for (int t = 0; t < T; t++) {
            if (keep && !keep[t * keep_st]) continue;
            const uint16_t *vt = v + t * v_st + d0;
            __m256 vv[4];
            for (int j = 0; j < n; j++) vv[j] = load_bf16x8(vt + 8 * j);
            for (int h = 0; h < group; h++) {
                const __m256 w = _mm256_set1_ps(scores[(size_t)h * T + t]);
                for (int j = 0; j < n; j++) o[h][j] = _mm256_fmadd_ps(w, vv[j], o[h][j]);
            }
        }
        for (int h = 0; h < group; h++) {
            float part[32];
            for (int j = 0; j < n; j++) _mm256_storeu_ps(part + 8 * j, o[h][j]);
            for (int d = 0; d < 8 * n; d++) out[h * dim + d0 + d] = f32_to_bf16(part[d]);
        }
    }
}

/* attend_heads with the group a constant, so each head's accumulators stay in registers */
static void by_group(const float *q, int group, int dim, const uint16_t *k, long k_st,
                     const uint16_t *v, long v_st, const uint8_t *keep, long keep_st,
                     const float *add, long add_st, int T, float scaling, float *scores,
                     uint16_t *out) {
#define GROUP(n)                                                                             \
    case n:                                                                                  \
        attend_heads(q, n, dim, k, k_st, v, v_st, keep, keep_st, add, add_st, T, scaling,    \
                     scores, out);                                                           \
        break;
    switch (group) {
        GROUP(1) GROUP(2) GROUP(3) GROUP(4) GROUP(5) GROUP(6) GROUP(7) GROUP(8)
    }
#undef GROUP
}

/* out [b, heads, dim] = attention of q [b, heads, dim] (rows q_sb elements apart, each
 * row's heads and dims contiguous) over T keys and values
 * (element strides: per row, per key head, per key; dim contiguous); keep [b, T] (nonzero:
 * attend) and add [b, T] (added to the scores) are optional (NULL), with strides per row and
 * per key. Returns 0, -1 where the shapes do not fit, -2 where memory ran out. */
int attend1(const uint16_t *q, long q_sb, const uint16_t *k, long k_sb, long k_sh, long k_st,
            const uint16_t *v, long v_sb, long v_sh, long v_st, const uint8_t *keep,
            long keep_sb, long keep_st, const float *add, long add_sb, long add_st, int b,
            int heads, int kv_heads, int T, int dim, float scaling, uint16_t *out) {
    if (b <= 0 || T <= 0 || kv_heads <= 0 || heads % kv_heads || dim % 8 || dim > 128) return -1;
    const int group = heads / kv_heads, tasks = b * kv_heads;
    int failed = 0;
    /* threads only where there is work for them: a few hundred keys are a few microseconds */
#pragma omp parallel if (tasks > 1 && (long)tasks * T * heads > 16384)
    {
        float *scores = malloc(sizeof(float) * (size_t)T * MAX_GROUP);
        float *qf = malloc(sizeof(float) * (size_t)group * dim);
        if (!scores || !qf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; task++) {
            if (!scores || !qf) continue;
            const int i = task / kv_heads, g = task % kv_heads;
            const uint16_t *qi = q + i * q_sb + (size_t)g * group * dim;
            for (int e = 0; e < group * dim; e++) qf[e] = bf16_to_f32(qi[e]);
            for (int h0 = 0; h0 < group; h0 += MAX_GROUP)
                by_group(qf + (size_t)h0 * dim, group - h0 < MAX_GROUP ? group - h0 : MAX_GROUP,
                         dim, k + i * k_sb + g * k_sh, k_st, v + i * v_sb + g * v_sh, v_st,
                         keep ? keep + i * keep_sb : NULL, keep_st,
                         add ? add + i * add_sb : NULL, add_st, T, scaling, scores,
                         out + ((size_t)i * heads + (size_t)(g * group + h0)) * dim);
        }
        free(scores);
        free(qf);
    }
    return failed ? -2 : 0;
}
