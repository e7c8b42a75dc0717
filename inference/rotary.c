/* Rotary position embedding of bfloat16 heads (transformers' apply_rotary_pos_emb with
 * rotate_half) in one call, bit for bit torch's: x * cos rounded to bfloat16, the rotated half
 * (-x2, x1) * sin rounded, their sum rounded, each product and sum in float32 as torch's
 * bfloat16 kernels compute them. Compiled with the 4-bit kernel (inference/q4mm.py). */
#include <immintrin.h>
#include <stdint.h>

#include "simd.h"

/* out[r, h] = rotate(x[r, h]) for `rows` rows of `heads` heads `dim` wide (dim a multiple of
 * 16); x's heads packed within a row, its rows `stride` elements apart; cos and sin one
 * `dim`-wide row per row; out packed. Returns 0, or 1 for a width it does not take. */
int rotary(const uint16_t *x, long stride, const uint16_t *cos, const uint16_t *sin,
           uint16_t *out, int rows, int heads, int dim) {
    if (dim <= 0 || dim % 16) return 1;
    const int half = dim / 2;
    const __m256 flip = _mm256_set1_ps(-0.0f);
    for (int r = 0; r < rows; r++) {
        const uint16_t *c = cos + (size_t)r * (size_t)dim, *s = sin + (size_t)r * (size_t)dim;
        for (int h = 0; h < heads; h++) {
            const uint16_t *v = x + (size_t)r * (size_t)stride + (size_t)h * (size_t)dim;
            uint16_t *o = out + ((size_t)r * (size_t)heads + (size_t)h) * (size_t)dim;
            for (int i = 0; i < dim; i += 8) {
                const int other = i < half ? i + half : i - half;
                __m256 turned = load_bf16x8(v + other);
                if (i < half) turned = _mm256_xor_ps(turned, flip); /* -x2 */
                const __m256 a = round_bf16x8(_mm256_mul_ps(load_bf16x8(v + i), load_bf16x8(c + i)));
                const __m256 b = round_bf16x8(_mm256_mul_ps(turned, load_bf16x8(s + i)));
                store_bf16x8(o + i, round_bf16x8(_mm256_add_ps(a, b)));
            }
        }
    }
    return 0;
}
