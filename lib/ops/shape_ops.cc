// The shape family: ops that move elements without arithmetic: Reshape,
// Transpose, Slice, SlicePad (Slice's gradient: the slice placed into
// zeros), Concat and BroadcastTo.
#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "op_def.hpp"

namespace tessera {
namespace {

using R = std::vector<Tensor>;
using Values = std::vector<double>;

OpCost perOutputElement(const Graph& graph, const OpNode& op) {
  return {.flops = elementsOf(graph, op.outputs[0])};
}

// Slice and SlicePad: [starts, ends) of the full shape (Slice's input,
// SlicePad's `shape`).
std::vector<OutputSpec> sliceShape(const OpChecker& c, OpAttributes& attributes) {
  c.arity(1);
  const bool isSlice = c.kind() == OpKind::Slice;
  const Shape full = isSlice ? c.shape(0) : attributes.shape;
  const std::size_t r = full.size();
  if (attributes.starts.size() != r || attributes.ends.size() != r) {
    c.fail(ErrorCode::InvalidAxis,
           fmt::format("starts [{}] and ends [{}] need one entry per axis of {}",
                       fmt::join(attributes.starts, ", "), fmt::join(attributes.ends, ", "), shapeStr(full)));
  }
  Shape part(r);
  for (std::size_t i = 0; i < r; ++i) {
    const int64_t s = attributes.starts[i];
    const int64_t e = attributes.ends[i];
    if (s < 0 || s > e || e > full[i]) {
      c.fail(ErrorCode::InvalidAxis,
             fmt::format("axis {}: [{}, {}) is not within [0, {}] of {}", i, s, e, full[i], shapeStr(full)));
    }
    part[i] = e - s;
  }
  if (isSlice) return {{part, c.in(0).dtype, {}}};
  if (c.shape(0) != part) {
    c.fail(ErrorCode::ShapeMismatch,
           fmt::format("input {} must have the slice's shape {}", c.desc(0), shapeStr(part)));
  }
  return {{full, c.in(0).dtype, {}}};
}

// The slice's element j sits at j + starts in the full tensor.
void sliceReference(ReferenceOp& r, int64_t replica) {
  const bool pad = r.op().kind == OpKind::SlicePad;
  const Shape& full = pad ? r.outShape() : r.inShape(0);
  const Shape& part = pad ? r.inShape(0) : r.outShape();
  const std::vector<std::size_t> fullStrides = reference::stridesOf(full);
  const Values& x = r.in(0, replica);
  Values& out = r.out(replica);
  for (std::size_t j = 0; j < reference::count(part); ++j) {
    const std::vector<int64_t> index = reference::unravel(j, part);
    std::size_t f = 0;
    for (std::size_t d = 0; d < index.size(); ++d)
      f += static_cast<std::size_t>(index[d] + r.attributes().starts[d]) * fullStrides[d];
    if (pad) {
      out[f] = x[j];
    } else {
      out[j] = x[f];
    }
  }
}

}  // namespace

void addShapeOps(OpTable& table) {
  table.add({.kind = OpKind::Reshape,
             .family = OpFamily::ShapeOp,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(1);
               Shape target = attributes.shape;
               int64_t known = 1;
               std::optional<std::size_t> inferred;
               for (std::size_t i = 0; i < target.size(); ++i) {
                 if (target[i] == -1 && !inferred) {
                   inferred = i;
                 } else if (target[i] < 0) {
                   c.fail(ErrorCode::ShapeMismatch,
                          fmt::format("target shape {} may hold one -1 and otherwise dimensions "
                                      ">= 0",
                                      shapeStr(target)));
                 } else {
                   known *= target[i];
                 }
               }
               const int64_t n = numElements(c.shape(0));
               if (inferred && known > 0 && n % known == 0) target[*inferred] = n / known;
               if (std::any_of(target.begin(), target.end(), [](int64_t d) { return d < 0; }) ||
                   numElements(target) != n) {
                 c.fail(ErrorCode::ShapeMismatch, fmt::format("cannot reshape {} ({} elements) to {}",
                                                              c.desc(0), n, shapeStr(attributes.shape)));
               }
               attributes.shape = target;
               return {{target, c.in(0).dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> R { return {ops::reshape(g.dy, g.in(0).shape())}; },
             .reference = [](ReferenceOp& r, int64_t replica) { r.out(replica) = r.in(0, replica); },
             // A view: no arithmetic.
             .cost = [](const Graph&, const OpNode&) { return OpCost{}; }});

  table.add({.kind = OpKind::Transpose,
             .family = OpFamily::ShapeOp,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(1);
               const int64_t r = c.rank(0);
               if (attributes.axes.empty()) {
                 for (int64_t i = r - 1; i >= 0; --i) attributes.axes.push_back(i);
               }
               std::vector<int64_t> perm;
               for (int64_t a : attributes.axes) perm.push_back(c.axis(a, r));
               std::vector<int64_t> sorted = perm;
               std::sort(sorted.begin(), sorted.end());
               bool isPermutation = static_cast<int64_t>(perm.size()) == r;
               for (int64_t i = 0; isPermutation && i < r; ++i)
                 isPermutation = sorted[static_cast<std::size_t>(i)] == i;
               if (!isPermutation) {
                 c.fail(ErrorCode::InvalidAxis, fmt::format("[{}] is not a permutation of the {} axes of {}",
                                                            fmt::join(attributes.axes, ", "), r, c.desc(0)));
               }
               attributes.axes = perm;
               Shape out;
               for (int64_t a : perm) out.push_back(c.shape(0)[static_cast<std::size_t>(a)]);
               return {{out, c.in(0).dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> R {
               const std::vector<int64_t>& axes = g.attributes().axes;
               std::vector<int64_t> inverse(axes.size());
               for (std::size_t i = 0; i < axes.size(); ++i)
                 inverse[static_cast<std::size_t>(axes[i])] = static_cast<int64_t>(i);
               return {ops::transpose(g.dy, inverse)};
             },
             // Output axis k is input axis perm[k].
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const std::vector<std::size_t> inStrides = reference::stridesOf(r.inShape(0));
                   const Values& x = r.in(0, replica);
                   Values& out = r.out(replica);
                   for (std::size_t i = 0; i < out.size(); ++i) {
                     const std::vector<int64_t> index = reference::unravel(i, r.outShape());
                     std::size_t src = 0;
                     for (std::size_t k = 0; k < index.size(); ++k)
                       src += static_cast<std::size_t>(index[k]) *
                              inStrides[static_cast<std::size_t>(r.attributes().axes[k])];
                     out[i] = x[src];
                   }
                 },
             .cost = perOutputElement});

  table.add({.kind = OpKind::Slice,
             .family = OpFamily::ShapeOp,
             .shape = sliceShape,
             .gradient = [](const GradientContext& g) -> R {
               OpAttributes attributes;
               attributes.starts = g.attributes().starts;
               attributes.ends = g.attributes().ends;
               attributes.shape = g.in(0).shape();
               return {g.make(OpKind::SlicePad, {g.dy.id()}, attributes)};
             },
             .reference = sliceReference,
             .cost = perOutputElement});
  table.add({.kind = OpKind::SlicePad,
             .family = OpFamily::ShapeOp,
             .shape = sliceShape,
             .gradient = [](const GradientContext& g) -> R {
               return {ops::slice(g.dy, g.attributes().starts, g.attributes().ends)};
             },
             .reference = sliceReference,
             .cost = perOutputElement});

  table.add(
      {.kind = OpKind::Concat,
       .family = OpFamily::ShapeOp,
       .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
         if (c.inputCount() == 0) c.fail(ErrorCode::InvalidOperand, "needs at least one input");
         const int64_t axis = c.axis(attributes.axis, c.rank(0));
         attributes.axis = axis;
         Shape out = c.shape(0);
         for (std::size_t i = 1; i < c.inputCount(); ++i) {
           if (isFloating(c.in(i).dtype) && isFloating(c.in(0).dtype)) c.sameDType(0, i);
           bool fits = c.rank(i) == c.rank(0) && c.in(i).dtype == c.in(0).dtype;
           for (std::size_t d = 0; fits && d < out.size(); ++d)
             fits = static_cast<int64_t>(d) == axis || c.shape(i)[d] == out[d];
           if (!fits) {
             c.fail(ErrorCode::ShapeMismatch,
                    fmt::format("input {} {} does not match input 0 {}: all inputs need the same dtype, rank "
                                "and dimensions except axis {}",
                                i, c.desc(i), c.desc(0), axis));
           }
           out[static_cast<std::size_t>(axis)] += c.shape(i)[static_cast<std::size_t>(axis)];
         }
         return {{out, c.in(0).dtype, {}}};
       },
       .gradient = [](const GradientContext& g) -> R {
         const auto axis = static_cast<std::size_t>(g.attributes().axis);
         std::vector<int64_t> starts(g.dy.shape().size(), 0);
         std::vector<int64_t> ends = g.dy.shape();
         R out;
         for (std::size_t i = 0; i < g.op.inputs.size(); ++i) {
           ends[axis] = starts[axis] + g.in(i).shape()[axis];
           out.push_back(ops::slice(g.dy, starts, ends));
           starts[axis] = ends[axis];
         }
         return out;
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             const auto axis = static_cast<std::size_t>(r.attributes().axis);
             const std::vector<std::size_t> outStrides = reference::stridesOf(r.outShape());
             Values& out = r.out(replica);
             int64_t offset = 0;
             for (std::size_t t = 0; t < r.op().inputs.size(); ++t) {
               const Values& x = r.in(t, replica);
               for (std::size_t j = 0; j < x.size(); ++j) {
                 std::vector<int64_t> index = reference::unravel(j, r.inShape(t));
                 index[axis] += offset;
                 std::size_t f = 0;
                 for (std::size_t d = 0; d < index.size(); ++d)
                   f += static_cast<std::size_t>(index[d]) * outStrides[d];
                 out[f] = x[j];
               }
               offset += r.inShape(t)[axis];
             }
           },
       .cost = perOutputElement});

  table.add({.kind = OpKind::BroadcastTo,
             .family = OpFamily::ShapeOp,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(1);
               const DType dtype = c.floating({0});
               if (!broadcastsTo(c.shape(0), attributes.shape)) {
                 c.fail(ErrorCode::ShapeMismatch,
                        fmt::format("{} does not broadcast to {}", c.desc(0), shapeStr(attributes.shape)));
               }
               numElements(attributes.shape);
               return {{attributes.shape, dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> R { return {reduceTo(g.dy, g.in(0).shape())}; },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& x = r.in(0, replica);
                   Values& out = r.out(replica);
                   for (std::size_t i = 0; i < out.size(); ++i)
                     out[i] = x[reference::broadcastSource(i, r.outShape(), r.inShape(0))];
                 },
             .cost = perOutputElement});
  table.keepsHalves({OpKind::Reshape, OpKind::Transpose, OpKind::Slice, OpKind::SlicePad, OpKind::Concat, OpKind::BroadcastTo});
  table.float64({OpKind::Reshape, OpKind::Transpose, OpKind::Slice, OpKind::Concat, OpKind::BroadcastTo});
}

}  // namespace tessera
