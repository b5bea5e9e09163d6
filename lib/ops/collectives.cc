// The collective family: ops over a ReplicaGrouping of the replicas
// (`grouping`; made explicit at construction, all replicas by default).
// Sharded values use ShardLayout(n, groupSize): member i of a group holds
// shard i.
//  - ReplicatedAllReduce: Sum or Mean over each group; same shape.
//  - ReplicatedReduceScatter: the reduction, of which member i keeps shard
//    i: [ceil(n/g)], metaShape = the input's shape.
//  - ReplicatedAllGather: the group's shards -> `shape`, else the input's
//    metaShape, else [g*s].
//  - ReplicaShardedSlice: this replica's shard of its own value (no
//    reduction); ReplicaShardedPad: that shard placed into zeros of `shape`
//    (the slice's gradient).
// The global loss is the sum of the replicas' losses, so a collective's
// gradient sends each replica's dy back along the same groups.
#include <fmt/format.h>

#include "op_def.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera {
namespace {

using R = std::vector<Tensor>;
using Values = std::vector<double>;

// Writes shard `shard`'s real elements into their places in `host`.
void placeShard(const Values& shardValues, int64_t shards, int64_t shard, Values& host) {
  const ShardLayout layout(static_cast<int64_t>(host.size()), shards);
  const auto begin = static_cast<std::size_t>(layout.hostOffset(shard));
  for (std::size_t j = 0; j < static_cast<std::size_t>(layout.realElements(shard)); ++j)
    host[begin + j] = shardValues[j];
}

// Calls f(members, groupSize) for each group of the op's grouping.
template <class F>
void forEachGroup(const ReferenceOp& r, F&& f) {
  const ReplicaGrouping& grouping = r.attributes().grouping.value();
  for (int64_t group = 0; group < grouping.numGroups(); ++group)
    f(grouping.replicasAt(group), grouping.groupSize());
}

void reduceReference(ReferenceOp& r, int64_t /*replica*/) {
  const bool scatter = r.op().kind == OpKind::ReplicatedReduceScatter;
  forEachGroup(r, [&](const std::vector<int64_t>& members, int64_t g) {
    // The reduction over the group's members.
    Values total(r.in(0, members[0]).size(), 0.0);
    for (int64_t m : members) {
      const Values& v = r.in(0, m);
      for (std::size_t i = 0; i < total.size(); ++i) total[i] += v[i];
    }
    if (r.attributes().reduction == ReductionType::Mean)
      for (double& v : total) v /= static_cast<double>(g);
    for (int64_t i = 0; i < g; ++i)
      r.out(members[static_cast<std::size_t>(i)]) = scatter ? reference::shardOf(total, g, i) : total;
  });
}

std::vector<OutputSpec> shardShape(const OpChecker& c, OpAttributes& attributes) {
  c.arity(1);
  const DType dtype = c.floating({0});
  const ReplicaGrouping g = c.grouping(attributes);
  return {{Shape{ceilDiv(numElements(c.shape(0)), g.groupSize())}, dtype, c.shape(0)}};
}

double groupSizeOf(const Graph& graph, const OpNode& op) {
  return static_cast<double>(
      op.attributes.grouping.value_or(ReplicaGrouping(graph.replicationFactor())).groupSize());
}

OpCost perOutputElement(const Graph& graph, const OpNode& op) {
  return {.flops = elementsOf(graph, op.outputs[0])};
}

}  // namespace

void addCollectiveOps(OpTable& table) {
  const OpDef base{
      .family = OpFamily::Collective, .work = OpWork::Collective, .collective = true, .acrossReplicas = true};

  OpDef allReduce = base;
  allReduce.kind = OpKind::ReplicatedAllReduce;
  allReduce.shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
    c.arity(1);
    const DType dtype = c.floating({0});
    c.grouping(attributes);
    return {{c.shape(0), dtype, c.in(0).metaShape}};
  };
  allReduce.gradient = [](const GradientContext& g) -> R {
    return {ops::replicatedAllReduce(g.dy, g.attributes().reduction, g.attributes().grouping)};
  };
  allReduce.reference = reduceReference;
  // A ring all-reduce sends and receives 2 (g-1)/g of the value.
  allReduce.cost = [](const Graph& graph, const OpNode& op) {
    const double g = groupSizeOf(graph, op);
    return OpCost{.linkBytes = 2.0 * (g - 1.0) / g * bytesOf(graph, op.inputs[0])};
  };
  table.add(allReduce);

  OpDef reduceScatter = base;
  reduceScatter.kind = OpKind::ReplicatedReduceScatter;
  reduceScatter.shape = shardShape;
  reduceScatter.gradient = [](const GradientContext& g) -> R {
    Tensor gathered = ops::replicatedAllGather(g.dy, g.attributes().grouping, g.in(0).shape());
    if (g.attributes().reduction == ReductionType::Mean)
      gathered = scaled(gathered, 1.0 / static_cast<double>(g.attributes().grouping->groupSize()));
    return {gathered};
  };
  reduceScatter.reference = reduceReference;
  // Every replica sends g - 1 padded shards of ceil(n/g) elements.
  reduceScatter.cost = [](const Graph& graph, const OpNode& op) {
    return OpCost{.linkBytes = (groupSizeOf(graph, op) - 1.0) * bytesOf(graph, op.outputs[0])};
  };
  table.add(reduceScatter);

  OpDef allGather = base;
  allGather.kind = OpKind::ReplicatedAllGather;
  allGather.shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
    c.arity(1);
    const DType dtype = c.floating({0});
    const ReplicaGrouping g = c.grouping(attributes);
    if (c.rank(0) != 1)
      c.fail(ErrorCode::InvalidCollective, fmt::format("input {} must be a 1-D shard", c.desc(0)));
    Shape full = !attributes.shape.empty() ? attributes.shape : c.in(0).metaShape;
    if (full.empty()) full = {g.groupSize() * c.shape(0)[0]};
    c.shardFits(full, g.groupSize());
    attributes.shape = full;
    return {{full, dtype, {}}};
  };
  allGather.gradient = [](const GradientContext& g) -> R {
    return {ops::replicatedReduceScatter(g.dy, ReductionType::Sum, g.attributes().grouping)};
  };
  // Member i's input is shard i of the full value.
  allGather.reference = [](ReferenceOp& r, int64_t /*replica*/) {
    forEachGroup(r, [&](const std::vector<int64_t>& members, int64_t g) {
      Values full(reference::count(r.outShape()), 0.0);
      for (int64_t i = 0; i < g; ++i) placeShard(r.in(0, members[static_cast<std::size_t>(i)]), g, i, full);
      for (int64_t m : members) r.out(m) = full;
    });
  };
  // Receives the g - 1 other shards.
  allGather.cost = [](const Graph& graph, const OpNode& op) {
    return OpCost{.linkBytes = (groupSizeOf(graph, op) - 1.0) * bytesOf(graph, op.inputs[0])};
  };
  table.add(allGather);

  // The sharded slice and pad only rearrange a replica's own value.
  OpDef shardedSlice = base;
  shardedSlice.kind = OpKind::ReplicaShardedSlice;
  shardedSlice.work = OpWork::Compute;
  shardedSlice.shape = shardShape;
  shardedSlice.gradient = [](const GradientContext& g) -> R {
    OpAttributes attributes;
    attributes.grouping = g.attributes().grouping;
    attributes.shape = g.in(0).shape();
    return {g.make(OpKind::ReplicaShardedPad, {g.dy.id()}, attributes)};
  };
  shardedSlice.reference = [](ReferenceOp& r, int64_t /*replica*/) {
    forEachGroup(r, [&](const std::vector<int64_t>& members, int64_t g) {
      for (int64_t i = 0; i < g; ++i) {
        const int64_t m = members[static_cast<std::size_t>(i)];
        r.out(m) = reference::shardOf(r.in(0, m), g, i);
      }
    });
  };
  shardedSlice.cost = perOutputElement;
  table.add(shardedSlice);

  OpDef shardedPad = shardedSlice;
  shardedPad.kind = OpKind::ReplicaShardedPad;
  shardedPad.shape = [](const OpChecker& c, OpAttributes& attributes) -> std::vector<OutputSpec> {
    c.arity(1);
    const DType dtype = c.floating({0});
    const ReplicaGrouping g = c.grouping(attributes);
    const Shape full = !attributes.shape.empty() ? attributes.shape : c.in(0).metaShape;
    if (full.empty()) {
      c.fail(
          ErrorCode::InvalidCollective,
          fmt::format("input {} has no metaShape; give the full shape in the `shape` attribute", c.desc(0)));
    }
    c.shardFits(full, g.groupSize());
    attributes.shape = full;
    return {{full, dtype, {}}};
  };
  shardedPad.gradient = [](const GradientContext& g) -> R {
    return {ops::replicaShardedSlice(g.dy, g.attributes().grouping)};
  };
  shardedPad.reference = [](ReferenceOp& r, int64_t /*replica*/) {
    forEachGroup(r, [&](const std::vector<int64_t>& members, int64_t g) {
      for (int64_t i = 0; i < g; ++i) {
        const int64_t m = members[static_cast<std::size_t>(i)];
        Values full(reference::count(r.outShape()), 0.0);
        placeShard(r.in(0, m), g, i, full);
        r.out(m) = std::move(full);
      }
    });
  };
  table.add(shardedPad);
  table.keepsHalves({OpKind::ReplicatedAllGather, OpKind::ReplicaShardedSlice, OpKind::ReplicaShardedPad});
}

}  // namespace tessera
