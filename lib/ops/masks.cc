// The mask family: comparisons, logic on masks and Where.
//
// A mask is a float32 tensor of 0 and 1 (1 = true), so that masks mix with
// arithmetic without a cast (ONNX's Cast of a bool to float is the value
// itself) and every input that is not 0 counts as true. Masks stay float32
// when they compare float16 values: 0 and 1 are exact in either dtype, and
// their consumers (Where's cond, Not, And, Or) take a float16 or float32
// mask alike, so a mask never forces a cast. Comparisons and
// logic are piecewise constant: no gradient flows through them. Where is a
// real select: cond ? x : y never touches the element it does not pick, so
// a -inf in y (masked_fill in causal attention) stays -inf and NaN never
// appears where x * m + y * (1 - m) would make one. Dropout draws its mask
// from (seed, step, element of the global batch): the same on any number of
// replicas. The casts between float32, float16 and int32 live here too: a
// mask becomes an integer or a count the same way.
#include "ops/masks.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

using R = std::vector<Tensor>;
using Values = std::vector<double>;

OpCost perElement(const Graph& graph, const OpNode& op) {
  return {.flops = elementsOf(graph, op.outputs[0])};
}

std::optional<Shape> broadcastAll(const OpChecker& c) {
  std::optional<Shape> out = c.shape(0);
  for (std::size_t i = 1; i < c.inputCount() && out; ++i) out = broadcastShapes(*out, c.shape(i));
  return out;
}

[[noreturn]] void notBroadcastable(const OpChecker& c) {
  std::string operands;
  for (std::size_t i = 0; i < c.inputCount(); ++i) operands += (i == 0 ? "" : ", ") + c.desc(i);
  c.fail(ErrorCode::ShapeMismatch,
         fmt::format("{} do not broadcast (numpy rules: aligned from the right, each "
                     "set of dimensions equal or 1)",
                     operands));
}

// Comparisons: two values of one dtype (float32, float16 or int32).
std::vector<OutputSpec> compareShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(2);
  c.sameDType(0, 1);
  const auto out = broadcastAll(c);
  if (!out) notBroadcastable(c);
  return {{*out, DType::Float32, {}}};
}

// Logic: masks (float32, or float16 ones; they need not share a dtype).
std::vector<OutputSpec> logicShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(c.kind() == OpKind::Not ? 1 : 2);
  for (std::size_t i = 0; i < c.inputCount(); ++i) c.floating({i});
  const auto out = broadcastAll(c);
  if (!out) notBroadcastable(c);
  return {{*out, DType::Float32, {}}};
}

template <bool (*F)(double, double)>
void compareReference(ReferenceOp& r, int64_t replica) {
  const Values& a = r.in(0, replica);
  const Values& b = r.in(1, replica);
  Values& out = r.out(replica);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = F(a[reference::broadcastSource(i, r.outShape(), r.inShape(0))],
               b[reference::broadcastSource(i, r.outShape(), r.inShape(1))])
                 ? 1.0
                 : 0.0;
  }
}

bool equalOf(double a, double b) { return a == b; }
bool lessOf(double a, double b) { return a < b; }
bool greaterOf(double a, double b) { return a > b; }
bool andOf(double a, double b) { return a != 0.0 && b != 0.0; }
bool orOf(double a, double b) { return a != 0.0 || b != 0.0; }

R noGradient(const GradientContext& g) { return R(g.op.inputs.size()); }

}  // namespace

void addMaskOps(OpTable& table) {
  auto add = [&](OpKind kind, auto shape, auto reference) {
    table.add({.kind = kind,
               .family = OpFamily::Mask,
               .elementwise = true,
               .shape = shape,
               .gradient = noGradient,
               .reference = reference,
               .cost = perElement});
  };
  add(OpKind::Equal, compareShape, compareReference<equalOf>);
  add(OpKind::Less, compareShape, compareReference<lessOf>);
  add(OpKind::Greater, compareShape, compareReference<greaterOf>);
  add(OpKind::And, logicShape, compareReference<andOf>);
  add(OpKind::Or, logicShape, compareReference<orOf>);
  add(OpKind::Not, logicShape, [](ReferenceOp& r, int64_t replica) {
    const Values& x = r.in(0, replica);
    Values& out = r.out(replica);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = x[i] == 0.0 ? 1.0 : 0.0;
  });

  // (cond, x, y): the gradient of x is dy where cond holds, y's elsewhere,
  // each summed back to its operand's shape.
  table.add({.kind = OpKind::Where,
             .family = OpFamily::Mask,
             .elementwise = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(3);
               c.floating({0});  // the mask: float32 or float16, whatever x and y are
               c.sameDType(1, 2);
               const auto out = broadcastAll(c);
               if (!out) notBroadcastable(c);
               // A choice between shards (or a shard and a scalar) is a
               // shard of the same tensor, as in the arithmetic ops.
               Shape meta;
               for (std::size_t i = 1; i < 3 && meta.empty(); ++i) {
                 if (c.shape(i) == *out) meta = c.in(i).metaShape;
               }
               return {{*out, c.in(1).dtype, std::move(meta)}};
             },
             .gradient = [](const GradientContext& g) -> R {
               R out(3);
               const Tensor zero = ops::scalar(g.graph, 0.0, g.dy.dtype());
               const Tensor cond = g.in(0);
               if (g.isWanted(1)) out[1] = reduceTo(ops::where(cond, g.dy, zero), g.in(1).shape());
               if (g.isWanted(2)) out[2] = reduceTo(ops::where(cond, zero, g.dy), g.in(2).shape());
               return out;
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& cond = r.in(0, replica);
                   const Values& x = r.in(1, replica);
                   const Values& y = r.in(2, replica);
                   Values& out = r.out(replica);
                   const Shape& shape = r.outShape();
                   for (std::size_t i = 0; i < out.size(); ++i) {
                     out[i] = cond[reference::broadcastSource(i, shape, r.inShape(0))] != 0.0
                                  ? x[reference::broadcastSource(i, shape, r.inShape(1))]
                                  : y[reference::broadcastSource(i, shape, r.inShape(2))];
                   }
                 },
             .cost = perElement});

  // Casts: one element from one element. No gradient flows through a cast
  // from or to int32; between float32 and float16 the gradient is the cast
  // back.
  table.add({.kind = OpKind::CastToInt32,
             .family = OpFamily::Mask,
             .elementwise = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               c.floating({0});
               return {{c.shape(0), DType::Int32, {}}};
             },
             .gradient = noGradient,
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& x = r.in(0, replica);
                   Values& out = r.out(replica);
                   for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::trunc(x[i]);
                 },
             .cost = perElement});
  table.add({.kind = OpKind::CastToFloat32,
             .family = OpFamily::Mask,
             .elementwise = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               if (c.in(0).dtype == DType::Float32) {
                 c.fail(ErrorCode::InvalidOperand,
                        fmt::format("input 0 {} is float32 already; CastToFloat32 takes int32, float16 or float64",
                                    c.desc(0)));
               }
               return {{c.shape(0), DType::Float32, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R {
               const DType from = g.in(0).dtype();
               if (from == DType::Int32) return {Tensor{}};
               return {ops::cast(g.dy, from)};
             },
             // From float64 the value is rounded to float32; int32 and
             // float16 values are float32 values already.
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& x = r.in(0, replica);
                   Values& out = r.out(replica);
                   for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(static_cast<float>(x[i]));
                 },
             .cost = perElement});
  // From float32 or float64. The output is stored as half: the reference's
  // rounding model (and the device's) rounds every float16 output to the
  // nearest half, so the op itself is the identity; a double is rounded
  // once, not through float32.
  table.add({.kind = OpKind::CastToFloat16,
             .family = OpFamily::Mask,
             .elementwise = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               if (c.in(0).dtype != DType::Float32 && c.in(0).dtype != DType::Float64) {
                 c.fail(ErrorCode::InvalidOperand,
                        fmt::format("input 0 {} is {}; CastToFloat16 takes float32 or float64", c.desc(0),
                                    c.in(0).dtype));
               }
               return {{c.shape(0), DType::Float16, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R { return {ops::cast(g.dy, g.in(0).dtype())}; },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(0, replica); },
             .cost = perElement});

  table.add({.kind = OpKind::CastToFloat64,
             .family = OpFamily::Mask,
             .elementwise = true,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               if (c.in(0).dtype == DType::Float64) {
                 c.fail(ErrorCode::InvalidOperand,
                        fmt::format("input 0 {} is float64 already; CastToFloat64 takes int32, float32 or float16",
                                    c.desc(0)));
               }
               return {{c.shape(0), DType::Float64, c.in(0).metaShape}};
             },
             .gradient = [](const GradientContext& g) -> R {
               const DType from = g.in(0).dtype();
               if (from == DType::Int32) return {Tensor{}};
               return {ops::cast(g.dy, from)};
             },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(0, replica); },
             .cost = perElement});

  // (x, step int32 []) -> x * mask / (1 - a), seed b. Element i of replica
  // r's value is element r * n + i of the global batch (host data [R, B, ...]
  // is the batch in order). The gradient is the same op on dy with the same
  // step, hence the same mask.
  table.add(
      {.kind = OpKind::Dropout,
       .family = OpFamily::Mask,
       .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
         c.arity(2);
         const DType dtype = c.floating({0});
         c.dtype(1, DType::Int32);
         if (c.rank(1) != 0)
           c.fail(ErrorCode::ShapeMismatch, fmt::format("the step {} must be a scalar", c.desc(1)));
         if (!(attributes.a >= 0.0 && attributes.a < 1.0))
           c.fail(ErrorCode::InvalidOperand, fmt::format("ratio {} is outside [0, 1)", attributes.a));
         if (!(attributes.b >= 0.0 && attributes.b == std::floor(attributes.b)))
           c.fail(ErrorCode::InvalidOperand,
                  fmt::format("seed {} must be a non-negative integer", attributes.b));
         return {{c.shape(0), dtype, {}}};
       },
       .gradient = [](const GradientContext& g) -> R {
         return {g.make(OpKind::Dropout, {g.dy.id(), g.in(1).id()}, g.attributes()), Tensor{}};
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             const Values& x = r.in(0, replica);
             const auto step = static_cast<uint64_t>(r.in(1, replica)[0]);
             const auto seed = static_cast<uint64_t>(r.attributes().b);
             const double ratio = r.attributes().a;
             const uint64_t threshold = dropoutThreshold(ratio);
             Values& out = r.out(replica);
             const auto base = static_cast<uint64_t>(replica) * out.size();
             for (std::size_t i = 0; i < out.size(); ++i)
               out[i] = dropoutKeeps(seed, step, base + i, threshold) ? x[i] / (1.0 - ratio) : 0.0;
           },
       .cost = [](const Graph& graph,
                  const OpNode& op) { return OpCost{.flops = 8.0 * elementsOf(graph, op.outputs[0])}; }});
  table.keepsHalves({OpKind::Where});
  table.float64({OpKind::Where, OpKind::CastToInt32, OpKind::CastToFloat32, OpKind::CastToFloat16,
                 OpKind::CastToFloat64});
}

}  // namespace tessera
