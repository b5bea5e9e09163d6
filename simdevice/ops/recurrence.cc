// The recurrence family's kernels (lib/ops/recurrence.cc defines the ops):
// the formulas of lib/ops/recurrence.hpp in float, split over the step's
// threads by independent pieces: the lanes (a direction and a batch row)
// forward and back through time, the rows of the weights' gradient, the
// steps and batch rows of x's. Each piece is computed whole by one part in
// a fixed order, so the bits are the same at any thread count. A part's
// temporaries (a few gate rows) live in its thread's workspace.
#include <algorithm>

#include "kernel_table.hpp"
#include "ops/recurrence.hpp"

namespace tessera::sim {
namespace {

using recurrence::Geometry;

float* workspace(const Step& s, int thread) { return s.scratch->product + thread * s.scratch->productStride; }

// f(piece, thread) for every piece in [0, pieces), the pieces cut into one
// part per thread.
template <class F>
void forPieces(const Step& s, int64_t pieces, F&& f) {
  const int parts =
      s.pool == nullptr ? 1 : static_cast<int>(std::clamp<int64_t>(pieces, 1, s.pool->threads()));
  if (parts == 1) {
    const int thread = callerThread(s);
    for (int64_t p = 0; p < pieces; ++p) f(p, thread);
    return;
  }
  s.pool->run(parts, [&](int part, int thread) {
    for (int64_t p = pieces * part / parts; p < pieces * (part + 1) / parts; ++p) f(p, thread);
  });
}

// The geometry the plan stored: Step::table holds seq, dirs, batch, input,
// hidden; the kind, direction and Gru's flag come from the op.
Geometry geometryOf(const Step& s) {
  Geometry g;
  g.cell = static_cast<OpKind>(s.table[5]);
  g.direction = static_cast<RecurrenceDirection>(s.table[6]);
  g.linearBeforeReset = s.table[7] != 0;
  g.seq = s.table[0];
  g.dirs = s.table[1];
  g.batch = s.table[2];
  g.input = s.table[3];
  g.hidden = s.table[4];
  return g;
}

// Per group of each run: the operands' values of that group.
template <class F>
void forGroups(const Step& s, F&& f) {
  for (const Run& run : s.runs) {
    for (int64_t k = 0; k < run.count; ++k) {
      std::array<const float*, 3> in{};
      for (std::size_t i = 0; i < 3; ++i)
        if (s.in[i] != nullptr) in[i] = inOf(s, run, i) + (run.advance[i] ? k * s.inElements[i] : 0);
      f(in, outOf(s, run) + k * s.outElements);
    }
  }
}

void cellKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, [&](const std::array<const float*, 3>& in, float* out) {
    forPieces(s, g.lanes(), [&](int64_t lane, int thread) {
      recurrence::forwardLane(g, lane / g.batch, lane % g.batch, in[0], in[1], in[2], out,
                              workspace(s, thread));
    });
  });
}

void gradKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, [&](const std::array<const float*, 3>& in, float* out) {
    forPieces(s, g.lanes(), [&](int64_t lane, int thread) {
      recurrence::backwardLane(g, lane / g.batch, lane % g.batch, in[0], in[1], in[2], out,
                               workspace(s, thread));
    });
  });
}

void weightGradKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, [&](const std::array<const float*, 3>& in, float* out) {
    forPieces(s, g.dirs * g.gateRows(), [&](int64_t row, int) {
      recurrence::weightGradRow(g, row / g.gateRows(), row % g.gateRows(), in[0], in[1], in[2],
                                out + row * g.row());
    });
  });
}

void inputGradKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, [&](const std::array<const float*, 3>& in, float* out) {
    forPieces(s, g.seq * g.batch, [&](int64_t row, int) {
      recurrence::inputGradRow(g, row / g.batch, row % g.batch, in[0], in[1], out + row * g.input);
    });
  });
}

template <Kernel kKernel>
void planRecurrence(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const bool cell = recurrence::isCell(op.kind);
  Geometry g;
  g.cell = cell ? op.kind : op.attributes.cell;
  g.direction = op.attributes.direction;
  g.linearBeforeReset = op.attributes.linearBeforeReset;
  g.dirs = op.attributes.direction == RecurrenceDirection::Bidirectional ? 2 : 1;
  if (cell) {
    const Shape& x = planner.shape(op.inputs[0]);
    g.seq = x[0];
    g.batch = x[1];
    g.input = x[2];
    g.hidden = planner.shape(op.inputs[2])[2] / recurrence::stateChannelsOf(g.cell);
  } else {
    const Shape& first = planner.shape(op.inputs[0]);
    g.seq = first[0] - 1;
    g.batch = first[2];
    if (op.kind == OpKind::RecurrenceGrad) {
      g.hidden = first[3] / g.channels();
      g.input = planner.shape(op.inputs[2])[2] - g.hidden - 2;
    } else {
      g.hidden = first[3] / (2 * g.gates());
      g.input = op.kind == OpKind::RecurrenceWeightGrad ? planner.shape(op.inputs[2])[2]
                                                        : planner.shape(op.inputs[1])[2] - g.hidden - 2;
    }
  }
  if (op.inputs.size() == 3)
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}, {op.inputs[2], 0}});
  else
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  step.table = {g.seq,
                g.dirs,
                g.batch,
                g.input,
                g.hidden,
                static_cast<int64_t>(g.cell),
                static_cast<int64_t>(g.direction),
                g.linearBeforeReset ? 1 : 0};
  if (cell) step.workFloats = g.preWidth();
  if (op.kind == OpKind::RecurrenceGrad) step.workFloats = 4 * g.hidden;
  step.kernel = kKernel;
  planner.emit(std::move(step));
}

}  // namespace

void addRecurrenceKernels(KernelTable& table) {
  table.add({.kind = OpKind::Rnn, .plan = planRecurrence<cellKernel>});
  table.add({.kind = OpKind::Gru, .plan = planRecurrence<cellKernel>});
  table.add({.kind = OpKind::Lstm, .plan = planRecurrence<cellKernel>});
  table.add({.kind = OpKind::RecurrenceGrad, .plan = planRecurrence<gradKernel>});
  table.add({.kind = OpKind::RecurrenceWeightGrad, .plan = planRecurrence<weightGradKernel>});
  table.add({.kind = OpKind::RecurrenceInputGrad, .plan = planRecurrence<inputGradKernel>});
}

}  // namespace tessera::sim
