// The elementwise family's kernels (lib/ops/elementwise.cc defines the ops):
// strided kernels over broadcast loops, and slice kernels for fused chains.
#include <algorithm>
#include <array>
#include <cmath>

#include "cpu_features.hpp"
#include "kernel_table.hpp"
#include "ops/elementwise.hpp"
#include "planes.hpp"
#include "vector_math.hpp"
#include "x86_simd.hpp"

namespace tessera::sim {
namespace {

struct AddF {
  template <class T>
  T operator()(T x, T y) const {
    return x + y;
  }
};
struct SubF {
  template <class T>
  T operator()(T x, T y) const {
    return x - y;
  }
};
struct MulF {
  template <class T>
  T operator()(T x, T y) const {
    return x * y;
  }
};
struct DivF {
  template <class T>
  T operator()(T x, T y) const {
    return x / y;
  }
};
struct ReluGradF {
  float operator()(float dy, float x) const { return x > 0.0f ? dy : 0.0f; }
};
struct GeluGradF {
  float operator()(float dy, float x) const { return static_cast<float>(dy * geluDerivative(x)); }
};
struct NegF {
  template <class T>
  T operator()(T x) const {
    return -x;
  }
};
struct ReluF {
  template <class T>
  T operator()(T x) const {
    return x > T(0) ? x : T(0);
  }
};
struct GeluF {
  float operator()(float x) const { return static_cast<float>(geluOf(x)); }
};
// On floats the device's own (vector_math.hpp), on doubles the C library's.
struct TanhF {
  float operator()(float x) const { return tanhOf(x); }
  double operator()(double x) const { return std::tanh(x); }
};
struct SigmoidF {
  float operator()(float x) const { return sigmoidOf(x); }
  double operator()(double x) const { return 1.0 / (1.0 + std::exp(-x)); }
};
struct ExpF {
  float operator()(float x) const { return exponentialOf(x); }
  double operator()(double x) const { return std::exp(x); }
};
struct LogF {
  template <class T>
  T operator()(T x) const {
    return std::log(x);
  }
};
struct SqrtF {
  template <class T>
  T operator()(T x) const {
    return std::sqrt(x);
  }
};

struct AbsF {
  template <class T>
  T operator()(T x) const {
    return std::abs(x);
  }
};
struct SignF {
  template <class T>
  T operator()(T x) const {
    return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0);
  }
};
struct ErfF {
  float operator()(float x) const { return erfOf(x); }
};
struct ReciprocalF {
  template <class T>
  T operator()(T x) const {
    return T(1) / x;
  }
};
// Without overflow: max(x, 0) + log(1 + exp(-|x|)).
struct SoftplusF {
  float operator()(float x) const {
    const double d = x;
    return static_cast<float>(std::max(d, 0.0) + std::log1p(std::exp(-std::abs(d))));
  }
};
struct PowF {
  template <class T>
  T operator()(T x, T y) const {
    return std::pow(x, y);
  }
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

// The flat steps (chains' tiles) and strided rows of the hottest ops run 16
// floats at a time on AVX-512: Add, Sub, Relu, ReluGrad, Mul, Div and Sqrt
// (the build targets baseline x86-64, so the portable kernels use 4). An x86 core also takes a
// microcode assist of about 150 cycles for every multiply, division or
// square root that reads a subnormal float (or makes one): the momentum of a
// weight that gets no gradient (a pixel that is 0 in every image) decays by
// the momentum factor each step through float32's subnormal range, and a
// 784 x 256 Mul of such values took 1.6 ms where it takes 20 us. A block of
// Mul, Div or Sqrt holding a subnormal operand is therefore computed in
// double and rounded once to float: a product of two floats is exact in
// double, and a quotient or square root rounded to double and then to float
// is the correctly rounded float (double has more than twice float's
// precision, plus 2 bits), so the bits are those of the float operation
// either way. (A compiler folds the scalar form back into a float operation,
// hence the intrinsics.)
#ifdef TESSERA_X86_SIMD
// The ops' vector forms (Op::inFloat, and Op::inDouble where a subnormal
// operand takes an assist) and scalar forms for the tails.
struct AddOp {
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static float scalar(float a, float b) { return a + b; }
};
struct SubOp {
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
  static float scalar(float a, float b) { return a - b; }
};
// ReluGrad(dy, x): dy where x > 0 (false for NaN), else 0.
struct ReluGradOp {
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 dy, __m512 x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), dy);
  }
  static float scalar(float dy, float x) { return ReluGradF{}(dy, x); }
};
// Unary ops: the second operand is the first again.
struct ReluOp {
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 x, __m512) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), x);
  }
  static float scalar(float x, float) { return ReluF{}(x); }
};
struct MulOp {
  static constexpr bool kSubnormalAssist = true;
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  __attribute__((target("avx512f"))) static __m512d inDouble(__m512d a, __m512d b) {
    return _mm512_mul_pd(a, b);
  }
  static float scalar(float a, float b) { return a * b; }
};
struct DivOp {
  static constexpr bool kSubnormalAssist = true;
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  __attribute__((target("avx512f"))) static __m512d inDouble(__m512d a, __m512d b) {
    return _mm512_div_pd(a, b);
  }
  static float scalar(float a, float b) { return a / b; }
};
struct SqrtOp {
  static constexpr bool kSubnormalAssist = true;
  __attribute__((target("avx512f"))) static __m512 inFloat(__m512 a, __m512) {
    return _mm512_maskz_sqrt_ps(0xffff, a);
  }
  __attribute__((target("avx512f"))) static __m512d inDouble(__m512d a, __m512d) {
    return _mm512_maskz_sqrt_pd(0xff, a);
  }
  static float scalar(float a, float) { return std::sqrt(a); }
};

// 8 floats of Op through double. (The zero-masked forms here: the plain ones
// start from an undefined register, which g++ 12 reports as maybe
// uninitialized.)
template <class Op>
__attribute__((target("avx512f"))) inline __m256 throughDouble(__m256 a, __m256 b) {
  const __mmask8 all = 0xff;
  return _mm512_maskz_cvtpd_ps(all,
                               Op::inDouble(_mm512_maskz_cvtps_pd(all, a), _mm512_maskz_cvtps_pd(all, b)));
}

template <class Op>
concept AssistsOnSubnormals = Op::kSubnormalAssist;

// n floats of Op(x, y); a stride of 0 is a scalar.
template <class Op, int64_t kSx, int64_t kSy>
__attribute__((target("avx512f,avx512dq"))) void vectorAvx512(float* o, const float* x, const float* y,
                                                              int64_t n) {
  if (n <= 0) return;               // (the scalars below read x[0] and y[0])
  constexpr int kSubnormal = 0x20;  // vfpclassps: denormal
  const __m512 xs = _mm512_set1_ps(*x);
  const __m512 ys = _mm512_set1_ps(*y);
  const __m256 xs8 = _mm256_set1_ps(*x);
  const __m256 ys8 = _mm256_set1_ps(*y);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = kSx == 0 ? xs : _mm512_loadu_ps(x + i);
    const __m512 b = kSy == 0 ? ys : _mm512_loadu_ps(y + i);
    if constexpr (AssistsOnSubnormals<Op>) {
      if ((_mm512_fpclass_ps_mask(a, kSubnormal) | _mm512_fpclass_ps_mask(b, kSubnormal)) != 0) {
        for (int64_t h = i; h < i + 16; h += 8) {
          const __m256 ha = kSx == 0 ? xs8 : _mm256_loadu_ps(x + h);
          const __m256 hb = kSy == 0 ? ys8 : _mm256_loadu_ps(y + h);
          _mm256_storeu_ps(o + h, throughDouble<Op>(ha, hb));
        }
        continue;
      }
    }
    _mm512_storeu_ps(o + i, Op::inFloat(a, b));
  }
  for (; i < n; ++i) o[i] = Op::scalar(x[i * kSx], y[i * kSy]);
}

// 16 floats of Op(a, b), through double when Op takes an assist on a
// subnormal operand and one is there (the same bits either way).
template <class Op>
__attribute__((target("avx512f,avx512dq"))) inline __m512 applyAvx512(__m512 a, __m512 b) {
  if constexpr (AssistsOnSubnormals<Op>) {
    constexpr int kSubnormal = 0x20;  // vfpclassps: denormal
    if ((_mm512_fpclass_ps_mask(a, kSubnormal) | _mm512_fpclass_ps_mask(b, kSubnormal)) != 0) {
      const __mmask8 all = 0xff;
      const __m256 low =
          throughDouble<Op>(_mm512_maskz_extractf32x8_ps(all, a, 0), _mm512_maskz_extractf32x8_ps(all, b, 0));
      const __m256 high =
          throughDouble<Op>(_mm512_maskz_extractf32x8_ps(all, a, 1), _mm512_maskz_extractf32x8_ps(all, b, 1));
      return _mm512_insertf32x8(_mm512_insertf32x8(_mm512_setzero_ps(), low, 0), high, 1);
    }
  }
  return Op::inFloat(a, b);
}

// A plane of Op (planes.hpp), the output contiguous along a row and each
// input contiguous (kSx, kSy 1) or one value (0) along it. A row's last
// vector goes through masks, its lanes past the row holding 1 (so nothing
// there can make a subnormal).
template <class Op, int64_t kSx, int64_t kSy>
__attribute__((target("avx512f,avx512dq"))) void planeAvx512(const Plane& p, float* o, const float* x,
                                                             const float* y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t r = 0; r < p.rows; ++r) {
    float* out = o + r * p.row[0];
    const float* xr = x + r * p.row[1];
    const float* yr = y + r * p.row[2];
    for (int64_t c = 0; c < p.cols; c += 16) {
      const __mmask16 lanes = firstLanes16(p.cols - c);
      const __m512 a = kSx == 0 ? _mm512_set1_ps(*xr) : _mm512_mask_loadu_ps(one, lanes, xr + c);
      const __m512 b = kSy == 0 ? _mm512_set1_ps(*yr) : _mm512_mask_loadu_ps(one, lanes, yr + c);
      _mm512_mask_storeu_ps(out + c, lanes, applyAvx512<Op>(a, b));
    }
  }
}
#endif

// Runs the loop of Op a plane at a time (planes.hpp) when the CPU has the
// vector form and every plane's rows are contiguous in the output and
// contiguous or one value in each input; false when it cannot.
template <class Op>
bool vectorPlanes(const StridedLoop& loop, float* o, const float* x, const float* y) {
#ifdef TESSERA_X86_SIMD
  if (!cpuHasAvx512() || loop.rank == 0) return false;
  const Plane p = innerPlane(loop);
  using PlaneKernel = void (*)(const Plane&, float*, const float*, const float*);
  PlaneKernel plane = nullptr;
  if (p.col[1] == 1 && p.col[2] == 1) plane = planeAvx512<Op, 1, 1>;
  if (p.col[1] == 1 && p.col[2] == 0) plane = planeAvx512<Op, 1, 0>;
  if (p.col[1] == 0 && p.col[2] == 1) plane = planeAvx512<Op, 0, 1>;
  if (p.col[0] != 1 || plane == nullptr) return false;
  forEachPlane(loop, [&](int64_t o0, int64_t o1, int64_t o2) { plane(p, o + o0, x + o1, y + o2); });
  return true;
#else
  (void)loop, (void)o, (void)x, (void)y;
  return false;
#endif
}

// Runs n points of Op with output stride 1 and input strides sx and sy (1,
// or 0 for a scalar) vectorized when the CPU can; false when it cannot.
template <class Op>
bool vectorRow(float* o, const float* x, const float* y, int64_t n, int64_t sx, int64_t sy) {
#ifdef TESSERA_X86_SIMD
  if (!cpuHasAvx512()) return false;
  if (sx == 1 && sy == 1) return vectorAvx512<Op, 1, 1>(o, x, y, n), true;
  if (sx == 1 && sy == 0) return vectorAvx512<Op, 1, 0>(o, x, y, n), true;
  if (sx == 0 && sy == 1) return vectorAvx512<Op, 0, 1>(o, x, y, n), true;
#else
  (void)o, (void)x, (void)y, (void)n, (void)sx, (void)sy;
#endif
  return false;
}

// Op's strided kernels and flat steps (unary ops: the input is read as both
// operands), falling back on F's.
template <class Op, class F>
void vectorBinaryKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    const float* y = inOf(s, run, 1);
    forLoopParts(s, run.loop, [&](const StridedLoop& loop, const std::array<int64_t, kMaxOperands>& at) {
      float* po = o + at[0];
      const float* px = x + at[1];
      const float* py = y + at[2];
      if (vectorPlanes<Op>(loop, po, px, py)) return;
      const auto f = [&](int64_t io, int64_t ix, int64_t iy) { po[io] = F{}(px[ix], py[iy]); };
      forEachRow(loop,
                 [&](int64_t n, int64_t s0, int64_t s1, int64_t s2, int64_t o0, int64_t o1, int64_t o2) {
                   if (s0 != 1 || !vectorRow<Op>(po + o0, px + o1, py + o2, n, s1, s2))
                     inner(n, s0, s1, s2, o0, o1, o2, f);
                 });
    });
  }
}

template <class Op, class F>
void vectorBinaryTile(const Step& s, const TileOperands& t, int64_t n) {
  if (!vectorRow<Op>(t.out, t.in[0], t.in[1], n, s.tileStride[0], s.tileStride[1])) binaryTile<F>(s, t, n);
}

// A unary op whose runs of contiguous elements go through kRow (x, n, out)
// where it can (false: it cannot), and through F one element at a time
// elsewhere; its loop split over the threads as the binary ops split
// theirs (forLoopParts).
using UnaryRow = bool (*)(const float* x, int64_t n, float* out);

template <class F, UnaryRow kRow>
void unaryRowKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forLoopParts(s, run.loop, [&](const StridedLoop& loop, const std::array<int64_t, kMaxOperands>& at) {
      float* po = o + at[0];
      const float* px = x + at[1];
      const auto f = [&](int64_t io, int64_t ix, int64_t) { po[io] = F{}(px[ix]); };
      forEachRow(loop,
                 [&](int64_t n, int64_t s0, int64_t s1, int64_t s2, int64_t o0, int64_t o1, int64_t o2) {
                   if (s0 != 1 || s1 != 1 || !kRow(px + o1, n, po + o0)) inner(n, s0, s1, s2, o0, o1, o2, f);
                 });
    });
  }
}

template <class F, UnaryRow kRow>
void unaryRowTile(const Step& s, const TileOperands& t, int64_t n) {
  if (s.tileStride[0] != 1 || !kRow(t.in[0], n, t.out)) unaryTile<F>(s, t, n);
}

// Rows through Op's vector form (unary: the input is read as both
// operands), or through a bulk function of vector_math.hpp that makes the
// same bits as F one element at a time.
template <class Op>
bool vectorUnaryRow(const float* x, int64_t n, float* out) {
  return vectorRow<Op>(out, x, x, n, 1, 1);
}
template <void (*kBulk)(const float*, int64_t, float*)>
bool bulkRow(const float* x, int64_t n, float* out) {
  kBulk(x, n, out);
  return true;
}

template <class F, UnaryRow kRow>
KernelDef unaryRows(KernelDef def) {
  def.plan = planSplitBroadcast<unaryRowKernel<F, kRow>>;
  def.tile = unaryRowTile<F, kRow>;
  return def;
}

// `def` (F's kernels) with Op's strided kernel and flat step.
template <class Op, class F>
KernelDef vectorBinary(KernelDef def) {
  def.plan = planSplitBroadcast<vectorBinaryKernel<Op, F>>;
  def.tile = vectorBinaryTile<Op, F>;
  return def;
}

template <class Op, class F>
KernelDef vectorUnary(KernelDef def) {
  return unaryRows<F, vectorUnaryRow<Op>>(def);
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

#ifdef TESSERA_X86_SIMD
// n floats of a * x + b * y, in double as scaledAddKernel computes them (a
// and b are floats, so both products are exact in double and only the sum
// rounds, fused into a multiply-add by the compiler or not).
template <int64_t kSx, int64_t kSy>
__attribute__((target("avx512f"))) void scaledAddAvx512(float* o, const float* x, const float* y, double a,
                                                        double b, int64_t n) {
  if (n <= 0) return;
  const __mmask8 all = 0xff;
  const __m512d va = _mm512_set1_pd(a);
  const __m512d vb = _mm512_set1_pd(b);
  const __m256 xs = _mm256_set1_ps(*x);
  const __m256 ys = _mm256_set1_ps(*y);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d ax = _mm512_mul_pd(va, _mm512_maskz_cvtps_pd(all, kSx == 0 ? xs : _mm256_loadu_ps(x + i)));
    const __m512d by = _mm512_mul_pd(vb, _mm512_maskz_cvtps_pd(all, kSy == 0 ? ys : _mm256_loadu_ps(y + i)));
    _mm256_storeu_ps(o + i, _mm512_maskz_cvtpd_ps(all, _mm512_add_pd(ax, by)));
  }
  for (; i < n; ++i) o[i] = static_cast<float>(a * x[i * kSx] + b * y[i * kSy]);
}
#endif

void scaledAddTile(const Step& s, const TileOperands& t, int64_t n) {
  const double a = s.a;
  const double b = s.b;
#ifdef TESSERA_X86_SIMD
  const int64_t sx = s.tileStride[0];
  const int64_t sy = s.tileStride[1];
  if (cpuHasAvx512()) {
    if (sx == 1 && sy == 1) return scaledAddAvx512<1, 1>(t.out, t.in[0], t.in[1], a, b, n);
    if (sx == 1 && sy == 0) return scaledAddAvx512<1, 0>(t.out, t.in[0], t.in[1], a, b, n);
    if (sx == 0 && sy == 1) return scaledAddAvx512<0, 1>(t.out, t.in[0], t.in[1], a, b, n);
  }
#endif
  float* o = t.out;
  const float* x = t.in[0];
  const float* y = t.in[1];
  flatTile(s, n,
           [&](int64_t io, int64_t ix, int64_t iy) { o[io] = static_cast<float>(a * x[ix] + b * y[iy]); });
}

// A binary op computing F in float and, on float64 operands, in double.
template <class F>
KernelDef binaryKernelsWithDouble(OpKind kind) {
  KernelDef def = binaryKernels<F>(kind);
  def.planFloat64 = planSplitBroadcast<binaryKernel<F, double>>;
  return def;
}

void planCopy(StepPlanner& planner, Step& step) { planFlatCopy(planner, step, planner.op().inputs[0]); }

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
  table.add(vectorBinary<AddOp, AddF>(binaryKernelsWithDouble<AddF>(OpKind::Add)));
  table.add(vectorBinary<SubOp, SubF>(binaryKernelsWithDouble<SubF>(OpKind::Sub)));
  table.add(vectorBinary<MulOp, MulF>(binaryKernelsWithDouble<MulF>(OpKind::Mul)));
  table.add(vectorBinary<DivOp, DivF>(binaryKernelsWithDouble<DivF>(OpKind::Div)));
  table.add(vectorBinary<ReluGradOp, ReluGradF>(binaryKernels<ReluGradF>(OpKind::ReluGrad)));
  table.add(binaryKernels<GeluGradF>(OpKind::GeluGrad));
  table.add(unaryKernelsWithDouble<NegF>(OpKind::Neg));
  table.add(vectorUnary<ReluOp, ReluF>(unaryKernelsWithDouble<ReluF>(OpKind::Relu)));
  table.add(unaryKernels<GeluF>(OpKind::Gelu));
  table.add(unaryRows<TanhF, bulkRow<tanhOf>>(unaryKernelsWithDouble<TanhF>(OpKind::Tanh)));
  table.add(unaryRows<SigmoidF, bulkRow<sigmoidOf>>(unaryKernelsWithDouble<SigmoidF>(OpKind::Sigmoid)));
  table.add(unaryRows<ExpF, bulkRow<exponentialOf>>(unaryKernelsWithDouble<ExpF>(OpKind::Exp)));
  table.add(unaryKernelsWithDouble<LogF>(OpKind::Log));
  table.add(vectorUnary<SqrtOp, SqrtF>(unaryKernelsWithDouble<SqrtF>(OpKind::Sqrt)));
  table.add(unaryKernelsWithDouble<AbsF>(OpKind::Abs));
  table.add(unaryKernelsWithDouble<SignF>(OpKind::Sign));
  table.add(unaryRows<ErfF, bulkRow<erfOf>>(unaryKernels<ErfF>(OpKind::Erf)));
  table.add(unaryKernelsWithDouble<ReciprocalF>(OpKind::Reciprocal));
  table.add(unaryKernels<SoftplusF>(OpKind::Softplus));
  table.add(binaryKernelsWithDouble<PowF>(OpKind::Pow));
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
  table.add({.kind = OpKind::Copy, .plan = planCopy, .tile = copyTile, .planFloat64 = planCopy});
  table.add({.kind = OpKind::IpuCopy, .plan = planCopy, .tile = copyTile, .planFloat64 = planCopy});
  // (dst, src): the source is copied into the destination's storage.
  table.add(
      {.kind = OpKind::CopyInplace,
       .plan = [](StepPlanner& planner, Step& step) { planFlatCopy(planner, step, planner.op().inputs[1]); },
       .tile = copyTile});
}

}  // namespace tessera::sim
