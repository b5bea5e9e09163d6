// The elementwise family: binary arithmetic with numpy broadcasting, the
// unary functions, the gradient helpers of Relu and Gelu, and the copies and
// in-place updates that transforms and optimizers use.
#include "ops/elementwise.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

using R = std::vector<Tensor>;
using Values = std::vector<double>;

// Flops per output element.
template <int kPerElement>
OpCost perElement(const Graph& graph, const OpNode& op) {
  return {.flops = kPerElement * elementsOf(graph, op.outputs[0])};
}

// Shape rules.

// Int32 arithmetic (counters, the seed's `v += 1`) is exact; Div stays
// float. Both operands share one dtype: float16 beside float32 is a
// DTypeMismatch.
std::vector<OutputSpec> broadcastingShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(2);
  if (c.kind() == OpKind::Div) c.floating({0});
  c.sameDType(0, 1);
  auto out = broadcastShapes(c.shape(0), c.shape(1));
  if (!out) {
    c.fail(ErrorCode::ShapeMismatch,
           fmt::format("{} and {} do not broadcast (numpy rules: aligned from the right, each pair of "
                       "dimensions equal or one of them 1)",
                       c.desc(0), c.desc(1)));
  }
  // A shard combined with a scalar (or another shard) is still a shard of
  // the same tensor.
  Shape meta = c.shape(0) == *out ? c.in(0).metaShape : Shape{};
  if (meta.empty() && c.shape(1) == *out) meta = c.in(1).metaShape;
  return {{*out, c.in(0).dtype, std::move(meta)}};
}

std::vector<OutputSpec> unaryShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(1);
  const DType dtype = c.floating({0});
  return {{c.shape(0), dtype, c.in(0).metaShape}};
}

// (dy, x) of the same shape.
std::vector<OutputSpec> gradHelperShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(2);
  c.floating({0, 1});
  c.sameShape(0, 1);
  return c.same(0);
}

// References.

template <double (*F)(double)>
void unaryReference(ReferenceOp& r, int64_t replica) {
  const Values& x = r.in(0, replica);
  Values& out = r.out(replica);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = F(x[i]);
}

template <double (*F)(double, double)>
void binaryReference(ReferenceOp& r, int64_t replica) {
  const Values& a = r.in(0, replica);
  const Values& b = r.in(1, replica);
  Values& out = r.out(replica);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = F(a[reference::broadcastSource(i, r.outShape(), r.inShape(0))],
               b[reference::broadcastSource(i, r.outShape(), r.inShape(1))]);
  }
}

double addOf(double a, double b) { return a + b; }
double subOf(double a, double b) { return a - b; }
double mulOf(double a, double b) { return a * b; }
double divOf(double a, double b) { return a / b; }
double negOf(double x) { return -x; }
double reluOf(double x) { return x > 0.0 ? x : 0.0; }
double tanhOf(double x) { return std::tanh(x); }
double sigmoidOf(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double expOf(double x) { return std::exp(x); }
double logOf(double x) { return std::log(x); }
double sqrtOf(double x) { return std::sqrt(x); }
double absOf(double x) { return std::abs(x); }
double signOf(double x) { return x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : 0.0; }
double erfOf(double x) { return std::erf(x); }
double reciprocalOf(double x) { return 1.0 / x; }
double powOf(double a, double b) { return std::pow(a, b); }
double reluGradOf(double dy, double x) { return x > 0.0 ? dy : 0.0; }
double geluGradOf(double dy, double x) { return dy * geluDerivative(x); }

// Unary and gradient-helper references that read the attributes a and b.
template <double (*F)(double, double, double)>
void parameterisedReference(ReferenceOp& r, int64_t replica) {
  const Values& x = r.in(0, replica);
  Values& out = r.out(replica);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = F(x[i], r.attributes().a, r.attributes().b);
}

template <double (*F)(double, double, double, double)>
void parameterisedGradReference(ReferenceOp& r, int64_t replica) {
  const Values& dy = r.in(0, replica);
  const Values& x = r.in(1, replica);
  Values& out = r.out(replica);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = F(dy[i], x[i], r.attributes().a, r.attributes().b);
}

double leakyReluOf(double x, double alpha, double /*unused*/) { return x > 0.0 ? x : alpha * x; }
double eluOf(double x, double alpha, double /*unused*/) { return x > 0.0 ? x : alpha * std::expm1(x); }
double seluOf(double x, double alpha, double gamma) { return gamma * eluOf(x, alpha, 0.0); }
double clipOf(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }
// Without overflow: max(x, 0) + log(1 + exp(-|x|)).
double softplusOf(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }
double leakyReluGradOf(double dy, double x, double alpha, double /*unused*/) {
  return x > 0.0 ? dy : alpha * dy;
}
double eluGradOf(double dy, double x, double alpha, double /*unused*/) {
  return x > 0.0 ? dy : dy * alpha * std::exp(x);
}
double seluGradOf(double dy, double x, double alpha, double gamma) {
  return gamma * eluGradOf(dy, x, alpha, 0.0);
}
double clipGradOf(double dy, double x, double lo, double hi) { return x >= lo && x <= hi ? dy : 0.0; }

// The gradient of a piecewise activation through its helper kind, with the
// activation's attributes.
template <OpKind kHelper>
std::vector<Tensor> helperGradient(const GradientContext& g) {
  return {g.make(kHelper, {g.dy.id(), g.in(0).id()}, g.attributes())};
}

}  // namespace

void addElementwiseOps(OpTable& table) {
  const OpDef binaryBase{.family = OpFamily::Elementwise,
                         .elementwise = true,
                         .shape = broadcastingShape,
                         .cost = perElement<1>};
  const OpDef unaryBase{.family = OpFamily::Elementwise, .elementwise = true, .shape = unaryShape};
  auto with = [](OpDef def, OpKind kind, auto gradient, auto reference, auto cost) {
    def.kind = kind;
    def.gradient = gradient;
    def.reference = reference;
    def.cost = cost;
    return def;
  };

  table.add(with(
      binaryBase, OpKind::Add,
      [](const GradientContext& g) -> R {
        return {reduceTo(g.dy, g.in(0).shape()), reduceTo(g.dy, g.in(1).shape())};
      },
      binaryReference<addOf>, perElement<1>));
  table.add(with(
      binaryBase, OpKind::Sub,
      [](const GradientContext& g) -> R {
        return {reduceTo(g.dy, g.in(0).shape()), reduceTo(ops::neg(g.dy), g.in(1).shape())};
      },
      binaryReference<subOf>, perElement<1>));
  table.add(with(
      binaryBase, OpKind::Mul,
      [](const GradientContext& g) -> R {
        return {reduceTo(ops::mul(g.dy, g.in(1)), g.in(0).shape()),
                reduceTo(ops::mul(g.dy, g.in(0)), g.in(1).shape())};
      },
      binaryReference<mulOf>, perElement<1>));
  // d(a/b)/db = -(a/b)/b, with a/b the output.
  table.add(with(
      binaryBase, OpKind::Div,
      [](const GradientContext& g) -> R {
        return {reduceTo(ops::div(g.dy, g.in(1)), g.in(0).shape()),
                reduceTo(ops::neg(ops::div(ops::mul(g.dy, g.out(0)), g.in(1))), g.in(1).shape())};
      },
      binaryReference<divOf>, perElement<1>));

  table.add(with(
      unaryBase, OpKind::Neg, [](const GradientContext& g) -> R { return {ops::neg(g.dy)}; },
      unaryReference<negOf>, perElement<1>));
  table.add(with(
      unaryBase, OpKind::Relu,
      [](const GradientContext& g) -> R {
        return {g.make(OpKind::ReluGrad, {g.dy.id(), g.in(0).id()}, {})};
      },
      unaryReference<reluOf>, perElement<1>));
  table.add(with(
      unaryBase, OpKind::Gelu,
      [](const GradientContext& g) -> R {
        return {g.make(OpKind::GeluGrad, {g.dy.id(), g.in(0).id()}, {})};
      },
      unaryReference<geluOf>, perElement<8>));
  table.add(with(
      unaryBase, OpKind::Tanh,
      [](const GradientContext& g) -> R {
        return {ops::sub(g.dy, ops::mul(ops::mul(g.dy, g.out(0)), g.out(0)))};
      },
      unaryReference<tanhOf>, perElement<4>));
  table.add(with(
      unaryBase, OpKind::Sigmoid,
      [](const GradientContext& g) -> R {
        return {ops::mul(g.dy, ops::sub(g.out(0), ops::mul(g.out(0), g.out(0))))};
      },
      unaryReference<sigmoidOf>, perElement<4>));
  table.add(with(
      unaryBase, OpKind::Exp, [](const GradientContext& g) -> R { return {ops::mul(g.dy, g.out(0))}; },
      unaryReference<expOf>, perElement<4>));
  table.add(with(
      unaryBase, OpKind::Log, [](const GradientContext& g) -> R { return {ops::div(g.dy, g.in(0))}; },
      unaryReference<logOf>, perElement<4>));
  table.add(with(
      unaryBase, OpKind::Sqrt,
      [](const GradientContext& g) -> R { return {ops::div(scaled(g.dy, 0.5), g.out(0))}; },
      unaryReference<sqrtOf>, perElement<4>));

  table.add(with(
      unaryBase, OpKind::Abs,
      [](const GradientContext& g) -> R { return {ops::mul(g.dy, ops::sign(g.in(0)))}; },
      unaryReference<absOf>, perElement<1>));
  // Piecewise constant: its gradient is zero, so none flows back.
  table.add(with(
      unaryBase, OpKind::Sign, [](const GradientContext& /*g*/) -> R { return {Tensor{}}; },
      unaryReference<signOf>, perElement<1>));
  // d erf(x) = 2/sqrt(pi) exp(-x^2) dx
  table.add(with(
      unaryBase, OpKind::Erf,
      [](const GradientContext& g) -> R {
        const Tensor x = g.in(0);
        return {
            ops::mul(scaled(g.dy, 2.0 / std::sqrt(std::numbers::pi)), ops::exp(ops::neg(ops::mul(x, x))))};
      },
      unaryReference<erfOf>, perElement<8>));
  // d(1/x) = -y^2 dx
  table.add(with(
      unaryBase, OpKind::Reciprocal,
      [](const GradientContext& g) -> R { return {ops::neg(ops::mul(g.dy, ops::mul(g.out(0), g.out(0))))}; },
      unaryReference<reciprocalOf>, perElement<1>));
  table.add(with(
      unaryBase, OpKind::Softplus,
      [](const GradientContext& g) -> R { return {ops::mul(g.dy, ops::sigmoid(g.in(0)))}; },
      unaryReference<softplusOf>, perElement<8>));
  table.add(with(unaryBase, OpKind::LeakyRelu, helperGradient<OpKind::LeakyReluGrad>,
                 parameterisedReference<leakyReluOf>, perElement<2>));
  table.add(with(unaryBase, OpKind::Elu, helperGradient<OpKind::EluGrad>, parameterisedReference<eluOf>,
                 perElement<4>));
  table.add(with(unaryBase, OpKind::Selu, helperGradient<OpKind::SeluGrad>, parameterisedReference<seluOf>,
                 perElement<5>));
  OpDef clip = with(unaryBase, OpKind::Clip, helperGradient<OpKind::ClipGrad>, parameterisedReference<clipOf>,
                    perElement<2>);
  clip.shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
    if (!(attributes.a <= attributes.b)) {
      c.fail(ErrorCode::InvalidOperand,
             fmt::format("the bounds [{}, {}] are empty; the lower bound must not exceed the upper",
                         attributes.a, attributes.b));
    }
    return unaryShape(c, attributes);
  };
  table.add(clip);
  // d(a^b) = b a^(b-1) da + a^b log(a) db; the exponent's gradient is built
  // only when wanted (it needs a > 0).
  table.add(with(
      binaryBase, OpKind::Pow,
      [](const GradientContext& g) -> R {
        const Tensor a = g.in(0);
        const Tensor b = g.in(1);
        R out{Tensor{}, Tensor{}};
        if (g.isWanted(0)) {
          out[0] = reduceTo(ops::mul(g.dy, ops::mul(b, ops::pow(a, ops::sub(b, ops::scalar(g.graph, 1.0, b.dtype()))))),
                            a.shape());
        }
        if (g.isWanted(1)) out[1] = reduceTo(ops::mul(g.dy, ops::mul(g.out(0), ops::log(a))), b.shape());
        return out;
      },
      binaryReference<powOf>, perElement<8>));

  // The gradient helpers of Relu and Gelu: (dy, x); no gradient of their own.
  table.add({.kind = OpKind::ReluGrad,
             .family = OpFamily::Elementwise,
             .shape = gradHelperShape,
             .reference = binaryReference<reluGradOf>,
             .cost = perElement<1>});
  table.add({.kind = OpKind::GeluGrad,
             .family = OpFamily::Elementwise,
             .shape = gradHelperShape,
             .reference = binaryReference<geluGradOf>,
             .cost = perElement<8>});

  using Reference = void (*)(ReferenceOp&, int64_t);
  for (const auto& [kind, reference] :
       {std::pair<OpKind, Reference>{OpKind::LeakyReluGrad, parameterisedGradReference<leakyReluGradOf>},
        std::pair<OpKind, Reference>{OpKind::EluGrad, parameterisedGradReference<eluGradOf>},
        std::pair<OpKind, Reference>{OpKind::SeluGrad, parameterisedGradReference<seluGradOf>},
        std::pair<OpKind, Reference>{OpKind::ClipGrad, parameterisedGradReference<clipGradOf>}}) {
    table.add({.kind = kind,
               .family = OpFamily::Elementwise,
               .shape = gradHelperShape,
               .reference = reference,
               .cost = perElement<2>});
  }

  // x = a*x + b*y, in place; y broadcasts to x.
  table.add(
      {.kind = OpKind::ScaledAddInplace,
       .family = OpFamily::Elementwise,
       .elementwise = true,
       .inplace = true,
       .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
         c.arity(2);
         c.sameDType(0, 1);
         if (!broadcastsTo(c.shape(1), c.shape(0))) {
           c.fail(ErrorCode::ShapeMismatch,
                  fmt::format("y {} must broadcast to the shape of the modified x {}", c.desc(1), c.desc(0)));
         }
         return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
       },
       .gradient = [](const GradientContext& g) -> R {
         return {scaled(g.dy, g.attributes().a), reduceTo(scaled(g.dy, g.attributes().b), g.in(1).shape())};
       },
       // Writes x's storage, which the output shares.
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             const Values& x = r.in(0, replica);
             const Values& y = r.in(1, replica);
             Values& out = r.out(replica);
             for (std::size_t i = 0; i < out.size(); ++i) {
               out[i] = r.attributes().a * x[i] +
                        r.attributes().b * y[reference::broadcastSource(i, r.outShape(), r.inShape(1))];
             }
           },
       .cost = perElement<3>});
  table.add({.kind = OpKind::Copy,
             .family = OpFamily::Elementwise,
             .elementwise = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R { return {g.dy}; },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(0, replica); },
             .cost = perElement<1>});
  // (dst, src): dst = src, in place.
  table.add({.kind = OpKind::CopyInplace,
             .family = OpFamily::Elementwise,
             .elementwise = true,
             .inplace = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(2);
               c.sameShape(0, 1);
               c.sameDType(0, 1);
               return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R {
               return {Tensor{}, g.dy};
             },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(1, replica); },
             .cost = perElement<1>});
  // y = x on another IPU of the replica: the copy transform inserts it
  // after autodiff; numerically the identity.
  table.add({.kind = OpKind::IpuCopy,
             .family = OpFamily::Elementwise,
             .work = OpWork::InterIpu,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R { return {g.dy}; },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(0, replica); },
             .cost = [](const Graph& graph, const OpNode& op) {
               return OpCost{.ipuLinkBytes = bytesOf(graph, op.inputs[0])};
             }});
  table.keepsHalves({OpKind::Neg, OpKind::Relu, OpKind::Abs, OpKind::Sign, OpKind::ReluGrad, OpKind::Copy,
                     OpKind::CopyInplace, OpKind::IpuCopy});
  table.float64({OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow, OpKind::Neg, OpKind::Abs, OpKind::Sign,
                 OpKind::Relu, OpKind::Sqrt, OpKind::Exp, OpKind::Log, OpKind::Reciprocal, OpKind::Tanh,
                 OpKind::Sigmoid, OpKind::Copy, OpKind::IpuCopy});
}

}  // namespace tessera
