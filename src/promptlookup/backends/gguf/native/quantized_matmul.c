/* Matrix products over quantized weights whose every output is computed by one fixed formula.
 *
 * A weight matrix W (N outputs x K inputs) is stored in panels of LANES outputs. Within a
 * panel, each block of B inputs (B = 16 or 32) has a header, the LANES outputs' scales s (and,
 * where the format has one, their offsets m), then the block's integers q, input by input, one
 * lane per output. Scales and offsets are float32, or float16 where every one of the tensor's
 * is a float16 exactly (the formats whose file stores them so: fewer bytes to read, the same
 * values, widened exactly):
 *   4 bits: B/2 lines of LANES bytes, byte (j, l) = q[2j][l] | q[2j + 1][l] << 4  (q in 0..15)
 *   8 bits: B lines of LANES signed bytes                                         (q in -128..127)
 * The weight is w[k][n] = fmaf(q, s, m) (m = 0 without offsets): the GGUF file's integers and
 * scales, with no other rounding than that one.
 *
 * For one row x of the input and one output n:
 *   y[n] = fmaf chain over k = 0..K-1 of w[k][n] * x[k], from 0, then + bias[n]
 * computed lane by lane: each lane holds one output, so how many rows or panels share a call,
 * which thread computes them, and whether the lanes are AVX-512 registers or plain C floats
 * change nothing (every operation is an exact IEEE one: built without -ffast-math and with
 * -ffp-contract=off, fmaf written out). Rows go through the same panel together (ROWS_MAX at a
 * time, the integers converted once for all of them), each with its own accumulators.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quantized_matmul.h"  /* struct weights; bounds.h: PANEL_LANES */

/* A float16's value as a float32 (exact: every float16 is a float32). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 31u,
                   mantissa = h & 1023u;
    uint32_t bits;
    if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else {
        const float value = (float)mantissa * 5.9604644775390625e-8f;  /* 2^-24: exact */
        memcpy(&bits, &value, sizeof bits);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define LANES PANEL_LANES  /* outputs per panel */

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vload_half(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
/* LANES bytes of two 4-bit integers each: the low nibbles and the high nibbles, as floats. */
static inline void u4_pair(const uint8_t *bytes, vf *low, vf *high) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    *low = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    *high = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}
static inline vf i8_line(const uint8_t *bytes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)bytes)));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef struct { __m256 a, b; } vf;  /* lanes 0-7, 8-15 */
static inline vf vzero(void) { vf r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline vf vset1(float x) { vf r = {_mm256_set1_ps(x), _mm256_set1_ps(x)}; return r; }
static inline vf vload(const float *p) { vf r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; return r; }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v.a); _mm256_storeu_ps(p + 8, v.b); }
static inline vf vfma(vf a, vf b, vf c) {
    vf r = {_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)};
    return r;
}
static inline vf vadd(vf a, vf b) { vf r = {_mm256_add_ps(a.a, b.a), _mm256_add_ps(a.b, b.b)}; return r; }
static inline vf vload_half(const uint8_t *p) {
#if defined(__F16C__)
    vf r = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
#else
    float lanes[LANES];
    for (int i = 0; i < LANES; i++) lanes[i] = half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    vf r = vload(lanes);
#endif
    return r;
}
static inline void u4_pair(const uint8_t *bytes, vf *low, vf *high) {
    const __m256i mask = _mm256_set1_epi32(15);
    __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
    __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bytes + 8)));
    low->a = _mm256_cvtepi32_ps(_mm256_and_si256(v0, mask));
    low->b = _mm256_cvtepi32_ps(_mm256_and_si256(v1, mask));
    high->a = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
    high->b = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
}
static inline vf i8_line(const uint8_t *bytes) {
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)bytes))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(bytes + 8))))};
    return r;
}
#else
typedef struct { float l[LANES]; } vf;
static inline vf vzero(void) { vf r; for (int i = 0; i < LANES; i++) r.l[i] = 0.0f; return r; }
static inline vf vset1(float x) { vf r; for (int i = 0; i < LANES; i++) r.l[i] = x; return r; }
static inline vf vload(const float *p) { vf r; memcpy(r.l, p, sizeof r.l); return r; }
static inline void vstore(float *p, vf v) { memcpy(p, v.l, sizeof v.l); }
static inline vf vfma(vf a, vf b, vf c) {
    vf r;
    for (int i = 0; i < LANES; i++) r.l[i] = fmaf(a.l[i], b.l[i], c.l[i]);
    return r;
}
static inline vf vadd(vf a, vf b) {
    vf r;
    for (int i = 0; i < LANES; i++) r.l[i] = a.l[i] + b.l[i];
    return r;
}
static inline vf vload_half(const uint8_t *p) {
    vf r;
    for (int i = 0; i < LANES; i++) r.l[i] = half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    return r;
}
static inline void u4_pair(const uint8_t *bytes, vf *low, vf *high) {
    for (int i = 0; i < LANES; i++) {
        low->l[i] = (float)(bytes[i] & 15);
        high->l[i] = (float)(bytes[i] >> 4);
    }
}
static inline vf i8_line(const uint8_t *bytes) {
    vf r;
    for (int i = 0; i < LANES; i++) r.l[i] = (float)(int8_t)bytes[i];
    return r;
}
#endif

/* Input rows carried through the same panels together, and how many panels a tile of `rows`
 * rows takes: as many accumulators as the registers hold (32 vector registers with AVX-512,
 * 16 of half the width with AVX2). Neither changes a bit of the results. */
#if defined(__AVX512F__)
#define ROWS_MAX 8
static inline int panels_for(int rows) { return rows <= 4 ? 4 : 2; }
#else
#define ROWS_MAX 4
static inline int panels_for(int rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }
#endif

/* Blocks ahead of the one being multiplied that each panel's stream asks memory for. */
#ifndef PREFETCH
#define PREFETCH 4
#endif
#ifndef PREFETCH_LOCALITY
#define PREFETCH_LOCALITY 3
#endif

static inline int64_t header_bytes(const struct weights *w) {
    return (int64_t)LANES * (w->half ? 2 : 4) * (w->has_offset ? 2 : 1);
}
/* A block's scales (part 0) or offsets (part 1), as floats. */
static inline vf header_part(const struct weights *w, const uint8_t *block, int part) {
    const uint8_t *at = block + part * LANES * (w->half ? 2 : 4);
    return w->half ? vload_half(at) : vload((const float *)at);
}
static inline float header_lane(const struct weights *w, const uint8_t *block, int part, int lane) {
    const uint8_t *at = block + (part * LANES + lane) * (w->half ? 2 : 4);
    if (w->half) return half_to_float((uint16_t)(at[0] | at[1] << 8));
    float f;
    memcpy(&f, at, sizeof f);
    return f;
}
static inline int64_t block_bytes(const struct weights *w) {
    return header_bytes(w) + (int64_t)w->block * LANES * w->bits / 8;
}
static inline int64_t panel_bytes(const struct weights *w) {
    return block_bytes(w) * (w->k / w->block);
}

/* Rows [0, ROWS) of x times PANELS panels from `panel`, into y (row stride ldy). x is input
 * by input, its rows side by side: row r's input j is x[j * ldx + r] (ldx >= ROWS), so a tile
 * reads its inputs in order (rows a power-of-two apart would alias in the L1 cache).
 * Inlined into each (ROWS, PANELS, BITS) instance below, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(
    const struct weights *w, int64_t panel, const float *x, int64_t ldx, float *y, int64_t ldy,
    const float *bias, const int ROWS, const int PANELS, const int BITS) {
    vf acc[ROWS_MAX][4];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int p = 0; p < PANELS; p++) acc[r][p] = vzero();
    const int64_t blocks = w->k / w->block, stride = panel_bytes(w), bb = block_bytes(w);
    const uint8_t *base = w->panels + panel * stride;
    for (int64_t b = 0; b < blocks; b++) {
        vf s[4], m[4];
        const uint8_t *data[4];
#pragma GCC unroll 4
        for (int p = 0; p < PANELS; p++) {
            const uint8_t *blk = base + p * stride + b * bb;
            /* The block PREFETCH blocks ahead in this panel, asked for now (a hint only). */
            if (b + PREFETCH < blocks)
                for (int64_t line = 0; line < bb; line += 64)
                    __builtin_prefetch(blk + PREFETCH * bb + line, 0, PREFETCH_LOCALITY);
            s[p] = header_part(w, blk, 0);
            m[p] = w->has_offset ? header_part(w, blk, 1) : vzero();
            data[p] = blk + header_bytes(w);
        }
        const float *xb = x + b * w->block * ldx;
        if (BITS == 4) {
            for (int j = 0; j < w->block; j += 2) {
                vf lo[4], hi[4];
#pragma GCC unroll 4
                for (int p = 0; p < PANELS; p++) {
                    u4_pair(data[p] + (j / 2) * LANES, &lo[p], &hi[p]);
                    lo[p] = vfma(lo[p], s[p], m[p]);
                    hi[p] = vfma(hi[p], s[p], m[p]);
                }
#pragma GCC unroll 8
                for (int r = 0; r < ROWS; r++) {
                    vf x0 = vset1(xb[j * ldx + r]), x1 = vset1(xb[(j + 1) * ldx + r]);
#pragma GCC unroll 4
                    for (int p = 0; p < PANELS; p++) acc[r][p] = vfma(lo[p], x0, acc[r][p]);
#pragma GCC unroll 4
                    for (int p = 0; p < PANELS; p++) acc[r][p] = vfma(hi[p], x1, acc[r][p]);
                }
            }
        } else {
            for (int j = 0; j < w->block; j++) {
                vf q[4];
#pragma GCC unroll 4
                for (int p = 0; p < PANELS; p++)
                    q[p] = vfma(i8_line(data[p] + j * LANES), s[p], m[p]);
#pragma GCC unroll 8
                for (int r = 0; r < ROWS; r++) {
                    vf xj = vset1(xb[j * ldx + r]);
#pragma GCC unroll 4
                    for (int p = 0; p < PANELS; p++) acc[r][p] = vfma(q[p], xj, acc[r][p]);
                }
            }
        }
    }
    /* Store, the bias added; the last panel may hold fewer than LANES outputs. */
    for (int p = 0; p < PANELS; p++) {
        int64_t first = (panel + p) * LANES;
        int valid = (int)(w->n - first < LANES ? w->n - first : LANES);
        vf add = vzero();
        if (bias) {
            float lanes[LANES] = {0};
            memcpy(lanes, bias + first, (size_t)valid * sizeof(float));
            add = vload(lanes);
        }
        for (int r = 0; r < ROWS; r++) {
            vf out = bias ? vadd(acc[r][p], add) : acc[r][p];
            if (valid == LANES) {
                vstore(y + r * ldy + first, out);
            } else {
                float lanes[LANES];
                vstore(lanes, out);
                memcpy(y + r * ldy + first, lanes, (size_t)valid * sizeof(float));
            }
        }
    }
}

typedef void (*tile_fn)(const struct weights *, int64_t, const float *, int64_t, float *, int64_t,
                        const float *);
#define INSTANCE(R, P, BITS)                                                                    \
    static void tile_##R##_##P##_##BITS(const struct weights *w, int64_t panel, const float *x, \
                                        int64_t ldx, float *y, int64_t ldy, const float *bias) {\
        tile(w, panel, x, ldx, y, ldy, bias, R, P, BITS);                                       \
    }
/* Per bit width: the tiles of 1..ROWS_MAX rows over panels_for(rows) panels, and over one. */
#if defined(__AVX512F__)
#define INSTANCES(BITS)                                                                         \
    INSTANCE(1, 4, BITS) INSTANCE(2, 4, BITS) INSTANCE(3, 4, BITS) INSTANCE(4, 4, BITS)         \
    INSTANCE(5, 2, BITS) INSTANCE(6, 2, BITS) INSTANCE(7, 2, BITS) INSTANCE(8, 2, BITS)         \
    INSTANCE(1, 1, BITS) INSTANCE(2, 1, BITS) INSTANCE(3, 1, BITS) INSTANCE(4, 1, BITS)         \
    INSTANCE(5, 1, BITS) INSTANCE(6, 1, BITS) INSTANCE(7, 1, BITS) INSTANCE(8, 1, BITS)
#define TABLE(BITS)                                                                             \
    {{tile_1_4_##BITS, tile_2_4_##BITS, tile_3_4_##BITS, tile_4_4_##BITS, tile_5_2_##BITS,      \
      tile_6_2_##BITS, tile_7_2_##BITS, tile_8_2_##BITS},                                       \
     {tile_1_1_##BITS, tile_2_1_##BITS, tile_3_1_##BITS, tile_4_1_##BITS, tile_5_1_##BITS,      \
      tile_6_1_##BITS, tile_7_1_##BITS, tile_8_1_##BITS}}
#else
#define INSTANCES(BITS)                                                                         \
    INSTANCE(1, 4, BITS) INSTANCE(2, 2, BITS) INSTANCE(1, 1, BITS) INSTANCE(2, 1, BITS)         \
    INSTANCE(3, 1, BITS) INSTANCE(4, 1, BITS)
#define TABLE(BITS)                                                                             \
    {{tile_1_4_##BITS, tile_2_2_##BITS, tile_3_1_##BITS, tile_4_1_##BITS},                      \
     {tile_1_1_##BITS, tile_2_1_##BITS, tile_3_1_##BITS, tile_4_1_##BITS}}
#endif
INSTANCES(4)
INSTANCES(8)
static const tile_fn TILES4[2][ROWS_MAX] = TABLE(4);
static const tile_fn TILES8[2][ROWS_MAX] = TABLE(8);

/* The same products for many rows: a panel's weights are dequantized once, as fmaf(q, s, m),
 * into `buffer` (k x LANES floats), and every row goes through them in order of k, GEMM_ROWS
 * rows at a time: each output is the same fmaf chain as tile()'s, bit for bit. */
#if defined(__AVX512F__)
#define GEMM_ROWS 12
#else
#define GEMM_ROWS 6
#endif
#ifndef GEMM_FROM
#define GEMM_FROM 128  /* rows from which a call takes this path (measured: on par with tiles) */
#endif

static void dequantize_panel(const struct weights *w, int64_t panel, float *buffer) {
    const int64_t blocks = w->k / w->block, bb = block_bytes(w);
    const uint8_t *base = w->panels + panel * panel_bytes(w);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = base + b * bb, *data = blk + header_bytes(w);
        const vf s = header_part(w, blk, 0);
        const vf m = w->has_offset ? header_part(w, blk, 1) : vzero();
        float *out = buffer + b * w->block * LANES;
        if (w->bits == 4) {
            for (int j = 0; j < w->block; j += 2) {
                vf lo, hi;
                u4_pair(data + (j / 2) * LANES, &lo, &hi);
                vstore(out + j * LANES, vfma(lo, s, m));
                vstore(out + (j + 1) * LANES, vfma(hi, s, m));
            }
        } else {
            for (int j = 0; j < w->block; j++)
                vstore(out + j * LANES, vfma(i8_line(data + j * LANES), s, m));
        }
    }
}

static inline __attribute__((always_inline)) void gemm_tile(
    const float *buffer, int64_t k, const float *x, int64_t ldx, float *out, const int ROWS) {
    vf acc[GEMM_ROWS];
#pragma GCC unroll 12
    for (int r = 0; r < ROWS; r++) acc[r] = vzero();
    for (int64_t kk = 0; kk < k; kk++) {
        const vf wk = vload(buffer + kk * LANES);
#pragma GCC unroll 12
        for (int r = 0; r < ROWS; r++) acc[r] = vfma(wk, vset1(x[kk * ldx + r]), acc[r]);
    }
#pragma GCC unroll 12
    for (int r = 0; r < ROWS; r++) vstore(out + r * LANES, acc[r]);
}

typedef void (*gemm_fn)(const float *, int64_t, const float *, int64_t, float *);
#define GEMM_INSTANCE(R)                                                                        \
    static void gemm_##R(const float *b, int64_t k, const float *x, int64_t ldx, float *out) {  \
        gemm_tile(b, k, x, ldx, out, R);                                                        \
    }
GEMM_INSTANCE(1) GEMM_INSTANCE(2) GEMM_INSTANCE(3) GEMM_INSTANCE(4) GEMM_INSTANCE(5)
GEMM_INSTANCE(6)
#if defined(__AVX512F__)
GEMM_INSTANCE(7) GEMM_INSTANCE(8) GEMM_INSTANCE(9) GEMM_INSTANCE(10) GEMM_INSTANCE(11)
GEMM_INSTANCE(12)
static const gemm_fn GEMMS[GEMM_ROWS] = {gemm_1, gemm_2, gemm_3, gemm_4,  gemm_5,  gemm_6,
                                         gemm_7, gemm_8, gemm_9, gemm_10, gemm_11, gemm_12};
#else
static const gemm_fn GEMMS[GEMM_ROWS] = {gemm_1, gemm_2, gemm_3, gemm_4, gemm_5, gemm_6};
#endif

/* x (rows x k, row by row) in groups of `group` rows, each group input by input with its rows
 * side by side (the layout tile() and gemm_tile() read): a new buffer, or NULL out of memory. */
static float *interleaved(const float *x, int64_t rows, int64_t k, int group) {
    float *out = malloc(sizeof(float) * (size_t)(rows * k));
    if (!out) return NULL;
    for (int64_t first = 0; first < rows; first += group) {
        const int64_t count = rows - first < group ? rows - first : group;
        for (int64_t r = 0; r < count; r++)
            for (int64_t j = 0; j < k; j++) out[first * k + j * count + r] = x[(first + r) * k + j];
    }
    return out;
}

static int gemm(const struct weights *w, const float *x, int64_t rows, float *y, int64_t ldy,
                const float *bias, int threads) {
    const int64_t panels_total = (w->n + LANES - 1) / LANES;
    float *xt = interleaved(x, rows, w->k, GEMM_ROWS);
    if (!xt) return -2;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *buffer = aligned_alloc(64, (size_t)w->k * LANES * sizeof(float));
        float tile_out[GEMM_ROWS * LANES];
        if (!buffer) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t panel = 0; panel < panels_total; panel++) {
            if (!buffer) continue;
            dequantize_panel(w, panel, buffer);
            const int64_t first = panel * LANES;
            const int valid = (int)(w->n - first < LANES ? w->n - first : LANES);
            for (int64_t r0 = 0; r0 < rows; r0 += GEMM_ROWS) {
                const int count = (int)(rows - r0 < GEMM_ROWS ? rows - r0 : GEMM_ROWS);
                GEMMS[count - 1](buffer, w->k, xt + r0 * w->k, count, tile_out);
                for (int r = 0; r < count; r++) {
                    float *dst = y + (r0 + r) * ldy + first;
                    for (int l = 0; l < valid; l++)  /* the bias added as tile() adds it */
                        dst[l] = bias ? tile_out[r * LANES + l] + bias[first + l]
                                      : tile_out[r * LANES + l];
                }
            }
        }
        free(buffer);
    }
    free(xt);
    return failed ? -2 : 0;
}

/* y (rows x n, row stride ldy) = x (rows x k) times w's transpose, plus bias (n floats, or
 * NULL). Returns 0, or -2 out of memory. */
int packed_matmul(const struct weights *w, const float *x, int64_t rows, float *y, int64_t ldy,
                  const float *bias, int threads) {
    const int64_t n = w->n, k = w->k;
    if (rows >= GEMM_FROM) return gemm(w, x, rows, y, ldy, bias, threads);
    const int64_t panels_total = (n + LANES - 1) / LANES;
    const int64_t row_tiles = (rows + ROWS_MAX - 1) / ROWS_MAX;
    /* Tasks: (row tile, group of panels); a group's width follows its tile's row count. */
    const int wide = panels_for(rows < ROWS_MAX ? (int)rows : ROWS_MAX);
    const int64_t groups = (panels_total + wide - 1) / wide;
    const tile_fn(*table)[ROWS_MAX] = w->bits == 4 ? TILES4 : TILES8;
    float *xt = rows > 1 ? interleaved(x, rows, k, ROWS_MAX) : NULL;
    if (rows > 1 && !xt) return -2;
    const float *xs = rows > 1 ? xt : x;
#pragma omp parallel for schedule(static) num_threads(threads) if (row_tiles * groups > 1)
    for (int64_t task = 0; task < row_tiles * groups; task++) {
        const int64_t tile_index = task / groups, group = task % groups;
        const int64_t first_row = tile_index * ROWS_MAX;
        const int tile_rows = (int)(rows - first_row < ROWS_MAX ? rows - first_row : ROWS_MAX);
        const int group_panels = panels_for(tile_rows);
        /* The group's panels in runs the tile's width allows, then one at a time. */
        int64_t panel = group * wide, end = panel + wide < panels_total ? panel + wide : panels_total;
        for (; panel + group_panels <= end; panel += group_panels)
            table[0][tile_rows - 1](w, panel, xs + first_row * k, tile_rows, y + first_row * ldy,
                                    ldy, bias);
        for (; panel < end; panel++)
            table[1][tile_rows - 1](w, panel, xs + first_row * k, tile_rows, y + first_row * ldy,
                                    ldy, bias);
    }
    free(xt);
    return 0;
}

/* y (rows x n, float32) = x (rows x k, float32) times the weights' transpose, plus bias (n
 * floats, or NULL). Returns 0, -1 for a layout it does not know, -2 out of memory. */
int quantized_matmul(const uint8_t *panels, int64_t n, int64_t k, int block, int bits,
                     int header, const float *x, int64_t rows, float *y, const float *bias,
                     int threads) {
    if (!known_layout(block, bits, k)) return -1;
    const struct weights w = weights_of(panels, n, k, block, bits, header);
    return packed_matmul(&w, x, rows, y, n, bias, threads);
}

/* Rows `ids` of the weight matrix (the embedding's table), dequantized: out (count x k). */
void quantized_rows(const uint8_t *panels, int64_t n, int64_t k, int block, int bits,
                    int header, const int64_t *ids, int64_t count, float *out) {
    const struct weights w = weights_of(panels, n, k, block, bits, header);
    const int64_t stride = panel_bytes(&w), bb = block_bytes(&w), hb = header_bytes(&w);
    for (int64_t i = 0; i < count; i++) {
        const int64_t id = ids[i], lane = id % LANES;
        const uint8_t *base = panels + (id / LANES) * stride;
        for (int64_t kk = 0; kk < k; kk++) {
            const uint8_t *blk = base + (kk / block) * bb;
            const int j = (int)(kk % block);
            const float s = header_lane(&w, blk, 0, (int)lane);
            const float m = w.has_offset ? header_lane(&w, blk, 1, (int)lane) : 0.0f;
            float q;
            if (bits == 4) {
                const uint8_t byte = blk[hb + (j / 2) * LANES + lane];
                q = (float)(j % 2 ? byte >> 4 : byte & 15);
            } else {
                q = (float)(int8_t)blk[hb + j * LANES + lane];
            }
            out[i * k + kk] = fmaf(q, s, m);
        }
    }
}
