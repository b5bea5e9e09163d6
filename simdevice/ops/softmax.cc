// The softmax family's kernels (lib/ops/softmax.cc defines the ops).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernel_table.hpp"
#include "tessera/error.hpp"

namespace tessera::sim {
namespace {

// Floats of rows per part of a row-wise kernel split over threads (each
// element costs one or two exponentials in double): below this, handing a
// part to another thread costs more than it saves.
constexpr int64_t kMinPartRowElements = 256;

// How many parts `rows` rows of `cols` are split into: whole rows each, at
// least kMinPartRowElements floats per part, at most one per thread.
int rowParts(const Step& s, int64_t rows, int64_t cols) {
  if (s.pool == nullptr || rows <= 1) return 1;
  return static_cast<int>(std::clamp<int64_t>(std::min(rows * cols / kMinPartRowElements, rows), 1, s.pool->threads()));
}

// Calls f(firstRow, endRow) for `parts` consecutive blocks of [0, rows).
template <class F>
void forRowBlocks(const Step& s, int parts, int64_t rows, F&& f) {
  if (parts == 1) {
    f(int64_t{0}, rows);
    return;
  }
  s.pool->run(parts, [&](int part, int) { f(rows * part / parts, rows * (part + 1) / parts); });
}

// Numerically stable softmax / log-softmax over rows of `cols`. Rows are
// independent: over threads each part takes a block of whole rows.
template <bool kLog>
void softmaxKernel(const Step& s) {
  const int64_t c = s.cols;
  for (const Run& run : s.runs) {
    if (c == 0) continue;
    const int64_t rows = run.count * s.outElements / c;
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forRowBlocks(s, rowParts(s, rows, c), rows, [&](int64_t first, int64_t end) {
      for (int64_t r = first; r < end; ++r) {
        const float* xr = x + r * c;
        float* orow = o + r * c;
        const float max = *std::max_element(xr, xr + c);
        double sum = 0.0;
        for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(xr[j] - max));
        if (kLog) {
          const double logSum = std::log(sum);
          for (int64_t j = 0; j < c; ++j)
            orow[j] = static_cast<float>(static_cast<double>(xr[j] - max) - logSum);
        } else {
          for (int64_t j = 0; j < c; ++j)
            orow[j] = static_cast<float>(std::exp(static_cast<double>(xr[j] - max)) / sum);
        }
      }
    });
  }
}

void argmaxKernel(const Step& s) {
  const int64_t c = s.cols;
  for (const Run& run : s.runs) {
    const int64_t rows = run.count * s.outElements;
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    for (int64_t r = 0; r < rows; ++r) {
      if (c == 0) {
        o[r] = 0.0f;
        continue;
      }
      const float* xr = x + r * c;
      int64_t best = 0;
      for (int64_t j = 1; j < c; ++j)
        if (xr[j] > xr[best]) best = j;
      o[r] = static_cast<float>(best);
    }
  }
}

// The row's log-sum-exp, computed stably.
double logSumExp(const float* x, int64_t c) {
  const float max = *std::max_element(x, x + c);
  double sum = 0.0;
  for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(x[j] - max));
  return static_cast<double>(max) + std::log(sum);
}

// Labels come from the host as exact floats; one outside [0, classes) has no
// class to pick.
int64_t labelAt(const Step& s, const float* labels, int64_t row, int64_t classes) {
  const float label = labels[row];
  if (!(label >= 0.0f && label < static_cast<float>(classes))) {
    throw DeviceError(ErrorCode::InvalidProgram, s.name,
                      fmt::format("{}: label {} of row {} is outside [0, {}); labels must be class indices",
                                  s.kind, label, row, classes));
  }
  return static_cast<int64_t>(label);
}

// (logits, labels) operands 0, 1; or (dloss, logits, labels) for the
// gradient. Every label is checked first, in row order, on the calling
// thread; then the rows of all the run's groups are split over threads in
// blocks of whole rows. The gradient's rows are independent. The loss adds
// one term per row: the parts write the terms (Step::rowTerms) and the
// calling thread adds each group's in row order, the order of one thread.
template <bool kGrad>
void crossEntropyKernel(const Step& s) {
  constexpr std::size_t kLogits = kGrad ? 1 : 0;
  const int64_t c = s.cols;
  const int64_t n = s.rows;
  if (c == 0) return;
  for (const Run& run : s.runs) {
    auto operand = [&](std::size_t i, int64_t g) {
      return inOf(s, run, i) + (run.advance[i] ? g * s.inElements[i] : 0);
    };
    for (int64_t g = 0; g < run.count; ++g) {
      const float* labels = operand(kLogits + 1, g);
      for (int64_t r = 0; r < n; ++r) labelAt(s, labels, r, c);
    }
    const int64_t rows = run.count * n;
    forRowBlocks(s, rowParts(s, rows, c), rows, [&](int64_t first, int64_t end) {
      // The block's rows, group by group (none when the groups have no rows).
      for (int64_t g = n == 0 ? run.count : first / n; g * n < end; ++g) {
        const int64_t begin = std::max(first, g * n) - g * n;
        const int64_t stop = std::min(end, (g + 1) * n) - g * n;
        const float* logits = operand(kLogits, g);
        const float* labels = operand(kLogits + 1, g);
        if constexpr (kGrad) {
          const double factor = static_cast<double>(*operand(0, g)) * s.scale;
          float* o = outOf(s, run) + g * s.outElements;
          for (int64_t r = begin; r < stop; ++r) {
            const float* x = logits + r * c;
            const double lse = logSumExp(x, c);
            const auto label = static_cast<int64_t>(labels[r]);
            for (int64_t j = 0; j < c; ++j) {
              const double p = std::exp(static_cast<double>(x[j]) - lse);
              o[r * c + j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * factor);
            }
          }
        } else {
          double* terms = s.rowTerms.data() + g * n;
          for (int64_t r = begin; r < stop; ++r) {
            const float* x = logits + r * c;
            terms[r] = logSumExp(x, c) - static_cast<double>(x[static_cast<int64_t>(labels[r])]);
          }
        }
      }
    });
    if constexpr (!kGrad) {
      for (int64_t g = 0; g < run.count; ++g) {
        double loss = 0.0;
        for (int64_t r = 0; r < n; ++r) loss += s.rowTerms[static_cast<std::size_t>(g * n + r)];
        outOf(s, run)[g * s.outElements] = static_cast<float>(loss * s.scale);
      }
    }
  }
}

// Row-wise kernels over rows of the last axis.
template <Kernel kKernel>
void planRows(StepPlanner& planner, Step& step) {
  planner.runsOver(step, {{planner.op().inputs[0], 0}});
  step.cols = planner.shape(planner.op().inputs[0]).back();
  step.kernel = kKernel;
  planner.emit(std::move(step));
}

template <bool kGrad>
void planCrossEntropy(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  if (kGrad) {
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}, {op.inputs[2], 0}});
  } else {
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  }
  const Shape& logits = planner.shape(op.inputs[kGrad ? 1 : 0]);
  step.rows = logits[0];
  step.cols = logits[1];
  if (op.attributes.reduction == ReductionType::Mean && step.rows > 0) {
    step.scale = 1.0f / static_cast<float>(step.rows);
  }
  if (!kGrad) {
    int64_t widest = 0;
    for (const Run& run : step.runs) widest = std::max(widest, run.count);
    step.rowTerms.assign(static_cast<std::size_t>(widest * step.rows), 0.0);
  }
  step.kernel = crossEntropyKernel<kGrad>;
  planner.emit(std::move(step));
}

}  // namespace

void addSoftmaxKernels(KernelTable& table) {
  table.add({.kind = OpKind::Softmax, .plan = planRows<softmaxKernel<false>>});
  table.add({.kind = OpKind::LogSoftmax, .plan = planRows<softmaxKernel<true>>});
  table.add({.kind = OpKind::ArgMax, .plan = planRows<argmaxKernel>});
  table.add({.kind = OpKind::SoftmaxCrossEntropy, .plan = planCrossEntropy<false>});
  table.add({.kind = OpKind::SoftmaxCrossEntropyGrad, .plan = planCrossEntropy<true>});
}

}  // namespace tessera::sim
