// Strided copies and sums a plane at a time. A strided loop's two innermost
// dimensions form a plane: `rows` rows of `cols` points each. The kernels
// that move or reduce values along strides (Transpose, Slice, pads, Concat
// parts, Reshape, BroadcastTo; ReduceSum, ReduceMean, ReduceToShape) walk
// the outer dimensions once per plane and handle each plane's common
// patterns (contiguous rows, rows filled with one value, 2-D transposes,
// short rows summed into one value each, rows summed into one row) in a
// loop made for it, instead of point by point. The binary elementwise ops
// with vector forms walk their broadcast loops by planes too
// (ops/elementwise.cc).
#pragma once

#include <array>
#include <cstdint>

#include "kernels.hpp"

namespace tessera::sim {

struct Plane {
  int64_t rows = 1;
  int64_t cols = 1;
  // Each operand's strides (the loop's: 0 is the output) between rows and
  // between the points of a row.
  std::array<int64_t, kMaxOperands> row{};
  std::array<int64_t, kMaxOperands> col{};
};

// The plane of the loop's two innermost dimensions (rows = 1 for a loop of
// rank 1, one point for rank 0).
Plane innerPlane(const StridedLoop& loop);

// Calls plane(outOffset, in0Offset, in1Offset) at the origin of every
// plane of the loop, in the loop's order (nothing when a dimension is
// empty).
template <class F>
void forEachPlane(const StridedLoop& loop, F&& plane) {
  for (int d = 0; d < loop.rank; ++d)
    if (loop.size[static_cast<std::size_t>(d)] == 0) return;
  if (loop.rank <= 2) {
    plane(int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  StridedLoop outer = loop;
  outer.rank = loop.rank - 2;
  forEachRow(outer, [&](int64_t n, int64_t s0, int64_t s1, int64_t s2, int64_t o0, int64_t o1, int64_t o2) {
    for (int64_t i = 0; i < n; ++i) plane(o0 + i * s0, o1 + i * s1, o2 + i * s2);
  });
}

// out[r * row[0] + c * col[0]] = in[r * row[1] + c * col[1]] for every
// point.
void copyPlane(const Plane& p, float* out, const float* in);

// out[r * row[0] + c * col[0]] += in[r * row[1] + c * col[1]], the points
// visited row by row, each row in order, so every output element gets its
// terms in the loop's order; a row of kRowSumLanes values or more that adds
// into one output element (col[0] 0, col[1] 1) is summed as rowSum() orders
// it, then added. Rows that add into different output elements may be
// summed side by side: each element's order stays.
void sumPlane(const Plane& p, float* out, const float* in);

// Every point of the loop: copyPlane and sumPlane over its planes.
void copyStrided(const StridedLoop& loop, float* out, const float* in);
void sumStrided(const StridedLoop& loop, float* out, const float* in);
// The same into double accumulators (out's offsets count elements, as for
// float), a long row into one element summed as rowSumWide() orders it: the
// reductions sum in double and round once.
void sumStrided(const StridedLoop& loop, double* out, const float* in);

}  // namespace tessera::sim
