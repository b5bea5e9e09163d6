// The reduction family: ReduceSum and ReduceMean over `axes` (all when empty,
// `keepDims`), and ReduceToShape, which sums a broadcast value back to
// `shape` (the gradient of broadcasting).
#include <algorithm>

#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

using Values = std::vector<double>;

// The input's shape with the reduced axes set to 1.
Shape keptShape(const Shape& in, const std::vector<int64_t>& axes) {
  Shape kept = in;
  for (std::size_t d = 0; d < kept.size(); ++d) {
    if (axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end())
      kept[d] = 1;
  }
  return kept;
}

Shape reducedShape(const Shape& in, const std::vector<int64_t>& axes, bool keepDims) {
  Shape out;
  for (std::size_t d = 0; d < in.size(); ++d) {
    const bool reduced =
        axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    if (!reduced) {
      out.push_back(in[d]);
    } else if (keepDims) {
      out.push_back(1);
    }
  }
  return out;
}

std::vector<OutputSpec> reduceShape(const OpChecker& c, OpAttributes& attributes) {
  c.arity(1);
  const DType dtype = c.floating({0});
  std::vector<int64_t> axes;
  for (int64_t a : attributes.axes) {
    const int64_t normal = c.axis(a, c.rank(0));
    if (std::find(axes.begin(), axes.end(), normal) != axes.end()) {
      c.fail(ErrorCode::InvalidAxis, fmt::format("axis {} of {} is listed twice", a, c.desc(0)));
    }
    axes.push_back(normal);
  }
  std::sort(axes.begin(), axes.end());
  attributes.axes = axes;
  return {{reducedShape(c.shape(0), axes, attributes.keepDims), dtype, {}}};
}

std::vector<Tensor> reduceGradient(const GradientContext& g) {
  const Shape xShape = g.in(0).shape();
  const Shape kept = keptShape(xShape, g.attributes().axes);
  Tensor spread = ops::broadcastTo(g.dy.shape() == kept ? g.dy : ops::reshape(g.dy, kept), xShape);
  if (g.op.kind == OpKind::ReduceMean) {
    const int64_t outElements = numElements(kept);
    if (outElements > 0 && numElements(xShape) > 0) {
      spread = scaled(spread, static_cast<double>(outElements) / static_cast<double>(numElements(xShape)));
    }
  }
  return {spread};
}

// Input element i adds into the output element with the reduced axes set to
// 0 (keepDims and not keepDims share one flat layout).
void reduceReference(ReferenceOp& r, int64_t replica) {
  const Shape& xShape = r.inShape(0);
  const Shape kept = keptShape(xShape, r.attributes().axes);
  const Values& x = r.in(0, replica);
  Values& out = r.out(replica);
  for (std::size_t i = 0; i < x.size(); ++i) out[reference::broadcastSource(i, xShape, kept)] += x[i];
  if (r.op().kind == OpKind::ReduceMean && !out.empty() && !x.empty()) {
    const double per = static_cast<double>(x.size()) / static_cast<double>(out.size());
    for (double& v : out) v /= per;
  }
}

OpCost perInputElement(const Graph& graph, const OpNode& op) {
  return {.flops = elementsOf(graph, op.inputs[0])};
}

}  // namespace

void addReductionOps(OpTable& table) {
  for (OpKind kind : {OpKind::ReduceSum, OpKind::ReduceMean}) {
    table.add({.kind = kind,
               .family = OpFamily::Reduction,
               .shape = reduceShape,
               .gradient = reduceGradient,
               .reference = reduceReference,
               .cost = perInputElement});
  }
  table.add({.kind = OpKind::ReduceToShape,
             .family = OpFamily::Reduction,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(1);
               const DType dtype = c.floating({0});
               if (!broadcastsTo(attributes.shape, c.shape(0))) {
                 c.fail(ErrorCode::ShapeMismatch,
                        fmt::format("{} is not a broadcast of {}", c.desc(0), shapeStr(attributes.shape)));
               }
               numElements(attributes.shape);
               return {{attributes.shape, dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               return {ops::broadcastTo(g.dy, g.in(0).shape())};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& x = r.in(0, replica);
                   Values& out = r.out(replica);
                   for (std::size_t i = 0; i < x.size(); ++i)
                     out[reference::broadcastSource(i, r.inShape(0), r.outShape())] += x[i];
                 },
             .cost = perInputElement});
}

}  // namespace tessera
