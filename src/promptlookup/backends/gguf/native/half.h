/* 16-bit floats for the kernels: float16 (IEEE binary16) and bfloat16, to float32 (exact: every
 * 16-bit value is a float32) and from float32 (rounded to nearest, ties to even, as torch's
 * .to() rounds), one value at a time and in runs. The element types are bounds.h's ELEMENT_*.
 *
 * float16 converts with the CPU's F16C instructions where it has them (vcvtph2ps, vcvtps2ph:
 * IEEE conversions, the same bits as the portable functions here, which
 * tests/test_kv_dtype.py checks against torch through half_convert). */
#ifndef PROMPTLOOKUP_HALF_H
#define PROMPTLOOKUP_HALF_H

#include <stdint.h>
#include <string.h>

#include "bounds.h"  /* ELEMENT_FLOAT32, ELEMENT_BFLOAT16, ELEMENT_FLOAT16 */

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline uint32_t float_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

static inline float bits_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* bfloat16: the high half of a float32. */
static inline float bf16_to_float(uint16_t x) { return bits_float((uint32_t)x << 16); }

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits = float_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

/* float16, in portable C: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline float f16_to_float_portable(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float32 */
        const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13)); /* inf, NaN */
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline uint16_t float_to_f16_portable(float f) {
    const uint32_t bits = float_bits(f);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) /* NaN: quiet, its top mantissa bits kept */
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: inf */
    if (magnitude >= 0x38800000u) { /* a normal float16 (2^-14 and up): rebias, round */
        uint32_t rebiased = magnitude - 0x38000000u; /* exponent - 127 + 15 */
        rebiased += 0xfffu + ((rebiased >> 13) & 1u);
        return (uint16_t)(sign | (rebiased >> 13));
    }
    if (magnitude <= 0x33000000u) return sign; /* 2^-25 and below round to zero */
    /* A subnormal float16: the float's 24-bit significand shifted to units of 2^-24. */
    const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const int shift = 126 - (int)(magnitude >> 23); /* 14 .. 24 */
    uint32_t rounded = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (rounded & 1u))) rounded++;
    return (uint16_t)(sign | rounded); /* 0x400: rounded up to the least normal */
}

static inline float f16_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return f16_to_float_portable(h);
#endif
}

static inline uint16_t float_to_f16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, 0); /* 0: round to nearest even */
#else
    return float_to_f16_portable(f);
#endif
}

/* to[i] = from[i] as float32, i < n, from an array of element type `type`. */
static inline void run_to_float(const void *from, int type, int64_t n, float *to) {
    if (type == ELEMENT_FLOAT32) {
        memcpy(to, from, sizeof(float) * (size_t)n);
    } else if (type == ELEMENT_BFLOAT16) {
        const uint16_t *half = (const uint16_t *)from;
        for (int64_t i = 0; i < n; i++) to[i] = bf16_to_float(half[i]);
    } else {
        const uint16_t *half = (const uint16_t *)from;
        int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(to + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(half + i))));
#endif
        for (; i < n; i++) to[i] = f16_to_float(half[i]);
    }
}

/* The element `index` of an array of element type `type`, set to x (rounded). */
static inline void store_element(void *array, int type, int64_t index, float x) {
    if (type == ELEMENT_FLOAT32) ((float *)array)[index] = x;
    else if (type == ELEMENT_BFLOAT16) ((uint16_t *)array)[index] = float_to_bf16(x);
    else ((uint16_t *)array)[index] = float_to_f16(x);
}

/* Bytes per element of type `type`. */
static inline int element_size(int type) { return type == ELEMENT_FLOAT32 ? 4 : 2; }

#endif
