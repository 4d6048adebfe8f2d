/* The kernels' bounds, each written here only: the C sources include this header, and
 * native_build.py's bounds() reads its #define lines for the Python side (the KV cache's
 * growth, which attention shapes go to the kernel, the panels' packing, element types). */
#ifndef PROMPTLOOKUP_BOUNDS_H
#define PROMPTLOOKUP_BOUNDS_H

#define KEY_BLOCK 64    /* keys per block of attention; cache capacities are multiples of it */
#define MAX_GROUP 16    /* query heads per key/value head that row_attention.c takes */
#define MAX_DIM 256     /* head size that row_attention.c takes */
#define PANEL_LANES 16  /* outputs per panel of a packed weight (quantized_matmul.c) */

/* Element types of queries, outputs and cached keys and values (half.h converts them). */
#define ELEMENT_FLOAT32 0
#define ELEMENT_BFLOAT16 1
#define ELEMENT_FLOAT16 2

#endif
