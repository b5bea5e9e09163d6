// The softmax family: row-wise ops along the last axis (Softmax,
// LogSoftmax, ArgMax) and the softmax cross-entropy loss with its gradient.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

using R = std::vector<Tensor>;
using Values = std::vector<double>;

// Softmax over rows of length c.
Values softmaxRows(const Values& x, std::size_t c) {
  Values out(x.size());
  for (std::size_t row = 0; row + c <= x.size() && c > 0; row += c) {
    double max = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < c; ++j) max = std::max(max, x[row + j]);
    double sum = 0.0;
    for (std::size_t j = 0; j < c; ++j) sum += std::exp(x[row + j] - max);
    for (std::size_t j = 0; j < c; ++j) out[row + j] = std::exp(x[row + j] - max) / sum;
  }
  return out;
}

std::vector<OutputSpec> rowShape(const OpChecker& c, OpAttributes& /*attributes*/) {
  c.arity(1);
  c.floating({0});
  c.minRank(0, 1);
  return c.same(0);
}

template <int kPerElement>
OpCost perOutputElement(const Graph& graph, const OpNode& op) {
  return {.flops = kPerElement * elementsOf(graph, op.outputs[0])};
}

// loss = -sum_n log softmax(logits)[n, label_n] (divided by N for Mean);
// its gradient is (softmax - onehot(label)) * dloss (divided by N for Mean).
// Operands (logits, labels), or (dloss, logits, labels) for the gradient.
void crossEntropyReference(ReferenceOp& r, int64_t replica) {
  const bool grad = r.op().kind == OpKind::SoftmaxCrossEntropyGrad;
  const std::size_t base = grad ? 1 : 0;
  const Values& logits = r.in(base, replica);
  const Values& labels = r.in(base + 1, replica);
  const auto rows = static_cast<std::size_t>(r.inShape(base)[0]);
  const auto classes = static_cast<std::size_t>(r.inShape(base)[1]);
  const Values p = softmaxRows(logits, classes);
  const double scale =
      r.attributes().reduction == ReductionType::Mean && rows > 0 ? 1.0 / static_cast<double>(rows) : 1.0;
  Values& out = r.out(replica);
  double loss = 0.0;
  if (grad) out = p;
  for (std::size_t n = 0; n < rows; ++n) {
    const double label = labels[n];
    if (label < 0 || label >= static_cast<double>(classes)) {
      r.fail(fmt::format("label {} of row {} is outside [0, {})", label, n, classes));
    }
    const std::size_t cell = n * classes + static_cast<std::size_t>(label);
    loss -= std::log(p[cell]);
    if (grad) out[cell] -= 1.0;
  }
  if (grad) {
    const double dloss = r.in(0, replica)[0];
    for (double& v : out) v *= dloss * scale;
  } else {
    out[0] = loss * scale;
  }
}

}  // namespace

void addSoftmaxOps(OpTable& table) {
  table.add(
      {.kind = OpKind::Softmax,
       .family = OpFamily::Softmax,
       .shape = rowShape,
       .gradient = [](const GradientContext& g) -> R {
         return {ops::mul(g.out(0), ops::sub(g.dy, ops::reduceSum(ops::mul(g.dy, g.out(0)), {-1}, true)))};
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             r.out(replica) = softmaxRows(r.in(0, replica), static_cast<std::size_t>(r.inShape(0).back()));
           },
       .cost = perOutputElement<5>});
  table.add({.kind = OpKind::LogSoftmax,
             .family = OpFamily::Softmax,
             .shape = rowShape,
             .gradient = [](const GradientContext& g) -> R {
               return {ops::sub(g.dy, ops::mul(ops::exp(g.out(0)), ops::reduceSum(g.dy, {-1}, true)))};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   Values& out = r.out(replica);
                   out = softmaxRows(r.in(0, replica), static_cast<std::size_t>(r.inShape(0).back()));
                   for (double& v : out) v = std::log(v);
                 },
             .cost = perOutputElement<5>});
  // The index of the largest element of each row (the first of equals);
  // int32, no gradient.
  table.add({.kind = OpKind::ArgMax,
             .family = OpFamily::Softmax,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(1);
               c.floating({0});
               c.minRank(0, 1);
               Shape out = c.shape(0);
               out.pop_back();
               return {{out, DType::Int32, {}}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const auto c = static_cast<std::size_t>(r.inShape(0).back());
                   const Values& x = r.in(0, replica);
                   Values& out = r.out(replica);
                   for (std::size_t row = 0; row < out.size(); ++row) {
                     std::size_t best = 0;
                     for (std::size_t j = 1; j < c; ++j)
                       if (x[row * c + j] > x[row * c + best]) best = j;
                     out[row] = static_cast<double>(best);
                   }
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.inputs[0])}; }});

  // Logits [N, C] float, labels [N] int32 -> scalar (`reduction` Sum or Mean).
  table.add(
      {.kind = OpKind::SoftmaxCrossEntropy,
       .family = OpFamily::Softmax,
       .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
         c.arity(2);
         const DType dtype = c.floating({0});
         c.dtype(1, DType::Int32);
         if (c.rank(0) != 2 || c.rank(1) != 1 || c.shape(1)[0] != c.shape(0)[0]) {
           c.fail(ErrorCode::ShapeMismatch, fmt::format("logits {} and labels {}: expected logits [N, C] and "
                                                        "labels [N]",
                                                        c.desc(0), c.desc(1)));
         }
         return {{Shape{}, dtype, {}}};
       },
       .gradient = [](const GradientContext& g) -> R {
         OpAttributes attributes;
         attributes.reduction = g.attributes().reduction;
         return {g.make(OpKind::SoftmaxCrossEntropyGrad, {g.dy.id(), g.in(0).id(), g.in(1).id()}, attributes),
                 Tensor{}};
       },
       .reference = crossEntropyReference,
       .cost = [](const Graph& graph,
                  const OpNode& op) { return OpCost{.flops = 5.0 * elementsOf(graph, op.inputs[0])}; }});
  // (dloss, logits, labels) -> dlogits; no gradient of its own.
  table.add(
      {.kind = OpKind::SoftmaxCrossEntropyGrad,
       .family = OpFamily::Softmax,
       .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
         c.arity(3);
         c.floating({0, 1});
         c.dtype(2, DType::Int32);
         if (c.rank(0) != 0 || c.rank(1) != 2 || c.rank(2) != 1 || c.shape(2)[0] != c.shape(1)[0]) {
           c.fail(ErrorCode::ShapeMismatch,
                  fmt::format("expected (dloss [], logits [N, C], labels [N]), found ({}, "
                              "{}, {})",
                              c.desc(0), c.desc(1), c.desc(2)));
         }
         return c.same(1);
       },
       .reference = crossEntropyReference,
       .cost = [](const Graph& graph,
                  const OpNode& op) { return OpCost{.flops = 5.0 * elementsOf(graph, op.inputs[1])}; }});
}

}  // namespace tessera
