#include "gradient_accumulation.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "locations.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"

namespace tessera {
namespace {

bool isSource(OpKind kind) {
  return kind == OpKind::Input || kind == OpKind::Variable || kind == OpKind::Constant;
}

// Copies a graph into `out`, unrolling the ops that depend on input data.
class Unroller {
 public:
  Unroller(const Graph& in, Graph& out, int64_t factor)
      : in_(in), out_(out), factor_(factor), perBatch_(in.tensors().size(), 0),
        tensorMap_(in.tensors().size()), opMap_(in.ops().size()) {
    for (const OpNode& op : in.ops()) {
      const bool data = op.kind == OpKind::Input ||
                        std::any_of(op.inputs.begin(), op.inputs.end(),
                                    [&](TensorId t) { return perBatch_[static_cast<std::size_t>(t)] != 0; });
      for (TensorId t : op.outputs) perBatch_[static_cast<std::size_t>(t)] = data ? 1 : 0;
    }
  }

  bool perBatch(const OpNode& op) const {
    return op.kind == OpKind::Input ||
           (!op.outputs.empty() ? perBatch_[static_cast<std::size_t>(op.outputs.front())] != 0
                                : std::any_of(op.inputs.begin(), op.inputs.end(), [&](TensorId t) {
                                    return perBatch_[static_cast<std::size_t>(t)] != 0;
                                  }));
  }

  // The copy of `t` for micro-batch i (the only copy when t is computed once).
  TensorId mapped(TensorId t, int64_t i) const {
    const std::vector<TensorId>& copies = tensorMap_[static_cast<std::size_t>(t)];
    return copies.size() == 1 ? copies.front() : copies.at(static_cast<std::size_t>(i));
  }

  // Sources and the ops that do not depend on input data, once; inputs get
  // the micro-batch dimension.
  void copyShared() {
    for (std::size_t id = 0; id < in_.ops().size(); ++id) {
      const OpNode& op = in_.ops()[id];
      if (isSource(op.kind)) {
        TensorNode node = in_.tensor(op.outputs.front());
        if (op.kind == OpKind::Input) node.shape.insert(node.shape.begin(), factor_);
        const TensorId t = out_.addSource(op.kind, std::move(node));
        opMap_[id].push_back(out_.tensor(t).producer);
        // An input's micro-batches are its slices, made by sliceInputs().
        if (op.kind == OpKind::Input) {
          fullInputs_.emplace_back(op.outputs.front(), t);
        } else {
          tensorMap_[static_cast<std::size_t>(op.outputs.front())].push_back(t);
        }
      } else if (!perBatch(op)) {
        copyOp(static_cast<OpId>(id), -1);
      }
    }
  }

  void sliceInputs(int64_t i) {
    for (const auto& [original, full] : fullInputs_) {
      const Tensor whole{&out_, full};
      Shape starts(whole.shape().size(), 0);
      Shape ends = whole.shape();
      starts.front() = i;
      ends.front() = i + 1;
      const Shape microShape(whole.shape().begin() + 1, whole.shape().end());
      const Tensor sliced = ops::slice(whole, starts, ends);
      out_.rename(sliced.id(), out_.uniqueName(fmt::format("{}.mb{}.slice", whole.name(), i)));
      const Tensor micro = ops::reshape(sliced, microShape);
      out_.rename(micro.id(), out_.uniqueName(fmt::format("{}.mb{}", whole.name(), i)));
      tensorMap_[static_cast<std::size_t>(original)].push_back(micro.id());
    }
  }

  void copyMicroBatch(int64_t i) {
    for (std::size_t id = 0; id < in_.ops().size(); ++id) {
      const OpNode& op = in_.ops()[id];
      if (!isSource(op.kind) && perBatch(op)) copyOp(static_cast<OpId>(id), i);
    }
  }

  // Re-creates the program order constraints of the original graph: a copy
  // runs after the copy of the same micro-batch, or after every copy of an
  // op that was unrolled when it was not.
  void copyOrder() {
    for (std::size_t id = 0; id < in_.ops().size(); ++id) {
      const std::vector<OpId>& copies = opMap_[id];
      for (OpId before : in_.ops()[id].after) {
        const std::vector<OpId>& targets = opMap_[static_cast<std::size_t>(before)];
        for (std::size_t j = 0; j < copies.size(); ++j) {
          if (targets.size() == 1) {
            out_.addAfter(copies[j], targets.front());
          } else if (copies.size() > 1) {
            out_.addAfter(copies[j], targets[j]);
          } else {
            for (OpId target : targets) out_.addAfter(copies[j], target);
          }
        }
      }
    }
  }

 private:
  // Copies op `id` for micro-batch i (i < 0: the one copy of a shared op).
  void copyOp(OpId id, int64_t i) {
    const OpNode& op = in_.op(id);
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size());
    for (TensorId t : op.inputs) inputs.push_back(mapped(t, std::max<int64_t>(i, 0)));
    const OpId copy = out_.addOp(op.kind, std::move(inputs), op.attributes,
                                 i < 0 ? op.name : fmt::format("{}.mb{}", op.name, i));
    out_.copyRecomputeMarks(copy, op);
    const std::vector<TensorId> outputs = out_.op(copy).outputs;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const TensorNode& original = in_.tensor(op.outputs[k]);
      const std::string name = i < 0 ? original.name : fmt::format("{}.mb{}", original.name, i);
      if (out_.tensor(outputs[k]).name != name) out_.rename(outputs[k], out_.uniqueName(name));
      out_.tensor(outputs[k]).category = original.category;
      tensorMap_[static_cast<std::size_t>(op.outputs[k])].push_back(outputs[k]);
    }
    opMap_[static_cast<std::size_t>(id)].push_back(copy);
  }

  const Graph& in_;
  Graph& out_;
  int64_t factor_;
  std::vector<char> perBatch_;
  std::vector<std::vector<TensorId>> tensorMap_;
  std::vector<std::vector<OpId>> opMap_;
  std::vector<std::pair<TensorId, TensorId>> fullInputs_;  // (original, [af, ...] copy)
};

}  // namespace

GradientAccumulationTransform::GradientAccumulationTransform(const SessionOptions& options,
                                                             TrainingTensors& tensors, DType accumType)
    : options_(options), factor_(options.getAccumulationFactor()), reduction_(options.accumulationAndReplicationReductionType),
      strategy_(options.meanAccumulationAndReplicationReductionStrategy), tensors_(tensors), accumType_(accumType) {}

void GradientAccumulationTransform::apply(Graph& graph) {
  if (factor_ <= 1) return;
  if (tensors_.loss == kNoTensor || tensors_.gradients.size() != tensors_.weights.size()) {
    throw GraphError(ErrorCode::InvalidOperand, "gradients",
                     fmt::format("{} weights but {} gradients; run autodiff before accumulating gradients",
                                 tensors_.weights.size(), tensors_.gradients.size()));
  }
  Graph out(graph.replicationFactor());
  for (const RemoteBufferInfo& buffer : graph.remoteBuffers()) out.addRemoteBuffer(buffer);
  Unroller unroller(graph, out, factor_);
  unroller.copyShared();

  std::vector<Tensor> accumulators;
  // Accumulators sharded unlike their weight: the domain each micro-batch's
  // gradient is reduce-scattered over before it is accumulated.
  std::vector<std::optional<ReplicaGrouping>> scatterOver;
  for (TensorId w : tensors_.weights) {
    const Tensor weight{&out, unroller.mapped(w, 0)};
    const std::string name = weight.name() + ".accum";
    const std::optional<ReplicaGrouping> domain = accumulatorShardingDomain(options_, weight.node(), name);
    scatterOver.push_back(domain);
    Tensor accumulator = domain ? shardedZeroVariable(weight, name, *domain)
                                : zeroVariableLike(weight, name, TensorCategory::Accumulator);
    // float16 weights accumulate in the optimizer's accumType.
    if (weight.dtype() == DType::Float16) out.tensor(accumulator.id()).dtype = accumType_;
    accumulators.push_back(accumulator);
  }
  const bool running = reduction_ == ReductionType::Mean && strategy_ == MeanReductionStrategy::Running;
  {
    // The flat schedule: one micro-batch after the other.
    InSequence sequence(out);
    for (int64_t i = 0; i < factor_; ++i) {
      const auto first = static_cast<OpId>(out.ops().size());
      unroller.sliceInputs(i);
      unroller.copyMicroBatch(i);
      for (std::size_t k = 0; k < accumulators.size(); ++k) {
        Tensor gradient{&out, unroller.mapped(tensors_.gradients[k], i)};
        if (scatterOver[k]) gradient = ops::replicatedReduceScatter(gradient, ReductionType::Sum, scatterOver[k]);
        Tensor& acc = accumulators[k];
        if (gradient.dtype() != acc.dtype()) gradient = ops::cast(gradient, acc.dtype());
        if (i == 0) {
          acc = ops::copyInplace(acc, gradient);
        } else if (running) {
          const auto n = static_cast<double>(i + 1);
          acc = ops::scaledAddInplace(acc, gradient, static_cast<double>(i) / n, 1.0 / n);
        } else {
          acc = ops::scaledAddInplace(acc, gradient);
        }
      }
      // The ops of micro-batch i (OpNode::microBatch), which pipelining
      // runs in its own cycles.
      for (auto id = first; id < static_cast<OpId>(out.ops().size()); ++id) out.setMicroBatch(id, i);
    }
    if (reduction_ == ReductionType::Mean && !running) {
      for (Tensor& acc : accumulators) {
        const Tensor zero = ops::scalar(out, 0.0, acc.dtype());
        acc = ops::scaledAddInplace(acc, zero, 1.0 / static_cast<double>(factor_), 0.0);
      }
    }
  }

  std::vector<Tensor> losses;
  for (int64_t i = 0; i < factor_; ++i) {
    losses.push_back(ops::reshape(Tensor{&out, unroller.mapped(tensors_.loss, i)}, {1}));
  }
  const Tensor loss = ops::concat(losses, 0);
  out.rename(loss.id(), out.uniqueName(graph.tensor(tensors_.loss).name));
  unroller.copyOrder();

  TrainingTensors updated;
  updated.loss = loss.id();
  if (tensors_.lossScale != kNoTensor) updated.lossScale = unroller.mapped(tensors_.lossScale, 0);
  for (std::size_t k = 0; k < tensors_.weights.size(); ++k) {
    updated.weights.push_back(unroller.mapped(tensors_.weights[k], 0));
    updated.gradients.push_back(accumulators[k].id());
  }
  graph = std::move(out);
  tensors_ = std::move(updated);
}

}  // namespace tessera
