#include "kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include <fmt/format.h>

#include "tessera/error.hpp"

namespace tessera::sim {

void StridedLoop::push(int64_t extent, std::array<int64_t, kMaxOperands> strides) {
  size[static_cast<std::size_t>(rank)] = extent;
  for (std::size_t i = 0; i < kMaxOperands; ++i) stride[i][static_cast<std::size_t>(rank)] = strides[i];
  ++rank;
}

void StridedLoop::coalesce() {
  StridedLoop out;
  for (int d = 0; d < rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (size[u] == 1) continue;
    if (out.rank > 0) {
      const auto last = static_cast<std::size_t>(out.rank - 1);
      bool contiguous = true;
      for (std::size_t i = 0; i < kMaxOperands; ++i)
        contiguous = contiguous && out.stride[i][last] == stride[i][u] * size[u];
      if (contiguous) {
        out.size[last] *= size[u];
        for (std::size_t i = 0; i < kMaxOperands; ++i) out.stride[i][last] = stride[i][u];
        continue;
      }
    }
    out.push(size[u], {stride[0][u], stride[1][u], stride[2][u]});
  }
  *this = out;
}

int64_t StridedLoop::elements() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= size[static_cast<std::size_t>(d)];
  return n;
}

namespace {

// The innermost dimension with strides known at compile time, so the
// compiler vectorizes it; a stride of 0 is a broadcast operand.
template <int kS0, int kS1, int kS2, class F>
void innerFixed(int64_t n, int64_t o0, int64_t o1, int64_t o2, F& f) {
  for (int64_t i = 0; i < n; ++i) f(o0 + i * kS0, o1 + i * kS1, o2 + i * kS2);
}

// Dispatches the common contiguous and broadcast patterns of the innermost
// dimension (after coalescing, elementwise ops are mostly one of these).
template <class F>
void inner(int64_t n, int64_t s0, int64_t s1, int64_t s2, int64_t o0, int64_t o1, int64_t o2, F& f) {
  if (s0 == 1 && s1 == 1 && s2 == 1) return innerFixed<1, 1, 1>(n, o0, o1, o2, f);
  if (s0 == 1 && s1 == 1 && s2 == 0) return innerFixed<1, 1, 0>(n, o0, o1, o2, f);
  if (s0 == 1 && s1 == 0 && s2 == 1) return innerFixed<1, 0, 1>(n, o0, o1, o2, f);
  if (s0 == 1 && s1 == 0 && s2 == 0) return innerFixed<1, 0, 0>(n, o0, o1, o2, f);
  if (s0 == 0 && s1 == 1 && s2 == 0) return innerFixed<0, 1, 0>(n, o0, o1, o2, f);
  for (int64_t i = 0; i < n; ++i) f(o0 + i * s0, o1 + i * s1, o2 + i * s2);
}

// Calls f(outOffset, in0Offset, in1Offset) for every point of the loop.
template <class F>
void forEach(const StridedLoop& loop, F&& f) {
  for (int d = 0; d < loop.rank; ++d)
    if (loop.size[static_cast<std::size_t>(d)] == 0) return;
  if (loop.rank == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  const auto innermost = static_cast<std::size_t>(loop.rank - 1);
  const int64_t n = loop.size[innermost];
  const int64_t s0 = loop.stride[0][innermost];
  const int64_t s1 = loop.stride[1][innermost];
  const int64_t s2 = loop.stride[2][innermost];
  std::array<int64_t, kMaxDims> index{};
  int64_t o0 = 0;
  int64_t o1 = 0;
  int64_t o2 = 0;
  for (;;) {
    inner(n, s0, s1, s2, o0, o1, o2, f);
    std::size_t d = innermost;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++index[d] < loop.size[d]) {
        o0 += loop.stride[0][d];
        o1 += loop.stride[1][d];
        o2 += loop.stride[2][d];
        break;
      }
      o0 -= loop.stride[0][d] * (loop.size[d] - 1);
      o1 -= loop.stride[1][d] * (loop.size[d] - 1);
      o2 -= loop.stride[2][d] * (loop.size[d] - 1);
      index[d] = 0;
    }
  }
}

float* outOf(const Step& s, const Run& run) { return s.out + run.out; }
const float* inOf(const Step& s, const Run& run, std::size_t i) { return s.in[i] + run.in[i]; }

void zeroRun(const Step& s, const Run& run) { std::fill_n(outOf(s, run), run.count * s.outElements, 0.0f); }

template <class F>
void unaryKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t) { o[io] = F{}(x[ix]); });
  }
}

template <class F>
void binaryKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    const float* y = inOf(s, run, 1);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t iy) { o[io] = F{}(x[ix], y[iy]); });
  }
}

double geluOf(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

double geluDerivative(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

struct AddF {
  float operator()(float x, float y) const { return x + y; }
};
struct SubF {
  float operator()(float x, float y) const { return x - y; }
};
struct MulF {
  float operator()(float x, float y) const { return x * y; }
};
struct DivF {
  float operator()(float x, float y) const { return x / y; }
};
struct ReluGradF {
  float operator()(float dy, float x) const { return x > 0.0f ? dy : 0.0f; }
};
struct GeluGradF {
  float operator()(float dy, float x) const { return static_cast<float>(dy * geluDerivative(x)); }
};
struct NegF {
  float operator()(float x) const { return -x; }
};
struct ReluF {
  float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct GeluF {
  float operator()(float x) const { return static_cast<float>(geluOf(x)); }
};
struct TanhF {
  float operator()(float x) const { return std::tanh(x); }
};
struct SigmoidF {
  float operator()(float x) const {
    return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
  }
};
struct ExpF {
  float operator()(float x) const { return std::exp(x); }
};
struct LogF {
  float operator()(float x) const { return std::log(x); }
};
struct SqrtF {
  float operator()(float x) const { return std::sqrt(x); }
};
struct IdentityF {
  float operator()(float x) const { return x; }
};

void copyRuns(const Step& s) {
  for (const Run& run : s.runs) {
    if (s.zeroFirst) zeroRun(s, run);
    float* o = outOf(s, run) + s.outLoopOffset;
    const float* x = inOf(s, run, 0);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t) { o[io] = x[ix]; });
  }
}

void scaledAddKernel(const Step& s) {
  const double a = s.a;
  const double b = s.b;
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    const float* y = inOf(s, run, 1);
    forEach(run.loop,
            [&](int64_t io, int64_t ix, int64_t iy) { o[io] = static_cast<float>(a * x[ix] + b * y[iy]); });
  }
}

// ReduceSum, ReduceMean, ReduceToShape: the output has stride 0 along the
// reduced dimensions, so every input element adds into its output element.
void reduceKernel(const Step& s) {
  for (const Run& run : s.runs) {
    zeroRun(s, run);
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t) { o[io] += x[ix]; });
    if (s.scale != 1.0f) {
      for (int64_t i = 0; i < run.count * s.outElements; ++i) o[i] *= s.scale;
    }
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

// C[m, n] = alpha * op(A) op(B) with the step's plan and scratch.
void gemm(const Step& s, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
          float alpha) {
  sim::gemm(s.gemmPlan, GemmShape{m, n, k, s.transA, s.transB}, a, b, c, alpha, s.scratch->lhs, s.scratch->rhs);
}

void matmul(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* a = inOf(s, run, 0);
    const float* b = inOf(s, run, 1);
    if (run.count == 1 || (!s.transA && run.advance[0] && !run.advance[1])) {
      // Stacked groups against one right operand: a single GEMM.
      gemm(s, run.count * s.rows, s.cols, s.depth, a, b, o, s.scale);
      continue;
    }
    for (int64_t g = 0; g < run.count; ++g) {
      gemm(s, s.rows, s.cols, s.depth, a + (run.advance[0] ? g * s.inElements[0] : 0),
           b + (run.advance[1] ? g * s.inElements[1] : 0), o + g * s.outElements, s.scale);
    }
  }
}

void matmulSlices(const Step& s) {
  for (std::size_t i = 0; i < s.runs.size(); ++i) {
    const Run& run = s.runs[i];
    gemm(s, s.rows, s.cols, s.depth, inOf(s, run, 0), inOf(s, run, 1), s.scratch->product, s.scale);
    const int64_t* slice = s.table2.data() + 3 * i;
    std::copy_n(s.scratch->product + slice[1], slice[2], s.out + slice[0]);
  }
}

void feedKernel(const Step& s) { std::copy(s.feed->begin(), s.feed->end(), s.out); }

// Flat steps (TileKernel): n elements from the slice's operands; an input
// of stride 0 is a scalar read at every element.
template <class F>
void flatTile(const Step& s, int64_t n, F&& f) {
  inner(n, 1, s.tileStride[0], s.tileStride[1], 0, 0, 0, f);
}

template <class F>
void unaryTile(const Step& s, const TileOperands& t, int64_t n) {
  float* o = t.out;
  const float* x = t.in[0];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t) { o[io] = F{}(x[ix]); });
}

template <class F>
void binaryTile(const Step& s, const TileOperands& t, int64_t n) {
  float* o = t.out;
  const float* x = t.in[0];
  const float* y = t.in[1];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t iy) { o[io] = F{}(x[ix], y[iy]); });
}

void scaledAddTile(const Step& s, const TileOperands& t, int64_t n) {
  const double a = s.a;
  const double b = s.b;
  float* o = t.out;
  const float* x = t.in[0];
  const float* y = t.in[1];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t iy) { o[io] = static_cast<float>(a * x[ix] + b * y[iy]); });
}

void runChain(const Step& s) {
  float* const scratch = s.chainScratch;
  for (int64_t begin = 0; begin < s.chainElements; begin += kChainSlice) {
    const int64_t n = std::min(kChainSlice, s.chainElements - begin);
    for (const Step& part : s.chain) {
      const Run& run = part.runs.front();
      TileOperands t;
      t.out = part.outSlot >= 0 ? scratch + part.outSlot * kChainSlice : part.out + run.out + begin;
      for (std::size_t i = 0; i < t.in.size(); ++i) {
        if (part.in[i] == nullptr) continue;
        t.in[i] = part.inSlot[i] >= 0 ? scratch + part.inSlot[i] * kChainSlice
                                      : part.in[i] + run.in[i] + begin * part.tileStride[i];
      }
      part.tile(part, t, n);
    }
  }
}

}  // namespace

std::array<int64_t, 2> planGemm(Step& step) {
  int64_t rows = step.rows;
  for (const Run& run : step.runs) {
    if (!step.transA && run.advance[0] && !run.advance[1]) rows = std::max(rows, run.count * step.rows);
  }
  step.gemmPlan = sim::planGemm(bestGemmIsa(), rows, step.cols, step.depth);
  return {step.gemmPlan.lhsFloats, step.gemmPlan.rhsFloats};
}

Kernel denseKernel(OpKind kind) {
  switch (kind) {
    case OpKind::Add: return binaryKernel<AddF>;
    case OpKind::Sub: return binaryKernel<SubF>;
    case OpKind::Mul: return binaryKernel<MulF>;
    case OpKind::Div: return binaryKernel<DivF>;
    case OpKind::ReluGrad: return binaryKernel<ReluGradF>;
    case OpKind::GeluGrad: return binaryKernel<GeluGradF>;
    case OpKind::Neg: return unaryKernel<NegF>;
    case OpKind::Relu: return unaryKernel<ReluF>;
    case OpKind::Gelu: return unaryKernel<GeluF>;
    case OpKind::Tanh: return unaryKernel<TanhF>;
    case OpKind::Sigmoid: return unaryKernel<SigmoidF>;
    case OpKind::Exp: return unaryKernel<ExpF>;
    case OpKind::Log: return unaryKernel<LogF>;
    case OpKind::Sqrt: return unaryKernel<SqrtF>;
    case OpKind::BroadcastTo: return unaryKernel<IdentityF>;
    case OpKind::Softmax: return softmaxKernel<false>;
    case OpKind::LogSoftmax: return softmaxKernel<true>;
    case OpKind::SoftmaxCrossEntropy: return crossEntropyKernel<false>;
    case OpKind::SoftmaxCrossEntropyGrad: return crossEntropyKernel<true>;
    case OpKind::ArgMax: return argmaxKernel;
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceToShape: return reduceKernel;
    case OpKind::ScaledAddInplace: return scaledAddKernel;
    case OpKind::MatMul: return matmul;
    default: return copyRuns;
  }
}

TileKernel tileKernel(OpKind kind) {
  switch (kind) {
    case OpKind::Add: return binaryTile<AddF>;
    case OpKind::Sub: return binaryTile<SubF>;
    case OpKind::Mul: return binaryTile<MulF>;
    case OpKind::Div: return binaryTile<DivF>;
    case OpKind::ReluGrad: return binaryTile<ReluGradF>;
    case OpKind::GeluGrad: return binaryTile<GeluGradF>;
    case OpKind::ScaledAddInplace: return scaledAddTile;
    case OpKind::Neg: return unaryTile<NegF>;
    case OpKind::Relu: return unaryTile<ReluF>;
    case OpKind::Gelu: return unaryTile<GeluF>;
    case OpKind::Tanh: return unaryTile<TanhF>;
    case OpKind::Sigmoid: return unaryTile<SigmoidF>;
    case OpKind::Exp: return unaryTile<ExpF>;
    case OpKind::Log: return unaryTile<LogF>;
    case OpKind::Sqrt: return unaryTile<SqrtF>;
    case OpKind::BroadcastTo:
    case OpKind::Reshape:
    case OpKind::Copy:
    case OpKind::CopyInplace: return unaryTile<IdentityF>;
    default: return nullptr;
  }
}

Kernel matmulKernel() { return matmul; }
Kernel matmulSlicesKernel() { return matmulSlices; }
Kernel copyKernel() { return copyRuns; }
Kernel inputKernel() { return feedKernel; }
Kernel chainKernel() { return runChain; }

}  // namespace tessera::sim
