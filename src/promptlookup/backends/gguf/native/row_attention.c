/* Causal attention whose every query row is computed by one fixed formula.
 *
 * A row's result depends only on its own query, its position p and the keys and values
 * 0..p of its own sequence: never on how many other rows, heads or sequences share the call,
 * nor on which thread computes it. Every value is defined by C's IEEE semantics (no
 * reassociation: built without -ffast-math and with -ffp-contract=off, products and sums
 * written as explicit fmaf, + and *), so a vectorised and a scalar evaluation of the same
 * expression give the same bits. Rows are grouped in tasks (rows of one sequence, one
 * key/value head, up to MAX_VECTORS query vectors) for the threads. Within a task several
 * query vectors go through the same keys and values at once (each key or value read once for
 * all of them, as in a matrix product's micro-kernel), but each vector keeps its own
 * accumulators: no arithmetic is shared between rows, and a vector's bits are the same
 * whichever others it is grouped with.
 *
 * For one row and one query head, with s = scale:
 *   score[j]  = fmaf chain over d = 0..D-1 of query[d] * key[j][d], from 0   (j = 0..p)
 *   top       = max_j score[j] * s   (in LANES lanes, j into lane j % LANES, then across them; a
 *               maximum is the same whatever the order, signed zeros aside, and exp below
 *               gives the same bits for x - (+0) and x - (-0))
 *   weight[j] = exp(score[j] * s - top)                    (exp_approx, row_attention.h)
 *   total     = sum of weight[j] into lane j % LANES, in order of j, then a fixed tree
 *   out[d]    = (fmaf chain over j of weight[j] * value[j][d], from 0) / total
 *
 * Sliding windows: with window W > 0, a row at position p sees keys max(0, p - W + 1)..p only.
 * Keys before that are still in the cache (a crop never loses what a window needs); their
 * weights are exactly 0, so every sum above keeps its bits as if they were not there (+0
 * accumulators stay +0 through 0 * value, values being finite), wherever a tile starts
 * computing: a row's bits still depend on nothing but itself.
 *
 * Layouts (one sequence's cache): keys  [kv_heads][D][capacity] (transposed, so a block of
 * keys is a contiguous vector per dimension), values [kv_heads][capacity][D]. Queries and
 * outputs: [rows][heads][D]. Element types (half.h): queries and outputs float32 or bfloat16,
 * keys and values float32, bfloat16 or float16, each its own; all computed in float32 (a
 * 16-bit key or value converted exactly as it is read, a bfloat16 output rounded to nearest
 * even). A 16-bit key or value was rounded once when it was stored, by itself: its bits
 * depend on its own token alone, as a float32 one's do.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"           /* 16-bit conversions; bounds.h: ELEMENT_* */
#include "row_attention.h"  /* exp_approx; bounds.h: KEY_BLOCK, MAX_GROUP, MAX_DIM */
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define LANES 16   /* lanes of the weight sum and of the maximum */
#define BLOCK KEY_BLOCK  /* keys per block (cache capacities are multiples of it) */
#define MAX_VECTORS 72  /* query vectors per task: rows of one sequence times the group
                           (a multiple of WIDE for groups of 1, 2, 3, 4, 6 and 8) */
#define NV 2       /* query vectors a micro-kernel carries through the same keys or values */
#define KEYS 64    /* keys scored per micro-kernel call */
#define CHUNK 64   /* output elements summed per micro-kernel call */

/* max_j scores[j] * scale over j < n, in LANES lanes then across them (the same maximum in
 * any order). Vector extensions, as the compiler does not vectorise a maximum without fast-math. */
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t lane_mask_t __attribute__((vector_size(LANES * sizeof(int32_t))));
static inline lanes_t lanes_max(lanes_t a, lanes_t b) {
    const lane_mask_t greater = a > b;
    return (lanes_t)(((lane_mask_t)a & greater) | ((lane_mask_t)b & ~greater));
}
static float top_score(const float *scores, int64_t n, float scale) {
#if defined(__AVX2__) && LANES == 16
    /* The same in two registers of 8 lanes: _mm256_max_ps(a, b) is a > b ? a : b, lane by lane. */
    __m256 low = _mm256_set1_ps(-INFINITY), high = low;
    const __m256 s = _mm256_set1_ps(scale);
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES) {
        low = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(scores + j), s), low);
        high = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(scores + j + 8), s), high);
    }
    float lanes[LANES];
    _mm256_storeu_ps(lanes, low);
    _mm256_storeu_ps(lanes + 8, high);
    for (int l = 0; j + l < n; l++) {
        const float x = scores[j + l] * scale;
        lanes[l] = x > lanes[l] ? x : lanes[l];
    }
    float best = -INFINITY;
    for (int l = 0; l < LANES; l++) best = lanes[l] > best ? lanes[l] : best;
    return best;
#else
    lanes_t tops, scaled;
    for (int l = 0; l < LANES; l++) tops[l] = -INFINITY;
    int64_t j0 = 0;
    for (; j0 + LANES <= n; j0 += LANES) {
        memcpy(&scaled, scores + j0, sizeof scaled);
        tops = lanes_max(scaled * scale, tops);
    }
    for (int l = 0; j0 + l < n; l++) {
        const float x = scores[j0 + l] * scale;
        tops[l] = x > tops[l] ? x : tops[l];
    }
    float top = -INFINITY;
    for (int l = 0; l < LANES; l++) top = tops[l] > top ? tops[l] : top;
    return top;
#endif
}

/* The softmax weights of one row from key j0 on: for each whole run of LANES keys below n,
 * row[j] = weight[j] (0 before `start`, else exp_approx(row[j] * scale - top)) and
 * lanes[j % LANES] += weight[j]; returns where the runs end (the caller does the rest). With
 * AVX2 and FMA, 8 keys at a time in vector registers: each lane runs exp_approx's operations
 * (the same fmaf, *, -, + and the same truncation to an integer), so every weight and every
 * lane's sum has the bits of the scalar loop's. */
#if defined(__AVX2__) && defined(__FMA__)
/* exp_approx (row_attention.h) in each of 8 lanes. */
static inline __m256 exp_approx_8(__m256 x) {
    const __m256 magic = _mm256_set1_ps(12582912.0f), low = _mm256_set1_ps(-87.0f);
    const __m256 below = _mm256_cmp_ps(x, low, _CMP_LT_OQ);  /* x < -87 */
    const __m256 clamped = _mm256_blendv_ps(x, low, below);
    const __m256 n = _mm256_sub_ps(
        _mm256_fmadd_ps(clamped, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), clamped);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
    poly = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), r);
    poly = _mm256_add_ps(poly, _mm256_set1_ps(1.0f));
    const __m256i exponent = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 value = _mm256_mul_ps(poly, _mm256_castsi256_ps(exponent));
    return _mm256_blendv_ps(value, _mm256_setzero_ps(), below);
}
#endif
static int64_t weigh_runs(float *row, int64_t j0, int64_t n, int64_t start, float scale,
                          float top, float lanes[LANES]) {
    for (; j0 + LANES <= n; j0 += LANES) {
#if defined(__AVX2__) && defined(__FMA__) && LANES == 16
        if (j0 >= start) {  /* a whole run inside the window */
            const __m256 s = _mm256_set1_ps(scale), t = _mm256_set1_ps(top);
            for (int half = 0; half < LANES; half += 8) {
                const __m256 x = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(row + j0 + half), s), t);
                const __m256 weight = exp_approx_8(x);
                _mm256_storeu_ps(row + j0 + half, weight);
                _mm256_storeu_ps(lanes + half, _mm256_add_ps(_mm256_loadu_ps(lanes + half), weight));
            }
            continue;
        }
#endif
        for (int l = 0; l < LANES; l++) {
            const float weight = j0 + l < start ? 0.0f : exp_approx(row[j0 + l] * scale - top);
            row[j0 + l] = weight;
            lanes[l] = lanes[l] + weight;
        }
    }
    return j0;
}

/* Micro-kernels over COUNT query vectors (1 or NV), on float blocks. */

/* to[v][l] = fmaf chain over d of queries[v][d] * keys[d][l], for KEYS keys from `keys`
 * (row stride BLOCK); queries[v] at queries + v * MAX_DIM, to[v] at to + v * to_stride. */
#define DEFINE_SCORES(NAME, COUNT, DIM)                                                        \
__attribute__((noinline)) static void NAME(const float *keys, const float *queries, int dim,   \
                                           float *to, int64_t to_stride) {                     \
    (void)dim;                                                                                 \
    float acc[COUNT][KEYS] = {{0}};                                                            \
    for (int d = 0; d < (DIM); d++) {                                                          \
        const float *key_row = keys + d * BLOCK;                                               \
        _Pragma("GCC unroll 16") for (int v = 0; v < (COUNT); v++) {                           \
            const float q = queries[v * MAX_DIM + d];                                          \
            for (int l = 0; l < KEYS; l++) acc[v][l] = fmaf(q, key_row[l], acc[v][l]);         \
        }                                                                                      \
    }                                                                                          \
    for (int v = 0; v < (COUNT); v++)                                                          \
        for (int l = 0; l < KEYS; l++) to[v * to_stride + l] = acc[v][l];                      \
}

/* sums[v][c] = fmaf chain over j < seen[v] of weights[v][j] * values[j][c], continued from
 * sums[v][c], for CHUNK elements c (values_tail: `width`, fewer); values: row stride `dim`;
 * weights[v] at weights + v * weight_stride; sums[v] at sums + v * MAX_DIM. Rows of a tile
 * see different numbers of keys: the vectors go together up to the fewest, then each alone,
 * j always in order. */
#define DEFINE_VALUES(NAME, COUNT, WIDTH)                                                      \
__attribute__((noinline)) static void NAME(const float *values, int dim, const float *weights, \
                                           int64_t weight_stride, const int64_t *seen,         \
                                           float *sums, int width) {                           \
    (void)width;                                                                               \
    float acc[COUNT][CHUNK];                                                                   \
    int64_t fewest = seen[0];                                                                  \
    for (int v = 0; v < (COUNT); v++) {                                                        \
        if (seen[v] < fewest) fewest = seen[v];                                                \
        for (int c = 0; c < (WIDTH); c++) acc[v][c] = sums[v * MAX_DIM + c];                   \
    }                                                                                          \
    for (int64_t j = 0; j < fewest; j++) {                                                     \
        const float *value_row = values + j * dim;                                             \
        _Pragma("GCC unroll 16") for (int v = 0; v < (COUNT); v++) {                           \
            const float w = weights[v * weight_stride + j];                                    \
            for (int c = 0; c < (WIDTH); c++) acc[v][c] = fmaf(w, value_row[c], acc[v][c]);    \
        }                                                                                      \
    }                                                                                          \
    for (int v = 0; v < (COUNT); v++) {                                                        \
        for (int64_t j = fewest; j < seen[v]; j++) {                                           \
            const float w = weights[v * weight_stride + j];                                    \
            const float *value_row = values + j * dim;                                         \
            for (int c = 0; c < (WIDTH); c++) acc[v][c] = fmaf(w, value_row[c], acc[v][c]);    \
        }                                                                                      \
        for (int c = 0; c < (WIDTH); c++) sums[v * MAX_DIM + c] = acc[v][c];                   \
    }                                                                                          \
}

DEFINE_VALUES(values_one, 1, CHUNK)
DEFINE_VALUES(values_many, NV, CHUNK)
DEFINE_VALUES(values_tail, 1, width)  /* the last dim % CHUNK elements, a vector at a time */

/* With AVX2 and FMA: WIDE query vectors at a time against 16 keys (scores) or 16 elements of
 * the sums (values), their 2 x WIDE accumulators held in registers. Each accumulator is the
 * same fmaf chain as the kernels' above (_mm256_fmadd_ps rounds once, as fmaf does), in the same
 * order of d or j: only how many go side by side changes, not a bit. */
#if defined(__AVX2__) && defined(__FMA__)
#define WIDE 6
static inline __attribute__((always_inline)) void scores_wide(
    const float *keys, const float *queries, int dim, float *to, int64_t to_stride) {
    __m256 acc[WIDE][2];
#pragma GCC unroll 6
    for (int v = 0; v < WIDE; v++) acc[v][0] = acc[v][1] = _mm256_setzero_ps();
    for (int d = 0; d < dim; d++) {
        const __m256 k0 = _mm256_loadu_ps(keys + d * BLOCK), k1 = _mm256_loadu_ps(keys + d * BLOCK + 8);
#pragma GCC unroll 6
        for (int v = 0; v < WIDE; v++) {
            const __m256 q = _mm256_broadcast_ss(queries + v * MAX_DIM + d);
            acc[v][0] = _mm256_fmadd_ps(q, k0, acc[v][0]);
            acc[v][1] = _mm256_fmadd_ps(q, k1, acc[v][1]);
        }
    }
#pragma GCC unroll 6
    for (int v = 0; v < WIDE; v++) {
        _mm256_storeu_ps(to + v * to_stride, acc[v][0]);
        _mm256_storeu_ps(to + v * to_stride + 8, acc[v][1]);
    }
}
/* Vectors [0, WIDE * n) against a block of BLOCK keys (as DEFINE_BLOCK_SCORES); returns them. */
static inline __attribute__((always_inline)) int block_scores_wide(
    const float *block, const float (*queries)[MAX_DIM], int vectors, int dim, float *scores,
    int64_t padded) {
    int v = 0;
    for (; v + WIDE <= vectors; v += WIDE)
        for (int k = 0; k < BLOCK; k += 16)
            scores_wide(block + k, queries[v], dim, scores + v * padded + k, padded);
    return v;
}
__attribute__((noinline)) static void values_wide(const float *values, int dim,
                                                  const float *weights, int64_t weight_stride,
                                                  const int64_t *seen, float *sums) {
    __m256 acc[WIDE][2];
    int64_t fewest = seen[0];
#pragma GCC unroll 6
    for (int v = 0; v < WIDE; v++) {
        if (seen[v] < fewest) fewest = seen[v];
        acc[v][0] = _mm256_loadu_ps(sums + v * MAX_DIM);
        acc[v][1] = _mm256_loadu_ps(sums + v * MAX_DIM + 8);
    }
    for (int64_t j = 0; j < fewest; j++) {
        const __m256 a = _mm256_loadu_ps(values + j * dim), b = _mm256_loadu_ps(values + j * dim + 8);
#pragma GCC unroll 6
        for (int v = 0; v < WIDE; v++) {
            const __m256 w = _mm256_broadcast_ss(weights + v * weight_stride + j);
            acc[v][0] = _mm256_fmadd_ps(w, a, acc[v][0]);
            acc[v][1] = _mm256_fmadd_ps(w, b, acc[v][1]);
        }
    }
#pragma GCC unroll 6
    for (int v = 0; v < WIDE; v++) {
        for (int64_t j = fewest; j < seen[v]; j++) {
            const __m256 w = _mm256_broadcast_ss(weights + v * weight_stride + j);
            acc[v][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + j * dim), acc[v][0]);
            acc[v][1] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + j * dim + 8), acc[v][1]);
        }
        _mm256_storeu_ps(sums + v * MAX_DIM, acc[v][0]);
        _mm256_storeu_ps(sums + v * MAX_DIM + 8, acc[v][1]);
    }
}
#endif

/* The scores of vectors [0, vectors) against one block of BLOCK keys. */
#ifdef WIDE
#define WIDE_SCORES(statement) statement
#else
#define WIDE_SCORES(statement)
#endif
#define DEFINE_BLOCK_SCORES(NAME, DIM)                                                         \
DEFINE_SCORES(NAME##_one, 1, DIM)                                                              \
DEFINE_SCORES(NAME##_many, NV, DIM)                                                            \
static void NAME(const float *block, const float (*queries)[MAX_DIM], int vectors, int dim,    \
                 float *scores, int64_t padded) {                                              \
    int wide = 0;  /* vectors the wide kernel took */                                          \
    WIDE_SCORES(wide = block_scores_wide(block, queries, vectors, DIM, scores, padded));       \
    for (int k = 0; k < BLOCK; k += KEYS) {                                                    \
        int v = wide;                                                                          \
        for (; v + NV <= vectors; v += NV)                                                     \
            NAME##_many(block + k, queries[v], dim, scores + v * padded + k, padded);          \
        for (; v < vectors; v++)                                                               \
            NAME##_one(block + k, queries[v], dim, scores + v * padded + k, padded);           \
    }                                                                                          \
}
DEFINE_BLOCK_SCORES(scores_64, 64)
DEFINE_BLOCK_SCORES(scores_128, 128)
DEFINE_BLOCK_SCORES(scores_any, dim)

/* The weighted sums of values rows [0, rows) of one block (row j0 + 0 of the cache first) for
 * vectors [0, vectors), each over its own first `seen[v] - j0` of them. */
static void block_values(const float *block, int64_t rows, int64_t j0, const int64_t *seen,
                         int vectors, int dim, const float *weights, int64_t padded,
                         float (*sums)[MAX_DIM]) {
    int64_t counts[MAX_VECTORS];
    for (int v = 0; v < vectors; v++) {
        const int64_t n = seen[v] - j0;
        counts[v] = n < 0 ? 0 : n < rows ? n : rows;
    }
    int wide = 0;  /* vectors the wide kernel took */
#ifdef WIDE
    for (; wide + WIDE <= vectors; wide += WIDE) {
        int c = 0;
        for (; c + 16 <= dim; c += 16)
            values_wide(block + c, dim, weights + wide * padded + j0, padded, counts + wide,
                        sums[wide] + c);
        if (c < dim)
            for (int v = wide; v < wide + WIDE; v++)
                values_tail(block + c, dim, weights + v * padded + j0, padded, counts + v,
                            sums[v] + c, dim - c);
    }
#endif
    int c = 0;
    for (; c + CHUNK <= dim; c += CHUNK) {
        int v = wide;
        for (; v + NV <= vectors; v += NV)
            values_many(block + c, dim, weights + v * padded + j0, padded, counts + v,
                        sums[v] + c, CHUNK);
        for (; v < vectors; v++)
            values_one(block + c, dim, weights + v * padded + j0, padded, counts + v,
                       sums[v] + c, CHUNK);
    }
    if (c < dim)
        for (int v = wide; v < vectors; v++)
            values_tail(block + c, dim, weights + v * padded + j0, padded, counts + v,
                        sums[v] + c, dim - c);
}

typedef struct {
    int query_type, kv_type;  /* element types: of queries and outputs, of keys and values */
    const void *query;
    void *out;
    const int64_t *row_sequence;  /* the sequence of each row */
    const int64_t *row_position;  /* its position: it sees keys 0..position */
    const int64_t *key_pointers, *value_pointers, *capacities;  /* per sequence */
    int heads, kv_heads, head_dim;
    float scale;
    int64_t window;  /* keys a row sees, itself included (0: all of them) */
} call_t;

/* One key block (BLOCK keys from `keys`, of element type `type`, row stride `capacity`) as
 * contiguous floats. */
static inline const float *keys_as_floats(const void *keys, int type, int64_t capacity, int dim,
                                          float *block) {
    const size_t stride = (size_t)capacity * (size_t)element_size(type);
    for (int d = 0; d < dim; d++)
        run_to_float((const char *)keys + d * stride, type, BLOCK, block + d * BLOCK);
    return block;
}
/* `count` values from `values` (of element type `type`) as floats: float32 ones in place. */
static inline const float *values_as_floats(const void *values, int type, int64_t count,
                                            float *block) {
    if (type == ELEMENT_FLOAT32) return (const float *)values;
    run_to_float(values, type, count, block);
    return block;
}

/* Rows first..first+count-1 (one sequence), key/value head h, over keys and values of
 * element type KV (ELEMENT in C): each type gets its own function. */
#define DEFINE_ATTEND_TILE(NAME, ELEMENT, KV)                                                  \
static void NAME(const call_t *c, int64_t first, int count, int h) {                           \
    const int group = c->heads / c->kv_heads, dim = c->head_dim;                               \
    const int64_t sequence = c->row_sequence[first], capacity = c->capacities[sequence];       \
    const ELEMENT *keys = (const ELEMENT *)(intptr_t)c->key_pointers[sequence]                 \
                          + (int64_t)h * dim * capacity;                                       \
    const ELEMENT *values = (const ELEMENT *)(intptr_t)c->value_pointers[sequence]             \
                            + (int64_t)h * dim * capacity;                                     \
    int64_t seen[MAX_VECTORS], from[MAX_VECTORS], longest = 0, lowest = INT64_MAX;             \
    const int vectors = count * group;  /* query vectors of the tile: row-major, then head */  \
    for (int v = 0; v < vectors; v++) {                                                        \
        seen[v] = c->row_position[first + v / group] + 1;                                      \
        from[v] = c->window > 0 && seen[v] > c->window ? seen[v] - c->window : 0;              \
        if (seen[v] > longest) longest = seen[v];                                              \
        if (from[v] < lowest) lowest = from[v];                                                \
    }                                                                                          \
    const int64_t first_block = lowest / BLOCK * BLOCK;  /* blocks before it: no row sees */   \
    const int64_t padded = (longest + BLOCK - 1) / BLOCK * BLOCK;                              \
    float *scores = malloc(sizeof(float) * (size_t)vectors * (size_t)padded);                  \
    if (scores == NULL) abort();  /* out of memory: as loud as Python's own failure */         \
    float queries[MAX_VECTORS][MAX_DIM];                                                       \
    for (int v = 0; v < vectors; v++) {                                                        \
        const int64_t at = ((first + v / group) * c->heads + (int64_t)h * group + v % group) * dim; \
        run_to_float((const char *)c->query + at * element_size(c->query_type), c->query_type, \
                     dim, queries[v]);                                                         \
    }                                                                                          \
    float block[MAX_DIM * BLOCK];  /* keys or values of one block, as contiguous floats */     \
    for (int64_t j0 = first_block; j0 < padded; j0 += BLOCK) {                                 \
        const float *key_block = keys_as_floats(keys + j0, KV, capacity, dim, block);          \
        if (dim == 64) scores_64(key_block, queries, vectors, dim, scores + j0, padded);       \
        else if (dim == 128) scores_128(key_block, queries, vectors, dim, scores + j0, padded); \
        else scores_any(key_block, queries, vectors, dim, scores + j0, padded);                \
    }                                                                                          \
    /* Softmax weights per vector, over its own row's keys only (0 before its window). */      \
    float totals[MAX_VECTORS];                                                                 \
    for (int v = 0; v < vectors; v++) {                                                        \
        float *row = scores + (size_t)v * padded;                                              \
        const int64_t n = seen[v], start = from[v];                                            \
        const float top = top_score(row + start, n - start, c->scale);                         \
        float lanes[LANES] = {0};                                                              \
        int64_t j0 = weigh_runs(row, first_block, n, start, c->scale, top, lanes);             \
        for (int l = 0; j0 + l < n; l++) {                                                     \
            const float weight = j0 + l < start                                                \
                ? 0.0f : exp_approx(row[j0 + l] * c->scale - top);                             \
            row[j0 + l] = weight;                                                              \
            lanes[l] = lanes[l] + weight;                                                      \
        }                                                                                      \
        for (int width = LANES / 2; width >= 1; width /= 2)                                    \
            for (int l = 0; l < width; l++) lanes[l] = lanes[l] + lanes[l + width];            \
        totals[v] = lanes[0];                                                                  \
    }                                                                                          \
    /* Weighted sums of the values, carried from block to block. */                            \
    float sums[MAX_VECTORS][MAX_DIM];                                                          \
    for (int v = 0; v < vectors; v++)                                                          \
        for (int d = 0; d < dim; d++) sums[v][d] = 0.0f;                                       \
    for (int64_t j0 = first_block; j0 < longest; j0 += BLOCK) {                                \
        const int64_t rows = longest - j0 < BLOCK ? longest - j0 : BLOCK;                      \
        const float *value_block = values_as_floats(values + j0 * dim, KV, rows * dim, block); \
        block_values(value_block, rows, j0, seen, vectors, dim, scores, padded, sums);         \
    }                                                                                          \
    for (int v = 0; v < vectors; v++) {                                                        \
        const int64_t at = ((first + v / group) * c->heads + (int64_t)h * group + v % group) * dim; \
        for (int d = 0; d < dim; d++)                                                          \
            store_element(c->out, c->query_type, at + d, sums[v][d] / totals[v]);              \
    }                                                                                          \
    free(scores);                                                                              \
}

DEFINE_ATTEND_TILE(float_tile, float, ELEMENT_FLOAT32)
DEFINE_ATTEND_TILE(bf16_tile, uint16_t, ELEMENT_BFLOAT16)
DEFINE_ATTEND_TILE(f16_tile, uint16_t, ELEMENT_FLOAT16)

typedef void (*tile_function)(const call_t *, int64_t, int, int);

/* Entry point (row_attention.h): every row of the call, each against its own sequence's cache
 * (each within its last `window` keys, 0: all). Returns 0, or -1 when a shape is beyond
 * bounds.h (the caller then uses another path). */
int row_attention(int query_type, int kv_type, const void *query, void *out, int64_t rows,
                  const int64_t *row_sequence, const int64_t *row_position,
                  const int64_t *key_pointers, const int64_t *value_pointers,
                  const int64_t *capacities, int heads, int kv_heads, int head_dim,
                  float scale, int64_t window, int threads) {
    if (kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP || head_dim > MAX_DIM)
        return -1;
    if ((query_type != ELEMENT_FLOAT32 && query_type != ELEMENT_BFLOAT16)
        || kv_type < ELEMENT_FLOAT32 || kv_type > ELEMENT_FLOAT16)
        return -1;
    call_t c = {query_type, kv_type, query, out, row_sequence, row_position, key_pointers, value_pointers,
                capacities, heads, kv_heads, head_dim, scale, window};
    const tile_function attend = kv_type == ELEMENT_FLOAT32    ? float_tile
                                 : kv_type == ELEMENT_BFLOAT16 ? bf16_tile
                                                               : f16_tile;
    /* Tiles: runs of rows of one sequence, as many as MAX_VECTORS query vectors allow. */
    const int tile_rows = MAX_VECTORS / (heads / kv_heads);
    int64_t *tile_first = malloc(sizeof(int64_t) * (size_t)(rows + 1));
    int *tile_count = malloc(sizeof(int) * (size_t)(rows + 1));
    if (tile_first == NULL || tile_count == NULL) {
        free(tile_first);
        free(tile_count);
        return -1;
    }
    int64_t tiles = 0;
    for (int64_t r = 0; r < rows;) {
        int n = 1;
        while (n < tile_rows && r + n < rows && row_sequence[r + n] == row_sequence[r]) n++;
        tile_first[tiles] = r;
        tile_count[tiles++] = n;
        r += n;
    }
    const int64_t tasks = tiles * kv_heads;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        /* Longest rows last in the pass are the most work: start from the end. */
        int64_t task = tasks - 1 - t;
        attend(&c, tile_first[task / kv_heads], tile_count[task / kv_heads],
               (int)(task % kv_heads));
    }
    free(tile_first);
    free(tile_count);
    return 0;
}

/* For the tests (tests/test_kv_dtype.py): n floats rounded to the 16-bit element type `type`,
 * and n 16-bit values of that type widened to floats; `portable`: by half.h's portable C (what
 * a CPU without F16C runs) instead of the CPU's instructions. */
void half_round(int type, int portable, const float *from, uint16_t *to, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        to[i] = type == ELEMENT_BFLOAT16 ? float_to_bf16(from[i])
                : portable               ? float_to_f16_portable(from[i])
                                         : float_to_f16(from[i]);
}

void half_widen(int type, int portable, const uint16_t *from, float *to, int64_t n) {
    if (!portable) {
        run_to_float(from, type, n, to);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        to[i] = type == ELEMENT_BFLOAT16 ? bf16_to_float(from[i]) : f16_to_float_portable(from[i]);
}
