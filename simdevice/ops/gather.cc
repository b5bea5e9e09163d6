// The gather family's kernels (lib/ops/gather.cc defines the ops): slice
// copies by index along the op's axis, and the scatter-add of the gradient,
// in index order so that repeated indices add up the same way on every run.
#include <algorithm>

#include <fmt/format.h>

#include "kernel_table.hpp"
#include "tessera/error.hpp"

namespace tessera::sim {
namespace {

// Indices come from the host or from int32 ops as exact floats; one outside
// [-rows, rows) names no row.
int64_t rowAt(const Step& s, float index, int64_t i, int64_t rows) {
  if (!(index >= static_cast<float>(-rows) && index < static_cast<float>(rows))) {
    throw DeviceError(
        ErrorCode::InvalidProgram, s.name,
        fmt::format("{}: index {} (element {}) is outside [{}, {}); indices must name rows of the "
                    "table",
                    s.kind, index, i, -rows, rows));
  }
  const auto row = static_cast<int64_t>(index);
  return row < 0 ? row + rows : row;
}

// Per group: operand 0 the table (Gather) or dy (GatherGrad), operand 1 the
// indices. The table [A..., V, D...] is `groups` blocks (the product of A) of
// `rows` (V) slices of `cols` elements (the product of D); the gathered
// values are `groups` blocks of one slice per index.
template <bool kScatter>
void gatherKernel(const Step& s) {
  const int64_t n = s.inElements[1];
  const int64_t block = s.rows * s.cols;  // a block of the table
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* values = inOf(s, run, 0) + (run.advance[0] ? g * s.inElements[0] : 0);
      const float* indices = inOf(s, run, 1) + (run.advance[1] ? g * s.inElements[1] : 0);
      float* out = outOf(s, run) + g * s.outElements;
      if constexpr (kScatter) {
        std::fill_n(out, s.outElements, 0.0f);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t row = rowAt(s, indices[i], i, s.rows);
          for (int64_t o = 0; o < s.groups; ++o) {
            float* slice = out + o * block + row * s.cols;
            const float* dy = values + (o * n + i) * s.cols;
            for (int64_t k = 0; k < s.cols; ++k) slice[k] += dy[k];
          }
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t row = rowAt(s, indices[i], i, s.rows);
          for (int64_t o = 0; o < s.groups; ++o)
            std::copy_n(values + o * block + row * s.cols, s.cols, out + (o * n + i) * s.cols);
        }
      }
    }
  }
}

template <bool kScatter>
void planGather(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  const Shape& table = kScatter ? planner.shape(op.outputs[0]) : planner.shape(op.inputs[0]);
  const auto axis = static_cast<std::ptrdiff_t>(op.attributes.axis);
  step.groups = numElements(Shape(table.begin(), table.begin() + axis));
  step.rows = table[static_cast<std::size_t>(axis)];
  step.cols = numElements(Shape(table.begin() + axis + 1, table.end()));
  step.kernel = gatherKernel<kScatter>;
  planner.emit(std::move(step));
}

}  // namespace

void addGatherKernels(KernelTable& table) {
  table.add({.kind = OpKind::Gather, .plan = planGather<false>});
  table.add({.kind = OpKind::GatherGrad, .plan = planGather<true>});
}

}  // namespace tessera::sim
