// The softmax family's kernels (lib/ops/softmax.cc defines the ops).
#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

#include "kernel_table.hpp"
#include "tessera/lib/error.hpp"
#include "vector_math.hpp"

namespace tessera::sim {
namespace {

// Elements per part of a row-wise step split over threads (each costs an
// exponential or two): below this, handing rows to another thread costs
// more than it saves.
constexpr int64_t kMinPartElements = 256;
// A row's exponentials are kept (in double) for its second pass when it has
// at most this many classes, else computed again: the same values either way.
constexpr int64_t kKeptExponentials = 1024;

// Calls f(first, last) over rows [0, rows) of `cols` elements each, split
// over the step's threads when there is enough work. Rows are independent,
// so each is the same bits whichever part computes it.
template <class F>
void forRows(const Step& s, int64_t rows, int64_t cols, F&& f) {
  const int parts = s.pool == nullptr ? 1 : rowParts(rows, cols, s.pool->threads());
  if (parts == 1) return f(int64_t{0}, rows);
  s.pool->run(parts, [&](int part, int) { f(rows * part / parts, rows * (part + 1) / parts); });
}

// exp(x[j] - max) in double for every j (shiftedExponentials, a block of
// at most kKeptExponentials at a time), their sum returned, added in the
// order of a LaneSum; `kept` (c doubles, or null) holds them.
double exponentials(const float* x, int64_t c, float max, double* kept) {
  std::array<double, kKeptExponentials> block;
  LaneSum sum;
  for (int64_t j0 = 0; j0 < c; j0 += kKeptExponentials) {
    const int64_t n = std::min(kKeptExponentials, c - j0);
    double* e = kept != nullptr ? kept + j0 : block.data();
    shiftedExponentials(x + j0, n, max, e);
    sum.add(e, n);
  }
  return sum.total();
}

// The row's log-sum-exp, computed stably.
double logSumExp(const float* x, int64_t c) {
  const float max = *std::max_element(x, x + c);
  return static_cast<double>(max) + std::log(exponentials(x, c, max, nullptr));
}

// The row's probabilities (probabilities(), from the exponentials and
// their sum): out[j] = float((exp(x[j] - max) / sum - (j == label)) *
// factor), from the exponentials kept by exponentials() when c <=
// kKeptExponentials, else computed again (the same values).
void rowProbabilities(const float* x, int64_t c, float max, const double* kept, double sum, int64_t label,
                      double factor, float* out) {
  if (c <= kKeptExponentials) return probabilities(kept, c, sum, label, factor, out);
  std::array<double, kKeptExponentials> block;
  for (int64_t j0 = 0; j0 < c; j0 += kKeptExponentials) {
    const int64_t n = std::min(kKeptExponentials, c - j0);
    shiftedExponentials(x + j0, n, max, block.data());
    probabilities(block.data(), n, sum, label - j0, factor, out + j0);
  }
}

// Numerically stable softmax / log-softmax over rows of `cols`.
template <bool kLog>
void softmaxKernel(const Step& s) {
  const int64_t c = s.cols;
  for (const Run& run : s.runs) {
    if (c == 0) continue;
    const int64_t rows = run.count * s.outElements / c;
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forRows(s, rows, c, [&](int64_t first, int64_t last) {
      std::array<double, kKeptExponentials> kept;
      const int64_t n = last - first;
      first += kLog ? shortRowLogSoftmax(x + first * c, n, c, o + first * c)
                    : shortRowProbabilities(x + first * c, n, c, nullptr, 1.0, o + first * c);
      for (int64_t r = first; r < last; ++r) {
        const float* xr = x + r * c;
        float* orow = o + r * c;
        const float max = *std::max_element(xr, xr + c);
        const double sum = exponentials(xr, c, max, kLog || c > kKeptExponentials ? nullptr : kept.data());
        if (kLog) {
          const double logSum = std::log(sum);
          for (int64_t j = 0; j < c; ++j)
            orow[j] = static_cast<float>(static_cast<double>(xr[j] - max) - logSum);
        } else {
          rowProbabilities(xr, c, max, kept.data(), sum, -1, 1.0, orow);
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

// Labels come from the host as exact floats; one outside [0, classes) has no
// class to pick. Checked for every row before any is computed (the parts of
// a step split over threads must not throw).
void checkLabels(const Step& s, const float* labels, int64_t rows, int64_t classes) {
  for (int64_t row = 0; row < rows; ++row) {
    const float label = labels[row];
    if (!(label >= 0.0f && label < static_cast<float>(classes))) {
      throw DeviceError(ErrorCode::InvalidProgram, s.name,
                        fmt::format("{}: label {} of row {} is outside [0, {}); labels must be class indices",
                                    s.kind, label, row, classes));
    }
  }
}

// Rows of the loss summed at a time: each block's rows are computed over
// the threads, then added in row order.
constexpr int64_t kLossBlock = 512;

// (logits, labels) operands 0, 1; or (dloss, logits, labels) for the
// gradient. The loss: each row's log-sum-exp minus its label's logit, in
// double, added in row order. The gradient: (softmax - onehot(label)) *
// dloss (/ rows for Mean), softmax computed as in softmaxKernel.
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
      checkLabels(s, labels, n, c);
      if constexpr (kGrad) {
        const double factor = static_cast<double>(*operand(0)) * s.scale;
        forRows(s, n, c, [&](int64_t first, int64_t last) {
          std::array<double, kKeptExponentials> kept;
          first += shortRowProbabilities(logits + first * c, last - first, c, labels + first, factor,
                                         o + first * c);
          for (int64_t r = first; r < last; ++r) {
            const float* x = logits + r * c;
            const float max = *std::max_element(x, x + c);
            const double sum = exponentials(x, c, max, c <= kKeptExponentials ? kept.data() : nullptr);
            const auto label = static_cast<int64_t>(labels[r]);
            rowProbabilities(x, c, max, kept.data(), sum, label, factor, o + r * c);
          }
        });
      } else {
        std::array<double, kLossBlock> terms;
        double loss = 0.0;
        for (int64_t r0 = 0; r0 < n; r0 += kLossBlock) {
          const int64_t rows = std::min(kLossBlock, n - r0);
          forRows(s, rows, c, [&](int64_t first, int64_t last) {
            // terms[i]: row r0 + i's log-sum-exp, then its term.
            const int64_t vectorized =
                first + shortRowLogSumExps(logits + (r0 + first) * c, last - first, c, terms.data() + first);
            for (int64_t i = first; i < last; ++i) {
              const float* x = logits + (r0 + i) * c;
              double& term = terms[static_cast<std::size_t>(i)];
              if (i >= vectorized) term = logSumExp(x, c);
              term -= static_cast<double>(x[static_cast<int64_t>(labels[r0 + i])]);
            }
          });
          for (int64_t i = 0; i < rows; ++i) loss += terms[static_cast<std::size_t>(i)];
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

int rowParts(int64_t rows, int64_t cols, int threads) {
  return static_cast<int>(std::clamp<int64_t>(std::min(rows * cols / kMinPartElements, rows), 1, threads));
}

void addSoftmaxKernels(KernelTable& table) {
  table.add({.kind = OpKind::Softmax, .plan = planRows<softmaxKernel<false>>});
  table.add({.kind = OpKind::LogSoftmax, .plan = planRows<softmaxKernel<true>>});
  table.add({.kind = OpKind::ArgMax, .plan = planRows<argmaxKernel>});
  table.add({.kind = OpKind::SoftmaxCrossEntropy, .plan = planCrossEntropy<false>});
  table.add({.kind = OpKind::SoftmaxCrossEntropyGrad, .plan = planCrossEntropy<true>});
}

}  // namespace tessera::sim
