// The elementwise family: binary arithmetic with numpy broadcasting, the
// unary functions, the gradient helpers of Relu and Gelu, and the copies and
// in-place updates that transforms and optimizers use.
#include "ops/elementwise.hpp"

#include <cmath>

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

// Int32 arithmetic (counters, the seed's `v += 1`) is exact; Div stays float.
std::vector<OutputSpec> broadcastingShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(2);
  if (c.kind() == OpKind::Div) c.dtype(0, DType::Float32);
  c.dtype(1, c.in(0).dtype);
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
  c.dtype(0, DType::Float32);
  return {{c.shape(0), DType::Float32, c.in(0).metaShape}};
}

// (dy, x) of the same shape.
std::vector<OutputSpec> gradHelperShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(2);
  c.dtype(0, DType::Float32);
  c.dtype(1, DType::Float32);
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
double reluGradOf(double dy, double x) { return x > 0.0 ? dy : 0.0; }
double geluGradOf(double dy, double x) { return dy * geluDerivative(x); }

}  // namespace

void addElementwiseOps(OpTable& table) {
  const OpDef binaryBase{.family = OpFamily::Elementwise, .elementwise = true, .shape = broadcastingShape,
                         .cost = perElement<1>};
  const OpDef unaryBase{.family = OpFamily::Elementwise, .elementwise = true, .shape = unaryShape};
  auto with = [](OpDef def, OpKind kind, auto gradient, auto reference, auto cost) {
    def.kind = kind;
    def.gradient = gradient;
    def.reference = reference;
    def.cost = cost;
    return def;
  };

  table.add(with(binaryBase, OpKind::Add,
                 [](const GradientContext& g) -> R {
                   return {reduceTo(g.dy, g.in(0).shape()), reduceTo(g.dy, g.in(1).shape())};
                 },
                 binaryReference<addOf>, perElement<1>));
  table.add(with(binaryBase, OpKind::Sub,
                 [](const GradientContext& g) -> R {
                   return {reduceTo(g.dy, g.in(0).shape()), reduceTo(ops::neg(g.dy), g.in(1).shape())};
                 },
                 binaryReference<subOf>, perElement<1>));
  table.add(with(binaryBase, OpKind::Mul,
                 [](const GradientContext& g) -> R {
                   return {reduceTo(ops::mul(g.dy, g.in(1)), g.in(0).shape()),
                           reduceTo(ops::mul(g.dy, g.in(0)), g.in(1).shape())};
                 },
                 binaryReference<mulOf>, perElement<1>));
  // d(a/b)/db = -(a/b)/b, with a/b the output.
  table.add(with(binaryBase, OpKind::Div,
                 [](const GradientContext& g) -> R {
                   return {reduceTo(ops::div(g.dy, g.in(1)), g.in(0).shape()),
                           reduceTo(ops::neg(ops::div(ops::mul(g.dy, g.out(0)), g.in(1))), g.in(1).shape())};
                 },
                 binaryReference<divOf>, perElement<1>));

  table.add(with(unaryBase, OpKind::Neg, [](const GradientContext& g) -> R { return {ops::neg(g.dy)}; },
                 unaryReference<negOf>, perElement<1>));
  table.add(with(unaryBase, OpKind::Relu,
                 [](const GradientContext& g) -> R {
                   return {g.make(OpKind::ReluGrad, {g.dy.id(), g.in(0).id()}, {})};
                 },
                 unaryReference<reluOf>, perElement<1>));
  table.add(with(unaryBase, OpKind::Gelu,
                 [](const GradientContext& g) -> R {
                   return {g.make(OpKind::GeluGrad, {g.dy.id(), g.in(0).id()}, {})};
                 },
                 unaryReference<geluOf>, perElement<8>));
  table.add(with(unaryBase, OpKind::Tanh,
                 [](const GradientContext& g) -> R {
                   return {ops::sub(g.dy, ops::mul(ops::mul(g.dy, g.out(0)), g.out(0)))};
                 },
                 unaryReference<tanhOf>, perElement<4>));
  table.add(with(unaryBase, OpKind::Sigmoid,
                 [](const GradientContext& g) -> R {
                   return {ops::mul(g.dy, ops::sub(g.out(0), ops::mul(g.out(0), g.out(0))))};
                 },
                 unaryReference<sigmoidOf>, perElement<4>));
  table.add(with(unaryBase, OpKind::Exp,
                 [](const GradientContext& g) -> R { return {ops::mul(g.dy, g.out(0))}; },
                 unaryReference<expOf>, perElement<4>));
  table.add(with(unaryBase, OpKind::Log,
                 [](const GradientContext& g) -> R { return {ops::div(g.dy, g.in(0))}; },
                 unaryReference<logOf>, perElement<4>));
  table.add(with(unaryBase, OpKind::Sqrt,
                 [](const GradientContext& g) -> R { return {ops::div(scaled(g.dy, 0.5), g.out(0))}; },
                 unaryReference<sqrtOf>, perElement<4>));

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

  // x = a*x + b*y, in place; y broadcasts to x.
  table.add({.kind = OpKind::ScaledAddInplace,
             .family = OpFamily::Elementwise,
             .elementwise = true,
             .inplace = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(2);
               c.dtype(1, c.in(0).dtype);
               if (!broadcastsTo(c.shape(1), c.shape(0))) {
                 c.fail(ErrorCode::ShapeMismatch, fmt::format("y {} must broadcast to the shape of the modified x {}",
                                                              c.desc(1), c.desc(0)));
               }
               return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R {
               return {scaled(g.dy, g.attributes().a), reduceTo(scaled(g.dy, g.attributes().b), g.in(1).shape())};
             },
             // Writes x's storage, which the output shares.
             .reference = [](ReferenceOp& r, int64_t replica) {
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
               c.dtype(1, c.in(0).dtype);
               return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R { return {Tensor{}, g.dy}; },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(1, replica); },
             .cost = perElement<1>});
}

}  // namespace tessera
