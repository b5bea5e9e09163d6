// The collective family's kernels (lib/ops/collectives.cc defines the ops).
// The reductions and layout changes themselves are in collectives.hpp; this
// file plans them, including the gradient GEMM that an all-reduce or a
// reduce-scatter computes fused with its reduction (see executor.hpp).
#include <algorithm>

#include "collectives.hpp"
#include "kernel_table.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera::sim {
namespace {

// sum_r x_r^T dy_r over each group of consecutive replicas, as one GEMM per
// group: the reduced value, or for a reduce-scatter the group's shards in
// order (with padding: each shard its part of the product).
void planFusedGemm(StepPlanner& planner, Step& step, OpId matmulId) {
  const Graph& graph = planner.graph();
  const OpNode& op = planner.op();
  const OpNode& matmul = graph.op(matmulId);
  const TensorId x = graph.op(graph.tensor(matmul.inputs[0]).producer).inputs[0];
  const TensorId dy = matmul.inputs[1];
  const TensorId y = op.outputs[0];
  const ReplicaGrouping grouping = op.attributes.grouping.value_or(ReplicaGrouping(planner.globalReplicas()));
  const int64_t g = grouping.groupSize();
  step.transA = true;
  step.rows = planner.shape(x)[1];
  step.cols = planner.shape(dy)[1];
  step.depth = g * planner.shape(x)[0];
  step.in[0] = planner.buffer(x);
  step.in[1] = planner.buffer(dy);
  step.inElements = {planner.elements(x), planner.elements(dy), 0};
  if (op.attributes.reduction == ReductionType::Mean) step.scale = 1.0f / static_cast<float>(g);
  // Groups that span instances read every member's x and dy from exchanged
  // copies (by global replica), others from the arena (by local replica).
  const bool crosses = crossesInstances(planner.topology(), grouping);
  if (crosses) {
    step.in[0] = planner.exchanged(x).values.data();
    step.in[1] = planner.exchanged(dy).values.data();
  }
  const int64_t offset = planner.topology().replicaOffset;
  const int64_t first = crosses ? 0 : offset;
  step.kernel = matmulKernel();
  if (op.kind == OpKind::ReplicatedAllReduce) {
    const ReplicaGrouping& out = planner.layout(y);
    for (int64_t j = 0; j < out.numGroups(); ++j) {
      const int64_t start = (out.replicaAt(j, 0) + offset) / g * g - first;
      Run run;
      run.out = j * step.outElements;
      run.in = {start * planner.elements(x), start * planner.elements(dy), 0};
      run.advance.fill(true);
      step.runs.push_back(run);
    }
    planner.emit(std::move(step));
    return;
  }
  const int64_t localReplicas = planner.localReplicas();
  const ShardLayout shards(planner.elements(matmul.outputs[0]), g);
  if (shards.padding() != 0) {
    // Each member's shard is its part of the group's product and padding.
    step.kernel = matmulShardsKernel();
    for (int64_t r = 0; r < localReplicas;) {
      const int64_t start = (r + offset) / g * g;  // the group's first global replica
      const int64_t end = std::min(start + g - offset, localReplicas);
      Run run;
      run.in = {(start - first) * planner.elements(x), (start - first) * planner.elements(dy), 0};
      run.advance.fill(true);
      step.runs.push_back(run);
      step.table.insert(step.table.end(), {static_cast<int64_t>(step.table2.size() / 3), end - r});
      for (; r < end; ++r) {
        const int64_t index = r + offset - start;
        step.table2.insert(step.table2.end(),
                           {r * step.outElements, shards.hostOffset(index), shards.realElements(index)});
      }
    }
    planner.emit(std::move(step));
    return;
  }
  // A reduce-scatter: each group's product covers its members' shards; a
  // group wider than this instance computes the whole product, as one
  // instance would, and keeps this instance's part.
  if (crosses) step.kernel = matmulSlicesKernel();
  for (int64_t r = 0; r < localReplicas;) {
    const int64_t start = (r + offset) / g * g;  // the group's first global replica
    const int64_t end = std::min(start + g - offset, localReplicas);
    Run run;
    run.out = r * step.outElements;
    run.in = {(start - first) * planner.elements(x), (start - first) * planner.elements(dy), 0};
    run.advance.fill(true);
    step.runs.push_back(run);
    if (crosses) {
      step.table2.insert(step.table2.end(), {r * step.outElements, (r + offset - start) * step.outElements,
                                             (end - r) * step.outElements});
    }
    r = end;
  }
  planner.emit(std::move(step));
}

void planGroupCollective(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  if (const OpId matmul = planner.fusedMatMul(); matmul != kNoOp) return planFusedGemm(planner, step, matmul);
  const TensorId x = op.inputs[0];
  step.in[0] = planner.buffer(x);
  const bool gathers = op.kind == OpKind::ReplicatedAllReduce || op.kind == OpKind::ReplicatedReduceScatter ||
                       op.kind == OpKind::ReplicatedAllGather;
  const ReplicaGrouping grouping = op.attributes.grouping.value_or(ReplicaGrouping(planner.globalReplicas()));
  const ExchangedTensor* values = nullptr;
  if (gathers && crossesInstances(planner.topology(), grouping)) values = &planner.exchanged(x);
  planCollective(step, op, planner.layout(op.outputs[0]), planner.layout(x), planner.elements(x),
                 step.outElements, planner.topology(), values);
  planner.emit(std::move(step));
}

}  // namespace

void addCollectiveKernels(KernelTable& table) {
  for (OpKind kind : {OpKind::ReplicatedAllReduce, OpKind::ReplicatedReduceScatter,
                      OpKind::ReplicatedAllGather, OpKind::ReplicaShardedSlice, OpKind::ReplicaShardedPad}) {
    table.add({.kind = kind, .plan = planGroupCollective});
  }
}

}  // namespace tessera::sim
