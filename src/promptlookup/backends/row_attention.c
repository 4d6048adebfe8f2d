/* Causal attention whose every query row is computed by one fixed formula.
 *
 * A row's result depends only on its own query, its position p and the keys and values
 * 0..p of its own sequence: never on how many other rows, heads or sequences share the call,
 * nor on which thread computes it. Every value is defined by C's IEEE semantics (no
 * reassociation: built without -ffast-math and with -ffp-contract=off, products and sums
 * written as explicit fmaf, + and *), so a vectorised and a scalar evaluation of the same
 * expression give the same bits. Rows are grouped in tasks (up to TILE rows of one sequence,
 * one key/value head) for the threads; no arithmetic is shared between rows.
 *
 * For one row and one query head, with s = scale:
 *   score[j]  = fmaf chain over d = 0..D-1 of query[d] * key[j][d], from 0   (j = 0..p)
 *   top       = max_j score[j] * s
 *   weight[j] = exp(score[j] * s - top)                    (exp_approx below, fixed)
 *   total     = sum of weight[j] into lane j % LANES, in order of j, then a fixed tree
 *   out[d]    = (fmaf chain over j of weight[j] * value[j][d], from 0) / total
 *
 * Layouts (one sequence's cache): keys  [kv_heads][D][capacity] (transposed, so a block of
 * keys is a contiguous vector per dimension), values [kv_heads][capacity][D]. Queries and
 * outputs: [rows][heads][D]. Element type float32 or bfloat16 (computed in float32, the output
 * rounded to nearest even).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16   /* lanes of the weight sum and of the maximum */
#define BLOCK 64   /* keys scored side by side (cache capacities are multiples of it) */
#define TILE 4     /* rows of one sequence per task */
#define MAX_GROUP 16
#define MAX_DIM 256

static inline float bf16_to_float(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);  /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

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

typedef struct {
    const void *query;
    void *out;
    const int64_t *row_sequence;  /* the sequence of each row */
    const int64_t *row_position;  /* its position: it sees keys 0..position */
    const int64_t *key_pointers, *value_pointers, *capacities;  /* per sequence */
    int heads, kv_heads, head_dim;
    float scale;
} call_t;

/* Rows first..first+count-1 (one sequence), key/value head h; ELEMENT is float or uint16_t
 * (bfloat16), TO_FLOAT reads one. Written once as a macro so that each element type gets its
 * own loops, vectorised without a branch on the type inside them. */
#define DEFINE_ATTEND_TILE(NAME, ELEMENT, TO_FLOAT, STORE, DIM, DIM_BOUND, KEY_TYPE, AS_FLOAT_BLOCK, AS_FLOAT_ROWS, KEY_STRIDE)                  \
/* score[l] = fmaf chain over d of query[d] * key[d][l], for a block of BLOCK keys (kept in  \
 * registers: its own function, small enough for the compiler to see that). */             \
__attribute__((noinline)) static void NAME##_scores(const KEY_TYPE *keys, int64_t stride,    \
                                                    const float *query, int dim, float *to) { \
    float acc[BLOCK] = {0};                                                                   \
    for (int d = 0; d < (DIM); d++) {                                                         \
        const float q = query[d];                                                             \
        const KEY_TYPE *key_row = keys + d * stride;                                          \
        for (int l = 0; l < BLOCK; l++) acc[l] = fmaf(q, key_row[l], acc[l]);                 \
    }                                                                                         \
    for (int l = 0; l < BLOCK; l++) to[l] = acc[l];                                           \
}                                                                                             \
/* sum[d] = fmaf chain over j < seen of weight[j] * value[j][d], continued from sum[d]. */   \
__attribute__((noinline)) static void NAME##_values(const KEY_TYPE *values, const float *weights, \
                                                    int64_t seen, int dim, float *to) {       \
    float sum[DIM_BOUND];                                                                     \
    for (int d = 0; d < (DIM); d++) sum[d] = to[d];                                           \
    for (int64_t j = 0; j < seen; j++) {                                                      \
        const float w = weights[j];                                                           \
        const KEY_TYPE *value_row = values + j * (DIM);                                       \
        for (int d = 0; d < (DIM); d++) sum[d] = fmaf(w, value_row[d], sum[d]);               \
    }                                                                                         \
    for (int d = 0; d < (DIM); d++) to[d] = sum[d];                                           \
}                                                                                             \
static void NAME(const call_t *c, int64_t first, int count, int h) {                          \
    const int group = c->heads / c->kv_heads, dim = c->head_dim;                             \
    const int64_t sequence = c->row_sequence[first], capacity = c->capacities[sequence];     \
    const ELEMENT *keys = (const ELEMENT *)(intptr_t)c->key_pointers[sequence]               \
                          + (int64_t)h * dim * capacity;                                      \
    const ELEMENT *values = (const ELEMENT *)(intptr_t)c->value_pointers[sequence]           \
                            + (int64_t)h * dim * capacity;                                    \
    const ELEMENT *query = (const ELEMENT *)c->query;                                         \
    int64_t seen[TILE * MAX_GROUP], longest = 0;                                              \
    const int vectors = count * group;  /* query vectors of the tile: row-major, then head */ \
    for (int v = 0; v < vectors; v++) {                                                       \
        seen[v] = c->row_position[first + v / group] + 1;                                     \
        if (seen[v] > longest) longest = seen[v];                                             \
    }                                                                                         \
    const int64_t padded = (longest + BLOCK - 1) / BLOCK * BLOCK;                             \
    float *scores = malloc(sizeof(float) * (size_t)vectors * (size_t)padded);                 \
    if (scores == NULL) abort();  /* out of memory: as loud as Python's own failure */       \
    float queries[TILE * MAX_GROUP][MAX_DIM];                                                 \
    for (int v = 0; v < vectors; v++) {                                                       \
        const ELEMENT *from = query + ((first + v / group) * c->heads                          \
                                       + (int64_t)h * group + v % group) * dim;               \
        for (int d = 0; d < dim; d++) queries[v][d] = TO_FLOAT(from[d]);                      \
    }                                                                                         \
    /* Scores: a block of keys at a time (contiguous per dimension), read as float once per  \
     * block for all the task's vectors. */                                                   \
    float block[MAX_DIM * BLOCK];  /* bfloat16 keys or values of one block, as float */    \
    (void)block;                                                                              \
    for (int64_t j0 = 0; j0 < padded; j0 += BLOCK) {                                          \
        const KEY_TYPE *key_block = AS_FLOAT_BLOCK(keys + j0, capacity, dim, block);          \
        const int64_t stride = KEY_STRIDE(capacity);                                          \
        for (int v = 0; v < vectors; v++)                                                     \
            NAME##_scores(key_block, stride, queries[v], dim, scores + (size_t)v * padded + j0); \
    }                                                                                         \
    /* Softmax weights per vector, over its own row's keys only (0 past them). */             \
    float totals[TILE * MAX_GROUP];                                                           \
    for (int v = 0; v < vectors; v++) {                                                       \
        float *row = scores + (size_t)v * padded;                                             \
        const int64_t n = seen[v];                                                            \
        float top = -INFINITY;  /* a maximum does not depend on order */                     \
        for (int64_t j = 0; j < n; j++) {                                                     \
            const float scaled = row[j] * c->scale;                                           \
            top = scaled > top ? scaled : top;                                                \
        }                                                                                     \
        /* Whole lanes first (vectorised), then the rest: the same formula either way. */     \
        float lanes[LANES] = {0};                                                             \
        int64_t j0 = 0;                                                                       \
        for (; j0 + LANES <= n; j0 += LANES)                                                  \
            for (int l = 0; l < LANES; l++) {                                                 \
                const float weight = exp_approx(row[j0 + l] * c->scale - top);                \
                row[j0 + l] = weight;                                                         \
                lanes[l] = lanes[l] + weight;                                                 \
            }                                                                                 \
        for (int l = 0; j0 + l < n; l++) {                                                    \
            const float weight = exp_approx(row[j0 + l] * c->scale - top);                    \
            row[j0 + l] = weight;                                                             \
            lanes[l] = lanes[l] + weight;                                                     \
        }                                                                                     \
        for (int width = LANES / 2; width >= 1; width /= 2)                                   \
            for (int l = 0; l < width; l++) lanes[l] = lanes[l] + lanes[l + width];           \
        totals[v] = lanes[0];                                                                 \
    }                                                                                         \
    /* Weighted sums of the values, one fmaf chain over j per output element, carried from   \
     * block to block (values read as float once per block for all the task's vectors). */   \
    float sums[TILE * MAX_GROUP][MAX_DIM];                                                    \
    for (int v = 0; v < vectors; v++)                                                         \
        for (int d = 0; d < dim; d++) sums[v][d] = 0.0f;                                      \
    for (int64_t j0 = 0; j0 < longest; j0 += BLOCK) {                                         \
        const int64_t rows = longest - j0 < BLOCK ? longest - j0 : BLOCK;                     \
        const KEY_TYPE *value_block = AS_FLOAT_ROWS(values + j0 * dim, rows * dim, block);    \
        for (int v = 0; v < vectors; v++) {                                                   \
            const int64_t n = seen[v] - j0 < rows ? seen[v] - j0 : rows;                      \
            if (n > 0)                                                                        \
                NAME##_values(value_block, scores + (size_t)v * padded + j0, n, dim, sums[v]); \
        }                                                                                     \
    }                                                                                         \
    ELEMENT *out = (ELEMENT *)c->out;                                                         \
    for (int v = 0; v < vectors; v++) {                                                       \
        ELEMENT *to = out + ((first + v / group) * c->heads + (int64_t)h * group + v % group) * dim; \
        for (int d = 0; d < dim; d++) to[d] = STORE(sums[v][d] / totals[v]);                  \
    }                                                                                         \
    free(scores);                                                                             \
}

#define SAME(x) (x)
/* float32 caches are read in place; bfloat16 blocks are converted into `block` first. */
#define IN_PLACE(keys, capacity, dim, block) (keys)
#define IN_PLACE_ROWS(values, count, block) (values)
#define CAPACITY(capacity) (capacity)
#define WHOLE_BLOCK(capacity) BLOCK

static const float *bf16_key_block(const uint16_t *keys, int64_t capacity, int dim, float *block) {
    for (int d = 0; d < dim; d++)
        for (int l = 0; l < BLOCK; l++) block[d * BLOCK + l] = bf16_to_float(keys[d * capacity + l]);
    return block;
}

static const float *bf16_rows(const uint16_t *values, int64_t count, float *block) {
    for (int64_t i = 0; i < count; i++) block[i] = bf16_to_float(values[i]);
    return block;
}
/* Each element type for the common head sizes (64, 128: constant trip counts, accumulators in
 * registers) and for any other up to MAX_DIM. The formula is the same in all of them. */
#define FLOAT_TILE(NAME, DIM, BOUND) \
    DEFINE_ATTEND_TILE(NAME, float, SAME, SAME, DIM, BOUND, float, IN_PLACE, IN_PLACE_ROWS, CAPACITY)
#define BF16_TILE(NAME, DIM, BOUND) \
    DEFINE_ATTEND_TILE(NAME, uint16_t, bf16_to_float, float_to_bf16, DIM, BOUND, float, \
                       bf16_key_block, bf16_rows, WHOLE_BLOCK)
FLOAT_TILE(float_64, 64, 64)
FLOAT_TILE(float_128, 128, 128)
FLOAT_TILE(float_any, dim, MAX_DIM)
BF16_TILE(bf16_64, 64, 64)
BF16_TILE(bf16_128, 128, 128)
BF16_TILE(bf16_any, dim, MAX_DIM)

typedef void (*tile_function)(const call_t *, int64_t, int, int);

/* Entry point: every row of the call, each against its own sequence's cache. Returns 0, or
 * -1 when a shape is beyond the static bounds above (the caller then uses another path). */
int row_attention(int bf16, const void *query, void *out, int64_t rows,
                  const int64_t *row_sequence, const int64_t *row_position,
                  const int64_t *key_pointers, const int64_t *value_pointers,
                  const int64_t *capacities, int heads, int kv_heads, int head_dim,
                  float scale, int threads) {
    if (kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP || head_dim > MAX_DIM)
        return -1;
    call_t c = {query, out, row_sequence, row_position, key_pointers, value_pointers,
                capacities, heads, kv_heads, head_dim, scale};
    const tile_function attend =
        head_dim == 64 ? (bf16 ? bf16_64 : float_64)
        : head_dim == 128 ? (bf16 ? bf16_128 : float_128) : (bf16 ? bf16_any : float_any);
    /* Tiles: runs of up to TILE rows of one sequence. */
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
        while (n < TILE && r + n < rows && row_sequence[r + n] == row_sequence[r]) n++;
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
