/* bfloat16 conversions and a horizontal sum, shared by inference/q4mm.c, attend1.c,
 * rmsnorm.c and rotary.c. */
#ifndef TOKENSTREAM_SIMD_H
#define TOKENSTREAM_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
    bits += 0x7fff + ((bits >> 16) & 1); /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

/* 8 bfloat16 values as float32 lanes. */
static inline __m256 load_bf16x8(const uint16_t *p) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* float32 lanes rounded to bfloat16 (to nearest, ties to even; NaN kept), still float32. */
static inline __m256 round_bf16x8(__m256 f) {
    const __m256i bits = _mm256_castps_si256(f), high = _mm256_set1_epi32((int)0xffff0000);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_and_si256(up, high)),
                            _mm256_castsi256_ps(_mm256_and_si256(quiet, high)), nan);
}

/* 8 float32 lanes that hold bfloat16 values exactly, stored as bfloat16. */
static inline void store_bf16x8(uint16_t *p, __m256 f) {
    const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(f), 16);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
    _mm_storeu_si128((__m128i *)p, packed);
}

#endif
