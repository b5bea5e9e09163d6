#include "support/reference_evaluator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

#include "half.hpp"
#include "op_def.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera::test {
namespace {

using Values = std::vector<double>;

[[noreturn]] void fail(const std::string& message) {
  throw std::invalid_argument("ReferenceEvaluator: " + message);
}

std::size_t count(const Shape& shape) { return static_cast<std::size_t>(numElements(shape)); }

// The rounding model of float16 storage: a value stored in a float16 tensor
// is the half nearest to it, rounded once. (Through float32 first is the
// same only for a value that one operation made from halves, 24 >= 2 x 11 + 2
// bits; the reference's doubles come from whole chains of operations.)
void roundIfHalf(DType dtype, Values& values) {
  if (dtype != DType::Float16) return;
  for (double& v : values) v = static_cast<double>(roundDoubleToHalf(v));
}

}  // namespace

ReferenceEvaluator::ReferenceEvaluator(const Graph& graph)
    : graph_(graph), replicas_(graph.replicationFactor()) {
  const auto r = static_cast<std::size_t>(replicas_);
  storage_.assign(r, std::vector<Values>(graph.tensors().size()));
  feeds_.assign(r, std::vector<Values>(graph.tensors().size()));
  buffers_.resize(r);
  for (auto& perReplica : buffers_) {
    for (const RemoteBufferInfo& info : graph.remoteBuffers()) {
      perReplica.emplace_back(static_cast<std::size_t>(info.entries), Values(count(info.shape), 0.0));
    }
  }
  for (const OpNode& op : graph.ops())
    if (op.kind == OpKind::Variable) initialiseVariable(op.outputs[0]);
}

void ReferenceEvaluator::initialiseVariable(TensorId t) {
  const TensorNode& node = graph_.tensor(t);
  const bool sharded = !node.metaShape.empty();
  const Shape& hostShape = sharded ? node.metaShape : node.shape;
  const std::size_t n = count(hostShape);
  const ReplicaGrouping grouping = node.grouping.value_or(ReplicaGrouping(replicas_));
  const std::vector<float> data = node.initial.values();
  for (int64_t r = 0; r < replicas_; ++r) {
    const int64_t group = grouping.numGroups() > 1 ? grouping.groupAt(r) : 0;
    const auto first = data.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(group) * n);
    Values host(first, first + static_cast<std::ptrdiff_t>(n));
    Values value =
        sharded ? reference::shardOf(host, node.shardCount, shardIndexAt(node, replicas_, r)) : host;
    roundIfHalf(node.dtype, value);
    if (node.remoteBuffer >= 0) {
      buffers_[static_cast<std::size_t>(r)][static_cast<std::size_t>(node.remoteBuffer)]
              [static_cast<std::size_t>(node.remoteEntry)] = value;
    }
    slot(t, r) = std::move(value);
  }
}

ReferenceEvaluator::Values& ReferenceEvaluator::slot(TensorId t, int64_t replica) {
  return storage_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(graph_.storageOf(t))];
}

const std::vector<double>& ReferenceEvaluator::value(TensorId t, int64_t replica) const {
  if (replica < 0 || replica >= replicas_) fail(fmt::format("replica {} out of range", replica));
  return storage_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(graph_.storageOf(t))];
}

double ReferenceEvaluator::sumOverReplicas(TensorId t) const {
  double sum = 0.0;
  for (int64_t r = 0; r < replicas_; ++r) sum += value(t, r).at(0);
  return sum;
}

std::vector<double>& ReferenceEvaluator::state(TensorId variable, int64_t replica) {
  if (graph_.op(graph_.tensor(variable).producer).kind != OpKind::Variable) {
    fail(fmt::format("\"{}\" is not a variable", graph_.tensor(variable).name));
  }
  return slot(variable, replica);
}

const std::vector<double>& ReferenceEvaluator::buffer(int64_t buffer, int64_t entry, int64_t replica) const {
  return buffers_.at(static_cast<std::size_t>(replica))
      .at(static_cast<std::size_t>(buffer))
      .at(static_cast<std::size_t>(entry));
}

void ReferenceEvaluator::feed(TensorId input, int64_t replica, std::vector<double> values) {
  const TensorNode& node = graph_.tensor(input);
  if (graph_.op(node.producer).kind != OpKind::Input) fail(fmt::format("\"{}\" is not an input", node.name));
  if (values.size() != count(node.shape)) {
    fail(fmt::format("input \"{}\" {} needs {} values, got {}", node.name, shapeStr(node.shape),
                     count(node.shape), values.size()));
  }
  if (replica < 0 || replica >= replicas_) fail(fmt::format("replica {} out of range", replica));
  roundIfHalf(node.dtype, values);
  feeds_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(input)] = std::move(values);
}

void ReferenceEvaluator::feedAll(TensorId input, const std::vector<double>& values) {
  for (int64_t r = 0; r < replicas_; ++r) feed(input, r, values);
}

// The evaluator's state as an op's reference sees it: inputs from storage,
// outputs into fresh zeroed values that replace the output's storage once
// the op has run on every replica it runs on.
class ReferenceEvaluator::Op final : public ReferenceOp {
 public:
  Op(ReferenceEvaluator& evaluator, const OpNode& op)
      : ReferenceOp(evaluator.graph_, op), evaluator_(evaluator) {
    if (!op.outputs.empty()) {
      outputs_.assign(static_cast<std::size_t>(evaluator.replicas_),
                      Values(count(evaluator.graph_.tensor(op.outputs[0]).shape), 0.0));
    }
  }
  int64_t replicas() const override { return evaluator_.replicas_; }
  const Values& in(std::size_t i, int64_t replica) const override {
    return evaluator_.value(op().inputs.at(i), replica);
  }
  Values& out(int64_t replica) override {
    if (outputs_.empty()) fail("has no output");
    return outputs_.at(static_cast<std::size_t>(replica));
  }
  const Values& feed(int64_t replica) const override {
    return evaluator_.feeds_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(op().outputs[0])];
  }
  Values& remote(int64_t buffer, int64_t entry, int64_t replica) override {
    return evaluator_.buffers_.at(static_cast<std::size_t>(replica))
        .at(static_cast<std::size_t>(buffer))
        .at(static_cast<std::size_t>(entry));
  }
  // Stores the outputs computed on `replicas`.
  void commit(std::span<const int64_t> replicas) {
    if (outputs_.empty()) return;
    const DType dtype = evaluator_.graph_.tensor(op().outputs[0]).dtype;
    for (int64_t r : replicas) {
      Values& out = outputs_[static_cast<std::size_t>(r)];
      roundIfHalf(dtype, out);
      evaluator_.slot(op().outputs[0], r) = std::move(out);
    }
  }

 private:
  ReferenceEvaluator& evaluator_;
  std::vector<Values> outputs_;
};

void ReferenceEvaluator::run() {
  std::vector<int64_t> all(static_cast<std::size_t>(replicas_));
  for (int64_t r = 0; r < replicas_; ++r) all[static_cast<std::size_t>(r)] = r;
  for (OpId id : graph_.schedule()) {
    const OpNode& op = graph_.op(id);
    const OpDef& def = opDef(op.kind);
    if (def.reference == nullptr) continue;  // a variable: its state lives in storage
    Op evaluation(*this, op);
    if (def.acrossReplicas) {
      def.reference(evaluation, -1);
    } else {
      for (int64_t r = 0; r < replicas_; ++r) def.reference(evaluation, r);
    }
    evaluation.commit(all);
  }
}

}  // namespace tessera::test
