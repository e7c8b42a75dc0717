/* 4-bit weights (GGUF Q4_1's blocks), and 8-bit ones (Q8_0's), times bfloat16 activations, for few-row decode on CPUs
 * where torch's int4 kernel is compute-bound (AVX2 without AVX-512: it converts every code to
 * float). As llama.cpp does, each activation row is first quantized to int8 in blocks of 32
 * (one float scale each), so a block's dot product is integer multiply-adds.
 *
 * Every output row is computed on its own with the same sequence of operations whatever the
 * number of rows, so a stream's logits do not depend on the batch it shares a step with.
 * Compiled at run time for the machine it runs on (inference/native_kernel.py). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define QK 32

typedef struct {
    float d; /* scale */
    float s; /* d * sum of the codes */
} scale_q8;

/* The LM head's sum of each 4 adjacent products of unsigned bytes u and signed bytes s, as
 * int32. With VNNI one instruction does it; without, two, whose int16 middle step cannot
 * saturate here (|u| <= 128, |s| <= 127: a pair sums to at most 32,512), so both give the
 * same sums and a reply does not depend on which CPU family built the kernel. */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* One row of `in` bfloat16 values -> int8 codes and a scale (and code sum) per block. */
static void quantize_row(const uint16_t *x, int in, int8_t *q, scale_q8 *sc) {
    for (int b = 0; b < in / QK; b++) {
        float v[QK], amax = 0.0f;
        for (int i = 0; i < QK; i++) {
            v[i] = bf16_to_f32(x[b * QK + i]);
            float a = v[i] < 0 ? -v[i] : v[i];
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            int c = (int)__builtin_roundf(v[i] * id);
            q[b * QK + i] = (int8_t)c;
            sum += c;
        }
        sc[b].d = d;
        sc[b].s = d * (float)sum;
    }
}

#define MAX_ROWS 4
#define GROUP 8 /* outputs whose 4-bit blocks lie interleaved (q4mm.py's interleave) */

/* 4 int8 activations, the same in each of the 8 lanes */
static inline __m256i bcast4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* Products of unsigned codes u and signed activations s, added to acc: with VNNI each 4
 * adjacent ones into an int32 lane, in one instruction; without, each 2 into an int16 lane
 * (maddubs), widened to int32 once per block in dot_group. Both give the same exact sums. */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define VNNI 1
static inline __m256i acc_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#else
#define VNNI 0
/* codes <= 15 and |activations| <= 127: a pair of products sums to at most 3,810, and a
 * block's 8 such pairs per lane to 30,480, so the int16 sums neither saturate nor wrap */
static inline __m256i acc_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
}
#endif

/* Group g's 8 outputs for ROWS rows: per 32-input block b, each output's exact integer dot
 * product, then acc = (d_w * d_x) * sum + acc, acc = m_w * s_x + acc, in float32, one block
 * after another. An output's arithmetic is its own row's and its own weights' alone, so its
 * bits do not depend on the rows or outputs computed beside it. */
static inline __attribute__((always_inline)) void dot_group(
    const uint8_t *w, const int8_t *q, const scale_q8 *sc, const int ROWS, int nb, int in,
    int out, int g, uint16_t *y) {
    const __m256i low_mask = _mm256_set1_epi8(0x0f);
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *blk = w + (size_t)g * nb * GROUP * 20;
    for (int b = 0; b < nb; b++, blk += GROUP * 20) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
        __m256i sums[MAX_ROWS];
        for (int r = 0; r < ROWS; r++) sums[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * c));
            const __m256i lo = _mm256_and_si256(raw, low_mask);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
            for (int r = 0; r < ROWS; r++) {
                const int8_t *x = q + (size_t)r * in + b * QK;
                sums[r] = acc_u8s8(sums[r], lo, bcast4(x + 4 * c));
                sums[r] = acc_u8s8(sums[r], hi, bcast4(x + 4 * c + 16));
            }
        }
        for (int r = 0; r < ROWS; r++) {
            const scale_q8 s = sc[(size_t)r * nb + b];
#if VNNI
            const __m256i isum = sums[r];
#else
            const __m256i isum = _mm256_madd_epi16(sums[r], _mm256_set1_epi16(1));
#endif
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(s.d));
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[r]);
            acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(s.s), acc[r]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        store_bf16x8(y + (size_t)r * out + (size_t)g * GROUP, round_bf16x8(acc[r]));
}

/* outputs [lo, hi) (whole groups) */
static inline __attribute__((always_inline)) void dot_rows(
    const uint8_t *w, const int8_t *q, const scale_q8 *sc, const int ROWS, int in, int out,
    int lo, int hi, uint16_t *y) {
    const int nb = in / QK;
    for (int g = lo / GROUP; g < hi / GROUP; g++) dot_group(w, q, sc, ROWS, nb, in, out, g, y);
}

/* The LM head's weights: GGUF's Q8_0, 32 int8 codes with a float16 scale. */
typedef struct {
    uint16_t d;
    int8_t qs[QK];
} block_q8_0;

static inline __attribute__((always_inline)) void block8(
    const block_q8_0 *blk, const int8_t *q, const scale_q8 *sc, const int ROWS, int b, int nb,
    int in, __m256 *acc) {
    const float dw = _cvtsh_ss(blk->d);
    const __m256i codes = _mm256_loadu_si256((const __m256i *)blk->qs);
    /* maddubs wants one unsigned operand: |w| times x with w's sign */
    const __m256i mag = _mm256_sign_epi8(codes, codes);
    for (int r = 0; r < ROWS; r++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(q + (size_t)r * in + b * QK));
        const __m256i sums = dot_u8s8(mag, _mm256_sign_epi8(xq, codes));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * sc[(size_t)r * nb + b].d),
                                 _mm256_cvtepi32_ps(sums), acc[r]);
    }
}

static inline __attribute__((always_inline)) void dot_rows8(
    const block_q8_0 *w, const int8_t *q, const scale_q8 *sc, const int ROWS, int in, int out,
    int lo, int hi, uint16_t *y) {
    const int nb = in / QK;
    for (int o = lo; o < hi; o++) {
        const block_q8_0 *wb = w + (size_t)o * nb;
        __m256 even[MAX_ROWS], odd[MAX_ROWS];
        for (int r = 0; r < ROWS; r++) even[r] = odd[r] = _mm256_setzero_ps();
        int b = 0;
        for (; b + 1 < nb; b += 2) {
            block8(wb + b, q, sc, ROWS, b, nb, in, even);
            block8(wb + b + 1, q, sc, ROWS, b + 1, nb, in, odd);
        }
        if (b < nb) block8(wb + b, q, sc, ROWS, b, nb, in, even);
        for (int r = 0; r < ROWS; r++)
            y[(size_t)r * out + o] = f32_to_bf16(hsum(_mm256_add_ps(even[r], odd[r])));
    }
}

typedef void (*dot_fn)(const void *, const int8_t *, const scale_q8 *, int, int, int, int, int,
                       uint16_t *);

/* `dot` with ROWS a constant, for each row count a call may have (up to MAX_ROWS) */
#define BY_ROWS(dot, blocks)                                                                 \
    switch (rows) {                                                                          \
    case 1: dot(blocks, q, sc, 1, in, out, lo, hi, y); break;                                \
    case 2: dot(blocks, q, sc, 2, in, out, lo, hi, y); break;                                \
    case 3: dot(blocks, q, sc, 3, in, out, lo, hi, y); break;                                \
    default: dot(blocks, q, sc, 4, in, out, lo, hi, y); break;                               \
    }

static void dot_outputs4(const void *w, const int8_t *q, const scale_q8 *sc, int rows, int in,
                         int out, int lo, int hi, uint16_t *y) {
    BY_ROWS(dot_rows, (const uint8_t *)w)
}

static void dot_outputs8(const void *w, const int8_t *q, const scale_q8 *sc, int rows, int in,
                         int out, int lo, int hi, uint16_t *y) {
    BY_ROWS(dot_rows8, (const block_q8_0 *)w)
}

/* y [rows, out] = x [rows, in] (bfloat16) times the weights, in bfloat16. The outputs are
 * shared among the calling thread's OpenMP team (torch's: the same runtime, so
 * torch.set_num_threads sets its size). Returns 0, -1 where the shapes do not fit, -2 where
 * memory ran out. */
static int matmul(dot_fn dot, const void *weights, const uint16_t *x, int rows, int in, int out,
                  uint16_t *y) {
    if (rows <= 0 || in <= 0 || out <= 0 || in % QK) return -1;
    const int nb = in / QK;
    int8_t *q = malloc((size_t)rows * in + (size_t)rows * nb * sizeof(scale_q8));
    if (!q) return -2;
    scale_q8 *sc = (scale_q8 *)(q + (size_t)rows * in);
    for (int r = 0; r < rows; r++)
        quantize_row(x + (size_t)r * in, in, q + (size_t)r * in, sc + (size_t)r * nb);
    const int chunk = 32, chunks = (out + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (chunks > 1 && omp_get_max_threads() > 1)
    for (int c = 0; c < chunks; c++) {
        const int lo = c * chunk, hi = lo + chunk < out ? lo + chunk : out;
        for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
            const int n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
            dot(weights, q + (size_t)r0 * in, sc + (size_t)r0 * nb, n, in, out, lo, hi,
                y + (size_t)r0 * out);
        }
    }
    free(q);
    return 0;
}

/* Q4_1 blocks (20 bytes per 32 weights), 8 outputs' interleaved (q4mm.py's interleave). */
int q4mm(const void *weights, const uint16_t *x, int rows, int in, int out, uint16_t *y) {
    if (out % GROUP) return -1;
    return matmul(dot_outputs4, weights, x, rows, in, out, y);
}

/* Q8_0 blocks (34 bytes per 32 weights). */
int q8mm(const void *weights, const uint16_t *x, int rows, int in, int out, uint16_t *y) {
    return matmul(dot_outputs8, weights, x, rows, in, out, y);
}
