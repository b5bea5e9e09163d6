// The recurrence family: ONNX's RNN, GRU and LSTM (default activations,
// layout 0) as the ops Rnn, Gru and Lstm over x [S, B, I], the packed
// weights [D, G*H, I+H+2] and the initial state [D, B, C*H], which output
// every step's states [S+1, D, B, K*H] (recurrence.hpp gives the layouts).
// The states hold what the gradient reads (the gates), so the backward pass
// recomputes nothing; ops::recurrence slices ONNX's Y, Y_h and Y_c out of
// them. The gradient is three ops: RecurrenceGrad goes back through time to
// the gates' pre-activation gradients (and the initial state's), from which
// RecurrenceWeightGrad and RecurrenceInputGrad sum the weights' and x's.
#include <fmt/format.h>

#include "op_def.hpp"
#include "recurrence.hpp"

namespace tessera {
namespace {

using recurrence::Geometry;

[[noreturn]] void refuse(const OpChecker& c, std::string_view message) {
  c.fail(ErrorCode::InvalidRecurrence, message);
}

int64_t directionsOf(RecurrenceDirection direction) {
  return direction == RecurrenceDirection::Bidirectional ? 2 : 1;
}

// The geometry from x [S, B, I], the weights [D, G*H, L] and the states'
// hidden size; refuses weights that do not fit.
Geometry geometryOf(const OpChecker& c, OpKind cell, const OpAttributes& a, const Shape& x,
                    std::size_t xIndex, const Shape& weights, std::size_t weightIndex, int64_t hidden) {
  Geometry g;
  g.cell = cell;
  g.direction = a.direction;
  g.linearBeforeReset = a.linearBeforeReset;
  if (a.linearBeforeReset && cell != OpKind::Gru) refuse(c, "linearBeforeReset is a Gru attribute");
  if (x.size() != 3 || x[0] < 1)
    refuse(c, fmt::format("x {} must be [S, B, I] with S >= 1 steps", c.desc(xIndex)));
  g.seq = x[0];
  g.batch = x[1];
  g.input = x[2];
  g.hidden = hidden;
  g.dirs = directionsOf(a.direction);
  const Shape expected{g.dirs, g.gateRows(), g.row()};
  if (hidden < 1 || weights != expected) {
    refuse(c, fmt::format(
                  "the packed weights {} must be [D, G*H, I+H+2] = {} for {} {} with hidden size {} and {} "
                  "input features (G = {} gates; D = {} for {})",
                  c.desc(weightIndex), shapeStr(expected), a.direction, cell, hidden, g.input, g.gates(),
                  g.dirs, a.direction));
  }
  return g;
}

Geometry cellGeometry(const OpChecker& c, const OpAttributes& a) {
  c.arity(3);
  const int64_t sc = recurrence::stateChannelsOf(c.kind());
  const Shape& initial = c.shape(2);
  if (c.rank(2) != 3 || initial[2] % sc != 0 || c.rank(0) != 3 || initial[1] != c.shape(0)[1] ||
      initial[0] != directionsOf(a.direction)) {
    refuse(c,
           fmt::format("the initial state {} must be [D, B, {}H] with D = {} for {} and B the batch of x {}",
                       c.desc(2), sc == 2 ? "2" : "", directionsOf(a.direction), a.direction, c.desc(0)));
  }
  return geometryOf(c, c.kind(), a, c.shape(0), 0, c.shape(1), 1, initial[2] / sc);
}

Shape statesShape(const Geometry& g) { return {g.seq + 1, g.dirs, g.batch, g.stateWidth()}; }
Shape preShape(const Geometry& g) { return {g.seq + 1, g.dirs, g.batch, g.preWidth()}; }

// The gradients' geometry from the states [S+1, D, B, K*H] at `statesIndex`
// and the weights or x.
void checkCell(const OpChecker& c, const OpAttributes& a) {
  if (!recurrence::isCell(a.cell))
    refuse(c, fmt::format("`cell` is {}; it must name the recurrence: Rnn, Gru or Lstm", a.cell));
}

int64_t hiddenOfStates(const OpChecker& c, const OpAttributes& a, std::size_t i) {
  const int64_t k = recurrence::channelsOf(a.cell);
  if (c.rank(i) != 4 || c.shape(i)[3] % k != 0 || c.shape(i)[0] < 2)
    refuse(c, fmt::format("the states {} must be [S+1, D, B, {}H] for {}", c.desc(i), k, a.cell));
  return c.shape(i)[3] / k;
}

double flopsOf(const Geometry& g, double perGateRow) {
  return static_cast<double>(g.seq) * static_cast<double>(g.lanes()) * static_cast<double>(g.gateRows()) *
         perGateRow;
}

// The geometry of a recurrence op or one of its gradients, from the graph
// (for costs and references).
Geometry geometryIn(const Graph& graph, const OpNode& op) {
  const auto shape = [&](std::size_t i) -> const Shape& { return graph.tensor(op.inputs[i]).shape; };
  Geometry g;
  g.cell = recurrence::isCell(op.kind) ? op.kind : op.attributes.cell;
  g.direction = op.attributes.direction;
  g.linearBeforeReset = op.attributes.linearBeforeReset;
  g.dirs = directionsOf(g.direction);
  if (recurrence::isCell(op.kind)) {
    g.seq = shape(0)[0];
    g.batch = shape(0)[1];
    g.input = shape(0)[2];
    g.hidden = shape(2)[2] / recurrence::stateChannelsOf(g.cell);
    return g;
  }
  // The gradients: input 0 is dstates or dpre [S+1, D, B, ...]; the weights or x give I.
  const Shape& first = shape(0);
  g.seq = first[0] - 1;
  g.batch = first[2];
  if (op.kind == OpKind::RecurrenceGrad) {
    g.hidden = first[3] / g.channels();
    g.input = shape(2)[2] - g.hidden - 2;
  } else {
    g.hidden = first[3] / (2 * g.gates());
    g.input = op.kind == OpKind::RecurrenceWeightGrad ? shape(2)[2] : shape(1)[2] - g.hidden - 2;
  }
  return g;
}

std::vector<Tensor> recurrenceGradient(const GradientContext& c) {
  const Geometry g = geometryIn(c.graph, c.op);
  OpAttributes a;
  a.cell = c.op.kind;
  a.direction = g.direction;
  a.linearBeforeReset = g.linearBeforeReset;
  const Tensor pre = c.make(OpKind::RecurrenceGrad, {c.dy.id(), c.out(0).id(), c.in(1).id()}, a);
  std::vector<Tensor> grads(3);
  if (c.isWanted(0)) grads[0] = c.make(OpKind::RecurrenceInputGrad, {pre.id(), c.in(1).id()}, a);
  if (c.isWanted(1))
    grads[1] = c.make(OpKind::RecurrenceWeightGrad, {pre.id(), c.out(0).id(), c.in(0).id()}, a);
  if (c.isWanted(2)) {
    const Shape initial = c.in(2).shape();
    grads[2] =
        ops::reshape(ops::slice(pre, {g.seq, 0, 0, 0}, {g.seq + 1, g.dirs, g.batch, initial[2]}), initial);
  }
  return grads;
}

OpDef cellDef(OpKind kind) {
  return {.kind = kind,
          .family = OpFamily::Recurrence,
          .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
            const DType dtype = c.floating({0, 1, 2});
            return {{statesShape(cellGeometry(c, attributes)), dtype, {}}};
          },
          .gradient = recurrenceGradient,
          .reference =
              [](ReferenceOp& r, int64_t replica) {
                const Geometry g = geometryIn(r.graph(), r.op());
                std::vector<double> pre(static_cast<std::size_t>(g.preWidth()));
                std::vector<double>& out = r.out(replica);
                for (int64_t d = 0; d < g.dirs; ++d)
                  for (int64_t b = 0; b < g.batch; ++b)
                    recurrence::forwardLane(g, d, b, r.in(0, replica).data(), r.in(1, replica).data(),
                                            r.in(2, replica).data(), out.data(), pre.data());
              },
          .cost =
              [](const Graph& graph, const OpNode& op) {
                const Geometry g = geometryIn(graph, op);
                return OpCost{.flops = flopsOf(g, 2.0 * static_cast<double>(g.input + g.hidden) + 12.0)};
              }};
}

}  // namespace

void addRecurrenceOps(OpTable& table) {
  table.add(cellDef(OpKind::Rnn));
  table.add(cellDef(OpKind::Gru));
  table.add(cellDef(OpKind::Lstm));
  table.add({.kind = OpKind::RecurrenceGrad,
             .family = OpFamily::Recurrence,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(3);
               const DType dtype = c.floating({0, 1, 2});
               checkCell(c, attributes);
               c.sameShape(0, 1);
               const int64_t hidden = hiddenOfStates(c, attributes, 1);
               const Shape& states = c.shape(1);
               if (c.rank(2) != 3)
                 refuse(c, fmt::format("the packed weights {} must be [D, G*H, L]", c.desc(2)));
               const Shape x{states[0] - 1, states[2], c.shape(2)[2] - hidden - 2};
               const Geometry g = geometryOf(c, attributes.cell, attributes, x, 1, c.shape(2), 2, hidden);
               if (states != statesShape(g))
                 refuse(c, fmt::format("the states {} must be {}", c.desc(1), shapeStr(statesShape(g))));
               return {{preShape(g), dtype, {}}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Geometry g = geometryIn(r.graph(), r.op());
                   std::vector<double> work(static_cast<std::size_t>(4 * g.hidden));
                   std::vector<double>& out = r.out(replica);
                   for (int64_t d = 0; d < g.dirs; ++d)
                     for (int64_t b = 0; b < g.batch; ++b)
                       recurrence::backwardLane(g, d, b, r.in(0, replica).data(), r.in(1, replica).data(),
                                                r.in(2, replica).data(), out.data(), work.data());
                 },
             .cost =
                 [](const Graph& graph, const OpNode& op) {
                   const Geometry g = geometryIn(graph, op);
                   return OpCost{.flops = flopsOf(g, 4.0 * static_cast<double>(g.hidden) + 20.0)};
                 }});
  table.add(
      {.kind = OpKind::RecurrenceWeightGrad,
       .family = OpFamily::Recurrence,
       .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
         c.arity(3);
         const DType dtype = c.floating({0, 1, 2});
         checkCell(c, attributes);
         const int64_t hidden = hiddenOfStates(c, attributes, 1);
         const Shape& states = c.shape(1);
         const Geometry g =
             geometryOf(c, attributes.cell, attributes, c.shape(2), 2,
                        {directionsOf(attributes.direction), recurrence::gatesOf(attributes.cell) * hidden,
                         c.rank(2) == 3 ? c.shape(2)[2] + hidden + 2 : 0},
                        2, hidden);
         if (states != statesShape(g) || c.shape(0) != preShape(g)) {
           refuse(c, fmt::format("the states {} and dpre {} must be {} and {} for x {}", c.desc(1), c.desc(0),
                                 shapeStr(statesShape(g)), shapeStr(preShape(g)), c.desc(2)));
         }
         return {{Shape{g.dirs, g.gateRows(), g.row()}, dtype, {}}};
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             const Geometry g = geometryIn(r.graph(), r.op());
             std::vector<double>& out = r.out(replica);
             for (int64_t d = 0; d < g.dirs; ++d)
               for (int64_t j = 0; j < g.gateRows(); ++j)
                 recurrence::weightGradRow(g, d, j, r.in(0, replica).data(), r.in(1, replica).data(),
                                           r.in(2, replica).data(),
                                           out.data() + (d * g.gateRows() + j) * g.row());
           },
       .cost =
           [](const Graph& graph, const OpNode& op) {
             const Geometry g = geometryIn(graph, op);
             return OpCost{.flops = flopsOf(g, 2.0 * static_cast<double>(g.row()))};
           }});
  table.add({.kind = OpKind::RecurrenceInputGrad,
             .family = OpFamily::Recurrence,
             .shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0, 1});
               checkCell(c, attributes);
               const int64_t g2 = 2 * recurrence::gatesOf(attributes.cell);
               if (c.rank(0) != 4 || c.shape(0)[3] % g2 != 0 || c.shape(0)[0] < 2 || c.rank(1) != 3)
                 refuse(c, fmt::format("dpre {} must be [S+1, D, B, {}H] and the weights {} [D, G*H, L]",
                                       c.desc(0), g2, c.desc(1)));
               const int64_t hidden = c.shape(0)[3] / g2;
               const Shape x{c.shape(0)[0] - 1, c.shape(0)[2], c.shape(1)[2] - hidden - 2};
               const Geometry g = geometryOf(c, attributes.cell, attributes, x, 0, c.shape(1), 1, hidden);
               if (c.shape(0) != preShape(g))
                 refuse(c, fmt::format("dpre {} must be {}", c.desc(0), shapeStr(preShape(g))));
               return {{x, dtype, {}}};
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const Geometry g = geometryIn(r.graph(), r.op());
                   std::vector<double>& out = r.out(replica);
                   for (int64_t t = 0; t < g.seq; ++t)
                     for (int64_t b = 0; b < g.batch; ++b)
                       recurrence::inputGradRow(g, t, b, r.in(0, replica).data(), r.in(1, replica).data(),
                                                out.data() + (t * g.batch + b) * g.input);
                 },
             .cost =
                 [](const Graph& graph, const OpNode& op) {
                   const Geometry g = geometryIn(graph, op);
                   return OpCost{.flops = flopsOf(g, 2.0 * static_cast<double>(g.input))};
                 }});
}

}  // namespace tessera
