/* RMS norm of bfloat16 rows (LlamaRMSNorm's arithmetic) in one call.
 *
 * Per row: the squares of its values summed in float32, divided by the width, plus eps, one
 * over its square root; each value times that, rounded to bfloat16, times the weight, rounded
 * to bfloat16 again: transformers' dtypes and roundings, nine torch calls in one. The sum runs
 * in 8 lanes in a fixed order (not torch's), so its last bit may differ from transformers'
 * norm; every path of a model then normalizes with this one (inference/rmsnorm.py).
 *
 * Each row is computed on its own, so a row's result does not depend on the rows beside it.
 * Compiled with the 4-bit kernel (inference/q4mm.py). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd.h"

/* out[r] = rms_norm(x[r]) * w for `rows` packed rows, each `dim` wide (a multiple of 8).
 * Returns 0, or 1 for a width it does not take. */
int rmsnorm(const uint16_t *x, const uint16_t *w, uint16_t *out, int rows, int dim, float eps) {
    if (dim <= 0 || dim % 8) return 1;
    for (int r = 0; r < rows; r++) {
        const uint16_t *row = x + (size_t)r * (size_t)dim;
        uint16_t *o = out + (size_t)r * (size_t)dim;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < dim; i += 8) {
            const __m256 v = load_bf16x8(row + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        const __m256 scale = _mm256_set1_ps(1.0f / sqrtf(hsum(acc) / (float)dim + eps));
        for (int i = 0; i < dim; i += 8) {
            const __m256 h = round_bf16x8(_mm256_mul_ps(load_bf16x8(row + i), scale));
            store_bf16x8(o + i, round_bf16x8(_mm256_mul_ps(load_bf16x8(w + i), h)));
        }
    }
    return 0;
}
