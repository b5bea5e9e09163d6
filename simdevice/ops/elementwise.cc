// The elementwise family's kernels (lib/ops/elementwise.cc defines the ops):
// strided kernels over broadcast loops, and slice kernels for fused chains.
#include <algorithm>
#include <cmath>

#include "kernel_table.hpp"
#include "ops/elementwise.hpp"

namespace tessera::sim {
namespace {

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

struct AbsF {
  float operator()(float x) const { return std::abs(x); }
};
struct SignF {
  float operator()(float x) const { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f; }
};
struct ErfF {
  float operator()(float x) const { return std::erf(x); }
};
struct ReciprocalF {
  float operator()(float x) const { return 1.0f / x; }
};
// Without overflow: max(x, 0) + log(1 + exp(-|x|)).
struct SoftplusF {
  float operator()(float x) const {
    const double d = x;
    return static_cast<float>(std::max(d, 0.0) + std::log1p(std::exp(-std::abs(d))));
  }
};
struct PowF {
  float operator()(float x, float y) const { return std::pow(x, y); }
};
struct LeakyReluF {
  float operator()(float x, float alpha, float /*unused*/) const { return x > 0.0f ? x : alpha * x; }
};
struct EluF {
  float operator()(float x, float alpha, float /*unused*/) const {
    return x > 0.0f ? x : static_cast<float>(alpha * std::expm1(static_cast<double>(x)));
  }
};
struct SeluF {
  float operator()(float x, float alpha, float gamma) const {
    return static_cast<float>(
        gamma * (x > 0.0f ? static_cast<double>(x) : alpha * std::expm1(static_cast<double>(x))));
  }
};
struct ClipF {
  float operator()(float x, float lo, float hi) const { return std::min(std::max(x, lo), hi); }
};
struct LeakyReluGradF {
  float operator()(float dy, float x, float alpha, float /*unused*/) const {
    return x > 0.0f ? dy : alpha * dy;
  }
};
struct EluGradF {
  float operator()(float dy, float x, float alpha, float /*unused*/) const {
    return x > 0.0f ? dy : static_cast<float>(dy * alpha * std::exp(static_cast<double>(x)));
  }
};
struct SeluGradF {
  float operator()(float dy, float x, float alpha, float gamma) const {
    return static_cast<float>(
        gamma * (x > 0.0f ? static_cast<double>(dy) : dy * alpha * std::exp(static_cast<double>(x))));
  }
};
struct ClipGradF {
  float operator()(float dy, float x, float lo, float hi) const { return x >= lo && x <= hi ? dy : 0.0f; }
};

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

void scaledAddTile(const Step& s, const TileOperands& t, int64_t n) {
  const double a = s.a;
  const double b = s.b;
  float* o = t.out;
  const float* x = t.in[0];
  const float* y = t.in[1];
  flatTile(s, n,
           [&](int64_t io, int64_t ix, int64_t iy) { o[io] = static_cast<float>(a * x[ix] + b * y[iy]); });
}

// A binary op over its inputs' broadcast strides.
template <class F>
void planBinary(StepPlanner& planner, Step& step) {
  planBroadcastLoops(planner, step);
  step.kernel = binaryKernel<F>;
  planner.emit(std::move(step));
}

template <class F>
KernelDef binaryKernels(OpKind kind) {
  return {.kind = kind, .plan = planBinary<F>, .tile = binaryTile<F>};
}

// Ops with the scalar attributes a and b.
template <Kernel kKernel>
void planWithScalars(StepPlanner& planner, Step& step) {
  planBroadcastLoops(planner, step);
  step.a = static_cast<float>(planner.op().attributes.a);
  step.b = static_cast<float>(planner.op().attributes.b);
  step.kernel = kKernel;
  planner.emit(std::move(step));
}

template <class F>
KernelDef unaryParamKernels(OpKind kind) {
  return {.kind = kind, .plan = planWithScalars<unaryParamKernel<F>>, .tile = unaryParamTile<F>};
}

template <class F>
KernelDef binaryParamKernels(OpKind kind) {
  return {.kind = kind, .plan = planWithScalars<binaryParamKernel<F>>, .tile = binaryParamTile<F>};
}

}  // namespace

void addElementwiseKernels(KernelTable& table) {
  table.add(binaryKernels<AddF>(OpKind::Add));
  table.add(binaryKernels<SubF>(OpKind::Sub));
  table.add(binaryKernels<MulF>(OpKind::Mul));
  table.add(binaryKernels<DivF>(OpKind::Div));
  table.add(binaryKernels<ReluGradF>(OpKind::ReluGrad));
  table.add(binaryKernels<GeluGradF>(OpKind::GeluGrad));
  table.add(unaryKernels<NegF>(OpKind::Neg));
  table.add(unaryKernels<ReluF>(OpKind::Relu));
  table.add(unaryKernels<GeluF>(OpKind::Gelu));
  table.add(unaryKernels<TanhF>(OpKind::Tanh));
  table.add(unaryKernels<SigmoidF>(OpKind::Sigmoid));
  table.add(unaryKernels<ExpF>(OpKind::Exp));
  table.add(unaryKernels<LogF>(OpKind::Log));
  table.add(unaryKernels<SqrtF>(OpKind::Sqrt));
  table.add(unaryKernels<AbsF>(OpKind::Abs));
  table.add(unaryKernels<SignF>(OpKind::Sign));
  table.add(unaryKernels<ErfF>(OpKind::Erf));
  table.add(unaryKernels<ReciprocalF>(OpKind::Reciprocal));
  table.add(unaryKernels<SoftplusF>(OpKind::Softplus));
  table.add(binaryKernels<PowF>(OpKind::Pow));
  table.add(unaryParamKernels<LeakyReluF>(OpKind::LeakyRelu));
  table.add(unaryParamKernels<EluF>(OpKind::Elu));
  table.add(unaryParamKernels<SeluF>(OpKind::Selu));
  table.add(unaryParamKernels<ClipF>(OpKind::Clip));
  table.add(binaryParamKernels<LeakyReluGradF>(OpKind::LeakyReluGrad));
  table.add(binaryParamKernels<EluGradF>(OpKind::EluGrad));
  table.add(binaryParamKernels<SeluGradF>(OpKind::SeluGrad));
  table.add(binaryParamKernels<ClipGradF>(OpKind::ClipGrad));
  table.add({.kind = OpKind::ScaledAddInplace,
             .plan =
                 [](StepPlanner& planner, Step& step) {
                   planBroadcastLoops(planner, step);
                   step.a = static_cast<float>(planner.op().attributes.a);
                   step.b = static_cast<float>(planner.op().attributes.b);
                   step.kernel = scaledAddKernel;
                   planner.emit(std::move(step));
                 },
             .tile = scaledAddTile});
  table.add(
      {.kind = OpKind::Copy,
       .plan = [](StepPlanner& planner, Step& step) { planFlatCopy(planner, step, planner.op().inputs[0]); },
       .tile = unaryTile<IdentityF>});
  // (dst, src): the source is copied into the destination's storage.
  table.add(
      {.kind = OpKind::CopyInplace,
       .plan = [](StepPlanner& planner, Step& step) { planFlatCopy(planner, step, planner.op().inputs[1]); },
       .tile = unaryTile<IdentityF>});
}

}  // namespace tessera::sim
