#include "stitch/refengine/kernels.h"

#include <algorithm>

namespace stitch::kernels {
namespace {

// Eight float lanes. On the baseline x86-64 path the compiler splits each
// operation into two SSE halves; on the AVX2 path it is one register. The
// lanes never mix until Reduce8, so both paths compute identical bits.
typedef float V8 __attribute__((vector_size(32)));
// The same, readable at any float address (GCC's documented way to load a
// vector from unaligned memory without breaking aliasing rules).
typedef float V8Unaligned __attribute__((vector_size(32), aligned(4), may_alias));

// Reduce8 takes its vector by reference: passing it by value would have a
// different ABI on the two paths.
[[gnu::always_inline]] inline float Reduce8(const V8& a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// An R x C block of outputs: R rows of x against C rows of w.
template <int R, int C>
[[gnu::always_inline]] inline void Tile(const float* x, int64_t ldx, const float* w, int64_t ldw,
                                        int64_t in, float* y, int64_t ldy) {
  V8 acc[R][C] = {};
  const int64_t in8 = in & ~int64_t{7};
  for (int64_t i = 0; i < in8; i += 8) {
    V8 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = *reinterpret_cast<const V8Unaligned*>(x + r * ldx + i);
    for (int c = 0; c < C; ++c) {
      const V8 wv = *reinterpret_cast<const V8Unaligned*>(w + c * ldw + i);
      for (int r = 0; r < R; ++r) acc[r][c] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = Reduce8(acc[r][c]);
      for (int64_t i = in8; i < in; ++i) s += x[r * ldx + i] * w[c * ldw + i];
      y[r * ldy + c] = s;
    }
  }
}

// Rows of x processed against each block of w rows before moving on: small
// enough to stay in cache while every w row streams past once.
constexpr int64_t kRowChunk = 64;
constexpr int kTileRows = 4;
constexpr int kTileCols = 2;
constexpr int kWideCols = 8;

}  // namespace

__attribute__((target_clones("avx2", "default"))) void MatMulTransposed(const float* x,
                                                                        int64_t rows, int64_t ldx,
                                                                        const float* w, int64_t out,
                                                                        int64_t ldw, int64_t in,
                                                                        float* y, int64_t ldy) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t r_end = std::min(rows, r0 + kRowChunk);
    int64_t o = 0;
    if (r_end - r0 < kTileRows) {
      // Few rows (decoding a small batch): the product is bound by reading w,
      // so stream many w rows at once.
      for (; o + kWideCols <= out; o += kWideCols) {
        for (int64_t r = r0; r < r_end; ++r) {
          Tile<1, kWideCols>(x + r * ldx, ldx, w + o * ldw, ldw, in, y + r * ldy + o, ldy);
        }
      }
    }
    for (; o + kTileCols <= out; o += kTileCols) {
      const float* wo = w + o * ldw;
      int64_t r = r0;
      for (; r + kTileRows <= r_end; r += kTileRows) {
        Tile<kTileRows, kTileCols>(x + r * ldx, ldx, wo, ldw, in, y + r * ldy + o, ldy);
      }
      for (; r < r_end; ++r)
        Tile<1, kTileCols>(x + r * ldx, ldx, wo, ldw, in, y + r * ldy + o, ldy);
    }
    for (; o < out; ++o) {
      for (int64_t r = r0; r < r_end; ++r) {
        Tile<1, 1>(x + r * ldx, ldx, w + o * ldw, ldw, in, y + r * ldy + o, ldy);
      }
    }
  }
}

void MatMulTransposed(const float* x, int64_t rows, const float* w, int64_t out, int64_t in,
                      float* y) {
  MatMulTransposed(x, rows, in, w, out, in, in, y, out);
}

// Lanes run over d, never across j, so every path adds in the same order.
__attribute__((target_clones("avx2", "default"))) void AccumulateWeightedRows(
    const float* p, int64_t rows, const float* v, int64_t ldv, int64_t n, float* y) {
  for (int64_t j = 0; j < rows; ++j) {
    const float pj = p[j];
    const float* vj = v + j * ldv;
    for (int64_t d = 0; d < n; ++d) y[d] += pj * vj[d];
  }
}

}  // namespace stitch::kernels
