// The gather family: Gather picks rows of a table by index (an embedding
// lookup): data [V, D...], indices int32 [I...] -> [I..., D...]; an index in
// [-V, V) (negative counts from the end). GatherGrad is its gradient, a
// scatter-add: (dy [I..., D...], indices) -> zeros of `shape` [V, D...] with
// each dy row added into the row its index names, in index order.
#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

using Values = std::vector<double>;

// The index as a row of a table of `rows`; the reference refuses others.
std::size_t rowOf(const ReferenceOp& r, double index, std::size_t i, int64_t rows) {
  if (!(index >= static_cast<double>(-rows) && index < static_cast<double>(rows))) {
    r.fail(fmt::format("index {} (element {}) is outside [{}, {})", index, i, -rows, rows));
  }
  return static_cast<std::size_t>(index < 0 ? index + static_cast<double>(rows) : index);
}

// Elements of one row: the product of the table's dimensions after the first.
std::size_t rowElements(const Shape& table) {
  return static_cast<std::size_t>(numElements(Shape(table.begin() + 1, table.end())));
}

}  // namespace

void addGatherOps(OpTable& table) {
  table.add({.kind = OpKind::Gather,
             .family = OpFamily::Gather,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0});
               c.dtype(1, DType::Int32);
               c.minRank(0, 1);
               Shape out = c.shape(1);
               out.insert(out.end(), c.shape(0).begin() + 1, c.shape(0).end());
               return {{out, dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               OpAttributes attributes;
               attributes.shape = g.in(0).shape();
               return {g.make(OpKind::GatherGrad, {g.dy.id(), g.in(1).id()}, attributes), Tensor{}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& data = r.in(0, replica);
                   const Values& indices = r.in(1, replica);
                   Values& out = r.out(replica);
                   const std::size_t d = rowElements(r.inShape(0));
                   for (std::size_t i = 0; i < indices.size(); ++i) {
                     const std::size_t row = rowOf(r, indices[i], i, r.inShape(0)[0]);
                     for (std::size_t k = 0; k < d; ++k) out[i * d + k] = data[row * d + k];
                   }
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.outputs[0])}; }});
  table.add({.kind = OpKind::GatherGrad,
             .family = OpFamily::Gather,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0});
               c.dtype(1, DType::Int32);
               Shape expected = c.shape(1);
               if (!attributes.shape.empty())
                 expected.insert(expected.end(), attributes.shape.begin() + 1, attributes.shape.end());
               if (attributes.shape.empty() || c.shape(0) != expected) {
                 c.fail(
                     ErrorCode::ShapeMismatch,
                     fmt::format("dy {} must be the gather of indices {} from a table of `shape` {}, i.e. {}",
                                 c.desc(0), c.desc(1), shapeStr(attributes.shape), shapeStr(expected)));
               }
               numElements(attributes.shape);
               return {{attributes.shape, dtype, {}}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Values& dy = r.in(0, replica);
                   const Values& indices = r.in(1, replica);
                   Values& out = r.out(replica);
                   const std::size_t d = rowElements(r.outShape());
                   for (std::size_t i = 0; i < indices.size(); ++i) {
                     const std::size_t row = rowOf(r, indices[i], i, r.outShape()[0]);
                     for (std::size_t k = 0; k < d; ++k) out[row * d + k] += dy[i * d + k];
                   }
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.inputs[0])}; }});
  table.keepsHalves({OpKind::Gather});
}

}  // namespace tessera
