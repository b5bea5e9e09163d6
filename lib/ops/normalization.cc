// The normalization family: batch normalisation in training mode, over
// x [N, C, ...] with statistics per channel C over the batch and the spatial
// axes (M = N x spatial values a channel).
//
// A composition gets no op (CONVENTIONS) unless a measured hot path pays for
// one, and this one did: composed of reductions and elementwise ops, the
// BatchNormalizations of ResNet-18, MobileNetV2 and EfficientNet-B0 were
// the largest part of a training step after the convolutions (every
// broadcast statistic, centred copy and quotient a pass over the
// activations, and as many again backward). As ops a channel is two passes
// forward (the statistics, then y) and two backward (the two sums, then dx):
//
//   BatchNormStats(x)                     -> [2, C]: mean, population variance
//   BatchNorm(x, stats, affine)           -> y = (x - mean) / sqrt(var + eps) * scale + bias
//   BatchNormGradStats(dy, x, stats)      -> [2, C]: sum(dy * xhat), sum(dy)
//   BatchNormGrad(dy, x, [6, C])          -> dx = scale / sqrt(var + eps)
//                                                 * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M)
//
// with xhat = (x - mean) / sqrt(var + eps), affine = [scale; bias] and the
// [6, C] operand the rows of stats, BatchNormGradStats and affine. The
// statistics are an operand of BatchNorm (the running statistics read them
// too) but must be BatchNormStats of its x: BatchNorm's gradient rule gives
// x's whole gradient, through the statistics, and none to the statistics;
// BatchNormStats has its own rule for what else reads them. The affine's
// gradient is BatchNormGradStats itself. Every sum and the per-element
// arithmetic are in double, each output rounded once.
#include <cmath>

#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

struct Extents {
  int64_t n = 0;         // batch
  int64_t channels = 0;  // C
  int64_t spatial = 1;   // values of one (sample, channel)
  int64_t perChannel() const { return n * spatial; }
};

Extents extentsOf(const Shape& x) {
  Extents e;
  e.n = x[0];
  e.channels = x[1];
  for (std::size_t i = 2; i < x.size(); ++i) e.spatial *= x[i];
  return e;
}

// x [N, C, ...] with at least one value a channel; `rows` x C operands at
// the given indices.
Extents checkX(const OpChecker& c, std::size_t xIndex) {
  if (c.rank(xIndex) < 2 || c.shape(xIndex)[1] < 1)
    c.fail(ErrorCode::InvalidOperand,
           fmt::format("x {} must be [N, C, ...] with a channel axis", c.desc(xIndex)));
  const Extents e = extentsOf(c.shape(xIndex));
  if (e.perChannel() < 1)
    c.fail(ErrorCode::InvalidOperand, fmt::format("x {} has no values a channel", c.desc(xIndex)));
  return e;
}

void checkRows(const OpChecker& c, std::size_t i, int64_t rows, const Extents& e, std::string_view what) {
  if (c.shape(i) != Shape{rows, e.channels})
    c.fail(ErrorCode::InvalidOperand,
           fmt::format("{} {} must be [{}, C] = [{}, {}]", what, c.desc(i), rows, rows, e.channels));
}

void checkEpsilon(const OpChecker& c, const OpAttributes& a) {
  if (!(a.a >= 0.0) || !std::isfinite(a.a))
    c.fail(ErrorCode::InvalidOperand,
           fmt::format("epsilon (attribute a) is {}; it must be finite and >= 0", a.a));
}

Extents extentsIn(const Graph& graph, const OpNode& op, std::size_t xIndex) {
  return extentsOf(graph.tensor(op.inputs[xIndex]).shape);
}

// The statistics of channel ch of x in double: two passes, the variance of
// the centred values.
void channelStats(const Extents& e, const double* x, int64_t ch, double& mean, double& variance) {
  double sum = 0.0;
  for (int64_t n = 0; n < e.n; ++n)
    for (int64_t s = 0; s < e.spatial; ++s) sum += x[(n * e.channels + ch) * e.spatial + s];
  const auto m = static_cast<double>(e.perChannel());
  mean = sum / m;
  double squares = 0.0;
  for (int64_t n = 0; n < e.n; ++n)
    for (int64_t s = 0; s < e.spatial; ++s) {
      const double d = x[(n * e.channels + ch) * e.spatial + s] - mean;
      squares += d * d;
    }
  variance = squares / m;
}

// Channel shape [1, C, 1, ...] of x.
Shape channelShape(const Shape& x) {
  Shape s(x.size(), 1);
  s[1] = x[1];
  return s;
}

Tensor row(const Tensor& t, int64_t r, const Shape& channel) {
  return ops::reshape(ops::slice(t, {r, 0}, {r + 1, t.shape()[1]}), channel);
}

// What reads the statistics other than BatchNorm (the running statistics):
// dx = dmean / M + dvar * 2 (x - mean) / M.
std::vector<Tensor> statsGradient(const GradientContext& g) {
  const Tensor x = g.in(0);
  const Shape channel = channelShape(x.shape());
  const auto m = static_cast<double>(extentsOf(x.shape()).perChannel());
  const Tensor dmean = row(g.dy, 0, channel);
  const Tensor dvar = row(g.dy, 1, channel);
  const Tensor centred = ops::sub(x, row(g.out(0), 0, channel));
  return {ops::add(ops::mul(centred, scaled(dvar, 2.0 / m)), scaled(dmean, 1.0 / m))};
}

std::vector<Tensor> batchNormGradient(const GradientContext& g) {
  OpAttributes a;
  a.a = g.attributes().a;
  std::vector<Tensor> grads(3);
  const Tensor sums = g.make(OpKind::BatchNormGradStats, {g.dy.id(), g.in(0).id(), g.in(1).id()}, a);
  if (g.isWanted(0)) {
    const Tensor packed = ops::concat({g.in(1), sums, g.in(2)}, 0);
    grads[0] = g.make(OpKind::BatchNormGrad, {g.dy.id(), g.in(0).id(), packed.id()}, a);
  }
  if (g.isWanted(2)) grads[2] = sums;
  return grads;
}

double flopsOf(const Graph& graph, const OpNode& op, std::size_t xIndex, double perElement) {
  return perElement * elementsOf(graph, op.inputs[xIndex]);
}

}  // namespace

void addNormalizationOps(OpTable& table) {
  table.add({.kind = OpKind::BatchNormStats,
             .family = OpFamily::Normalization,
             .shape = [](const OpChecker& c, OpAttributes&) -> std::vector<OutputSpec> {
               c.arity(1);
               const DType dtype = c.floating({0});
               const Extents e = checkX(c, 0);
               return {{Shape{2, e.channels}, dtype, {}}};
             },
             .gradient = statsGradient,
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Extents e = extentsIn(r.graph(), r.op(), 0);
                   std::vector<double>& out = r.out(replica);
                   for (int64_t ch = 0; ch < e.channels; ++ch)
                     channelStats(e, r.in(0, replica).data(), ch, out[static_cast<std::size_t>(ch)],
                                  out[static_cast<std::size_t>(e.channels + ch)]);
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = flopsOf(graph, op, 0, 4.0)}; }});
  table.add({.kind = OpKind::BatchNorm,
             .family = OpFamily::Normalization,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(3);
               c.floating({0, 1, 2});
               const Extents e = checkX(c, 0);
               checkRows(c, 1, 2, e, "the statistics");
               checkRows(c, 2, 2, e, "the affine (scale, bias)");
               checkEpsilon(c, attributes);
               return c.same(0);
             },
             .gradient = batchNormGradient,
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Extents e = extentsIn(r.graph(), r.op(), 0);
                   const std::vector<double>& x = r.in(0, replica);
                   const std::vector<double>& stats = r.in(1, replica);
                   const std::vector<double>& affine = r.in(2, replica);
                   std::vector<double>& out = r.out(replica);
                   const auto C = static_cast<std::size_t>(e.channels);
                   for (std::size_t i = 0; i < x.size(); ++i) {
                     const std::size_t ch = (i / static_cast<std::size_t>(e.spatial)) % C;
                     out[i] = (x[i] - stats[ch]) / std::sqrt(stats[C + ch] + r.attributes().a) * affine[ch] +
                              affine[C + ch];
                   }
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = flopsOf(graph, op, 0, 3.0)}; }});
  table.add({.kind = OpKind::BatchNormGradStats,
             .family = OpFamily::Normalization,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(3);
               const DType dtype = c.floating({0, 1, 2});
               const Extents e = checkX(c, 1);
               c.sameShape(0, 1);
               checkRows(c, 2, 2, e, "the statistics");
               checkEpsilon(c, attributes);
               return {{Shape{2, e.channels}, dtype, {}}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Extents e = extentsIn(r.graph(), r.op(), 1);
                   const std::vector<double>& dy = r.in(0, replica);
                   const std::vector<double>& x = r.in(1, replica);
                   const std::vector<double>& stats = r.in(2, replica);
                   std::vector<double>& out = r.out(replica);
                   const auto C = static_cast<std::size_t>(e.channels);
                   std::fill(out.begin(), out.end(), 0.0);
                   for (std::size_t i = 0; i < x.size(); ++i) {
                     const std::size_t ch = (i / static_cast<std::size_t>(e.spatial)) % C;
                     const double invStd = 1.0 / std::sqrt(stats[C + ch] + r.attributes().a);
                     out[ch] += dy[i] * (x[i] - stats[ch]) * invStd;
                     out[C + ch] += dy[i];
                   }
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = flopsOf(graph, op, 1, 4.0)}; }});
  table.add({.kind = OpKind::BatchNormGrad,
             .family = OpFamily::Normalization,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(3);
               c.floating({0, 1, 2});
               const Extents e = checkX(c, 1);
               c.sameShape(0, 1);
               checkRows(c, 2, 6, e, "the statistics, sums and affine");
               checkEpsilon(c, attributes);
               return c.same(1);
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Extents e = extentsIn(r.graph(), r.op(), 1);
                   const std::vector<double>& dy = r.in(0, replica);
                   const std::vector<double>& x = r.in(1, replica);
                   const std::vector<double>& p = r.in(2, replica);
                   std::vector<double>& out = r.out(replica);
                   const auto C = static_cast<std::size_t>(e.channels);
                   const auto m = static_cast<double>(e.perChannel());
                   for (std::size_t i = 0; i < x.size(); ++i) {
                     const std::size_t ch = (i / static_cast<std::size_t>(e.spatial)) % C;
                     const double invStd = 1.0 / std::sqrt(p[C + ch] + r.attributes().a);
                     const double xhat = (x[i] - p[ch]) * invStd;
                     out[i] = p[4 * C + ch] * invStd * (dy[i] - p[3 * C + ch] / m - xhat * p[2 * C + ch] / m);
                   }
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = flopsOf(graph, op, 1, 6.0)}; }});
}

}  // namespace tessera
