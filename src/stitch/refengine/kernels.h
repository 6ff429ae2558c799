// The reference engine's numeric kernels (internal to refengine).
//
// Every output element is computed by the same sequence of float operations
// whatever the number of rows in the call and wherever the row sits in it:
// eight interleaved partial sums over the inner dimension in index order, a
// fixed pairwise reduction, then the leftover elements in order. A sequence's
// numbers therefore do not depend on which other sequences share its batch,
// on whether its prompt was processed in one piece or token by token, or on
// whether the CPU takes the AVX2 or the baseline path (the file is compiled
// with -ffp-contract=off, so no path fuses a multiply into an add). This is
// why the engine uses these loops instead of a BLAS, whose blocking changes
// the summation order with the matrix sizes.
#pragma once

#include <cstdint>

namespace stitch::kernels {

// y[r * out + o] = sum_i x[r * in + i] * w[o * in + i] for r < rows, o < out:
// a batch of rows times the transpose of a row-major [out, in] matrix.
// REQUIRES: the arrays do not overlap y.
void MatMulTransposed(const float* x, int64_t rows, const float* w, int64_t out, int64_t in,
                      float* y);

// The same with explicit row strides: x row r at x + r * ldx, w row o at
// w + o * ldw, y element (r, o) at y[r * ldy + o]; each row is `in` long.
void MatMulTransposed(const float* x, int64_t rows, int64_t ldx, const float* w, int64_t out,
                      int64_t ldw, int64_t in, float* y, int64_t ldy);

// y[d] += p[j] * v[j * ldv + d] for d < n, accumulated over j = 0, 1, ...,
// rows - 1 in that order (attention's weighted sum of value rows).
void AccumulateWeightedRows(const float* p, int64_t rows, const float* v, int64_t ldv, int64_t n,
                            float* y);

}  // namespace stitch::kernels
