/* bfloat16 conversions and a horizontal sum, shared by inference/q4mm.c, attend1.c and
 * rmsnorm.c. */
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

#endif
