// The gather family: Gather picks slices of a table by index along `axis`
// (ONNX Gather; on axis 0 an embedding lookup): data [A..., V, D...] with
// `axis` = rank(A), indices int32 [I...] -> [A..., I..., D...]; an index in
// [-V, V) (negative counts from the end). GatherGrad is its gradient, a
// scatter-add: (dy [A..., I..., D...], indices) -> zeros of `shape`
// [A..., V, D...] with each dy slice added into the slice its index names,
// in index order.
//
// GatherElements and ScatterElements (ONNX's, torch.gather and scatter) index
// single elements: indices int32 of the data's rank, each extent at most the
// data's off `axis`; index element i names the data element with i's
// coordinates but the index on `axis`. GatherElements reads those elements
// (-> the indices' shape); ScatterElements (data, indices, updates of the
// indices' shape) writes (`a` 0) or adds (`a` 1) each update there, in index
// order, into a copy of the data. GatherElements' gradient is a
// ScatterElements add of dy into zeros; ScatterElements' gives the data dy
// with the written positions zeroed (a ScatterElements of zeros into dy; for
// an add, dy itself) and the updates the GatherElements of dy.
#include <fmt/format.h>

#include "gather.hpp"
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

// A table [A..., V, D...] seen along `axis`: `outer` blocks (the product of
// A) of `rows` (V) slices of `inner` elements (the product of D).
struct TableView {
  std::size_t outer;
  int64_t rows;
  std::size_t inner;
};

TableView viewOf(const Shape& table, int64_t axis) {
  const auto a = static_cast<std::ptrdiff_t>(axis);
  return {static_cast<std::size_t>(numElements(Shape(table.begin(), table.begin() + a))), table[static_cast<std::size_t>(axis)],
          static_cast<std::size_t>(numElements(Shape(table.begin() + a + 1, table.end())))};
}

// Copies (or, kScatter, adds) between the table and the gathered values:
// gathered[o, i, k] and table[o, index i, k].
template <bool kScatter>
void gatherReference(const ReferenceOp& r, const TableView& t, const Values& indices, const Values& from,
                     Values& to) {
  const std::size_t n = indices.size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t row = rowOf(r, indices[i], i, t.rows);
    for (std::size_t o = 0; o < t.outer; ++o) {
      const std::size_t gathered = (o * n + i) * t.inner;
      const std::size_t sliced = (o * static_cast<std::size_t>(t.rows) + row) * t.inner;
      for (std::size_t k = 0; k < t.inner; ++k) {
        if constexpr (kScatter)
          to[sliced + k] += from[gathered + k];
        else
          to[gathered + k] = from[sliced + k];
      }
    }
  }
}

// The gathered shape: the table's with its `axis` replaced by the indices' shape.
Shape gatheredShape(const Shape& table, const Shape& indices, int64_t axis) {
  const auto a = static_cast<std::ptrdiff_t>(axis);
  Shape out(table.begin(), table.begin() + a);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), table.begin() + a + 1, table.end());
  return out;
}

// Checks the indices (operand `k`) against the data (operand 0) of an
// element-wise gather or scatter and normalises the axis.
void checkElementIndices(const OpChecker& c, std::size_t k, OpAttributes& attributes) {
  c.dtype(k, DType::Int32);
  c.minRank(0, 1);
  if (c.rank(k) != c.rank(0))
    c.fail(ErrorCode::ShapeMismatch,
           fmt::format("indices {} must have the rank of data {}", c.desc(k), c.desc(0)));
  attributes.axis = c.axis(attributes.axis, c.rank(0));
  for (std::size_t d = 0; d < c.shape(0).size(); ++d) {
    if (static_cast<int64_t>(d) != attributes.axis && c.shape(k)[d] > c.shape(0)[d])
      c.fail(ErrorCode::ShapeMismatch,
             fmt::format("indices {} are longer than data {} on axis {}; off axis {} each extent must be at "
                         "most the data's",
                         c.desc(k), c.desc(0), d, attributes.axis));
  }
}

Tensor zerosLike(const Tensor& t) {
  return ops::broadcastTo(ops::scalar(t.graph(), 0.0, t.dtype()), t.shape());
}

// GatherElements (kScatter false): out[i] = data[e(i)]; ScatterElements:
// out = data, then out[e(i)] = a * out[e(i)] + updates[i] in index order.
template <bool kScatter>
void elementsReference(ReferenceOp& r, int64_t replica) {
  const Values& data = r.in(0, replica);
  const Values& indices = r.in(1, replica);
  const ElementIndexing e = elementIndexing(r.inShape(0), r.inShape(1), r.attributes().axis);
  Values& out = r.out(replica);
  if constexpr (kScatter) out = data;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto at = static_cast<std::size_t>(e.bases[i]) +
                    rowOf(r, indices[i], i, e.rows) * static_cast<std::size_t>(e.stride);
    if constexpr (kScatter)
      out[at] = r.attributes().a * out[at] + r.in(2, replica)[i];
    else
      out[i] = data[at];
  }
}

}  // namespace

void addGatherOps(OpTable& table) {
  table.add({.kind = OpKind::Gather,
             .family = OpFamily::Gather,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0});
               c.dtype(1, DType::Int32);
               c.minRank(0, 1);
               attributes.axis = c.axis(attributes.axis, c.rank(0));
               return {{gatheredShape(c.shape(0), c.shape(1), attributes.axis), dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               OpAttributes attributes;
               attributes.shape = g.in(0).shape();
               attributes.axis = g.attributes().axis;
               return {g.make(OpKind::GatherGrad, {g.dy.id(), g.in(1).id()}, attributes), Tensor{}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   gatherReference<false>(r, viewOf(r.inShape(0), r.attributes().axis), r.in(1, replica),
                                          r.in(0, replica), r.out(replica));
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.outputs[0])}; }});
  table.add({.kind = OpKind::GatherGrad,
             .family = OpFamily::Gather,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0});
               c.dtype(1, DType::Int32);
               if (attributes.shape.empty())
                 c.fail(ErrorCode::ShapeMismatch, fmt::format("dy {} needs the table's `shape`", c.desc(0)));
               attributes.axis = c.axis(attributes.axis, static_cast<int64_t>(attributes.shape.size()));
               const Shape expected = gatheredShape(attributes.shape, c.shape(1), attributes.axis);
               if (c.shape(0) != expected) {
                 c.fail(ErrorCode::ShapeMismatch,
                        fmt::format("dy {} must be the gather of indices {} along axis {} from a table of `shape` "
                                    "{}, i.e. {}",
                                    c.desc(0), c.desc(1), attributes.axis, shapeStr(attributes.shape),
                                    shapeStr(expected)));
               }
               numElements(attributes.shape);
               return {{attributes.shape, dtype, {}}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   gatherReference<true>(r, viewOf(r.outShape(), r.attributes().axis), r.in(1, replica),
                                         r.in(0, replica), r.out(replica));
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.inputs[0])}; }});
  table.add({.kind = OpKind::GatherElements,
             .family = OpFamily::Gather,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0});
               checkElementIndices(c, 1, attributes);
               return {{c.shape(1), dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               const Tensor zeros = zerosLike(g.in(0));
               return {ops::scatterElements(zeros, g.in(1), g.dy, g.attributes().axis, true), Tensor{}};
             },
             .reference = elementsReference<false>,
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.outputs[0])}; }});
  table.add({.kind = OpKind::ScatterElements,
             .family = OpFamily::Gather,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(3);
               const DType dtype = c.floating({0, 2});
               checkElementIndices(c, 1, attributes);
               c.sameShape(1, 2);
               if (attributes.a != 0.0 && attributes.a != 1.0)
                 c.fail(ErrorCode::InvalidOperand,
                        fmt::format("a = {} on data {}: 0 writes the updates, 1 adds them", attributes.a,
                                    c.desc(0)));
               return {{c.shape(0), dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               const int64_t axis = g.attributes().axis;
               Tensor data;
               if (g.isWanted(0))
                 data = g.attributes().a == 1.0
                            ? g.dy
                            : ops::scatterElements(g.dy, g.in(1), zerosLike(g.in(2)), axis);
               Tensor updates;
               if (g.isWanted(2)) updates = ops::gatherElements(g.dy, g.in(1), axis);
               return {data, Tensor{}, updates};
             },
             .reference = elementsReference<true>,
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.flops = elementsOf(graph, op.outputs[0])}; }});
  table.keepsHalves({OpKind::Gather, OpKind::GatherElements});
}

}  // namespace tessera
