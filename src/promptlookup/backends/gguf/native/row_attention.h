/* row_attention.c's entry point and its exponential, for quantized_layers.c. */
#ifndef PROMPTLOOKUP_ROW_ATTENTION_H
#define PROMPTLOOKUP_ROW_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bounds.h"

/* exp(x) for x <= 0 (0 below -87): Cody-Waite reduction by ln 2, a degree-6 polynomial
 * (Cephes' expf coefficients), and the power of two put into the exponent. About 2 ulp. */
static inline float exp_approx(float x) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float clamped = x < -87.0f ? -87.0f : x;
    float n = (fmaf(clamped, 1.44269504088896341f, magic)) - magic;
    float r = fmaf(n, -0.693359375f, clamped);
    r = fmaf(n, 2.12194440e-4f, r);
    float poly = 1.9875691500e-4f;
    poly = fmaf(poly, r, 1.3981999507e-3f);
    poly = fmaf(poly, r, 8.3334519073e-3f);
    poly = fmaf(poly, r, 4.1665795894e-2f);
    poly = fmaf(poly, r, 1.6666665459e-1f);
    poly = fmaf(poly, r, 5.0000001201e-1f);
    poly = fmaf(poly, r * r, r);
    poly = poly + 1.0f;
    int32_t exponent = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &exponent, sizeof scale);
    return x < -87.0f ? 0.0f : poly * scale;
}

/* Every row of the call, each against its own sequence's cache (each within its last
 * `window` keys, 0: all); see row_attention.c. query_type: the element type (bounds.h) of
 * queries and outputs, kv_type: of the cached keys and values. Returns 0, or -1 when a shape or
 * type is beyond bounds.h (the caller then uses another path). */
int row_attention(int query_type, int kv_type, const void *query, void *out, int64_t rows,
                  const int64_t *row_sequence, const int64_t *row_position,
                  const int64_t *key_pointers, const int64_t *value_pointers,
                  const int64_t *capacities, int heads, int kv_heads, int head_dim,
                  float scale, int64_t window, int threads);

#endif
