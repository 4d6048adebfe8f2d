/* A quantized Llama model's decoder layers, every layer of a forward pass in one call.
 *
 * The pass of decoder_layer.py's LayerModules, written out in C for quantized weights so that
 * a one-token pass is not thirty layers of Python and tensor calls around small products. Per
 * layer and row, with H the hidden size, D the head size:
 *
 *   normed = rms_norm(hidden, attn_norm)          sum of squares in 16 lanes (fmaf, element i
 *                                                 into lane i % 16), a fixed tree, / H, + eps,
 *                                                 1 / sqrtf; then (x * scale) * weight
 *   q, k, v = normed @ Wq/Wk/Wv (+ bias)          quantized_matmul.c's products
 *   q, k  = rms_norm(q, q_norm) per head          where the layer has them (Qwen3, Gemma 3)
 *   q, k  = x * cos + rotate_half(x) * sin        per head, as transformers rounds it, over
 *                                                 the first rot_dim dims (partial RoPE), with
 *                                                 the layer's table (none: no RoPE, SmolLM3)
 *   k, v  -> the row's sequence's cache at the row's position (keys transposed), in the
 *                                                 cache's element type (a 16-bit one rounded
 *                                                 to nearest even, each value by itself)
 *   att   = row_attention(q, cache)               row_attention.c, over the cache up to the row
 *                                                 (its last `window` keys, a sliding layer)
 *   hidden += att @ Wo                            (Gemma 3: rms_norm(att @ Wo, attn_post_norm))
 *   normed = rms_norm(hidden, ffn_norm)
 *   act    = silu(normed @ Wgate) * (normed @ Wup) silu(x) = (x >= 0 ? x : x * e) / (1 + e),
 *                                                 e = exp(-|x|) (row_attention.h's exp_approx);
 *                                                 Gemma 3: gelu(x) = x/2 * (1 + tanh(u)),
 *                                                 u = 0.7978845608 * (x + 0.044715 x^3),
 *                                                 tanh(u) = sign(u) (1 - e) / (1 + e),
 *                                                 e = exp(-2|u|)
 *   hidden += act @ Wdown                         (Gemma 3: its ffn_post_norm likewise)
 *
 * Every step computes a row from that row alone (its sequence's cache aside) by a fixed
 * formula, built without -ffast-math and with -ffp-contract=off: a row's bits never depend on
 * the rows, sequences or threads beside it, so the pass is row-invariant by construction, as
 * its two kernels are.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"              /* 16-bit keys and values */
#include "quantized_matmul.h"  /* struct weights, packed_matmul */
#include "row_attention.h"     /* row_attention, exp_approx; bounds.h: MAX_DIM */

/* One linear layer: quantized_matmul.c's weights (header: its entry points' flags), and a bias
 * (n floats) or NULL. */
struct linear {
    const uint8_t *panels;
    int64_t n, k;
    int32_t block, bits, header;
    const float *bias;
};

/* One decoder layer. The query/key/value products are 1 or 3 linear parts whose outputs sit
 * side by side (one fused weight, or three), the gate/up products 1 or 2. */
struct layer {
    const float *attn_norm, *ffn_norm;
    struct linear qkv[3], o, gate_up[2], down;
    int32_t qkv_parts, gate_up_parts;
    const float *q_norm, *k_norm;                /* per-head norms, or NULL */
    const float *attn_post_norm, *ffn_post_norm; /* norms after attention / the MLP, or NULL */
    int32_t rope;                                /* the pass's rotary table, -1: no RoPE */
    int64_t window;                              /* a sliding window's keys, 0: all */
};

struct model {
    int32_t layers, hidden, heads, kv_heads, head_dim, intermediate;
    float eps, scale;
    const struct layer *layer;
    int32_t rot_dim, ropes, gelu;  /* rotated dims of a head; rotary tables; GELU, not SiLU */
};

/* Rows at which the element-wise steps are shared among the threads. */
#define PARALLEL_ROWS 16

static void rms_norm(const float *x, const float *weight, float eps, int64_t h, float *out) {
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= h; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = fmaf(x[i + l], x[i + l], lanes[l]);
    for (int l = 0; i + l < h; l++) lanes[l] = fmaf(x[i + l], x[i + l], lanes[l]);
    for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) lanes[l] = lanes[l] + lanes[l + width];
    const float scale = 1.0f / sqrtf(lanes[0] / (float)h + eps);
    for (int64_t j = 0; j < h; j++) out[j] = (x[j] * scale) * weight[j];
}

/* x * cos + rotate_half(x) * sin over one head's first `rot` dims (rotate_half(x) =
 * (-x[half:rot], x[:half])), the others kept; cos, sin: NULL for no rotation. */
static void rotary(const float *x, const float *cos, const float *sin, int dim, int rot,
                   float *out) {
    const int turned = cos ? rot : 0, half = turned / 2;
    for (int d = 0; d < half; d++) out[d] = -x[d + half] * sin[d] + x[d] * cos[d];
    for (int d = half; d < turned; d++) out[d] = x[d - half] * sin[d] + x[d] * cos[d];
    for (int d = turned; d < dim; d++) out[d] = x[d];
}

/* One head through its norm (if any), then rotated. */
static void head_in(const float *x, const float *norm, float eps, const float *cos,
                    const float *sin, int dim, int rot, float *out) {
    float normed[MAX_DIM];
    if (norm) rms_norm(x, norm, eps, dim, normed);
    rotary(norm ? normed : x, cos, sin, dim, rot, out);
}

static inline float gelu(float x) {
    const float u = 0.7978845608f * (x + 0.044715f * (x * x * x));
    const float e = exp_approx(-2.0f * fabsf(u));
    const float t = (1.0f - e) / (1.0f + e);
    return 0.5f * x * (1.0f + (u >= 0.0f ? t : -t));
}

/* rows of `product` (rows x h) through a norm after attention or the MLP (NULL: none), then
 * added to hidden. */
static void add_normed(float *hidden, float *product, const float *norm, float eps, int64_t rows,
                       int64_t h, float *normed, int parallel, int threads) {
    if (norm) {
#pragma omp parallel for num_threads(threads) if (parallel)
        for (int64_t r = 0; r < rows; r++)
            rms_norm(product + r * h, norm, eps, h, normed + r * h);
        product = normed;
    }
    for (int64_t i = 0; i < rows * h; i++) hidden[i] = hidden[i] + product[i];
}

static inline float silu(float x) {
    const float e = exp_approx(x >= 0.0f ? -x : x);
    return (x >= 0.0f ? x : x * e) / (1.0f + e);
}

/* normed (rows x k) times the parts' weights, side by side into out (row stride ld). */
static int linear_parts(const struct linear *parts, int count, const float *normed, int64_t rows,
                        float *out, int64_t ld, int threads) {
    int64_t first = 0;
    for (int p = 0; p < count; p++) {
        const struct linear *l = &parts[p];
        if (!known_layout(l->block, l->bits, l->k)) return -1;
        const struct weights w = weights_of(l->panels, l->n, l->k, l->block, l->bits, l->header);
        if (packed_matmul(&w, normed, rows, out + first, ld, l->bias, threads)) return -2;
        first += l->n;
    }
    return 0;
}

/* Floats of activations a row of a pass takes in layers_of_rows' buffer: the normed input, the
 * query/key/value products, the rotated queries and their attention, a product's output, the
 * gate/up products and their activation. */
static int64_t scratch_floats(const struct model *m) {
    const int64_t h = m->hidden, q_width = (int64_t)m->heads * m->head_dim;
    const int64_t kv_width = (int64_t)m->kv_heads * m->head_dim, inter = m->intermediate;
    return h + (q_width + 2 * kv_width) + 2 * q_width + h + 3 * inter;
}

/* `hidden` (rows x hidden, float32) through every layer, in place; see quantized_layers. cos
 * and sin: this call's first row's entries of tables of `table_rows` rows. */
static int layers_of_rows(const struct model *m, float *hidden, int64_t rows, const float *cos,
                          const float *sin, int64_t table_rows, const int64_t *row_sequence,
                          const int64_t *row_position, const int64_t *key_pointers,
                          const int64_t *value_pointers, const int64_t *capacities,
                          int64_t sequences, int kv_type, int threads) {
    const int64_t h = m->hidden, dim = m->head_dim, inter = m->intermediate;
    const int64_t q_width = (int64_t)m->heads * dim, kv_width = (int64_t)m->kv_heads * dim;
    const int64_t qkv_width = q_width + 2 * kv_width;
    float *buffer = malloc(sizeof(float) * (size_t)(rows * scratch_floats(m)));
    if (!buffer) return -2;
    float *normed = buffer, *qkv = normed + rows * h, *query = qkv + rows * qkv_width;
    float *attended = query + rows * q_width, *product = attended + rows * q_width;
    float *gate_up = product + rows * h, *act = gate_up + rows * 2 * inter;
    const int parallel = rows >= PARALLEL_ROWS;
    int status = 0;
    for (int32_t index = 0; index < m->layers && status == 0; index++) {
        const struct layer *L = &m->layer[index];
        const int64_t *keys_at = key_pointers + index * sequences;
        const int64_t *values_at = value_pointers + index * sequences;
        const int64_t *capacity_at = capacities + index * sequences;
#pragma omp parallel for num_threads(threads) if (parallel)
        for (int64_t r = 0; r < rows; r++)
            rms_norm(hidden + r * h, L->attn_norm, m->eps, h, normed + r * h);
        status = linear_parts(L->qkv, L->qkv_parts, normed, rows, qkv, qkv_width, threads);
        if (status) break;
        /* Rotate queries and keys; keys and values into the row's sequence's cache. */
#pragma omp parallel for num_threads(threads) if (parallel)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t table = ((int64_t)L->rope * table_rows + r) * m->rot_dim;
            const float *row = qkv + r * qkv_width;
            const float *c = L->rope < 0 ? NULL : cos + table, *s = L->rope < 0 ? NULL : sin + table;
            for (int head = 0; head < m->heads; head++)
                head_in(row + head * dim, L->q_norm, m->eps, c, s, (int)dim, m->rot_dim,
                        query + r * q_width + head * dim);
            const int64_t sequence = row_sequence[r], position = row_position[r];
            void *keys = (void *)(intptr_t)keys_at[sequence];
            void *values = (void *)(intptr_t)values_at[sequence];
            const int64_t capacity = capacity_at[sequence];
            float rotated[MAX_DIM];
            for (int g = 0; g < m->kv_heads; g++) {
                head_in(row + q_width + g * dim, L->k_norm, m->eps, c, s, (int)dim, m->rot_dim,
                        rotated);
                const float *value = row + q_width + kv_width + g * dim;
                for (int64_t d = 0; d < dim; d++) {
                    store_element(keys, kv_type, (g * dim + d) * capacity + position, rotated[d]);
                    store_element(values, kv_type, (g * capacity + position) * dim + d, value[d]);
                }
            }
        }
        if (row_attention(ELEMENT_FLOAT32, kv_type, query, attended, rows, row_sequence,
                          row_position, keys_at, values_at, capacity_at, m->heads, m->kv_heads,
                          (int)dim, m->scale, L->window, threads)) {
            status = -1;
            break;
        }
        status = linear_parts(&L->o, 1, attended, rows, product, h, threads);
        if (status) break;
        add_normed(hidden, product, L->attn_post_norm, m->eps, rows, h, normed, parallel, threads);
#pragma omp parallel for num_threads(threads) if (parallel)
        for (int64_t r = 0; r < rows; r++)
            rms_norm(hidden + r * h, L->ffn_norm, m->eps, h, normed + r * h);
        status = linear_parts(L->gate_up, L->gate_up_parts, normed, rows, gate_up, 2 * inter,
                              threads);
        if (status) break;
#pragma omp parallel for num_threads(threads) if (parallel)
        for (int64_t r = 0; r < rows; r++) {
            const float *gate = gate_up + r * 2 * inter, *up = gate + inter;
            if (m->gelu)
                for (int64_t i = 0; i < inter; i++) act[r * inter + i] = gelu(gate[i]) * up[i];
            else
                for (int64_t i = 0; i < inter; i++) act[r * inter + i] = silu(gate[i]) * up[i];
        }
        status = linear_parts(&L->down, 1, act, rows, product, h, threads);
        if (status) break;
        add_normed(hidden, product, L->ffn_post_norm, m->eps, rows, h, normed, parallel, threads);
    }
    free(buffer);
    return status;
}

/* Rows that go through the layers together: a longer pass (a long prompt's chunk) runs in
 * slices, one after the other, each through every layer, so its activations take a slice's
 * rows of memory instead of the whole pass's: as many rows as `slice_bytes` hold (a row:
 * scratch_floats(), and the copy of a product's input that quantized_matmul.c's many-row path
 * makes; Gemma 3 270M: 51 KiB), within SLICE_MIN_ROWS..SLICE_MAX_ROWS, split evenly (a
 * 512-row pass of Gemma 3 270M in slices of 8 MiB: 4 of 128 rows). The bits are the same
 * whatever the slices: a row depends on its own position and its sequence's cache alone, and a
 * slice's keys and values are in the cache before the next slice attends to them. */
#define SLICE_MIN_ROWS 64
#define SLICE_MAX_ROWS 512

static int64_t slice_rows(const struct model *m, int64_t slice_bytes) {
    if (slice_bytes <= 0) return SLICE_MAX_ROWS;  /* no budget: the most rows */
    int64_t widest = m->hidden > m->intermediate ? m->hidden : m->intermediate;
    if ((int64_t)m->heads * m->head_dim > widest) widest = (int64_t)m->heads * m->head_dim;
    const int64_t rows = slice_bytes / ((int64_t)sizeof(float) * (scratch_floats(m) + widest));
    return rows < SLICE_MIN_ROWS ? SLICE_MIN_ROWS : rows > SLICE_MAX_ROWS ? SLICE_MAX_ROWS : rows;
}

/* Entry point: `hidden` (rows x hidden, float32) through every layer, in place. Row r belongs
 * to sequence row_sequence[r] at position row_position[r]; layer l's cache of sequence s is
 * key_pointers / value_pointers / capacities [l * sequences + s] (row_attention.c's layouts,
 * element type kv_type, bounds.h's ELEMENT_*; room up to the pass's last position). cos, sin:
 * (ropes x rows x rot_dim). slice_bytes: the activations' memory (see slice_rows; 0: slices
 * of SLICE_MAX_ROWS). Returns 0,
 * -1 for a shape the kernels do not take, -2 out of memory. */
int quantized_layers(const struct model *m, float *hidden, int64_t rows, const float *cos,
                     const float *sin, const int64_t *row_sequence, const int64_t *row_position,
                     const int64_t *key_pointers, const int64_t *value_pointers,
                     const int64_t *capacities, int64_t sequences, int kv_type, int threads,
                     int64_t slice_bytes) {
    if (rows <= 0) return 0;
    /* Slices of equal size (the last a few rows shorter), none longer than slice_rows. */
    const int64_t longest = slice_rows(m, slice_bytes), slices = (rows + longest - 1) / longest;
    const int64_t slice = (rows + slices - 1) / slices;
    for (int64_t first = 0; first < rows; first += slice) {
        const int64_t count = rows - first < slice ? rows - first : slice;
        const int status = layers_of_rows(
            m, hidden + first * m->hidden, count, cos + first * m->rot_dim,
            sin + first * m->rot_dim, rows, row_sequence + first, row_position + first,
            key_pointers, value_pointers, capacities, sequences, kv_type, threads);
        if (status) return status;
    }
    return 0;
}
