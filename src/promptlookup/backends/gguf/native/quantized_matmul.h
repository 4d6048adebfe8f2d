/* quantized_matmul.c's weights and products, for quantized_layers.c; the entry points Python
 * calls. The panels' layout is described in quantized_matmul.c. */
#ifndef PROMPTLOOKUP_QUANTIZED_MATMUL_H
#define PROMPTLOOKUP_QUANTIZED_MATMUL_H

#include <stdint.h>

#include "bounds.h"

/* One weight matrix in panels (see quantized_matmul.c's header). */
struct weights {
    const uint8_t *panels;
    int64_t n, k;        /* outputs, inputs */
    int block;           /* inputs per block: 16 or 32 */
    int bits;            /* 4 or 8 */
    int has_offset;      /* whether blocks carry m */
    int half;            /* whether s and m are float16 (else float32) */
};

/* The `header` argument of the entry points: its bit 0 says the blocks carry offsets, bit 1
 * that scales and offsets are float16. */
static inline struct weights weights_of(const uint8_t *panels, int64_t n, int64_t k, int block,
                                        int bits, int header) {
    struct weights w = {panels, n, k, block, bits, header & 1, (header >> 1) & 1};
    return w;
}

static inline int known_layout(int block, int bits, int64_t k) {
    return (block == 16 || block == 32) && (bits == 4 || bits == 8) && k % block == 0;
}

/* y (rows x n, row stride ldy) = x (rows x k) times w's transpose, plus bias (n floats, or
 * NULL). Returns 0, or -2 out of memory. Not exported from the library. */
__attribute__((visibility("hidden"))) int packed_matmul(const struct weights *w, const float *x,
                                                        int64_t rows, float *y, int64_t ldy,
                                                        const float *bias, int threads);

/* Entry points. y (rows x n, float32) = x (rows x k, float32) times the weights' transpose,
 * plus bias (n floats, or NULL). Returns 0, -1 for a layout it does not know, -2 out of
 * memory. */
int quantized_matmul(const uint8_t *panels, int64_t n, int64_t k, int block, int bits,
                     int header, const float *x, int64_t rows, float *y, const float *bias,
                     int threads);
/* Rows `ids` of the weight matrix (the embedding's table), dequantized: out (count x k). */
void quantized_rows(const uint8_t *panels, int64_t n, int64_t k, int block, int bits,
                    int header, const int64_t *ids, int64_t count, float *out);

#endif
