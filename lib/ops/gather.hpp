// The element-wise gathers and scatters of the gather family (ONNX
// GatherElements and ScatterElements), shared by their references
// (lib/ops/gather.cc) and device kernels (simdevice/ops/gather.cc): where
// each index element reads or writes in the data.
#pragma once

#include <cstdint>
#include <vector>

#include "op_def.hpp"

namespace tessera {

// Data of shape `data` indexed by `indices` (the same rank, each extent at
// most data's off `axis`): for each index element, in row-major order, the
// offset in the data of the element with the same coordinates but 0 on
// `axis`. An index v then names offset base + v * stride, stride the
// data's row-major stride of `axis`.
struct ElementIndexing {
  std::vector<int64_t> bases;
  int64_t rows = 0;    // data[axis]: indices are in [-rows, rows)
  int64_t stride = 1;  // the data's stride of `axis`
};

inline ElementIndexing elementIndexing(const Shape& data, const Shape& indices, int64_t axis) {
  const std::size_t rank = data.size();
  std::vector<int64_t> strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * data[d];
  ElementIndexing e;
  e.rows = data[static_cast<std::size_t>(axis)];
  e.stride = strides[static_cast<std::size_t>(axis)];
  const int64_t n = numElements(indices);
  e.bases.reserve(static_cast<std::size_t>(n));
  std::vector<int64_t> coords(rank, 0);
  int64_t base = 0;  // of coords, without the axis term
  for (int64_t i = 0; i < n; ++i) {
    e.bases.push_back(base);
    for (std::size_t d = rank; d-- > 0;) {
      const int64_t step = static_cast<int64_t>(d) == axis ? 0 : strides[d];
      if (++coords[d] < indices[d]) {
        base += step;
        break;
      }
      base -= step * (coords[d] - 1);
      coords[d] = 0;
    }
  }
  return e;
}

}  // namespace tessera
