#include "collectives.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "tessera/communicator.hpp"
#include "tessera/shard_layout.hpp"

namespace tessera::sim {
namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

// Every member's input, summed in replica order into `out` (elements
// [begin, begin + count) of the value), then scaled.
void reduceMembers(const Step& s, int64_t group, int64_t begin, int64_t count, float* out) {
  const int64_t* members = s.table.data() + group * s.groupSize;
  std::copy_n(s.in[0] + members[0] + begin, count, out);
  for (int64_t m = 1; m < s.groupSize; ++m) {
    const float* x = s.in[0] + members[m] + begin;
    for (int64_t i = 0; i < count; ++i) out[i] += x[i];
  }
  if (s.scale != 1.0f)
    for (int64_t i = 0; i < count; ++i) out[i] *= s.scale;
}

void allReduceKernel(const Step& s) {
  for (int64_t j = 0; j < s.groups; ++j) reduceMembers(s, j, 0, s.outElements, s.out + j * s.outElements);
}

void reduceScatterKernel(const Step& s) {
  for (int64_t j = 0; j < s.groups; ++j) {
    float* out = s.out + j * s.outElements;
    std::fill_n(out, s.outElements, 0.0f);
    reduceMembers(s, j, s.table2[at(2 * j)], s.table2[at(2 * j + 1)], out);
  }
}

void allGatherKernel(const Step& s) {
  for (int64_t j = 0; j < s.groups; ++j) {
    float* out = s.out + j * s.outElements;
    for (int64_t i = 0; i < s.groupSize; ++i) {
      const float* shard = s.in[0] + s.table[at(j * s.groupSize + i)];
      std::copy_n(shard, s.table2[at(2 * i + 1)], out + s.table2[at(2 * i)]);
    }
  }
}

void shardedSliceKernel(const Step& s) {
  for (int64_t j = 0; j < s.groups; ++j) {
    float* out = s.out + j * s.outElements;
    std::fill_n(out, s.outElements, 0.0f);
    std::copy_n(s.in[0] + s.table[at(j)] + s.table2[at(2 * j)], s.table2[at(2 * j + 1)], out);
  }
}

void shardedPadKernel(const Step& s) {
  for (int64_t j = 0; j < s.groups; ++j) {
    float* out = s.out + j * s.outElements;
    std::fill_n(out, s.outElements, 0.0f);
    std::copy_n(s.in[0] + s.table[at(j)], s.table2[at(2 * j + 1)], out + s.table2[at(2 * j)]);
  }
}

void remoteLoadKernel(const Step& s) {
  for (int64_t j = 0; j < s.groups; ++j)
    std::copy_n(s.in[0] + s.table[at(j)], s.outElements, s.out + j * s.outElements);
}

// Packs this instance's replicas' values of every tensor, all-gathers them,
// and spreads each instance's part into the tensors' values.
void exchangeKernel(const Step& s) {
  Exchange& e = *s.exchange;
  float* send = e.send.data();
  for (const ExchangedTensor& t : e.tensors) {
    for (int64_t r = 0; r < e.localReplicas; ++r) {
      std::copy_n(t.source + t.sourceOffsets[at(r)], t.elements, send);
      send += t.elements;
    }
  }
  e.communicator->allGather(e.send, e.receive);
  const float* from = e.receive.data();
  const int64_t instances = e.communicator->size();
  for (int64_t q = 0; q < instances; ++q) {
    for (ExchangedTensor& t : e.tensors) {
      const int64_t block = e.localReplicas * t.elements;
      std::copy_n(from, block, t.values.data() + q * block);
      from += block;
    }
  }
}

void sizeBuffers(Exchange& e) {
  int64_t local = 0;
  for (const ExchangedTensor& t : e.tensors) local += e.localReplicas * t.elements;
  e.send.assign(at(local), 0.0f);
  e.receive.assign(at(local * e.communicator->size()), 0.0f);
}

void remoteStoreKernel(const Step& s) {
  for (int64_t r = 0; r < s.groups; ++r)
    std::copy_n(s.in[0] + s.table[at(2 * r + 1)], s.outElements, s.out + s.table[at(2 * r)]);
}

}  // namespace

bool crossesInstances(const LocalTopology& topology, const ReplicaGrouping& grouping) {
  if (topology.localReplicas == topology.globalReplicas) return false;
  for (int64_t r = 0; r < topology.localReplicas; ++r) {
    for (int64_t m : grouping.replicasAt(grouping.groupAt(r + topology.replicaOffset))) {
      if (m < topology.replicaOffset || m >= topology.replicaOffset + topology.localReplicas) return true;
    }
  }
  return false;
}

Step planExchange(Exchange& exchange, Communicator* communicator, TensorId tensor, const float* source,
                  const ReplicaGrouping& layout, int64_t elements, const LocalTopology& topology,
                  const OpNode& op) {
  exchange.communicator = communicator;
  exchange.replicaOffset = topology.replicaOffset;
  exchange.localReplicas = topology.localReplicas;
  ExchangedTensor& t = exchange.tensors.emplace_back();
  t.tensor = tensor;
  t.source = source;
  t.elements = elements;
  for (int64_t r = 0; r < topology.localReplicas; ++r)
    t.sourceOffsets.push_back(layout.groupAt(r) * elements);
  t.values.assign(at(topology.globalReplicas * elements), 0.0f);
  sizeBuffers(exchange);
  Step step;
  step.kind = op.kind;
  step.name = op.name;
  step.exchange = &exchange;
  step.kernel = exchangeKernel;
  return step;
}

Step mergeExchanges(Exchange& merged, std::span<Exchange* const> parts) {
  merged.communicator = parts.front()->communicator;
  merged.replicaOffset = parts.front()->replicaOffset;
  merged.localReplicas = parts.front()->localReplicas;
  for (Exchange* part : parts) {
    for (ExchangedTensor& t : part->tensors) merged.tensors.push_back(std::move(t));
    part->tensors.clear();
    part->send = {};
    part->receive = {};
  }
  sizeBuffers(merged);
  Step step;
  step.kind = OpKind::ReplicatedAllGather;
  step.name = fmt::format("exchange of {} tensor(s)", merged.tensors.size());
  step.exchange = &merged;
  step.kernel = exchangeKernel;
  return step;
}

bool consecutiveGroups(const LocalTopology& topology, const ReplicaGrouping& grouping) {
  const int64_t g = grouping.groupSize();
  for (int64_t r = 0; r < topology.localReplicas; ++r) {
    const int64_t global = r + topology.replicaOffset;
    const std::vector<int64_t> members = grouping.replicasAt(grouping.groupAt(global));
    for (int64_t i = 0; i < g; ++i) {
      if (members[at(i)] != global / g * g + i) return false;
    }
  }
  return true;
}

bool consecutiveGroupsLayout(const LocalTopology& topology, const ReplicaGrouping& grouping,
                             const ReplicaGrouping& reduced) {
  if (!consecutiveGroups(topology, grouping)) return false;
  for (int64_t r = 0; r < topology.localReplicas; ++r) {
    const int64_t global = r + topology.replicaOffset;
    for (int64_t q = 0; q < topology.localReplicas; ++q) {
      const bool sameGroup = grouping.groupAt(global) == grouping.groupAt(q + topology.replicaOffset);
      if (sameGroup != (reduced.groupAt(r) == reduced.groupAt(q))) return false;
    }
  }
  return true;
}

void planCollective(Step& step, const OpNode& op, const ReplicaGrouping& out, const ReplicaGrouping& in,
                    int64_t inputElements, int64_t outputElements, const LocalTopology& topology,
                    const ExchangedTensor* exchanged) {
  const ReplicaGrouping grouping = op.attributes.grouping.value_or(ReplicaGrouping(topology.globalReplicas));
  const int64_t g = grouping.groupSize();
  step.groups = out.numGroups();
  step.groupSize = g;
  step.outElements = outputElements;
  step.inElements[0] = inputElements;
  step.scale = op.kind != OpKind::ReplicatedAllGather && op.attributes.reduction == ReductionType::Mean &&
                       (op.kind == OpKind::ReplicatedAllReduce || op.kind == OpKind::ReplicatedReduceScatter)
                   ? 1.0f / static_cast<float>(g)
                   : 1.0f;
  const bool gathers = op.kind == OpKind::ReplicatedAllReduce || op.kind == OpKind::ReplicatedReduceScatter ||
                       op.kind == OpKind::ReplicatedAllGather;
  const int64_t full = op.kind == OpKind::ReplicatedAllReduce ? inputElements
                       : op.kind == OpKind::ReplicatedAllGather || op.kind == OpKind::ReplicaShardedPad
                           ? outputElements
                           : inputElements;
  const ShardLayout layout(full, g);
  if (exchanged != nullptr) step.in[0] = exchanged->values.data();
  for (int64_t j = 0; j < step.groups; ++j) {
    const int64_t replica = out.replicaAt(j, 0);
    const int64_t index = localIndexInGroup(topology, grouping, replica);
    if (gathers && exchanged != nullptr) {
      // Members by global index in the exchanged copy.
      for (int64_t m : grouping.replicasAt(grouping.groupAt(replica + topology.replicaOffset)))
        step.table.push_back(m * inputElements);
    } else if (gathers) {
      for (int64_t m : localMembers(topology, grouping, replica, op.name))
        step.table.push_back(in.groupAt(m) * inputElements);
    } else {
      // Slices and pads read the replica's own value only.
      step.table.push_back(in.groupAt(replica) * inputElements);
    }
    if (op.kind != OpKind::ReplicatedAllGather && op.kind != OpKind::ReplicatedAllReduce) {
      step.table2.push_back(layout.hostOffset(index));
      step.table2.push_back(layout.realElements(index));
    }
  }
  switch (op.kind) {
    case OpKind::ReplicatedAllReduce: step.kernel = allReduceKernel; break;
    case OpKind::ReplicatedReduceScatter: step.kernel = reduceScatterKernel; break;
    case OpKind::ReplicatedAllGather:
      for (int64_t i = 0; i < g; ++i) {
        step.table2.push_back(layout.hostOffset(i));
        step.table2.push_back(layout.realElements(i));
      }
      step.kernel = allGatherKernel;
      break;
    case OpKind::ReplicaShardedSlice: step.kernel = shardedSliceKernel; break;
    default: step.kernel = shardedPadKernel; break;
  }
}

void planRemoteLoad(Step& step, const ReplicaGrouping& out, const ReplicaGrouping& held, int64_t entry,
                    int64_t elements, int64_t replicas) {
  step.groups = out.numGroups();
  step.outElements = elements;
  for (int64_t j = 0; j < step.groups; ++j) {
    const int64_t first = held.replicaAt(held.groupAt(out.replicaAt(j, 0)), 0);
    step.table.push_back((entry * replicas + first) * elements);
  }
  step.kernel = remoteLoadKernel;
}

void planRemoteStore(Step& step, const ReplicaGrouping& in, const ReplicaGrouping& held, int64_t entry,
                     int64_t elements, int64_t replicas) {
  step.groups = held.numGroups();
  step.outElements = elements;
  for (int64_t g = 0; g < held.numGroups(); ++g) {
    const int64_t r = held.replicaAt(g, 0);
    step.table.push_back((entry * replicas + r) * elements);
    step.table.push_back(in.groupAt(r) * elements);
  }
  step.kernel = remoteStoreKernel;
}

}  // namespace tessera::sim
