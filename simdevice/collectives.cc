#include "collectives.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "tessera/popdist/communicator.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera::sim {
namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

// The offsets of the members of output group j's collective group (see
// planCollective).
const int64_t* membersOf(const Step& s, int64_t j) { return s.table.data() + s.table[at(j)]; }

// Every member's input, summed in replica order into `out` (elements
// [begin, begin + count) of the value), then scaled.
void reduceMembers(const Step& s, int64_t group, int64_t begin, int64_t count, float* out) {
  const int64_t* members = membersOf(s, group);
  std::copy_n(s.in[0] + members[0] + begin, count, out);
  for (int64_t m = 1; m < s.groupSize; ++m) {
    const float* x = s.in[0] + members[m] + begin;
    for (int64_t i = 0; i < count; ++i) out[i] += x[i];
  }
  if (s.scale != 1.0f)
    for (int64_t i = 0; i < count; ++i) out[i] *= s.scale;
}

// A collective moves whole tensors (the all-gather of an RTS weight writes
// every replica's copy of it, 1.6 MB a step for the MLP's first layer at
// R = 2): split over the step's threads by ranges of each output when the
// parts get at least kMinPartElements in all. One thread at a time took the
// main job's steps past the workers' poll, so that they fell asleep and
// had to be woken for the next parallel step. Every element is copied, or
// summed in replica order, as on one thread.
constexpr int64_t kMinPartElements = int64_t{1} << 14;

// Calls f(begin, end) for this part's range of each of `groups` outputs of
// `elements` (end - begin may be 0).
template <class F>
void inParts(const Step& s, int64_t groups, int64_t elements, F&& f) {
  const int64_t parts =
      s.pool == nullptr ? 1 : std::clamp<int64_t>(groups * elements / kMinPartElements, 1, s.pool->threads());
  const auto range = [&](int64_t part, int64_t j) {
    f(j, elements * part / parts, elements * (part + 1) / parts);
  };
  if (parts == 1) {
    for (int64_t j = 0; j < groups; ++j) range(0, j);
    return;
  }
  s.pool->run(static_cast<int>(parts), [&](int part, int /*thread*/) {
    for (int64_t j = 0; j < groups; ++j) range(part, j);
  });
}

// Copies the part of `count` elements of `from`, placed at `offset`, that
// falls in out[begin, end); returns the part [first, last).
std::pair<int64_t, int64_t> copyOverlap(float* out, int64_t begin, int64_t end, const float* from,
                                        int64_t offset, int64_t count) {
  const int64_t first = std::clamp(offset, begin, end);
  const int64_t last = std::clamp(offset + count, first, end);
  std::copy(from + (first - offset), from + (last - offset), out + first);
  return {first, last};
}

// out[begin, end) of a value that holds `count` elements of `from` at
// `offset` and zeros elsewhere.
void placeRange(float* out, int64_t begin, int64_t end, const float* from, int64_t offset, int64_t count) {
  const auto [first, last] = copyOverlap(out, begin, end, from, offset, count);
  std::fill(out + begin, out + first, 0.0f);
  std::fill(out + last, out + end, 0.0f);
}

void allReduceKernel(const Step& s) {
  inParts(s, s.groups, s.outElements, [&](int64_t j, int64_t begin, int64_t end) {
    reduceMembers(s, j, begin, end - begin, s.out + j * s.outElements + begin);
  });
}

void reduceScatterKernel(const Step& s) {
  inParts(s, s.groups, s.outElements, [&](int64_t j, int64_t begin, int64_t end) {
    float* out = s.out + j * s.outElements;
    const int64_t count = s.table2[at(2 * j + 1)];
    // The shard's elements, then the padding after them.
    const int64_t reduced = std::clamp(count, begin, end);
    if (reduced > begin) reduceMembers(s, j, s.table2[at(2 * j)] + begin, reduced - begin, out + begin);
    std::fill(out + reduced, out + end, 0.0f);
  });
}

void allGatherKernel(const Step& s) {
  inParts(s, s.groups, s.outElements, [&](int64_t j, int64_t begin, int64_t end) {
    float* out = s.out + j * s.outElements;
    const int64_t* members = membersOf(s, j);
    for (int64_t i = 0; i < s.groupSize; ++i)
      copyOverlap(out, begin, end, s.in[0] + members[i], s.table2[at(2 * i)], s.table2[at(2 * i + 1)]);
  });
}

void shardedSliceKernel(const Step& s) {
  inParts(s, s.groups, s.outElements, [&](int64_t j, int64_t begin, int64_t end) {
    placeRange(s.out + j * s.outElements, begin, end, s.in[0] + s.table[at(j)] + s.table2[at(2 * j)], 0,
               s.table2[at(2 * j + 1)]);
  });
}

void shardedPadKernel(const Step& s) {
  inParts(s, s.groups, s.outElements, [&](int64_t j, int64_t begin, int64_t end) {
    placeRange(s.out + j * s.outElements, begin, end, s.in[0] + s.table[at(j)], s.table2[at(2 * j)],
               s.table2[at(2 * j + 1)]);
  });
}

void remoteLoadKernel(const Step& s) {
  inParts(s, s.groups, s.outElements, [&](int64_t j, int64_t begin, int64_t end) {
    std::copy(s.in[0] + s.table[at(j)] + begin, s.in[0] + s.table[at(j)] + end,
              s.out + j * s.outElements + begin);
  });
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

bool crossesInstances(const ReplicaTopology& topology, const ReplicaGrouping& grouping) {
  if (topology.localReplicas == topology.globalReplicas) return false;
  // A group's members increase: its first and last tell.
  for (int64_t r = 0; r < topology.localReplicas; ++r) {
    const int64_t group = grouping.groupAt(r + topology.replicaOffset);
    if (grouping.replicaAt(group, 0) < topology.replicaOffset ||
        grouping.replicaAt(group, grouping.groupSize() - 1) >=
            topology.replicaOffset + topology.localReplicas)
      return true;
  }
  return false;
}

Step planExchange(Exchange& exchange, Communicator* communicator, TensorId tensor, const float* source,
                  const ReplicaGrouping& layout, int64_t elements, const ReplicaTopology& topology,
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

bool consecutiveGroups(const ReplicaTopology& topology, const ReplicaGrouping& grouping) {
  // Members are `stride` apart, so groups of more than one replica are runs
  // exactly when the stride is 1 (group c is then replicas c*g .. c*g+g-1).
  return topology.localReplicas < 1 || grouping.groupSize() == 1 || grouping.stride() == 1;
}

bool consecutiveGroupsLayout(const ReplicaTopology& topology, const ReplicaGrouping& grouping,
                             const ReplicaGrouping& reduced) {
  if (!consecutiveGroups(topology, grouping)) return false;
  // The local replicas' groups of `grouping` and of `reduced` must be the
  // same partition: a one-to-one map between their group ids.
  std::unordered_map<int64_t, int64_t> reducedOf;
  std::unordered_map<int64_t, int64_t> groupOf;
  for (int64_t r = 0; r < topology.localReplicas; ++r) {
    const int64_t group = grouping.groupAt(r + topology.replicaOffset);
    const int64_t value = reduced.groupAt(r);
    if (reducedOf.try_emplace(group, value).first->second != value) return false;
    if (groupOf.try_emplace(value, group).first->second != group) return false;
  }
  return true;
}

void planCollective(Step& step, const OpNode& op, const ReplicaGrouping& out, const ReplicaGrouping& in,
                    int64_t inputElements, int64_t outputElements, const ReplicaTopology& topology,
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
  // A gathering collective's table starts with an entry per output group:
  // where in the table the offsets of its collective group's members start.
  // Each collective group's members follow once, however many output groups
  // (one per replica for a reduce-scatter) read them.
  std::unordered_map<int64_t, int64_t> membersAt;  // collective group -> table position
  if (gathers) step.table.assign(at(step.groups), 0);
  for (int64_t j = 0; j < step.groups; ++j) {
    const int64_t replica = out.replicaAt(j, 0);
    const int64_t index = localIndexInGroup(topology, grouping, replica);
    if (gathers) {
      const int64_t group = grouping.groupAt(replica + topology.replicaOffset);
      const auto [listed, added] = membersAt.try_emplace(group, static_cast<int64_t>(step.table.size()));
      step.table[at(j)] = listed->second;
      if (added && exchanged != nullptr) {
        // Members by global index in the exchanged copy.
        for (int64_t m : grouping.replicasAt(group)) step.table.push_back(m * inputElements);
      } else if (added) {
        for (int64_t m : localMembers(topology, grouping, replica, op.name))
          step.table.push_back(in.groupAt(m) * inputElements);
      }
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
