// The gather family's kernels (lib/ops/gather.cc defines the ops): slice
// copies by index along the op's axis, and the scatter-add of the gradient,
// in index order so that repeated indices add up the same way on every run.
// GatherElements and ScatterElements read and write single elements, the
// scatter in index order too; neither splits, so their bits are the same at
// any thread count.
#include <algorithm>

#include <fmt/format.h>

#include "kernel_table.hpp"
#include "ops/gather.hpp"
#include "tessera/lib/error.hpp"

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

// Per group: operand 0 the data, 1 the indices, 2 (ScatterElements) the
// updates. `table` holds each index element's base offset in the data (see
// lib/ops/gather.hpp), `rows` the data's extent on the axis and `cols` its
// stride there; `a` 0 writes the updates, 1 adds them.
template <bool kScatter>
void elementsKernel(const Step& s) {
  const auto n = static_cast<int64_t>(s.table.size());
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* data = inOf(s, run, 0) + (run.advance[0] ? g * s.inElements[0] : 0);
      const float* indices = inOf(s, run, 1) + (run.advance[1] ? g * s.inElements[1] : 0);
      float* out = outOf(s, run) + g * s.outElements;
      if constexpr (kScatter) {
        // Every index is checked before the output is written.
        for (int64_t i = 0; i < n; ++i) rowAt(s, indices[i], i, s.rows);
        const float* updates = inOf(s, run, 2) + (run.advance[2] ? g * s.inElements[2] : 0);
        if (out != data) std::copy_n(data, s.outElements, out);
        for (int64_t i = 0; i < n; ++i) {
          float& at = out[s.table[static_cast<std::size_t>(i)] + rowAt(s, indices[i], i, s.rows) * s.cols];
          at = s.a == 0.0f ? updates[i] : at + updates[i];
        }
      } else {
        for (int64_t i = 0; i < n; ++i)
          out[i] = data[s.table[static_cast<std::size_t>(i)] + rowAt(s, indices[i], i, s.rows) * s.cols];
      }
    }
  }
}

template <bool kScatter>
void planElements(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  if constexpr (kScatter)
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}, {op.inputs[2], 0}});
  else
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  ElementIndexing e =
      elementIndexing(planner.shape(op.inputs[0]), planner.shape(op.inputs[1]), op.attributes.axis);
  step.table = std::move(e.bases);
  step.rows = e.rows;
  step.cols = e.stride;
  step.a = static_cast<float>(op.attributes.a);
  step.kernel = elementsKernel<kScatter>;
  planner.emit(std::move(step));
}

}  // namespace

void addGatherKernels(KernelTable& table) {
  table.add({.kind = OpKind::GatherElements, .plan = planElements<false>});
  table.add({.kind = OpKind::ScatterElements, .plan = planElements<true>});
  table.add({.kind = OpKind::Gather, .plan = planGather<false>});
  table.add({.kind = OpKind::GatherGrad, .plan = planGather<true>});
}

}  // namespace tessera::sim
