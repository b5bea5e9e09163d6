// The softmax family's kernels (lib/ops/softmax.cc defines the ops).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernel_table.hpp"
#include "tessera/error.hpp"

namespace tessera::sim {
namespace {

// Numerically stable softmax / log-softmax over rows of `cols`.
template <bool kLog>
void softmaxKernel(const Step& s) {
  const int64_t c = s.cols;
  for (const Run& run : s.runs) {
    if (c == 0) continue;
    const int64_t rows = run.count * s.outElements / c;
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    for (int64_t r = 0; r < rows; ++r) {
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

// (logits, labels) operands 0, 1; or (dloss, logits, labels) for the gradient.
template <bool kGrad>
void crossEntropyKernel(const Step& s) {
  constexpr std::size_t kLogits = kGrad ? 1 : 0;
  const int64_t c = s.cols;
  const int64_t n = s.rows;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      auto operand = [&](std::size_t i) {
        return inOf(s, run, i) + (run.advance[i] ? g * s.inElements[i] : 0);
      };
      const float* logits = operand(kLogits);
      const float* labels = operand(kLogits + 1);
      float* o = outOf(s, run) + g * s.outElements;
      if (c == 0) continue;
      if constexpr (kGrad) {
        const double factor = static_cast<double>(*operand(0)) * s.scale;
        for (int64_t r = 0; r < n; ++r) {
          const float* x = logits + r * c;
          const double lse = logSumExp(x, c);
          const int64_t label = labelAt(s, labels, r, c);
          for (int64_t j = 0; j < c; ++j) {
            const double p = std::exp(static_cast<double>(x[j]) - lse);
            o[r * c + j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * factor);
          }
        }
      } else {
        double loss = 0.0;
        for (int64_t r = 0; r < n; ++r) {
          const float* x = logits + r * c;
          loss += logSumExp(x, c) - static_cast<double>(x[labelAt(s, labels, r, c)]);
        }
        o[0] = static_cast<float>(loss * s.scale);
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
