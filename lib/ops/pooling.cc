// The pooling family over NC[D]HW tensors with 1 to 3 spatial axes, each
// channel of each sample on its own: MaxPool (the maximum of each window;
// pads never win) and AveragePool (the mean over the window's taps inside
// the input, or inside the input and its pads with countIncludePad), with
// their gradients MaxPoolGrad (each window's dy to its first maximum in scan
// order, the window's taps row-major) and AveragePoolGrad (each window's dy
// spread evenly over the taps its mean counted).
//
// Global pools are not ops of their own: ops::globalAveragePool is a
// ReduceMean over the spatial axes, ops::globalMaxPool a MaxPool whose
// window is the whole input.
#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "op_def.hpp"
#include "window.hpp"

namespace tessera {
namespace {

using Values = std::vector<double>;

// The window's attributes normalised and the pooled extents of input i's
// spatial axes.
Shape pooled(const OpChecker& c, OpAttributes& a, const Shape& x) {
  const int64_t r = static_cast<int64_t>(x.size()) - 2;
  if (static_cast<int64_t>(a.kernel.size()) != r) {
    c.fail(ErrorCode::InvalidOperand,
           fmt::format("`kernel` {} must have one extent per spatial axis of {} ({} values)", a.kernel,
                       shapeStr(x), r));
  }
  normaliseWindow(c, a, r, a.kernel, WindowUse::Pool);
  Shape out{x[0], x[1]};
  const Shape spatial = windowOutput(c, spatialOf(x), a.kernel, a, a.ceilMode);
  out.insert(out.end(), spatial.begin(), spatial.end());
  return out;
}

OpAttributes poolAttributes(const OpAttributes& a) {
  OpAttributes out;
  out.kernel = a.kernel;
  out.strides = a.strides;
  out.pads = a.pads;
  out.dilations = a.dilations;
  out.ceilMode = a.ceilMode;
  out.countIncludePad = a.countIncludePad;
  return out;
}

// Planes (sample, channel) of x and the window geometry.
struct PoolDims {
  std::size_t planes = 0;
  WindowGeometry window;
};

PoolDims poolDims(const Shape& x, const Shape& y, const OpAttributes& a) {
  return {static_cast<std::size_t>(x[0] * x[1]), windowOf(spatialOf(x), a.kernel, spatialOf(y), a)};
}

// The input position of window p's first maximum, or -1 when it has no tap
// inside the input.
int64_t argmaxOf(const std::vector<int64_t>& taps, const double* x, std::size_t p, std::size_t positions,
                 std::size_t kernelTaps) {
  int64_t best = -1;
  for (std::size_t k = 0; k < kernelTaps; ++k) {
    const int64_t at = taps[k * positions + p];
    if (at >= 0 && (best < 0 || x[at] > x[best])) best = at;
  }
  return best;
}

double poolCost(const Graph& graph, const OpNode& op, TensorId pooledTensor) {
  return elementsOf(graph, pooledTensor) * static_cast<double>(numElements(op.attributes.kernel));
}

}  // namespace

void addPoolingOps(OpTable& table) {
  table.add(
      {.kind = OpKind::MaxPool,
       .family = OpFamily::Pooling,
       .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
         c.arity(1);
         const DType dtype = c.floating({0});
         spatialRank(c, 0);
         return {{pooled(c, a, c.shape(0)), dtype, {}}};
       },
       .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
         return {g.make(OpKind::MaxPoolGrad, {g.dy.id(), g.in(0).id()}, poolAttributes(g.attributes()))};
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             const PoolDims d = poolDims(r.inShape(0), r.outShape(), r.attributes());
             const std::vector<int64_t> taps = windowTaps(d.window);
             const auto in = static_cast<std::size_t>(d.window.inPositions());
             const auto out = static_cast<std::size_t>(d.window.outPositions());
             const auto kernelTaps = static_cast<std::size_t>(d.window.taps());
             const Values& x = r.in(0, replica);
             Values& y = r.out(replica);
             for (std::size_t plane = 0; plane < d.planes; ++plane) {
               for (std::size_t p = 0; p < out; ++p) {
                 const int64_t at = argmaxOf(taps, x.data() + plane * in, p, out, kernelTaps);
                 y[plane * out + p] = at < 0 ? -std::numeric_limits<double>::infinity()
                                             : x[plane * in + static_cast<std::size_t>(at)];
               }
             }
           },
       .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
         return {.flops = poolCost(graph, op, op.outputs[0])};
       }});

  table.add({.kind = OpKind::MaxPoolGrad,
             .family = OpFamily::Pooling,
             .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
               c.arity(2);
               c.floating({0, 1});
               spatialRank(c, 1);
               const Shape expected = pooled(c, a, c.shape(1));
               if (c.shape(0) != expected) {
                 c.fail(ErrorCode::ShapeMismatch, fmt::format("dy {} must be the MaxPool of x {}: {}",
                                                              c.desc(0), c.desc(1), shapeStr(expected)));
               }
               return c.same(1);
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const PoolDims d = poolDims(r.inShape(1), r.inShape(0), r.attributes());
                   const std::vector<int64_t> taps = windowTaps(d.window);
                   const auto in = static_cast<std::size_t>(d.window.inPositions());
                   const auto out = static_cast<std::size_t>(d.window.outPositions());
                   const auto kernelTaps = static_cast<std::size_t>(d.window.taps());
                   const Values& dy = r.in(0, replica);
                   const Values& x = r.in(1, replica);
                   Values& dx = r.out(replica);
                   std::fill(dx.begin(), dx.end(), 0.0);
                   for (std::size_t plane = 0; plane < d.planes; ++plane) {
                     for (std::size_t p = 0; p < out; ++p) {
                       const int64_t at = argmaxOf(taps, x.data() + plane * in, p, out, kernelTaps);
                       if (at >= 0) dx[plane * in + static_cast<std::size_t>(at)] += dy[plane * out + p];
                     }
                   }
                 },
             .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
               return {.flops = poolCost(graph, op, op.inputs[0])};
             }});

  table.add({.kind = OpKind::AveragePool,
             .family = OpFamily::Pooling,
             .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
               c.arity(1);
               const DType dtype = c.floating({0});
               spatialRank(c, 0);
               return {{pooled(c, a, c.shape(0)), dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               OpAttributes a = poolAttributes(g.attributes());
               a.shape = g.in(0).shape();
               return {g.make(OpKind::AveragePoolGrad, {g.dy.id()}, a)};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const PoolDims d = poolDims(r.inShape(0), r.outShape(), r.attributes());
                   const std::vector<int64_t> taps = windowTaps(d.window);
                   const std::vector<int64_t> divisors =
                       windowDivisors(d.window, r.attributes().countIncludePad);
                   const auto in = static_cast<std::size_t>(d.window.inPositions());
                   const auto out = static_cast<std::size_t>(d.window.outPositions());
                   const auto kernelTaps = static_cast<std::size_t>(d.window.taps());
                   const Values& x = r.in(0, replica);
                   Values& y = r.out(replica);
                   for (std::size_t plane = 0; plane < d.planes; ++plane) {
                     for (std::size_t p = 0; p < out; ++p) {
                       double sum = 0.0;
                       for (std::size_t k = 0; k < kernelTaps; ++k) {
                         const int64_t at = taps[k * out + p];
                         if (at >= 0) sum += x[plane * in + static_cast<std::size_t>(at)];
                       }
                       y[plane * out + p] = sum / static_cast<double>(std::max<int64_t>(divisors[p], 1));
                     }
                   }
                 },
             .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
               return {.flops = poolCost(graph, op, op.outputs[0])};
             }});

  table.add(
      {.kind = OpKind::AveragePoolGrad,
       .family = OpFamily::Pooling,
       .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
         c.arity(1);
         const DType dtype = c.floating({0});
         spatialRank(c, 0);
         if (a.shape.size() != c.shape(0).size()) {
           c.fail(ErrorCode::InvalidOperand,
                  fmt::format("`shape` {} must be the pooled input's shape, of dy {}'s rank", a.shape,
                              c.desc(0)));
         }
         numElements(a.shape);
         const Shape expected = pooled(c, a, a.shape);
         if (c.shape(0) != expected) {
           c.fail(ErrorCode::ShapeMismatch, fmt::format("dy {} must be the AveragePool of `shape` {}: {}",
                                                        c.desc(0), a.shape, shapeStr(expected)));
         }
         return {{a.shape, dtype, {}}};
       },
       // Linear in dy: its gradient is the pool itself.
       .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
         return {g.make(OpKind::AveragePool, {g.dy.id()}, poolAttributes(g.attributes()))};
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             const PoolDims d = poolDims(r.outShape(), r.inShape(0), r.attributes());
             const std::vector<int64_t> taps = windowTaps(d.window);
             const std::vector<int64_t> divisors = windowDivisors(d.window, r.attributes().countIncludePad);
             const auto in = static_cast<std::size_t>(d.window.inPositions());
             const auto out = static_cast<std::size_t>(d.window.outPositions());
             const auto kernelTaps = static_cast<std::size_t>(d.window.taps());
             const Values& dy = r.in(0, replica);
             Values& dx = r.out(replica);
             std::fill(dx.begin(), dx.end(), 0.0);
             for (std::size_t plane = 0; plane < d.planes; ++plane) {
               for (std::size_t p = 0; p < out; ++p) {
                 const double share =
                     dy[plane * out + p] / static_cast<double>(std::max<int64_t>(divisors[p], 1));
                 for (std::size_t k = 0; k < kernelTaps; ++k) {
                   const int64_t at = taps[k * out + p];
                   if (at >= 0) dx[plane * in + static_cast<std::size_t>(at)] += share;
                 }
               }
             }
           },
       .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
         return {.flops = poolCost(graph, op, op.inputs[0])};
       }});
  table.keepsHalves({OpKind::MaxPool});
}

}  // namespace tessera
