#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <set>
#include <string>
#include <tuple>

#include "device_checks.hpp"
#include "half.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"
#include "vector_math.hpp"

// Counts every allocation of the test program, to check that running a
// loaded program allocates nothing. GCC pairs the inlined replacement
// operators with malloc/free and warns about a mismatch that is not one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<int64_t> allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace tessera;
using test::ReferenceEvaluator;

namespace {

// The sources every case can use, on R replicas: per-replica inputs, a
// shared weight and weights grouped as (R,1,2) and (R,2,2) when R allows.
struct Sources {
  Graph* graph = nullptr;
  int64_t replicas = 1;
  Tensor x;       // input [3, 4]
  Tensor y;       // input [3, 5]
  Tensor x3;      // input [2, 3, 4]
  Tensor labels;  // input int32 [3]
  Tensor w;       // shared [4, 5]
  Tensor wT;      // shared [5, 4]
  Tensor wg1;     // grouped (R,1,2) [4, 5]
  Tensor wg2;     // grouped (R,2,2) [4, 5]
  Tensor bias;    // shared [5]
  Tensor vg1;     // grouped (R,1,2) [4]
  Tensor vg2;     // grouped (R,2,2) [4]
  DType dtype = DType::Float32;  // of every float source
};

std::optional<ReplicaGrouping> groupingOrAll(int64_t replicas, int64_t stride, int64_t size) {
  if (replicas < stride * size) return std::nullopt;
  return ReplicaGrouping(replicas, stride, size);
}

std::vector<float> hostData(std::optional<ReplicaGrouping> grouping, std::size_t elements, uint64_t seed) {
  const std::size_t groups = grouping ? static_cast<std::size_t>(grouping->numGroups()) : 1;
  return test::pseudoRandom((groups > 1 ? groups : 1) * elements, seed);
}

// A variable of the sources' float dtype.
Tensor floatVariable(const Sources& s, std::string name, std::vector<float> data, Shape shape,
                     std::optional<ReplicaGrouping> grouping = std::nullopt) {
  return ops::variable(*s.graph, std::move(name), std::move(data), std::move(shape), grouping,
                       RetrievalMode::OnePerGroup, TensorCategory::Weight, s.dtype);
}

Sources makeSources(Graph& g, DType dtype = DType::Float32) {
  Sources s;
  s.graph = &g;
  s.dtype = dtype;
  s.replicas = g.replicationFactor();
  s.x = ops::input(g, "x", {3, 4}, dtype);
  s.y = ops::input(g, "y", {3, 5}, dtype);
  s.x3 = ops::input(g, "x3", {2, 3, 4}, dtype);
  s.labels = ops::input(g, "labels", {3}, DType::Int32);
  s.w = floatVariable(s, "w", test::pseudoRandom(20, 1), {4, 5});
  s.wT = floatVariable(s, "wT", test::pseudoRandom(20, 2), {5, 4});
  const auto g1 = groupingOrAll(s.replicas, 1, 2);
  const auto g2 = groupingOrAll(s.replicas, 2, 2);
  s.wg1 = floatVariable(s, "wg1", hostData(g1, 20, 3), {4, 5}, g1);
  s.wg2 = floatVariable(s, "wg2", hostData(g2, 20, 4), {4, 5}, g2);
  s.bias = floatVariable(s, "bias", test::pseudoRandom(5, 5), {5});
  s.vg1 = floatVariable(s, "vg1", hostData(g1, 4, 6), {4}, g1);
  s.vg2 = floatVariable(s, "vg2", hostData(g2, 4, 7), {4}, g2);
  return s;
}

Tensor make(Graph& g, OpKind kind, std::vector<Tensor> inputs, OpAttributes attributes = {}) {
  std::vector<TensorId> ids;
  for (const Tensor& t : inputs) ids.push_back(t.id());
  return {&g, g.op(g.addOp(kind, ids, std::move(attributes))).outputs[0]};
}

struct Case {
  std::string name;
  std::function<void(Sources&)> build;
};

// Every op kind appears in at least one case (checked below).
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"matmul with shared, grouped and batched operands",
       [](Sources& s) {
         ops::matmul(s.x, s.w);
         ops::matmul(s.x, s.wg1);
         ops::matmul(s.x, s.wg2);
         ops::matmul(s.x3, s.w);
         ops::matmul(ops::transpose(s.wg1), ops::transpose(s.wT));
       }},
      {"batched products of per-replica and shared operands",
       [](Sources& s) {
         const Tensor wb = floatVariable(s, "wb", test::pseudoRandom(40, 9), {2, 4, 5});
         ops::batchMatmul(s.x3, wb);
         const Tensor scores = ops::batchMatmul(s.x3, ops::transpose(s.x3, {0, 2, 1}));
         ops::batchMatmul(ops::softmax(scores), s.x3);
       }},
      {"matmul with transposed operands",
       [](Sources& s) {
         ops::matmul(ops::transpose(s.x), s.y);
         ops::matmul(s.y, ops::transpose(s.wg2));
         ops::matmul(s.y, ops::transpose(s.w));
         const Tensor t = ops::transpose(s.x);
         ops::matmul(t, s.y);
         ops::neg(t);
       }},
      {"elementwise with broadcasting and mixed layouts",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor h = ops::matmul(s.x, s.w);
         ops::add(h, s.bias);
         ops::sub(s.x, s.vg1);
         ops::mul(s.vg1, s.vg2);
         ops::add(s.wg1, s.wg2);
         ops::sub(ops::scalar(g, 2.0, s.dtype), s.wg1);
         ops::div(s.x, ops::add(ops::exp(s.x), ops::scalar(g, 0.5, s.dtype)));
         ops::mul(s.x3, s.vg2);
         ops::add(ops::reshape(s.vg1, {4, 1}), s.vg2);
       }},
      {"unary functions",
       [](Sources& s) {
         Graph& g = *s.graph;
         ops::neg(s.x);
         ops::relu(s.x);
         ops::gelu(s.x);
         ops::tanh(s.x);
         ops::sigmoid(s.wg2);
         ops::exp(s.x);
         ops::log(ops::add(ops::exp(s.x), ops::scalar(g, 1.0, s.dtype)));
         ops::sqrt(ops::exp(s.wg1));
       }},
      {"activations of imported models and their gradient helpers",
       [](Sources& s) {
         Graph& g = *s.graph;
         ops::abs(s.x);
         ops::sign(ops::sub(s.x, s.vg1));
         ops::erf(s.wg1);
         ops::reciprocal(ops::add(ops::exp(s.x), ops::scalar(g, 0.5, s.dtype)));
         ops::softplus(ops::mul(s.x, ops::scalar(g, 60.0, s.dtype)));
         ops::leakyRelu(s.x, 0.1);
         ops::elu(s.wg2, 0.8);
         ops::selu(s.x);
         ops::clip(s.x, -0.3, 0.6);
         ops::pow(ops::exp(s.x), s.vg2);
         OpAttributes slope;
         slope.a = 0.1;
         make(g, OpKind::LeakyReluGrad, {s.y, ops::matmul(s.x, s.wg2)}, slope);
         make(g, OpKind::EluGrad, {s.y, ops::matmul(s.x, s.wg1)}, slope);
         OpAttributes selu;
         selu.a = 1.6;
         selu.b = 1.05;
         make(g, OpKind::SeluGrad, {s.y, ops::matmul(s.x, s.w)}, selu);
         OpAttributes bounds;
         bounds.a = -0.2;
         bounds.b = 0.3;
         make(g, OpKind::ClipGrad, {s.y, ops::matmul(s.x, s.wg2)}, bounds);
       }},
      {"gather and its scatter-add gradient",
       [](Sources& s) {
         Graph& g = *s.graph;
         ops::gather(s.wT, s.labels);
         ops::gather(ops::transpose(s.wg2), s.labels);
         const Tensor fixed = ops::constant(g, "idx", {-1, 0, 4, 4}, {2, 2}, DType::Int32);
         ops::gather(s.wT, fixed);
         OpAttributes table;
         table.shape = {5, 4};
         make(g, OpKind::GatherGrad, {s.x, s.labels}, table);
         make(g, OpKind::GatherGrad, {ops::gather(s.wT, fixed), fixed}, table);
         // Along inner axes: columns of a grouped weight, columns of an input
         // by per-replica indices, the middle axis of a 3-D input, and their
         // scatter-adds.
         const Tensor columns = ops::gather(s.wg2, fixed, 1);
         const Tensor picked = ops::gather(s.y, s.labels, -1);
         const Tensor middle = ops::gather(s.x3, ops::constant(g, "mid", {2, -3, 0}, {3}, DType::Int32), -2);
         OpAttributes columnTable;
         columnTable.shape = {4, 5};
         columnTable.axis = 1;
         make(g, OpKind::GatherGrad, {columns, fixed}, columnTable);
         OpAttributes pickedTable;
         pickedTable.shape = {3, 5};
         pickedTable.axis = -1;
         make(g, OpKind::GatherGrad, {ops::mul(picked, picked), s.labels}, pickedTable);
         OpAttributes middleTable;
         middleTable.shape = {2, 3, 4};
         middleTable.axis = 1;
         make(g, OpKind::GatherGrad, {middle, ops::constant(g, "mid2", {1, 1, -1}, {3}, DType::Int32)}, middleTable);
       }},
      {"element gathers and scatters: per-replica indices and values, written and added",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor fixed = ops::constant(g, "eidx", {-1, 0, 4, 4, 2, 1}, {2, 3}, DType::Int32);
         ops::gatherElements(s.y, fixed, 1);
         ops::gatherElements(s.wg2, ops::constant(g, "eidx0", {3, -4, 1, 1}, {2, 2}, DType::Int32), 0);
         const Tensor perReplica =
             ops::reshape(ops::castToInt32(ops::abs(ops::mul(s.x, ops::scalar(g, 4.0, s.dtype)))), {3, 4});
         ops::gatherElements(s.y, perReplica, -1);
         ops::scatterElements(s.wg1, fixed, ops::slice(s.y, {0, 0}, {2, 3}), 1);
         ops::scatterElements(s.y, perReplica, s.x, 1, true);
         ops::scatterElements(ops::matmul(s.x, s.w), fixed, ops::slice(s.x, {0, 0}, {2, 3}), -1, true);
       }},
      {"recurrences (Rnn, Gru, Lstm) in every direction and their gradients",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor x = ops::input(g, "xs", {4, 2, 3}, s.dtype);
         const auto g1 = groupingOrAll(s.replicas, 1, 2);
         const auto weights = [&](const std::string& name, Shape shape, uint64_t seed,
                                  std::optional<ReplicaGrouping> grouping = std::nullopt) {
           const auto n = static_cast<std::size_t>(numElements(shape));
           return floatVariable(s, name, hostData(grouping, n, seed), std::move(shape), grouping);
         };
         const Tensor gw = weights("gw", {2, 6, 3}, 41, g1);
         const Tensor h0 = ops::input(g, "gh0", {2, 2, 2}, s.dtype);
         const ops::RecurrenceOutputs gru =
             ops::recurrence(OpKind::Gru, x, gw, weights("gr", {2, 6, 2}, 42), weights("gb", {2, 12}, 43), h0,
                             {}, {RecurrenceDirection::Bidirectional, true});
         const Tensor g0r = weights("g0r", {1, 6, 2}, 45);
         const ops::RecurrenceOutputs gru0 =
             ops::recurrence(OpKind::Gru, x, weights("g0w", {1, 6, 3}, 44), g0r);
         const Tensor lr = weights("lr", {1, 8, 2}, 47, g1);
         const ops::RecurrenceOutputs lstm = ops::recurrence(
             OpKind::Lstm, x, weights("lw", {1, 8, 3}, 46), lr, weights("lb", {1, 16}, 48), {},
             ops::input(g, "lc0", {1, 2, 2}, s.dtype), {RecurrenceDirection::Reverse, false});
         const Tensor rw = weights("rw", {1, 2, 3}, 49);
         const ops::RecurrenceOutputs rnn =
             ops::recurrence(OpKind::Rnn, ops::tanh(x), rw, weights("rr", {1, 2, 2}, 50));
         const Tensor loss = ops::add(
             ops::add(ops::reduceSum(ops::mul(gru.y, gru.y)), ops::reduceSum(ops::mul(gru0.yH, lstm.yC))),
             ops::add(ops::reduceSum(lstm.y), ops::reduceSum(ops::mul(rnn.y, rnn.yH))));
         autodiff(g, loss, {x, gw, h0, g0r, lr, rw});
       }},
      {"batch normalisation in training: statistics, output, running-statistic reads and gradients",
       [](Sources& s) {
         Graph& g = *s.graph;
         // Grouped scale and bias over per-replica activations; a rank-2 x
         // (no spatial axes) and a spatial size that is no multiple of the
         // kernels' eight lanes.
         const Tensor x = ops::input(g, "bnx", {2, 4, 3, 5}, s.dtype);
         const ops::BatchNormOutputs bn = ops::batchNormTraining(x, s.vg1, s.vg2, 1e-3);
         const Tensor flat = ops::input(g, "bnflat", {6, 4}, s.dtype);
         const ops::BatchNormOutputs bn2 = ops::batchNormTraining(flat, s.vg2, s.vg1);
         const Tensor loss =
             ops::add(ops::add(ops::reduceSum(ops::mul(bn.y, bn.y)), ops::reduceSum(ops::mul(bn2.y, ops::reshape(s.x3, {6, 4})))),
                      ops::reduceSum(ops::mul(bn.mean, bn.variance)));
         autodiff(g, loss, {x, flat, s.vg1, s.vg2});
       }},
      {"convolutions in 1, 2 and 3 dimensions and their gradients",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor x1 = ops::input(g, "x1", {2, 3, 9}, s.dtype);
         const Tensor w1 = floatVariable(s, "w1", test::pseudoRandom(36, 21), {4, 3, 3});
         ops::conv(x1, w1, {.strides = {2}, .pads = {1, 2}});
         const Tensor x2 = ops::input(g, "x2", {2, 4, 7, 6}, s.dtype);
         const auto g1 = groupingOrAll(s.replicas, 1, 2);
         const Tensor w2 = floatVariable(s, "w2", hostData(g1, 6 * 2 * 3 * 2, 22), {6, 2, 3, 2}, g1);
         const ops::ConvParams p2{.strides = {2, 1}, .pads = {1, 0, 2, 1}, .dilations = {1, 2}, .group = 2};
         const Tensor y2 = ops::conv(x2, w2, p2);
         const Tensor dy2 = ops::input(g, "dy2", y2.shape(), s.dtype);
         OpAttributes weight;
         weight.strides = p2.strides;
         weight.pads = p2.pads;
         weight.dilations = p2.dilations;
         weight.group = 2;
         weight.shape = {6, 2, 3, 2};
         make(g, OpKind::ConvGradWeight, {dy2, x2}, weight);
         ops::convTranspose(dy2, w2,
                            {.strides = {2, 1},
                             .pads = {1, 0, 2, 1},
                             .dilations = {1, 2},
                             .group = 2,
                             .outputPadding = {1, 0}});
         const Tensor w1x1 = floatVariable(s, "w1x1", test::pseudoRandom(20, 23), {5, 4, 1, 1});
         const Tensor pointwise = ops::conv(x2, w1x1);
         ops::convTranspose(pointwise, w1x1);
         // Rows wider than a vector with pads at both ends, not a shifted
         // copy of the plane (stride 2 down): the column rows in segments.
         const Tensor x4 = ops::input(g, "x4", {2, 3, 9, 21}, s.dtype);
         const Tensor w4 = floatVariable(s, "w4", test::pseudoRandom(4 * 3 * 3 * 5, 25), {4, 3, 3, 5});
         const ops::ConvParams p4{.strides = {2, 1}, .pads = {1, 2, 1, 2}};
         const Tensor dy4 = ops::input(g, "dy4", ops::conv(x4, w4, p4).shape(), s.dtype);
         OpAttributes weight4;
         weight4.strides = p4.strides;
         weight4.pads = p4.pads;
         weight4.dilations = {1, 1};
         weight4.group = 1;
         weight4.shape = {4, 3, 3, 5};
         make(g, OpKind::ConvGradWeight, {dy4, x4}, weight4);
         ops::convTranspose(dy4, w4, {.strides = {2, 1}, .pads = {1, 2, 1, 2}});
         const Tensor x3 = ops::input(g, "x3d", {1, 2, 4, 3, 3}, s.dtype);
         const Tensor w3 = floatVariable(s, "w3", test::pseudoRandom(2 * 2 * 8, 24), {2, 2, 2, 2, 2});
         ops::conv(x3, w3, {.pads = {1, 0, 1, 0, 1, 0}});
         // Depthwise (one channel per group, computed without products),
         // strided and padded, and its gradients.
         const Tensor wd = floatVariable(s, "wd", test::pseudoRandom(4 * 9, 26), {4, 1, 3, 3});
         const ops::ConvParams pd{.strides = {2, 1}, .pads = {1, 1, 1, 1}, .group = 4};
         const Tensor dyd = ops::input(g, "dyd", ops::conv(x2, wd, pd).shape(), s.dtype);
         OpAttributes weightd;
         weightd.strides = pd.strides;
         weightd.pads = pd.pads;
         weightd.dilations = {1, 1};
         weightd.group = 4;
         weightd.shape = {4, 1, 3, 3};
         make(g, OpKind::ConvGradWeight, {dyd, x2}, weightd);
         ops::convTranspose(dyd, wd, {.strides = {2, 1}, .pads = {1, 1, 1, 1}, .group = 4});
         // A 3 x 3 window with pads of 1 over a 1 x 1 plane: eight taps
         // read only pads, and the kernels leave them out.
         const Tensor x5 = ops::input(g, "x5", {3, 4, 1, 1}, s.dtype);
         const Tensor w5 = floatVariable(s, "w5", test::pseudoRandom(5 * 4 * 9, 27), {5, 4, 3, 3});
         const ops::ConvParams p5{.pads = {1, 1, 1, 1}};
         const Tensor dy5 = ops::input(g, "dy5", ops::conv(x5, w5, p5).shape(), s.dtype);
         OpAttributes weight5;
         weight5.strides = {1, 1};
         weight5.pads = p5.pads;
         weight5.dilations = {1, 1};
         weight5.group = 1;
         weight5.shape = {5, 4, 3, 3};
         make(g, OpKind::ConvGradWeight, {dy5, x5}, weight5);
         ops::convTranspose(dy5, w5, {.pads = {1, 1, 1, 1}});
         // The same window depthwise.
         const Tensor w6 = floatVariable(s, "w6", test::pseudoRandom(4 * 9, 28), {4, 1, 3, 3});
         const ops::ConvParams p6{.pads = {1, 1, 1, 1}, .group = 4};
         const Tensor dy6 = ops::input(g, "dy6", ops::conv(x5, w6, p6).shape(), s.dtype);
         OpAttributes weight6 = weight5;
         weight6.group = 4;
         weight6.shape = {4, 1, 3, 3};
         make(g, OpKind::ConvGradWeight, {dy6, x5}, weight6);
         ops::convTranspose(dy6, w6, p6);
       }},
      {"max and average pools and their gradients",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor x2 = ops::input(g, "p2", {2, 3, 7, 6}, s.dtype);
         const ops::PoolParams p{.kernel = {3, 2}, .strides = {2, 2}, .pads = {1, 0, 1, 1}, .ceilMode = true};
         const Tensor m = ops::maxPool(x2, p);
         make(g, OpKind::MaxPoolGrad, {ops::input(g, "dm", m.shape(), s.dtype), x2},
              g.op(m.node().producer).attributes);
         ops::maxPool(ops::input(g, "p1", {2, 2, 8}, s.dtype), {.kernel = {3}, .strides = {2}, .dilations = {2}});
         ops::maxPool(ops::input(g, "p3", {1, 2, 4, 4, 3}, s.dtype), {.kernel = {2, 2, 2}, .strides = {2, 2, 1}});
         const Tensor a = ops::averagePool(x2, p);
         ops::averagePool(x2, {.kernel = {3, 3}, .pads = {1, 1, 1, 1}, .countIncludePad = true});
         OpAttributes back = g.op(a.node().producer).attributes;
         back.shape = x2.shape();
         make(g, OpKind::AveragePoolGrad, {ops::input(g, "da", a.shape(), s.dtype)}, back);
         ops::globalAveragePool(x2);
         ops::globalMaxPool(s.x3);
       }},
      {"comparisons, logic on masks and where with broadcasting",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor h = ops::matmul(s.x, s.wg1);
         const Tensor positive = ops::greater(h, ops::scalar(g, 0.0, s.dtype));
         const Tensor below = ops::less(s.x, s.vg2);
         ops::equal(s.labels, ops::constant(g, "two", {2}, {}, DType::Int32));
         ops::equal(ops::relu(s.x), s.vg1);
         const Tensor either = ops::logicalOr(below, ops::logicalNot(ops::less(s.vg1, ops::scalar(g, 0.0, s.dtype))));
         ops::logicalAnd(either, ops::reshape(ops::greater(s.vg2, ops::scalar(g, 0.0, s.dtype)), {4}));
         // masked_fill with -inf: a select keeps -inf, and softmax of the row gives 0 there.
         const Tensor causal = ops::constant(g, "causal", {1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0}, {3, 4}, s.dtype);
         const Tensor masked = ops::where(ops::logicalNot(causal),
                                          ops::scalar(g, -std::numeric_limits<double>::infinity(), s.dtype), s.x);
         ops::softmax(masked);
         ops::where(positive, h, ops::reshape(s.bias, {1, 5}));
         ops::where(ops::reshape(below, {3, 4, 1}), ops::reshape(s.vg1, {4, 1}), s.bias);
         ops::where(ops::scalar(g, 1.0, s.dtype), s.labels, ops::constant(g, "seven", {7}, {}, DType::Int32));
         const Tensor counts = ops::castToInt32(ops::mul(s.x, ops::scalar(g, 7.0, s.dtype)));
         ops::castToFloat32(ops::add(counts, ops::reshape(s.labels, {3, 1})));
         // float32 -> float16 rounds to nearest even; float16 -> float32 and -> int32.
         const Tensor half = ops::cast(ops::mul(s.x, ops::scalar(g, 1000.0, s.dtype)), DType::Float16);
         ops::castToInt32(half);
         ops::cast(half, DType::Float32);
       }},
      {"float64: exact casts in, double arithmetic with broadcasting beyond float32's range, where, the "
       "shape ops, and casts out",
       [](Sources& s) {
         Graph& g = *s.graph;
         constexpr DType kF64 = DType::Float64;
         const Tensor x = ops::cast(s.x, kF64);    // [3, 4] per replica
         const Tensor v = ops::cast(s.vg1, kF64);  // [4] grouped
         const Tensor big = ops::scalar(g, 1e200, kF64);
         // (x * v + 1e200 - 1e200) / sigmoid(x): every value beyond float32 on the way.
         const Tensor wide = ops::div(ops::sub(ops::add(ops::mul(x, v), big), big), ops::sigmoid(x));
         const Tensor fine = ops::add(ops::exp(ops::neg(ops::abs(x))), ops::scalar(g, 0x1p-40, kF64));
         const Tensor picked = ops::where(ops::greater(s.x, ops::scalar(g, 0.0, s.dtype)), wide,
                                          ops::sqrt(ops::reciprocal(fine)));
         const Tensor moved =
             ops::concat({ops::transpose(picked, {1, 0}),
                          ops::slice(ops::broadcastTo(ops::reshape(v, {4, 1}), {4, 3}), {0, 1}, {4, 3})},
                         1);
         const Tensor powered = ops::pow(ops::relu(ops::tanh(moved)), ops::scalar(g, 2.0, kF64));
         ops::cast(ops::sub(powered, ops::log(ops::add(ops::sign(moved), ops::scalar(g, 2.0, kF64)))),
                   DType::Float32);
         ops::castToInt32(ops::mul(moved, ops::scalar(g, 1e3, kF64)));
         ops::cast(ops::cast(s.labels, kF64), DType::Float32);
       }},
      {"dropout of per-replica values at two steps, and its gradient",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor step = ops::constant(g, "step", {3}, {}, DType::Int32);
         const Tensor y = ops::dropout(ops::matmul(s.x3, s.wg1), step, 0.3, 7);
         ops::dropout(s.x, ops::constant(g, "step2", {4}, {}, DType::Int32), 0.5);
         const Tensor loss = ops::reduceSum(ops::mul(y, y));
         autodiff(g, loss, {s.wg1});
       }},
      {"softmax, cross entropy and argmax",
       [](Sources& s) {
         Graph& g = *s.graph;
         const Tensor logits = ops::mul(ops::matmul(s.x, s.wg1), ops::scalar(g, 30.0, s.dtype));
         ops::softmax(logits);
         ops::logSoftmax(logits);
         ops::softmax(s.x3);
         ops::argmax(logits);
         const Tensor loss = ops::softmaxCrossEntropy(logits, s.labels, ReductionType::Mean);
         ops::softmaxCrossEntropy(logits, s.labels, ReductionType::Sum);
         OpAttributes mean;
         mean.reduction = ReductionType::Mean;
         make(g, OpKind::SoftmaxCrossEntropyGrad, {ops::mul(loss, ops::scalar(g, 3.0, s.dtype)), logits, s.labels},
              mean);
         OpAttributes sum;
         make(g, OpKind::SoftmaxCrossEntropyGrad, {ops::scalar(g, 1.0, s.dtype), logits, s.labels}, sum);
       }},
      {"reductions and broadcasts",
       [](Sources& s) {
         Graph& g = *s.graph;
         ops::reduceSum(s.x3);
         ops::reduceSum(s.x3, {0, 2});
         ops::reduceSum(s.x3, {1}, true);
         ops::reduceMean(s.x3, {-1});
         ops::reduceMean(s.wg2, {0}, true);
         ops::broadcastTo(s.vg1, {3, 4});
         ops::broadcastTo(s.bias, {2, 3, 5});
         OpAttributes toShape;
         toShape.shape = {3, 1};
         make(g, OpKind::ReduceToShape, {s.x}, toShape);
         OpAttributes toVector;
         toVector.shape = {4};
         make(g, OpKind::ReduceToShape, {s.x3}, toVector);
       }},
      {"reshape, transpose, slice, concat and pads",
       [](Sources& s) {
         Graph& g = *s.graph;
         ops::reshape(s.x3, {4, -1});
         ops::transpose(s.x3, {2, 0, 1});
         ops::transpose(s.x3);
         ops::slice(s.x3, {0, 1, 1}, {2, 3, 3});
         ops::slice(s.wg1, {1, 0}, {3, 5});
         ops::concat({s.x, ops::transpose(s.wg1), ops::transpose(s.wg2)}, 0);
         ops::concat({s.y, s.x}, 1);
         OpAttributes pad;
         pad.shape = {4, 6};
         pad.starts = {1, 1};
         pad.ends = {4, 5};
         make(g, OpKind::SlicePad, {s.x}, pad);
       }},
      {"gradient helpers",
       [](Sources& s) {
         Graph& g = *s.graph;
         make(g, OpKind::ReluGrad, {s.y, ops::sub(s.y, ops::matmul(s.x, s.wg2))});
         make(g, OpKind::GeluGrad, {s.y, ops::matmul(s.x, s.wg2)});
       }},
      {"in-place updates, copies and refined layouts",
       [](Sources& s) {
         const Tensor before = ops::copy(s.w);
         ops::scaledAddInplace(s.w, ops::matmul(ops::transpose(s.x), s.y), 0.5, -0.1);
         ops::matmul(s.x, s.w);
         ops::scaledAddInplace(s.wg1, s.bias, 1.0, 2.0);
         const Tensor acc = floatVariable(s, "acc", std::vector<float>(4, 0.0f), {4});
         ops::copyInplace(acc, s.vg2);
         ops::copyInplace(s.wT, ops::transpose(s.wg2));
         // A copy to another IPU of the replica is the identity too.
         ops::add(make(*s.graph, OpKind::IpuCopy, {before}), s.w);
       }},
      {"collectives over every replica and over groups",
       [](Sources& s) {
         Graph& g = *s.graph;
         const auto g1 = groupingOrAll(s.replicas, 1, 2);
         const auto g2 = groupingOrAll(s.replicas, 2, 2);
         ops::replicatedAllReduce(s.x, ReductionType::Sum);
         ops::replicatedAllReduce(s.x, ReductionType::Mean, g2);
         ops::replicatedAllReduce(s.w, ReductionType::Sum, g1);
         ops::replicatedAllReduce(s.wg1, ReductionType::Mean, g2);
         const Tensor shard = ops::replicatedReduceScatter(s.x3, ReductionType::Mean, g1);
         ops::replicatedAllGather(shard, g1);
         const Tensor own = ops::replicaShardedSlice(s.y, g2);
         OpAttributes pad;
         pad.grouping = g2;
         make(g, OpKind::ReplicaShardedPad, {own}, pad);
         const ShardedVariable sharded =
             ops::replicaShardedVariable(g, "sharded", test::pseudoRandom(30, 8), {5, 6}, std::nullopt, std::nullopt, TensorCategory::Weight, s.dtype);
         ops::add(ops::replicatedAllGather(sharded.shard), ops::scalar(g, 1.0, s.dtype));
         const Tensor z = ops::input(g, "z", {5, 6}, s.dtype);
         ops::scaledAddInplace(sharded.shard, ops::replicatedReduceScatter(z, ReductionType::Mean), 1.0,
                               -0.5);
         ops::replicatedAllGather(sharded.shard);
       }},
      {"remote buffers",
       [](Sources& s) {
         Graph& g = *s.graph;
         const RemoteBuffer buffer = ops::remoteBuffer(g, {3, 4}, s.dtype, 2);
         ops::remoteStore(g, buffer, 1, ops::mul(s.x, s.x));
         const Tensor loaded = ops::remoteLoad(g, buffer, 1);
         ops::add(loaded, s.vg1);
         ops::remoteStore(g, buffer, 0, ops::broadcastTo(s.vg2, {3, 4}));
         ops::remoteLoad(g, buffer, 0);
       }},
  };
  return all;
}

void checkAgainstOracle(const Graph& graph, ExecutionMode mode, double tolerance = 1e-5) {
  const auto feeds = test::makeFeeds(graph, 5, 11);
  test::DeviceRun device = test::loadOnDevice(graph, mode);
  ReferenceEvaluator oracle(graph);
  test::feedOracle(oracle, graph, feeds);
  // Twice, so that in-place state and remote buffers carry over.
  for (int step = 0; step < 2; ++step) {
    test::runDevice(*device.executable, feeds);
    oracle.run();
  }
  CHECK(test::compareAll(*device.executable, graph, oracle, tolerance) > 0);
  // Float16 tensors hold halves exactly: every stored value is a half.
  for (std::size_t i = 0; i < graph.tensors().size(); ++i) {
    const TensorNode& node = graph.tensors()[i];
    if (node.dtype != DType::Float16) continue;
    const auto t = static_cast<TensorId>(i);
    for (int64_t r = 0; r < graph.replicationFactor(); ++r) {
      const std::vector<float> got = test::deviceValue(*device.executable, graph, t, r);
      const auto notHalf = std::count_if(got.begin(), got.end(), [](float v) {
        return !std::isnan(v) && roundToHalf(v) != v;
      });
      INFO(node.name);
      CHECK(notHalf == 0);
    }
  }
}

}  // namespace

TEST_CASE("every op kind: vectorized and per-replica execution agree with the double reference") {
  std::set<OpKind> seen;
  for (const Case& c : cases()) {
    for (int64_t replicas : {int64_t{1}, int64_t{4}}) {
      Graph g(replicas);
      Sources s = makeSources(g);
      c.build(s);
      for (const OpNode& op : g.ops()) seen.insert(op.kind);
      for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
        INFO(c.name << ", R = " << replicas << ", " << toString(mode));
        checkAgainstOracle(g, mode);
      }
    }
  }
  for (const auto& entry : EnumNames<OpKind>::kNames) {
    INFO(entry.second);
    CHECK(seen.contains(entry.first));
  }
}

// The same graphs with every float source in float16: the device (float32
// arithmetic, each float16 output rounded to half) against the reference
// (double arithmetic, each float16 output rounded to half). Both round the
// same value, so they differ where float32 and double arithmetic put a value
// on the two sides of a rounding boundary: one half ulp, 2^-10 relative at
// most, and a few ulps once such a difference goes through later ops. The
// bound asserted is 2^-8 relative (absolute below 1).
TEST_CASE("every op family in float16: vectorized and per-replica execution agree with the rounding model") {
  constexpr double kHalfTolerance = 1.0 / 256.0;
  for (const Case& c : cases()) {
    for (int64_t replicas : {int64_t{1}, int64_t{4}}) {
      Graph g(replicas);
      Sources s = makeSources(g, DType::Float16);
      c.build(s);
      for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
        INFO(c.name << ", float16, R = " << replicas << ", " << toString(mode));
        checkAgainstOracle(g, mode, kHalfTolerance);
      }
    }
  }
}

TEST_CASE("layouts: inputs per replica, variables by grouping, ops take the finest of their inputs") {
  Graph g(4);
  Sources s = makeSources(g);
  const Tensor h = ops::matmul(s.x, s.w);
  const Tensor grouped = ops::mul(s.vg1, s.vg1);
  const Tensor mixed = ops::add(s.vg1, s.vg2);
  const Tensor coarse = ops::add(ops::scalar(g, 1.0), s.vg1);
  const Tensor reduced = ops::replicatedAllReduce(h, ReductionType::Sum);
  const Tensor groupReduced = ops::replicatedAllReduce(h, ReductionType::Sum, ReplicaGrouping(4, 2, 2));
  const Tensor sharedReduced = ops::replicatedAllReduce(s.w, ReductionType::Mean, ReplicaGrouping(4, 1, 2));
  const ShardedVariable sharded =
      ops::replicaShardedVariable(g, "sharded", test::pseudoRandom(30, 1), {30}, std::nullopt, 2);
  const Tensor gathered = ops::replicatedAllGather(sharded.shard, ReplicaGrouping(4, 1, 2));
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  const Executable& e = *device.executable;
  const ReplicaGrouping perReplica(4, 1, 1);
  const ReplicaGrouping shared(4);
  struct Row {
    Tensor tensor;
    ReplicaGrouping layout;
  };
  const std::vector<Row> table = {
      {s.x, perReplica},
      {s.w, shared},
      {s.wg1, ReplicaGrouping(4, 1, 2)},
      {s.wg2, ReplicaGrouping(4, 2, 2)},
      {h, perReplica},
      {grouped, ReplicaGrouping(4, 1, 2)},
      {mixed, perReplica},
      {coarse, ReplicaGrouping(4, 1, 2)},
      {reduced, shared},
      {groupReduced, ReplicaGrouping(4, 2, 2)},
      {sharedReduced, shared},
      // Member m holds shard m mod 2: replicas 0 and 2, 1 and 3 hold one value.
      {sharded.shard, ReplicaGrouping(4, 2, 2)},
      {gathered, shared},
  };
  for (const Row& row : table) {
    INFO(row.tensor.name());
    CHECK(e.layout(row.tensor.id()) == row.layout);
  }
  test::DeviceRun reference = test::loadOnDevice(g, ExecutionMode::PerReplicaReference);
  for (const Row& row : table) CHECK(reference.executable->layout(row.tensor.id()) == perReplica);
}

TEST_CASE("an in-place update with a per-replica value makes the variable's storage per replica") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {2});
  const Tensor w = ops::variable(g, "w", {1.0f, 2.0f}, {2});
  const Tensor before = ops::mul(w, w);
  ops::scaledAddInplace(w, x, 1.0, 1.0);
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  CHECK(device.executable->layout(w.id()) == ReplicaGrouping(4, 1, 1));
  CHECK(device.executable->layout(before.id()) == ReplicaGrouping(4, 1, 1));
}

TEST_CASE("a per-replica GEMM against a shared weight is one kernel call over the stacked replicas") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {8, 16});
  const Tensor w = ops::variable(g, "w", test::pseudoRandom(16 * 4, 3), {16, 4});
  ops::matmul(x, w);
  test::DeviceRun vectorized = test::loadOnDevice(g, ExecutionMode::Vectorized);
  CHECK(vectorized.sim->stats().steps == 2);
  CHECK(vectorized.sim->stats().kernelRuns == 2);
  test::DeviceRun reference = test::loadOnDevice(g, ExecutionMode::PerReplicaReference);
  CHECK(reference.sim->stats().kernelRuns == 1 + 4);
}

namespace {

// sum over replicas of x_r^T dy_r, reduced over `grouping`.
struct GradientProgram {
  Graph graph;
  Tensor product;
  Tensor reduced;
};

GradientProgram gradientProgram(int64_t replicas, ReductionType reduction,
                                std::optional<ReplicaGrouping> grouping) {
  GradientProgram p{Graph(replicas), {}, {}};
  const Tensor x = ops::input(p.graph, "x", {6, 5});
  const Tensor dy = ops::input(p.graph, "dy", {6, 3});
  p.product = ops::matmul(ops::transpose(x), dy);
  p.reduced = ops::replicatedAllReduce(p.product, reduction, grouping);
  return p;
}

}  // namespace

TEST_CASE("the gradient GEMM and its all-reduce are fused into one GEMM over the concatenated batch") {
  struct Row {
    int64_t replicas;
    std::optional<ReplicaGrouping> grouping;
    ReductionType reduction;
    int64_t fused;  // expected fused GEMMs in the vectorized plan
  };
  const std::vector<Row> table = {
      {4, std::nullopt, ReductionType::Sum, 1},
      {4, std::nullopt, ReductionType::Mean, 1},
      {4, ReplicaGrouping(4, 1, 2), ReductionType::Mean, 1},
      {8, ReplicaGrouping(8, 1, 4), ReductionType::Sum, 1},
      {1, std::nullopt, ReductionType::Mean, 1},
      // Members two apart are not consecutive rows of the stacked batch.
      {4, ReplicaGrouping(4, 2, 2), ReductionType::Sum, 0},
  };
  for (const Row& row : table) {
    INFO("R = " << row.replicas << ", " << (row.grouping ? row.grouping->str() : "all") << ", "
                << toString(row.reduction));
    GradientProgram p = gradientProgram(row.replicas, row.reduction, row.grouping);
    const auto feeds = test::makeFeeds(p.graph, 1, 5);
    ReferenceEvaluator oracle(p.graph);
    test::feedOracle(oracle, p.graph, feeds);
    oracle.run();
    for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
      test::DeviceRun device = test::loadOnDevice(p.graph, mode);
      CHECK(device.sim->stats().fusedGemmAllReduces == (mode == ExecutionMode::Vectorized ? row.fused : 0));
      test::runDevice(*device.executable, feeds);
      CHECK(test::compareAll(*device.executable, p.graph, oracle) > 0);
      for (int64_t r = 0; r < row.replicas; ++r) {
        CHECK(test::deviceValue(*device.executable, p.graph, p.reduced.id(), r).size() == 15);
      }
    }
  }
  // The fused product is never stored; reading it says so.
  GradientProgram p = gradientProgram(4, ReductionType::Sum, std::nullopt);
  test::DeviceRun device = test::loadOnDevice(p.graph, ExecutionMode::Vectorized);
  std::vector<float> out(4 * 15);
  const auto error = test::catchError<DeviceError>([&] { device.executable->read(p.product.id(), out); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::InvalidProgram);
  CHECK(error->subject() == p.product.name());
}

namespace {

// A two-layer MLP training step built by hand: forward, autodiff, gradient
// all-reduce (mean) and an SGD update in place.
struct Mlp {
  Graph graph;
  Tensor x;
  Tensor labels;
  std::vector<Tensor> weights;
  Tensor loss;
};

Mlp makeMlp(int64_t replicas, int64_t batch) {
  Mlp m{Graph(replicas), {}, {}, {}, {}};
  Graph& g = m.graph;
  m.x = ops::input(g, "x", {batch, 6});
  m.labels = ops::input(g, "labels", {batch}, DType::Int32);
  const Tensor w1 = ops::variable(g, "W1", test::pseudoRandom(6 * 8, 21), {6, 8});
  const Tensor b1 = ops::variable(g, "b1", test::pseudoRandom(8, 22), {8});
  const Tensor w2 = ops::variable(g, "W2", test::pseudoRandom(8 * 3, 23), {8, 3});
  const Tensor b2 = ops::variable(g, "b2", test::pseudoRandom(3, 24), {3});
  m.weights = {w1, b1, w2, b2};
  const Tensor h = ops::relu(ops::add(ops::matmul(m.x, w1), b1));
  const Tensor logits = ops::add(ops::matmul(h, w2), b2);
  m.loss = ops::softmaxCrossEntropy(logits, m.labels, ReductionType::Mean);
  const std::vector<Tensor> grads = autodiff(g, m.loss, m.weights);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor reduced = ops::replicatedAllReduce(grads[i], ReductionType::Mean);
    ops::scaledAddInplace(m.weights[i], reduced, 1.0, -0.5);
  }
  return m;
}

// The same 8 rows of data: R replicas get consecutive slices of them.
std::map<TensorId, std::vector<float>> mlpFeeds(const Mlp& m, int step) {
  std::vector<float> x = test::pseudoRandom(8 * 6, 100 + static_cast<uint64_t>(step));
  std::vector<float> labels = test::pseudoRandom(8, 200 + static_cast<uint64_t>(step), 0.0f, 3.0f);
  for (float& v : labels) v = std::floor(v);
  return {{m.x.id(), x}, {m.labels.id(), labels}};
}

std::vector<float> readShared(const Executable& e, const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(e.layout(t.id()).numGroups() * numElements(t.shape())));
  e.read(t.id(), out);
  return out;
}

}  // namespace

TEST_CASE("the gradient GEMM and its reduce-scatter are fused into one GEMM per group, padded shards too") {
  struct Row {
    int64_t replicas;
    std::optional<ReplicaGrouping> grouping;
    ReductionType reduction;
    int64_t columns;  // of dy: the product has 5 x columns elements
    int64_t fused;    // expected fused GEMMs in the vectorized plan
  };
  const std::vector<Row> table = {
      {4, std::nullopt, ReductionType::Sum, 4, 1},
      {4, std::nullopt, ReductionType::Mean, 4, 1},
      {4, ReplicaGrouping(4, 1, 2), ReductionType::Sum, 4, 1},
      {8, ReplicaGrouping(8, 1, 4), ReductionType::Mean, 4, 1},
      // 15 elements over 4 (2) shards: each shard takes its part of the
      // group's product and zero padding.
      {4, std::nullopt, ReductionType::Sum, 3, 1},
      {4, ReplicaGrouping(4, 1, 2), ReductionType::Mean, 3, 1},
      {8, ReplicaGrouping(8, 1, 4), ReductionType::Sum, 3, 1},
      // Members two apart are not consecutive rows of the stacked batch.
      {4, ReplicaGrouping(4, 2, 2), ReductionType::Sum, 4, 0},
  };
  for (const Row& row : table) {
    INFO("R = " << row.replicas << ", " << (row.grouping ? row.grouping->str() : "all") << ", "
                << toString(row.reduction) << ", 5 x " << row.columns);
    Graph g(row.replicas);
    const Tensor x = ops::input(g, "x", {6, 5});
    const Tensor dy = ops::input(g, "dy", {6, row.columns});
    const Tensor product = ops::matmul(ops::transpose(x), dy);
    const Tensor shard = ops::replicatedReduceScatter(product, row.reduction, row.grouping);
    const auto feeds = test::makeFeeds(g, 1, 5);
    ReferenceEvaluator oracle(g);
    test::feedOracle(oracle, g, feeds);
    oracle.run();
    for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
      test::DeviceRun device = test::loadOnDevice(g, mode);
      CHECK(device.sim->stats().fusedGemmAllReduces == (mode == ExecutionMode::Vectorized ? row.fused : 0));
      test::runDevice(*device.executable, feeds);
      for (int64_t r = 0; r < row.replicas; ++r) {
        const std::vector<float> got = test::deviceValue(*device.executable, g, shard.id(), r);
        const std::vector<double>& want = oracle.value(shard.id(), r);
        REQUIRE(got.size() == want.size());
        for (std::size_t k = 0; k < got.size(); ++k) CHECK(test::close(got[k], want[k], 1e-5));
      }
    }
  }
}

TEST_CASE("a value loaded from streaming memory lives in its entry when nothing else needs the entry") {
  // Replica-sharded momentum in a remote buffer: loaded, updated in place,
  // stored back; and a second buffer only read.
  const int64_t replicas = 4;
  Graph g(replicas);
  const RemoteBuffer momentumBuffer = ops::remoteBuffer(g, {8});
  const RemoteBuffer readBuffer = ops::remoteBuffer(g, {8});
  const Tensor grad = ops::input(g, "grad", {8});
  const Tensor v = ops::remoteLoad(g, momentumBuffer, 0);
  const Tensor next = ops::add(ops::mul(v, ops::scalar(g, 0.9)), grad);
  const Tensor updated = ops::copyInplace(v, next);
  ops::remoteStore(g, momentumBuffer, 0, updated);
  const Tensor table = ops::remoteLoad(g, readBuffer, 0);
  // Reads the new value before it is stored: nothing touches v afterwards.
  const Tensor result = ops::mul(next, table);
  const auto feeds = test::makeFeeds(g, 1, 5);
  std::vector<float> initial = test::pseudoRandom(replicas * 8, 7);
  std::vector<float> read = test::pseudoRandom(replicas * 8, 8);
  for (bool known : {false, true}) {
    INFO("host reads known: " << known);
    Program program{g};
    program.replicas.localReplicas = replicas;
    program.replicas.globalReplicas = replicas;
    if (known) program.hostReads = std::vector<TensorId>{result.id()};
    auto executable = makeSimDevice()->load(std::move(program));
    const auto& sim = dynamic_cast<const sim::SimExecutable&>(*executable);
    CHECK(sim.stats().remoteAliases == (known ? 2 : 0));
    executable->writeRemote(momentumBuffer.id(), 0, initial);
    executable->writeRemote(readBuffer.id(), 0, read);
    test::runDevice(*executable, feeds);
    test::runDevice(*executable, feeds);
    // Two steps: v <- 0.9 v + grad twice; result = v * table.
    std::vector<float> stored(replicas * 8);
    executable->readRemote(momentumBuffer.id(), 0, stored);
    std::vector<float> out(replicas * 8);
    executable->read(result.id(), out);
    const std::vector<float>& gradients = feeds.at(grad.id());
    for (std::size_t k = 0; k < stored.size(); ++k) {
      const float once = initial[k] * 0.9f + gradients[k];
      const float twice = once * 0.9f + gradients[k];
      CHECK(test::close(stored[k], twice, 1e-6));
      CHECK(test::close(out[k], twice * read[k], 1e-6));
    }
  }
}

namespace {

// Loads g with the host's reads unknown (nothing is shared) and known (only
// result and w are read): the plan's `aliases` count is 0, then `shared`.
// With them known, the shared `view` is refused to the host, for reading
// and writing, naming it and its `operand`. Both plans give the
// reference's result, and after a second run (which reads the updated w)
// the same bits of result and w.
void checkSharedOutputs(const Graph& g, const Tensor& result, const Tensor& w,
                        int64_t sim::PlanStats::*aliases, int64_t shared, const Tensor& view,
                        const Tensor& operand) {
  const auto feeds = test::makeFeeds(g, 1, 9);
  ReferenceEvaluator oracle{g};
  test::feedOracle(oracle, g, feeds);
  oracle.run();
  std::vector<std::vector<float>> results;
  for (bool known : {false, true}) {
    INFO("host reads known: " << known);
    test::DeviceRun device =
        test::loadOnDevice(g, ExecutionMode::Vectorized, {},
                           known ? std::optional(std::vector<TensorId>{result.id(), w.id()}) : std::nullopt);
    Executable* executable = device.executable.get();
    CHECK(device.sim->stats().*aliases == (known ? shared : 0));
    if (known) {
      // A write would change the operand; a read could see it changed after
      // the view's last reader.
      std::vector<float> values(static_cast<std::size_t>(g.replicationFactor() * numElements(view.shape())),
                                1.0f);
      for (bool write : {false, true}) {
        const auto error = test::catchError<DeviceError>([&] {
          if (write) executable->write(view.id(), values);
          if (!write) executable->read(view.id(), values);
        });
        REQUIRE(error);
        CHECK(error->subject() == g.tensor(view.id()).name);
        CHECK(std::string(error->what()).find(g.tensor(operand.id()).name) != std::string::npos);
      }
    }
    test::runDevice(*executable, feeds);
    test::compareTensor(*executable, g, oracle, result.id());
    test::runDevice(*executable, feeds);
    std::vector<float> values = test::deviceValue(*executable, g, result.id(), 1);
    const std::vector<float> weights = test::deviceValue(*executable, g, w.id(), 0);
    values.insert(values.end(), weights.begin(), weights.end());
    results.push_back(values);
  }
  CHECK(results[0] == results[1]);
}

}  // namespace

TEST_CASE("a float32 cast shares its operand's memory unless the operand changes while the cast is read") {
  // wide = float32(x16) shares x16's memory. before = float32(w) of a
  // float16 variable is read after w's in-place update, so it keeps its
  // copy; after = float32(updated) is read after the last write and shares
  // w's memory. A float64 value's cast rounds: it is computed.
  Graph g(2);
  const Tensor x = ops::input(g, "x", {6, 5});
  const Tensor x16 = ops::cast(ops::mul(x, ops::scalar(g, 3.0)), DType::Float16);
  const Tensor wide = ops::cast(x16, DType::Float32);
  const Tensor w = ops::variable(g, "w", test::pseudoRandom(30, 3), {6, 5}, std::nullopt,
                                 RetrievalMode::OnePerGroup, TensorCategory::Weight, DType::Float16);
  const Tensor before = ops::cast(w, DType::Float32);
  const Tensor updated = ops::copyInplace(w, ops::cast(ops::add(wide, ops::scalar(g, 0.25)), DType::Float16));
  const Tensor after = ops::cast(updated, DType::Float32);
  const Tensor narrowed = ops::cast(ops::cast(x, DType::Float64), DType::Float32);
  const Tensor result = ops::add(ops::mul(wide, before), ops::sub(after, narrowed));
  checkSharedOutputs(g, result, w, &sim::PlanStats::castAliases, 2, wide, x16);
}

TEST_CASE("a reshape shares its operand's memory unless the operand changes while the reshape is read") {
  // flat, the reshape feeding w's update and after (of the updated w) are
  // their operands' memory; before (of w) is read after w's in-place
  // update, so it keeps its copy. A float64 value's reshape moves its two
  // floats as they are: shared too.
  Graph g(2);
  const Tensor x = ops::input(g, "x", {6, 5});
  const Tensor tripled = ops::mul(x, ops::scalar(g, 3.0));
  const Tensor flat = ops::reshape(tripled, {30});
  const Tensor w = ops::variable(g, "w", test::pseudoRandom(30, 3), {6, 5});
  const Tensor before = ops::reshape(w, {30});
  const Tensor updated = ops::copyInplace(w, ops::reshape(ops::add(flat, ops::scalar(g, 0.25)), {6, 5}));
  const Tensor after = ops::reshape(updated, {30});
  const Tensor narrowed = ops::cast(ops::reshape(ops::cast(x, DType::Float64), {30}), DType::Float32);
  const Tensor result = ops::add(ops::mul(flat, before), ops::sub(after, narrowed));
  checkSharedOutputs(g, result, w, &sim::PlanStats::reshapeAliases, 4, flat, tripled);
}

TEST_CASE("an all-gather of unpadded shards in replica order is their memory until the shards change") {
  // W's gather is read before W's update: it is W's memory. V's gather is
  // read again after V's update (the old value), so it keeps its copy. P's
  // 42 elements over 4 replicas carry padding. G has a value per pair of
  // replicas, sharded over the pair and gathered pair by pair: each pair's
  // shards are its gathered value. S is gathered over replicas two apart.
  const int64_t replicas = 4;
  const ReplicaGrouping pairs(replicas, 1, 2);
  const ReplicaGrouping strided(replicas, 2, 2);
  Graph g(replicas);
  const Tensor x = ops::input(g, "x", {6, 8});
  const auto w = ops::replicaShardedVariable(g, "W", test::pseudoRandom(40, 1), {8, 5});
  const auto v = ops::replicaShardedVariable(g, "V", test::pseudoRandom(40, 2), {8, 5});
  const auto p = ops::replicaShardedVariable(g, "P", test::pseudoRandom(42, 3), {6, 7});
  const auto grouped = ops::replicaShardedVariable(g, "G", test::pseudoRandom(80, 4), {8, 5}, pairs);
  const auto spread = ops::replicaShardedVariable(g, "S", test::pseudoRandom(80, 5), {8, 5}, strided);
  Tensor result;
  Tensor padded;
  {
    InSequence sequence(g);
    const Tensor wGathered = ops::replicatedAllGather(w.shard);
    const Tensor vGathered = ops::replicatedAllGather(v.shard);
    const Tensor pGathered = ops::replicatedAllGather(p.shard);
    const Tensor gGathered = ops::replicatedAllGather(grouped.shard, pairs);
    const Tensor sGathered = ops::replicatedAllGather(spread.shard, strided);
    const Tensor early = ops::add(ops::add(ops::matmul(x, wGathered), ops::matmul(x, vGathered)),
                                  ops::add(ops::matmul(x, gGathered), ops::matmul(x, sGathered)));
    ops::copyInplace(w.shard, ops::add(w.shard, ops::scalar(g, 0.5)));
    ops::copyInplace(v.shard, ops::add(v.shard, ops::scalar(g, 0.25)));
    result = ops::add(early, ops::matmul(x, vGathered));
    padded = ops::mul(pGathered, ops::scalar(g, 2.0));
  }
  const auto feeds = test::makeFeeds(g, 1, 11);
  ReferenceEvaluator oracle{g};
  test::feedOracle(oracle, g, feeds);
  oracle.run();
  std::vector<std::vector<float>> runs;
  for (bool known : {false, true}) {
    INFO("host reads known: " << known);
    test::DeviceRun device = test::loadOnDevice(
        g, ExecutionMode::Vectorized, {},
        known ? std::optional(std::vector<TensorId>{result.id(), padded.id()}) : std::nullopt);
    Executable* executable = device.executable.get();
    CHECK(device.sim->stats().gatherAliases == (known ? 2 : 0));
    test::runDevice(*executable, feeds);
    for (const Tensor& t : {result, padded}) test::compareTensor(*executable, g, oracle, t.id());
    // A second run gathers the updated shards; both plans give the same bits.
    test::runDevice(*executable, feeds);
    std::vector<float> values;
    for (const Tensor& t : {result, padded, w.shard, v.shard}) {
      const std::vector<float> got = test::deviceValue(*executable, g, t.id(), 3);
      values.insert(values.end(), got.begin(), got.end());
    }
    runs.push_back(values);
  }
  CHECK(runs[0] == runs[1]);
}

TEST_CASE(
    "an elementwise step moves down to the chain that reads it when nothing between touches its values") {
  // `scaled` moves past `decayed`, the product and the write of v, and
  // chains with that write and the two sums; `decayed` reads v, which the
  // copy writes before decayed's reader, so it stays.
  Graph g(1);
  const Tensor x = ops::input(g, "x", {40, 30});
  const Tensor y = ops::input(g, "y", {40, 30});
  const Tensor a = ops::input(g, "a", {6, 8});
  const Tensor b = ops::input(g, "b", {8, 5});
  const Tensor v = ops::variable(g, "v", test::pseudoRandom(1200, 4), {40, 30});
  Tensor sum;
  Tensor product;
  Tensor decayed;
  {
    InSequence sequence(g);
    const Tensor scaled = ops::mul(x, ops::scalar(g, 0.5));
    decayed = ops::mul(v, ops::scalar(g, 0.25));
    product = ops::matmul(a, b);
    ops::copyInplace(v, y);
    sum = ops::add(ops::add(scaled, y), decayed);
  }
  const auto feeds = test::makeFeeds(g, 1, 13);
  ReferenceEvaluator oracle{g};
  test::feedOracle(oracle, g, feeds);
  oracle.run();
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    INFO(toString(mode));
    const bool vectorized = mode == ExecutionMode::Vectorized;
    test::DeviceRun device = test::loadOnDevice(g, mode);
    CHECK(device.sim->stats().sunkSteps == (vectorized ? 1 : 0));
    // The copy, scaled and the two sums.
    CHECK(device.sim->stats().chainedSteps == (vectorized ? 4 : 0));
    test::runDevice(*device.executable, feeds);
    CHECK(test::compareAll(*device.executable, g, oracle) > 0);
  }
}

TEST_CASE("a buffer that only ever holds a replicated value is stored once and read back on every replica") {
  // A replicated momentum in streaming memory, updated by a replicated value.
  Graph g(4);
  const RemoteBuffer buffer = ops::remoteBuffer(g, {6});
  ops::remoteVariable(g, "m", test::pseudoRandom(6, 3), buffer);
  const Tensor loaded = ops::remoteLoad(g, buffer, 0);
  const Tensor step = ops::variable(g, "step", test::pseudoRandom(6, 4), {6});
  const Tensor updated = ops::copyInplace(loaded, ops::add(ops::mul(loaded, ops::scalar(g, 0.5)), step));
  ops::remoteStore(g, buffer, 0, updated);
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    INFO(toString(mode));
    test::DeviceRun device = test::loadOnDevice(g, mode);
    CHECK(device.executable->layout(loaded.id()).numGroups() == (mode == ExecutionMode::Vectorized ? 1 : 4));
    test::runDevice(*device.executable, {});
    test::runDevice(*device.executable, {});
    std::vector<float> values(4 * 6);
    device.executable->readRemote(buffer.id(), 0, values);
    const std::vector<float> initial = test::pseudoRandom(6, 3);
    const std::vector<float> add = test::pseudoRandom(6, 4);
    for (int64_t r = 0; r < 4; ++r) {
      for (std::size_t k = 0; k < 6; ++k) {
        const float once = initial[k] * 0.5f + add[k];
        CHECK(values[static_cast<std::size_t>(r) * 6 + k] == doctest::Approx(once * 0.5f + add[k]));
      }
    }
  }
}

TEST_CASE("an MLP training step on 2 replicas x batch 4 equals 1 replica x batch 8") {
  Mlp two = makeMlp(2, 4);
  Mlp one = makeMlp(1, 8);
  test::DeviceRun onTwo = test::loadOnDevice(two.graph, ExecutionMode::Vectorized);
  test::DeviceRun onOne = test::loadOnDevice(one.graph, ExecutionMode::Vectorized);
  test::DeviceRun reference = test::loadOnDevice(two.graph, ExecutionMode::PerReplicaReference);
  // Both weight gradients are fused GEMM + all-reduce.
  CHECK(onTwo.sim->stats().fusedGemmAllReduces == 2);
  CHECK(onTwo.sim->stats().foldedTransposes >= 2);
  for (int step = 0; step < 3; ++step) {
    test::runDevice(*onTwo.executable, mlpFeeds(two, step));
    test::runDevice(*onOne.executable, mlpFeeds(one, step));
    test::runDevice(*reference.executable, mlpFeeds(two, step));
  }
  for (std::size_t i = 0; i < two.weights.size(); ++i) {
    INFO(two.weights[i].name());
    // The update keeps every weight shared across replicas.
    CHECK(onTwo.executable->layout(two.weights[i].id()).numGroups() == 1);
    const std::vector<float> a = readShared(*onTwo.executable, two.weights[i]);
    const std::vector<float> b = readShared(*onOne.executable, one.weights[i]);
    const std::vector<float> c = readShared(*reference.executable, two.weights[i]);
    REQUIRE(a.size() == b.size());
    REQUIRE(c.size() == 2 * a.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      CHECK(test::close(a[k], b[k], 1e-6));
      CHECK(test::close(c[k], b[k], 1e-6));
      CHECK(test::close(c[a.size() + k], b[k], 1e-6));
    }
  }
  // And the weights did move.
  CHECK_FALSE(readShared(*onOne.executable, one.weights[0]) == test::pseudoRandom(6 * 8, 21));
}

TEST_CASE(
    "dropout masks depend on the seed, the step and the element of the global batch, not the replicas") {
  // Global batch of 8 rows: 1 x 8, 2 x 4 and 4 x 2 replicas draw the same mask.
  const std::vector<float> data = test::pseudoRandom(8 * 5, 31);
  std::vector<float> expected;
  for (int64_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    Graph g(replicas);
    const Tensor x = ops::input(g, "x", {8 / replicas, 5});
    const Tensor counter = ops::variable(g, "counter", {0}, {}, std::nullopt, RetrievalMode::OnePerGroup,
                                         TensorCategory::OptimizerState, DType::Int32);
    const Tensor now = ops::copy(counter);
    const Tensor y = ops::dropout(x, now, 0.4, 123);
    ops::scaledAddInplace(counter, ops::constant(g, "one", {1}, {}, DType::Int32), 1.0, 1.0);
    test::DeviceRun run = test::loadOnDevice(g, ExecutionMode::Vectorized);
    std::vector<float> outputs;
    for (int step = 0; step < 2; ++step) {
      test::runDevice(*run.executable, {{x.id(), data}});
      std::vector<float> out(data.size());
      run.executable->read(y.id(), out);
      outputs.insert(outputs.end(), out.begin(), out.end());
    }
    if (expected.empty()) {
      expected = outputs;
      // Some elements dropped, some kept and scaled, and the two steps differ.
      int dropped = 0;
      for (std::size_t i = 0; i < data.size(); ++i) {
        if (outputs[i] == 0.0f) {
          ++dropped;
        } else {
          CHECK(outputs[i] == doctest::Approx(data[i] / 0.6f));
        }
      }
      CHECK(dropped > 5);
      CHECK(dropped < 30);
      CHECK_FALSE(std::equal(outputs.begin(), outputs.begin() + 40, outputs.begin() + 40));
    }
    CHECK(outputs == expected);
  }
}

TEST_CASE("running a loaded program allocates nothing") {
  Mlp m = makeMlp(4, 16);
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    test::DeviceRun device = test::loadOnDevice(m.graph, mode);
    std::vector<float> x = test::pseudoRandom(4 * 16 * 6, 1);
    std::vector<float> labels(4 * 16, 2.0f);
    const std::vector<Executable::Feed> feeds = {{m.x.id(), x}, {m.labels.id(), labels}};
    device.executable->run(feeds);
    const int64_t before = allocations.load();
    for (int step = 0; step < 3; ++step) device.executable->run(feeds);
    CHECK(allocations.load() - before == 0);
  }
  // Large products, whose packing buffers Eigen would otherwise take from the heap.
  Graph big(2);
  const Tensor x = ops::input(big, "x", {256, 384});
  const Tensor dy = ops::input(big, "dy", {256, 320});
  const Tensor w = ops::variable(big, "w", test::pseudoRandom(384 * 320, 9), {384, 320});
  ops::matmul(x, w);
  ops::replicatedAllReduce(ops::matmul(ops::transpose(x), dy), ReductionType::Mean);
  test::DeviceRun device = test::loadOnDevice(big, ExecutionMode::Vectorized);
  CHECK(device.sim->stats().fusedGemmAllReduces == 1);
  const std::vector<float> xs = test::pseudoRandom(2 * 256 * 384, 10);
  const std::vector<float> dys = test::pseudoRandom(2 * 256 * 320, 11);
  const std::vector<Executable::Feed> feeds = {{x.id(), xs}, {dy.id(), dys}};
  const int64_t before = allocations.load();
  device.executable->run(feeds);
  CHECK(allocations.load() - before == 0);
}

TEST_CASE("run rejects missing, unknown and mis-sized feeds") {
  Graph g(2);
  const Tensor x = ops::input(g, "x", {3});
  const Tensor w = ops::variable(g, "w", {1, 2, 3}, {3});
  ops::add(x, w);
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  std::vector<float> six(6, 1.0f);
  std::vector<float> five(5, 1.0f);
  struct Row {
    std::vector<Executable::Feed> feeds;
    std::string subject;
  };
  const std::vector<Row> table = {
      {{}, "x"},
      {{{x.id(), five}}, "x"},
      {{{x.id(), six}, {w.id(), six}}, fmt::format("tensor #{}", w.id())},
  };
  for (const Row& row : table) {
    const auto error = test::catchError<DeviceError>([&] { device.executable->run(row.feeds); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::InvalidProgram);
    CHECK(error->subject() == row.subject);
  }
}

TEST_CASE("a program carries its replica topology to the device") {
  // The topology is derived and checked where the program is made
  // (ReplicaTopology::fromOptions, checkReplicationFactor): the device only
  // asserts it, and simulates the replicas it names.
  Graph g(4);
  const Tensor x = ops::input(g, "x", {3});
  Program program{g};
  program.replicas = ReplicaTopology{4, 2, 2, 1};
  REQUIRE(program.replicas.consistent());
  auto executable = makeSimDevice()->load(program);
  CHECK(executable->layout(x.id()).numReplicas() == 2);
}

namespace {

// A momentum update: v = 0.9 v + g; w -= 0.1 v, then a read of both. 1200
// elements span several slices of a chain, the last one partial.
struct MomentumChain {
  Graph g{1};
  Tensor w = ops::variable(g, "w", test::pseudoRandom(40 * 30, 1), {40, 30});
  Tensor v = ops::variable(g, "v", test::pseudoRandom(40 * 30, 2), {40, 30});
  Tensor grad = ops::input(g, "grad", {40, 30});
  Tensor decayed = ops::mul(v, ops::scalar(g, 0.9));
  Tensor scaledGrad = ops::mul(grad, ops::scalar(g, 1.0));
  Tensor updated = ops::add(decayed, scaledGrad);
  Tensor stored = ops::copyInplace(v, updated);
  Tensor step = ops::mul(stored, ops::scalar(g, 0.1));
  Tensor moved = ops::scaledAddInplace(w, step, 1.0, -1.0);
  // Reads v after the in-place write; the shifted rows of the slices end the
  // chain, as a slice is not elementwise.
  Tensor difference = ops::sub(moved, v);
  Tensor result = ops::add(ops::slice(difference, {1, 0}, {40, 30}), ops::slice(moved, {0, 0}, {39, 30}));
  std::map<TensorId, std::vector<float>> feeds = test::makeFeeds(g, 1, 5);
  ReferenceEvaluator oracle{g};

  MomentumChain() {
    test::feedOracle(oracle, g, feeds);
    oracle.run();
  }
  MomentumChain(const MomentumChain&) = delete;
  MomentumChain& operator=(const MomentumChain&) = delete;
};

}  // namespace

TEST_CASE("consecutive elementwise steps over one range run as one chain, in place updates included") {
  const MomentumChain m;
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    test::DeviceRun device = test::loadOnDevice(m.g, mode);
    const bool vectorized = mode == ExecutionMode::Vectorized;
    // Mul, Mul, Add, CopyInplace, Mul, ScaledAddInplace, Sub; the Slices and
    // the last Add stay apart.
    CHECK(device.sim->stats().fusedChains == (vectorized ? 1 : 0));
    CHECK(device.sim->stats().chainedSteps == (vectorized ? 7 : 0));
    test::runDevice(*device.executable, m.feeds);
    CHECK(test::compareAll(*device.executable, m.g, m.oracle) > 0);
  }
}

TEST_CASE("a chain keeps values that only its later steps read in scratch when the host reads are known") {
  // The host reads `result`, which the slices (outside the chain) make.
  const MomentumChain m;
  const Graph& g = m.g;
  const auto& [w, v, grad, decayed, scaledGrad, updated, step, difference, result] =
      std::tie(m.w, m.v, m.grad, m.decayed, m.scaledGrad, m.updated, m.step, m.difference, m.result);
  const auto& feeds = m.feeds;
  const ReferenceEvaluator& oracle = m.oracle;

  SUBCASE(
      "decayed, scaledGrad and step live in scratch, updated is written straight into v; none is stored") {
    Program program{g};
    program.hostReads = std::vector<TensorId>{result.id()};
    auto executable = makeSimDevice()->load(std::move(program));
    const auto& sim = dynamic_cast<const sim::SimExecutable&>(*executable);
    CHECK(sim.stats().fusedChains == 1);
    CHECK(sim.stats().scratchValues == 3);
    CHECK(sim.stats().elidedCopies == 1);  // the copy of updated into v
    test::runDevice(*executable, feeds);
    for (const Tensor& t : {w, v, difference, result}) {
      const std::vector<float> got = test::deviceValue(*executable, g, t.id(), 0);
      const std::vector<double>& want = oracle.value(t.id(), 0);
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < got.size(); ++k) REQUIRE(test::close(got[k], want[k], 1e-6));
    }
    for (const Tensor& t : {decayed, scaledGrad, updated, step}) {
      std::vector<float> values(40 * 30);
      const auto error = test::catchError<DeviceError>([&] { executable->read(t.id(), values); });
      REQUIRE(error);
      CHECK(error->subject() == g.tensor(t.id()).name);
      CHECK(std::string(error->what()).find("never stores it") != std::string::npos);
    }
  }
  SUBCASE("a value the host reads is stored") {
    Program program{g};
    program.hostReads = std::vector<TensorId>{result.id(), updated.id()};
    auto executable = makeSimDevice()->load(std::move(program));
    CHECK(dynamic_cast<const sim::SimExecutable&>(*executable).stats().scratchValues == 3);
    CHECK(dynamic_cast<const sim::SimExecutable&>(*executable).stats().elidedCopies == 0);
    test::runDevice(*executable, feeds);
    const std::vector<float> got = test::deviceValue(*executable, g, updated.id(), 0);
    REQUIRE(got.size() == 40 * 30);
    for (std::size_t k = 0; k < got.size(); ++k)
      CHECK(test::close(got[k], oracle.value(updated.id(), 0)[k], 1e-6));
  }
  SUBCASE("without the list every value stays readable, and the reference plan keeps them all") {
    for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
      Program program{g};
      if (mode == ExecutionMode::PerReplicaReference) program.hostReads = std::vector<TensorId>{result.id()};
      auto executable = makeSimDevice({}, mode)->load(std::move(program));
      CHECK(dynamic_cast<const sim::SimExecutable&>(*executable).stats().scratchValues == 0);
      CHECK(dynamic_cast<const sim::SimExecutable&>(*executable).stats().elidedCopies == 0);
    }
  }
  SUBCASE("an id outside the graph is refused") {
    Program program{g};
    program.hostReads = std::vector<TensorId>{static_cast<TensorId>(g.tensors().size())};
    const auto error = test::catchError<DeviceError>([&] { makeSimDevice()->load(std::move(program)); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::InvalidProgram);
    CHECK(error->subject() == "Program.hostReads");
  }
}

namespace {

// Floats of every class from their bits: subnormals, normals near the bottom
// of the range and near the top (products underflow, round into the
// subnormals and overflow), zeros of both signs, infinities and NaNs. Every
// third block of 16 holds normals around 1 only (the kernels treat blocks
// without subnormals apart).
std::vector<float> floatsOfEveryClass(std::size_t n, uint64_t seed) {
  std::vector<float> out(n);
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (std::size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto bits = static_cast<uint32_t>(state >> 32);
    const uint32_t sign = bits & 0x80000000u;
    const uint32_t mantissa = bits & 0x007fffffu;
    uint32_t exponent = 0;
    switch ((i / 16) % 3 == 0 ? 3 : (state >> 20) % 8) {
      case 0: exponent = 0; break;  // subnormal
      case 1:
      case 2: exponent = 1 + (bits >> 23) % 40; break;  // tiny
      case 3:
      case 4: exponent = 100 + (bits >> 23) % 50; break;     // around 1
      case 5: exponent = 215 + (bits >> 23) % 39; break;     // huge
      case 6: exponent = (bits & 1u) != 0 ? 255 : 0; break;  // infinities, NaNs, zeros
      default: exponent = 127 - (bits >> 23) % 3; break;
    }
    const uint32_t m =
        exponent == 255 || (exponent == 0 && (state >> 40) % 2 == 0) ? mantissa & 0x00400001u : mantissa;
    out[i] = std::bit_cast<float>(sign | exponent << 23 | m);
  }
  return out;
}

// The same bits, or both NaN (which NaN's payload survives a product of two
// NaNs depends on the operand order the compiler chose).
bool sameFloat(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want);
}

}  // namespace

TEST_CASE("the vectorized elementwise kernels keep the scalar float operations' bits, subnormals included") {
  // On AVX-512, the flat steps and strided rows (planes, for the binary ops) of Add, Sub, Mul, Div, Sqrt,
  // Relu and ReluGrad and the flat steps of ScaledAddInplace run 16 floats
  // at a time, those of Erf, Exp, Tanh and Sigmoid 8 (vector_math.hpp), and Mul, Div and Sqrt take blocks
  // with a subnormal operand through double (no microcode assist); copies are block copies. All must keep the
  // bits of the scalar float operations at every tail length, with tensor and scalar operands, fused or not.
  for (const int64_t n : {1, 7, 8, 9, 15, 17, 1031}) {
    CAPTURE(n);
    Graph g{1};
    const std::vector<float> wInit = floatsOfEveryClass(static_cast<std::size_t>(n), 3);
    Tensor w = ops::variable(g, "w", wInit, {n});
    Tensor x = ops::input(g, "x", {n});
    Tensor y = ops::input(g, "y", {n});
    const float factor = 0.9f;
    Tensor both = ops::mul(x, y);
    Tensor scaled = ops::mul(x, ops::scalar(g, factor));
    Tensor scaledFirst = ops::mul(ops::scalar(g, 3.0e-30f), y);
    Tensor quotient = ops::div(x, y);
    Tensor quotientScalar = ops::div(x, ops::scalar(g, 3.0e10f));
    Tensor root = ops::sqrt(y);
    Tensor sum = ops::add(x, y);
    Tensor difference = ops::sub(ops::scalar(g, 1.5f), y);
    Tensor rectified = ops::relu(x);
    Tensor errorFunction = ops::erf(x);
    Tensor exponential = ops::exp(y);
    Tensor hyperbolic = ops::tanh(x);
    Tensor logistic = ops::sigmoid(y);
    Tensor masked{&g, g.op(g.addOp(OpKind::ReluGrad, {y.id(), x.id()})).outputs[0]};
    Tensor copied = ops::copy(ops::reshape(y, {1, n}));
    Tensor moved = ops::scaledAddInplace(w, scaled, 0.75, -0.1);
    // A broadcast (a bias addition): strided rows, never a flat step.
    Tensor rows = ops::input(g, "rows", {3, n});
    Tensor biased = ops::add(rows, y);
    // Rows scaled by a value each, a value divided by each row's elements,
    // and rows divided by one row: planes of a row-wise step, each row's
    // last vector through masks, subnormal operands through double.
    Tensor column = ops::input(g, "column", {3, 1});
    Tensor rowsScaled = ops::mul(rows, column);
    Tensor columnDivided = ops::div(column, rows);
    Tensor rowsDivided = ops::div(rows, y);
    std::map<TensorId, std::vector<float>> feeds;
    feeds[rows.id()] = floatsOfEveryClass(3 * static_cast<std::size_t>(n), 4);
    feeds[column.id()] = {3.0e-30f, 1.0e-40f, -7.0f};
    const std::vector<float>& columnValues = feeds[column.id()];
    const std::vector<float>& rowValues = feeds[rows.id()];
    feeds[x.id()] = floatsOfEveryClass(static_cast<std::size_t>(n), 1);
    feeds[y.id()] = floatsOfEveryClass(static_cast<std::size_t>(n), 2);
    const std::vector<float>& xs = feeds[x.id()];
    const std::vector<float>& ys = feeds[y.id()];

    for (const ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
      CAPTURE(static_cast<int>(mode));
      test::DeviceRun device = test::loadOnDevice(g, mode);
      if (mode == ExecutionMode::Vectorized) CHECK(device.sim->stats().fusedChains >= 1);
      test::runDevice(*device.executable, feeds);
      const auto value = [&](const Tensor& t) { return test::deviceValue(*device.executable, g, t.id(), 0); };
      const std::vector<float> gotBoth = value(both);
      const std::vector<float> gotScaled = value(scaled);
      const std::vector<float> gotFirst = value(scaledFirst);
      const std::vector<float> gotMoved = value(moved);
      const std::vector<float> gotQuotient = value(quotient);
      const std::vector<float> gotQuotientScalar = value(quotientScalar);
      const std::vector<float> gotRoot = value(root);
      const std::vector<float> gotSum = value(sum);
      const std::vector<float> gotDifference = value(difference);
      const std::vector<float> gotRectified = value(rectified);
      const std::vector<float> gotErf = value(errorFunction);
      const std::vector<float> gotExp = value(exponential);
      const std::vector<float> gotTanh = value(hyperbolic);
      const std::vector<float> gotSigmoid = value(logistic);
      const std::vector<float> gotMasked = value(masked);
      const std::vector<float> gotCopied = value(copied);
      const std::vector<float> gotBiased = value(biased);
      const std::vector<float> gotRowsScaled = value(rowsScaled);
      const std::vector<float> gotColumnDivided = value(columnDivided);
      const std::vector<float> gotRowsDivided = value(rowsDivided);
      for (const std::vector<float>* got :
           {&gotBoth, &gotScaled, &gotFirst, &gotMoved, &gotQuotient, &gotQuotientScalar, &gotRoot, &gotSum,
            &gotDifference, &gotRectified, &gotErf, &gotExp, &gotTanh, &gotSigmoid, &gotMasked, &gotCopied})
        REQUIRE(got->size() == static_cast<std::size_t>(n));
      for (const std::vector<float>* got : {&gotBiased, &gotRowsScaled, &gotColumnDivided, &gotRowsDivided})
        REQUIRE(got->size() == 3 * static_cast<std::size_t>(n));
      int subnormalResults = 0;
      for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
        CAPTURE(i);
        const float scaledWant = xs[i] * factor;
        // Both products rounded to double before the sum, then to float.
        const double a = static_cast<double>(0.75f) * wInit[i];
        const double b = static_cast<double>(-0.1f) * scaledWant;
        REQUIRE(sameFloat(gotBoth[i], xs[i] * ys[i]));
        REQUIRE(sameFloat(gotScaled[i], scaledWant));
        REQUIRE(sameFloat(gotFirst[i], 3.0e-30f * ys[i]));
        REQUIRE(sameFloat(gotMoved[i], static_cast<float>(a + b)));
        REQUIRE(sameFloat(gotQuotient[i], xs[i] / ys[i]));
        REQUIRE(sameFloat(gotQuotientScalar[i], xs[i] / 3.0e10f));
        REQUIRE(sameFloat(gotRoot[i], std::sqrt(ys[i])));
        REQUIRE(sameFloat(gotSum[i], xs[i] + ys[i]));
        REQUIRE(sameFloat(gotDifference[i], 1.5f - ys[i]));
        REQUIRE(sameFloat(gotRectified[i], xs[i] > 0.0f ? xs[i] : 0.0f));
        // Erf, Exp, Tanh and Sigmoid: the vector forms of vector_math.hpp,
        // against the scalar ones.
        REQUIRE(sameFloat(gotErf[i], sim::erfOf(xs[i])));
        REQUIRE(sameFloat(gotExp[i], sim::exponentialOf(ys[i])));
        REQUIRE(sameFloat(gotTanh[i], sim::tanhOf(xs[i])));
        REQUIRE(sameFloat(gotSigmoid[i], sim::sigmoidOf(ys[i])));
        REQUIRE(sameFloat(gotMasked[i], xs[i] > 0.0f ? ys[i] : 0.0f));
        // A copy keeps NaN payloads too.
        REQUIRE(std::bit_cast<uint32_t>(gotCopied[i]) == std::bit_cast<uint32_t>(ys[i]));
        for (const float v : {gotBoth[i], gotQuotient[i], gotQuotientScalar[i]})
          if (std::fpclassify(v) == FP_SUBNORMAL) ++subnormalResults;
      }
      for (std::size_t i = 0; i < 3 * static_cast<std::size_t>(n); ++i) {
        CAPTURE(i);
        const float rowValue = rowValues[i];
        const float columnValue = columnValues[i / static_cast<std::size_t>(n)];
        const float yValue = ys[i % static_cast<std::size_t>(n)];
        REQUIRE(sameFloat(gotBiased[i], rowValue + yValue));
        REQUIRE(sameFloat(gotRowsScaled[i], rowValue * columnValue));
        REQUIRE(sameFloat(gotColumnDivided[i], columnValue / rowValue));
        REQUIRE(sameFloat(gotRowsDivided[i], rowValue / yValue));
      }
      if (n == 1031) CHECK(subnormalResults > 100);
    }
  }
}

TEST_CASE("a gather index outside the table is a device error naming the op and the index") {
  Graph g(2);
  const Tensor table = ops::variable(g, "table", test::pseudoRandom(10, 3), {5, 2});
  const Tensor ids = ops::input(g, "ids", {3}, DType::Int32);
  ops::gather(table, ids);
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  const std::vector<float> feed{0, 4, -5, 1, 5, 2};  // replica 1's second index is out of range
  try {
    test::runDevice(*device.executable, {{ids.id(), feed}});
    FAIL("an index outside the table was accepted");
  } catch (const DeviceError& e) {
    CHECK(e.code() == ErrorCode::InvalidProgram);
    CHECK(e.subject() == "Gather");
    CHECK(std::string(e.what()).find("Gather: index 5 (element 1) is outside [-5, 5)") != std::string::npos);
  }
}

TEST_CASE("max pools give each window's first maximum and route its gradient there, on every kernel path") {
  // Ties, signed zeros, infinities and NaNs, in windows that tile the
  // input, overlap, hang over pads, or are cut short (ceil mode), with
  // window counts that leave a partial vector of 8. The reference
  // evaluator picks the first maximum in scan order; the gradients are
  // small integers, so their sums are exact.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {-0.0f, 0.0f, 1.0f, -1.0f, 2.0f, 2.0f, nan, -inf, inf, 1.0f};
  struct Case {
    const char* name;
    Shape x;
    ops::PoolParams params;
  };
  const std::vector<Case> cases = {
      {"2 x 2, stride 2", {2, 3, 8, 8}, {.kernel = {2, 2}, .strides = {2, 2}}},
      {"3 x 3, stride 1, pads 1", {1, 2, 7, 9}, {.kernel = {3, 3}, .strides = {1, 1}, .pads = {1, 1, 1, 1}}},
      {"2 x 3, stride 2, ceil mode", {1, 1, 5, 5}, {.kernel = {2, 3}, .strides = {2, 2}, .ceilMode = true}},
      {"1-D 3, stride 2, dilation 2, pads 2 and 1",
       {2, 2, 11},
       {.kernel = {3}, .strides = {2}, .pads = {2, 1}, .dilations = {2}}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Graph g{1};
    const Tensor x = ops::input(g, "x", c.x);
    const Tensor y = ops::maxPool(x, c.params);
    const Tensor dy = ops::input(g, "dy", y.shape());
    const Tensor dx = autodiff(g, ops::reduceSum(ops::mul(y, dy)), {x})[0];
    std::map<TensorId, std::vector<float>> feeds;
    uint64_t state = 17;
    const auto next = [&] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<std::size_t>(state >> 33);
    };
    for (int64_t i = 0; i < numElements(c.x); ++i) feeds[x.id()].push_back(values[next() % values.size()]);
    for (int64_t i = 0; i < numElements(y.shape()); ++i)
      feeds[dy.id()].push_back(static_cast<float>(1 + next() % 4));
    ReferenceEvaluator oracle{g};
    test::feedOracle(oracle, g, feeds);
    oracle.run();
    test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
    test::runDevice(*device.executable, feeds);
    for (const Tensor& t : {y, dx}) {
      const std::vector<float> got = test::deviceValue(*device.executable, g, t.id(), 0);
      const std::vector<double>& want = oracle.value(t.id(), 0);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        CHECK(sameFloat(got[i], static_cast<float>(want[i])));
      }
    }
  }
}

TEST_CASE("convolutions and pools give every replica the same bits whatever the number of replicas") {
  // Replica r of an R-replica run gets the data of the one-replica run, so
  // each of its values must equal that run's bit for bit.
  auto build = [](Graph& g) {
    const Tensor x = ops::input(g, "x", {3, 4, 9, 8});
    const Tensor w = ops::variable(g, "w", test::pseudoRandom(6 * 2 * 3 * 3, 31), {6, 2, 3, 3});
    const Tensor y = ops::conv(x, w, {.strides = {2, 1}, .pads = {1, 1, 0, 1}, .group = 2});
    const Tensor p = ops::maxPool(ops::relu(y), {.kernel = {2, 2}, .strides = {2, 2}, .ceilMode = true});
    const Tensor a = ops::averagePool(p, {.kernel = {2, 2}, .pads = {1, 1, 0, 0}});
    const Tensor loss = ops::reduceSum(ops::mul(a, a));
    const std::vector<Tensor> grads = autodiff(g, loss, {x, w});
    return std::vector<TensorId>{y.id(), a.id(), grads[0].id(), grads[1].id()};
  };
  Graph one(1);
  const std::vector<TensorId> tensors = build(one);
  const auto feeds = test::makeFeeds(one, 5, 3);
  test::DeviceRun single = test::loadOnDevice(one, ExecutionMode::Vectorized);
  test::runDevice(*single.executable, feeds);
  Graph four(4);
  build(four);
  std::map<TensorId, std::vector<float>> repeated;
  for (const auto& [t, data] : feeds) {
    for (int r = 0; r < 4; ++r) repeated[t].insert(repeated[t].end(), data.begin(), data.end());
  }
  test::DeviceRun many = test::loadOnDevice(four, ExecutionMode::Vectorized);
  test::runDevice(*many.executable, repeated);
  for (TensorId t : tensors) {
    const std::vector<float> want = test::deviceValue(*single.executable, one, t, 0);
    REQUIRE(!want.empty());
    for (int64_t r = 0; r < 4; ++r) {
      CAPTURE(one.tensor(t).name);
      CAPTURE(r);
      CHECK(test::deviceValue(*many.executable, four, t, r) == want);
    }
  }
}

namespace {

// The largest error of a tensor against the double reference, relative to
// the largest magnitude of the reference's values.
double relativeError(const Executable& executable, const Graph& graph, const ReferenceEvaluator& oracle, Tensor t) {
  const std::vector<float> got = test::deviceValue(executable, graph, t.id(), 0);
  const std::vector<double>& want = oracle.value(t.id(), 0);
  REQUIRE(got.size() == want.size());
  double error = 0.0;
  double largest = 0.0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    error = std::max(error, std::abs(static_cast<double>(got[k]) - want[k]));
    largest = std::max(largest, std::abs(want[k]));
  }
  return largest > 0.0 ? error / largest : error;
}

}  // namespace

TEST_CASE("batch normalisation over 16 x 32 x 32 values a channel is as accurate as float32 allows") {
  // BatchNormalization in training mode as the ONNX importer composes it,
  // over inputs far from zero (post-ReLU activations): every statistic and
  // gradient is a sum of 16,384 terms a channel. Summed term by term in
  // float32 their error grows with the count; the reductions accumulate in
  // double, so what is left is the rounding of the elementwise ops and of
  // each sum's result.
  Graph g(1);
  const Shape shape{16, 4, 32, 32};
  const std::vector<int64_t> axes{0, 2, 3};
  const Tensor x = ops::input(g, "x", shape);
  const Tensor dy = ops::input(g, "dy", shape);
  const Tensor scale = ops::variable(g, "scale", test::pseudoRandom(4, 5, 0.5f, 1.5f), {1, 4, 1, 1});
  const Tensor bias = ops::variable(g, "bias", test::pseudoRandom(4, 6), {1, 4, 1, 1});
  const Tensor mean = ops::reduceMean(x, axes, true);
  const Tensor centred = ops::sub(x, mean);
  const Tensor variance = ops::reduceMean(ops::mul(centred, centred), axes, true);
  const Tensor normalised = ops::div(centred, ops::sqrt(ops::add(variance, ops::scalar(g, 1e-5))));
  const Tensor y = ops::add(ops::mul(normalised, scale), bias);
  const Tensor loss = ops::reduceSum(ops::mul(y, dy));
  const std::vector<Tensor> grads = autodiff(g, loss, {x, scale, bias});

  std::map<TensorId, std::vector<float>> feeds;
  feeds[x.id()] = test::pseudoRandom(static_cast<std::size_t>(numElements(shape)), 21, 2.0f, 6.0f);
  feeds[dy.id()] = test::pseudoRandom(static_cast<std::size_t>(numElements(shape)), 22);
  std::vector<TensorId> reads{mean.id(), variance.id(), y.id()};
  for (const Tensor& t : grads) reads.push_back(t.id());
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized, {}, reads);
  ReferenceEvaluator oracle(g);
  test::feedOracle(oracle, g, feeds);
  test::runDevice(*device.executable, feeds);
  oracle.run();

  const double meanError = relativeError(*device.executable, g, oracle, mean);
  const double varianceError = relativeError(*device.executable, g, oracle, variance);
  const double outputError = relativeError(*device.executable, g, oracle, y);
  const double inputGradError = relativeError(*device.executable, g, oracle, grads[0]);
  const double scaleGradError = relativeError(*device.executable, g, oracle, grads[1]);
  const double biasGradError = relativeError(*device.executable, g, oracle, grads[2]);
  CAPTURE(meanError);
  CAPTURE(varianceError);
  CAPTURE(outputError);
  CAPTURE(inputGradError);
  CAPTURE(scaleGradError);
  CAPTURE(biasGradError);
  // Measured: 2.4e-8, 3.6e-8, 1.2e-7, 2.4e-7, 3.3e-7, 1.6e-8; summed term by
  // term in float32 the statistics and the parameters' gradients were 3.5x,
  // 1.6x, 1.8x and 7x further off (8.4e-8, 5.9e-8, 5.9e-7, 1.2e-7).
  CHECK(meanError <= 6e-8);  // half of float32's epsilon: the mean's rounding
  CHECK(varianceError <= 6e-8);
  CHECK(outputError <= 2e-7);
  CHECK(inputGradError <= 4e-7);
  CHECK(scaleGradError <= 4e-7);
  CHECK(biasGradError <= 6e-8);
}

TEST_CASE("the batch normalisation ops over 16 x 32 x 32 values a channel are as accurate as float32 allows") {
  // The same statistics, output and gradients as the composition above, by
  // the normalization family's ops (what the ONNX importer makes of
  // BatchNormalization in training mode): every sum and every element's
  // arithmetic in double, each output rounded once. The bounds are the
  // composition's.
  Graph g(1);
  const Shape shape{16, 4, 32, 32};
  const Tensor x = ops::input(g, "x", shape);
  const Tensor dy = ops::input(g, "dy", shape);
  const Tensor scale = ops::variable(g, "scale", test::pseudoRandom(4, 5, 0.5f, 1.5f), {4});
  const Tensor bias = ops::variable(g, "bias", test::pseudoRandom(4, 6), {4});
  const ops::BatchNormOutputs bn = ops::batchNormTraining(x, scale, bias);
  const Tensor loss = ops::reduceSum(ops::mul(bn.y, dy));
  const std::vector<Tensor> grads = autodiff(g, loss, {x, scale, bias});

  std::map<TensorId, std::vector<float>> feeds;
  feeds[x.id()] = test::pseudoRandom(static_cast<std::size_t>(numElements(shape)), 21, 2.0f, 6.0f);
  feeds[dy.id()] = test::pseudoRandom(static_cast<std::size_t>(numElements(shape)), 22);
  std::vector<TensorId> reads{bn.mean.id(), bn.variance.id(), bn.y.id()};
  for (const Tensor& t : grads) reads.push_back(t.id());
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized, {}, reads);
  ReferenceEvaluator oracle(g);
  test::feedOracle(oracle, g, feeds);
  test::runDevice(*device.executable, feeds);
  oracle.run();

  const double meanError = relativeError(*device.executable, g, oracle, bn.mean);
  const double varianceError = relativeError(*device.executable, g, oracle, bn.variance);
  const double outputError = relativeError(*device.executable, g, oracle, bn.y);
  const double inputGradError = relativeError(*device.executable, g, oracle, grads[0]);
  const double scaleGradError = relativeError(*device.executable, g, oracle, grads[1]);
  const double biasGradError = relativeError(*device.executable, g, oracle, grads[2]);
  MESSAGE("mean " << meanError << ", variance " << varianceError << ", output " << outputError << ", dx "
                  << inputGradError << ", dscale " << scaleGradError << ", dbias " << biasGradError);
  CHECK(meanError <= 6e-8);
  CHECK(varianceError <= 6e-8);
  CHECK(outputError <= 2e-7);
  CHECK(inputGradError <= 4e-7);
  CHECK(scaleGradError <= 4e-7);
  CHECK(biasGradError <= 6e-8);
}

TEST_CASE("a reduction of 65,536 terms a value is rounded once, from a double sum") {
  // A bias gradient over a large batch (rows into one row), a statistic of
  // short rows, a whole tensor into one value: each within float32's
  // rounding of the exact sum, where term-by-term float32 sums drift by
  // hundreds of roundings.
  Graph g(1);
  const Tensor rows = ops::input(g, "rows", {65536, 4});
  const Tensor shortRows = ops::input(g, "short", {4, 16384, 4});
  const Tensor columnSums = ops::reduceSum(rows, {0});
  const Tensor shortSums = ops::reduceMean(shortRows, {1, 2});
  const Tensor total = ops::reduceSum(rows);
  OpAttributes toRow;
  toRow.shape = {1, 4};
  const Tensor toShape = make(g, OpKind::ReduceToShape, {ops::mul(rows, rows)}, toRow);
  std::map<TensorId, std::vector<float>> feeds;
  feeds[rows.id()] = test::pseudoRandom(65536 * 4, 31, 2.0f, 6.0f);
  feeds[shortRows.id()] = test::pseudoRandom(4 * 16384 * 4, 32, 2.0f, 6.0f);
  const std::vector<TensorId> reads{columnSums.id(), shortSums.id(), total.id(), toShape.id()};
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    test::DeviceRun device = test::loadOnDevice(g, mode, {}, reads);
    ReferenceEvaluator oracle(g);
    test::feedOracle(oracle, g, feeds);
    test::runDevice(*device.executable, feeds);
    oracle.run();
    for (const Tensor& t : {columnSums, shortSums, total, toShape}) {
      const double error = relativeError(*device.executable, g, oracle, t);
      const std::string name = g.tensor(t.id()).name;
      CAPTURE(name);
      CAPTURE(error);
      CHECK(error <= 6e-8);  // half of float32's epsilon: the rounding of the result
    }
  }
}
