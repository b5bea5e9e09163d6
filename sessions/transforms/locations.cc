#include "locations.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "derived_grouping.hpp"
#include "execution_phases.hpp"
#include "graph_copy.hpp"
#include "json_reader.hpp"
#include "option_paths.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/location_resolver.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera {
namespace {

using detail::GraphCopy;

int64_t logicalElements(const TensorNode& node) {
  return numElements(node.metaShape.empty() ? node.shape : node.metaShape);
}

bool sharded(const TensorNode& node) { return !node.metaShape.empty(); }

// Throws when a group of `domain` mixes replicas of different variable
// groups: those hold different values, which cannot be one sharded tensor.
void checkDomainFits(const ReplicaGrouping& variableGroups, const ReplicaGrouping& domain,
                     const ResolvedLocation& resolved, const std::string& name) {
  // One group of every replica holds every domain: the common case costs
  // nothing per replica.
  if (variableGroups.numGroups() == 1) return;
  for (int64_t r = 0; r < domain.numReplicas(); ++r) {
    const int64_t first = domain.replicaAt(domain.groupAt(r), 0);
    if (variableGroups.groupAt(r) != variableGroups.groupAt(first)) {
      throw ConfigError(
          ErrorCode::UnsupportedCombination, resolved.decidedBy + "/shardingDomain",
          fmt::format("{}: the sharding domain {} puts replicas {} and {} in one group, but they hold "
                      "different values of the variable (its grouping is {}); choose a domain whose "
                      "groups lie within the variable's groups",
                      name, domain.str(), first, r, variableGroups.str()));
    }
  }
}

// The replicas a variable is sharded over, or nullopt when it is kept whole.
std::optional<ReplicaGrouping> shardingDomainOf(const ResolvedLocation& resolved, const TensorNode& node,
                                                int64_t replicas) {
  const TensorLocation& location = resolved.location;
  if (location.replicatedTensorSharding != ReplicatedTensorSharding::On) return std::nullopt;
  const ReplicaGrouping domain = location.shardingDomain.toReplicaGrouping(replicas);
  if (domain.groupSize() <= 1) return std::nullopt;
  checkDomainFits(node.grouping.value_or(ReplicaGrouping(replicas)), domain, resolved, node.name);
  return domain;
}

TensorNode asFull(TensorNode node) {
  if (!sharded(node)) return node;
  node.shape = node.metaShape;
  node.metaShape.clear();
  node.shardCount = 1;
  node.shardDomain.reset();
  return node;
}

TensorNode asShard(TensorNode node, const ReplicaGrouping& domain) {
  node = asFull(std::move(node));
  const ShardLayout layout(numElements(node.shape), domain.groupSize());
  node.metaShape = node.shape;
  node.shape = {layout.shardElements()};
  node.shardCount = domain.groupSize();
  node.shardDomain = domain;
  return node;
}

void copyOpWithMappedInputs(GraphCopy& copy, OpId id) {
  const OpNode& op = copy.in().op(id);
  std::vector<TensorId> inputs;
  inputs.reserve(op.inputs.size());
  for (TensorId t : op.inputs) inputs.push_back(copy.mapped(t));
  copy.copyOp(id, std::move(inputs));
}

// How a value is held in the rebuilt graph.
struct Value {
  TensorId id = kNoTensor;
  bool sharded = false;
  // Sharded: the grouping whose groups split one value; nullopt when not
  // known (sharded by hand).
  std::optional<ReplicaGrouping> domain{};
};

bool sameHolding(const Value& a, const Value& b) {
  return a.sharded == b.sharded && (!a.sharded || a.domain == b.domain);
}

// A variable whose home is not the compute tiles: it gets a working copy on
// the compute tiles at its first use and is written back after its last
// in-place update.
struct Home {
  enum class Kind { Remote, IoTiles } kind = Kind::Remote;
  bool viaIoTiles = false;        // Remote: loads and stores are staged on the IO tiles
  int64_t buffer = -1;            // Remote
  TensorId variable = kNoTensor;  // the variable in the rebuilt graph
  bool loaded = false;
  // Phased execution: the phase the working copy was loaded for, and
  // whether it has been updated since (then it is kept, not reloaded).
  int64_t phase = kNoExecutionPhase;
  bool modified = false;
};

// A forward activation that the backward pass reads, held between the two
// passes in streaming memory (OffChip) or, on chip, on the IO tiles.
struct OffChipActivation {
  bool viaIoTiles = false;      // streaming memory: transfers staged on the IO tiles
  bool onIoTiles = false;       // on chip: kept on the IO tiles instead of streaming memory
  int64_t buffer = -1;          // streaming memory
  TensorId kept = kNoTensor;    // on IO tiles: the copy held there
  TensorId loaded = kNoTensor;  // back on the compute tiles for the backward pass
  int64_t loadedPhase = kNoExecutionPhase;  // phased execution: the phase it was loaded for
};

// One run of consecutive ops of the same execution phase and micro-batch,
// and the last op of the rebuilt graph made for it.
struct PhaseRun {
  int64_t phase = kNoExecutionPhase;
  int64_t microBatch = kNoMicroBatch;
  OpId last = kNoOp;
};

class Relocator {
 public:
  Relocator(const Graph& in, const SessionOptions& options, TensorId loss)
      : in_(in), options_(options), copy_(in), values_(in.tensors().size()), inDomains_(in.tensors().size()),
        forward_(in.ops().size(), 0), lastWrite_(in.tensors().size(), kNoOp), phased_(phasedExecution(options)) {
    if (loss != kNoTensor) {
      markForward(loss);
    } else if (phased_) {
      // Inference: every op is forward; activations move only between
      // phases.
      std::fill(forward_.begin(), forward_.end(), 1);
    }
    for (std::size_t id = 0; id < in.ops().size(); ++id) {
      const OpNode& op = in.ops()[id];
      if (isInplace(op.kind))
        lastWrite_[static_cast<std::size_t>(in.storageOf(op.inputs[0]))] = static_cast<OpId>(id);
    }
    planActivations();
  }

  // Whether any tensor is held or placed differently from the graph: most
  // programs keep everything on the compute tiles, and are not rebuilt.
  bool changesAnything() const {
    if (!activations_.empty()) return true;
    for (const OpNode& op : in_.ops()) {
      if (op.kind != OpKind::Variable) continue;
      const TensorNode& node = in_.tensor(op.outputs[0]);
      if (!isFloating(node.dtype) || node.remoteBuffer >= 0 || (sharded(node) && !node.shardDomain)) continue;
      const ResolvedLocation resolved =
          resolveTensorLocation(options_, {node.name, node.category, logicalElements(node)});
      if (resolved.location.storage == TensorStorage::OffChip ||
          resolved.location.storageTileSet == TileSet::IO) {
        return true;
      }
      if (node.category == TensorCategory::Weight) continue;
      const std::optional<ReplicaGrouping> domain = shardingDomainOf(resolved, node, in_.replicationFactor());
      if (domain.has_value() != sharded(node) || (domain && node.shardDomain != domain)) return true;
    }
    return false;
  }

  Graph run() {
    for (std::size_t i = 0; i < in_.ops().size(); ++i) {
      const auto id = static_cast<OpId>(i);
      const OpNode& op = in_.op(id);
      if (op.kind == OpKind::Variable) {
        copyVariable(id);
      } else if (op.kind == OpKind::Input || op.kind == OpKind::Constant) {
        const TensorId t = copy_.copySource(id, in_.tensor(op.outputs[0]));
        values_[index(op.outputs[0])] = {t, false, std::nullopt};
      } else {
        copyComputeOp(id);
        notePhase(id);
        afterOp(id);
      }
    }
    copy_.copyOrder();
    return copy_.take();
  }

  TensorId valueId(TensorId original) const { return values_[index(original)].id; }
  TensorId mapped(TensorId original) const { return copy_.mapped(original); }

 private:
  static std::size_t index(TensorId t) { return static_cast<std::size_t>(t); }
  Graph& out() { return copy_.out(); }
  Tensor outTensor(TensorId t) { return Tensor{&out(), t}; }

  void markForward(TensorId loss) {
    std::vector<TensorId> stack{loss};
    std::vector<char> seen(in_.tensors().size(), 0);
    while (!stack.empty()) {
      const TensorId t = stack.back();
      stack.pop_back();
      if (seen[index(t)] != 0) continue;
      seen[index(t)] = 1;
      const OpId producer = in_.tensor(t).producer;
      if (producer == kNoOp) continue;
      forward_[static_cast<std::size_t>(producer)] = 1;
      for (TensorId input : in_.op(producer).inputs) stack.push_back(input);
    }
  }

  bool backward(OpId consumer) const { return forward_[static_cast<std::size_t>(consumer)] == 0; }

  // Phased execution: whether forward op `consumer` reads `t` in another
  // phase than the one that made it (a skip connection, a mask read by
  // every layer), so that the value's location decides where it is kept
  // in between.
  bool laterPhase(TensorId t, OpId consumer) const {
    if (!phased_ || backward(consumer)) return false;
    const OpId producer = in_.tensor(t).producer;
    if (producer == kNoOp) return false;
    const int64_t made = in_.op(producer).executionPhase;
    const int64_t read = in_.op(consumer).executionPhase;
    return made != kNoExecutionPhase && read != kNoExecutionPhase && read != made;
  }

  // Whether `consumer` reads the activation `t` from where its location
  // keeps it rather than from the compute tiles of its producer.
  bool readsKept(TensorId t, OpId consumer) const { return backward(consumer) || laterPhase(t, consumer); }

  // Forward activations read by a backward op, or with phases by a forward
  // op of a later phase, go off chip when their location says so.
  void planActivations() {
    for (std::size_t id = 0; id < in_.ops().size(); ++id) {
      const OpNode& op = in_.ops()[id];
      if (forward_[id] == 0 || op.kind == OpKind::Variable || op.kind == OpKind::Input ||
          op.kind == OpKind::Constant) {
        continue;
      }
      for (TensorId t : op.outputs) {
        const TensorNode& node = in_.tensor(t);
        // Float64 values (computed beside a float model) stay on chip.
        if (node.category != TensorCategory::Activation || !isFloating(node.dtype) ||
            node.dtype == DType::Float64 || sharded(node) || node.aliasOf != kNoTensor) {
          continue;
        }
        bool readLater = false;
        for (OpId consumer : node.consumers) readLater = readLater || readsKept(t, consumer);
        if (!readLater) continue;
        const ResolvedLocation resolved =
            resolveTensorLocation(options_, {node.name, TensorCategory::Activation, numElements(node.shape)});
        if (resolved.location.storage == TensorStorage::OffChip) {
          activations_[t] = OffChipActivation{.viaIoTiles = resolved.location.loadTileSet == TileSet::IO};
        } else if (resolved.location.storageTileSet == TileSet::IO && options_.numIOTiles > 0) {
          activations_[t] = OffChipActivation{.onIoTiles = true};
        }
      }
    }
  }

  // The weight whose optimizer state `state` is: the variable of category
  // Weight whose name, followed by ".", starts the state's name ("W0" of
  // "W0.momentum" or "W0.master.accl1"); nullptr for state of no weight.
  const TensorNode* weightOf(const TensorNode& state) const {
    for (std::size_t dot = state.name.rfind('.'); dot != std::string::npos && dot > 0;
         dot = state.name.rfind('.', dot - 1)) {
      const std::optional<TensorId> found = in_.tryFind(std::string_view(state.name).substr(0, dot));
      if (found && in_.tensor(*found).category == TensorCategory::Weight) return &in_.tensor(*found);
    }
    return nullptr;
  }

  // A sharded weight and its sharded optimizer state are updated together:
  // they must be split over the same replicas, whether the categories' or a
  // per-tensor override's settings decided it (tessera.config.123, as for
  // the categories themselves).
  void checkLinkedToWeight(const TensorNode& state, const ReplicaGrouping& domain,
                           const ResolvedLocation& resolved) const {
    const TensorNode* weight = weightOf(state);
    if (weight == nullptr || !sharded(*weight) || !weight->shardDomain || *weight->shardDomain == domain) return;
    const ResolvedLocation weightResolved =
        resolveTensorLocation(options_, {weight->name, TensorCategory::Weight, logicalElements(*weight)});
    throw ConfigError(
        ErrorCode::LinkedShardingDomainsDiffer, resolved.decidedBy + "/shardingDomain",
        fmt::format("{}: the optimizer state is sharded over {} but its weight {} is sharded over {} (set by "
                    "{}); a weight and its optimizer state are updated together, so give them the same "
                    "sharding domain",
                    boundedText(state.name), domain.str(), boundedText(weight->name),
                    weight->shardDomain->str(), weightResolved.decidedBy + "/shardingDomain"));
  }

  void copyVariable(OpId id) {
    const TensorId t = in_.op(id).outputs[0];
    const TensorNode& node = in_.tensor(t);
    // Variables placed by hand (in a remote buffer, or sharded without a
    // domain) say where they live themselves.
    const bool placedByHand = node.remoteBuffer >= 0 || (sharded(node) && !node.shardDomain);
    if (!isFloating(node.dtype) || placedByHand) {
      const TensorId v = copy_.copySource(id, node);
      values_[index(t)] = {v, sharded(node), inDomain(t)};
      return;
    }
    const ResolvedLocation resolved =
        resolveTensorLocation(options_, {node.name, node.category, logicalElements(node)});
    TensorNode placed = node;
    // Weights were sharded before autodiff by the same rule; their gradients
    // and updates are built for that.
    if (node.category != TensorCategory::Weight) {
      const std::optional<ReplicaGrouping> domain = shardingDomainOf(resolved, node, in_.replicationFactor());
      if (domain && node.category == TensorCategory::OptimizerState) checkLinkedToWeight(node, *domain, resolved);
      placed = domain ? asShard(node, *domain) : asFull(node);
    }
    const TensorLocation& location = resolved.location;
    std::optional<Home> home;
    if (location.storage == TensorStorage::OffChip) {
      home = Home{Home::Kind::Remote, location.loadTileSet == TileSet::IO, -1, kNoTensor, false};
      home->buffer = out().addRemoteBuffer({placed.shape, placed.dtype, 1, placed.metaShape});
      placed.remoteBuffer = home->buffer;
      placed.remoteEntry = 0;
    } else if (location.storageTileSet == TileSet::IO) {
      home = Home{Home::Kind::IoTiles, true, -1, kNoTensor, false};
      placed.tileSet = TileSet::IO;
    }
    const bool isShard = sharded(placed);
    const std::optional<ReplicaGrouping> domain = placed.shardDomain;
    const TensorId v = copy_.copySource(id, std::move(placed));
    values_[index(t)] = {v, isShard, domain};
    if (home) {
      home->variable = v;
      homes_[t] = *home;
    }
  }

  // A copy of `from` (on the IO tiles) on the compute tiles, named
  // NAME.onCompute.
  Tensor toCompute(Tensor from, const std::string& name) {
    const Tensor copy = ops::copy(from);
    out().rename(copy.id(), copy_.freshName(name + ".onCompute"));
    return copy;
  }

  // The streaming-memory traffic of a tensor with a remote buffer, staged
  // through the IO tiles when `viaIoTiles` (the load lands on them, then a
  // copy to the compute tiles; the store's copy goes to them first). The
  // load is NAME.load, scheduled for `consumer`'s phase by `category`'s IO
  // schedule; `tag`, when set, is the category the load and the staged
  // store carry.
  Tensor loadFrom(int64_t buffer, bool viaIoTiles, const std::string& name, TensorCategory category,
                  std::optional<TensorCategory> tag, OpId consumer) {
    Tensor loaded = ops::remoteLoad(out(), RemoteBuffer{&out(), buffer}, 0);
    scheduleLoad(out().tensor(loaded.id()).producer, category, consumer);
    out().rename(loaded.id(), copy_.freshName(name + ".load"));
    if (tag) out().tensor(loaded.id()).category = *tag;
    if (!viaIoTiles) return loaded;
    out().tensor(loaded.id()).tileSet = TileSet::IO;
    return toCompute(loaded, name);
  }

  void storeTo(int64_t buffer, bool viaIoTiles, Tensor source, const std::string& name,
               std::optional<TensorCategory> tag) {
    if (viaIoTiles) {
      source = ops::copy(source);
      out().rename(source.id(), copy_.freshName(name + ".store"));
      out().tensor(source.id()).tileSet = TileSet::IO;
      if (tag) out().tensor(source.id()).category = *tag;
    }
    ops::remoteStore(out(), RemoteBuffer{&out(), buffer}, 0, source);
  }

  // The working copy of a variable with a home, made at its first use.
  void loadHome(TensorId t, Home& home, OpId consumer) {
    const TensorNode& node = in_.tensor(t);
    Value& value = values_[index(t)];
    const Tensor working =
        home.kind == Home::Kind::Remote
            ? loadFrom(home.buffer, home.viaIoTiles, node.name, node.category, node.category, consumer)
            : toCompute(outTensor(value.id), node.name);
    out().tensor(working.id()).category = node.category;
    value.id = working.id();
    home.loaded = true;
    home.phase = in_.op(consumer).executionPhase;
  }

  // Phased execution: whether a value loaded for phase `loadedFor` is loaded
  // again for `consumer`, which runs in another phase or (the optimizer's
  // update after the phases) in none: the copy of a phase is on chip only
  // in that phase.
  bool reloadFor(int64_t loadedFor, OpId consumer) const {
    return phased_ && loadedFor != kNoExecutionPhase && in_.op(consumer).executionPhase != loadedFor;
  }

  // Phased execution: a load for `consumer`'s phase p runs after the ops of
  // phase p - 1 (OnDemand) or p - 2 (Preload: during phase p - 1), by its
  // category's IO schedule.
  void scheduleLoad(OpId load, TensorCategory category, OpId consumer) {
    const OpNode& op = in_.op(consumer);
    if (!phased_ || op.executionPhase == kNoExecutionPhase || runs_.empty()) return;
    // The runs before the consumer's: the last one is its own when it has
    // begun already.
    std::size_t before = runs_.size();
    if (runs_.back().phase == op.executionPhase && runs_.back().microBatch == op.microBatch) --before;
    const std::size_t back =
        options_.executionPhaseSettings.ioSchedule(category) == ExecutionPhaseIOSchedule::OnDemand ? 1 : 2;
    if (before < back) return;
    out().addAfter(load, runs_[before - back].last);
  }

  // Records the op just copied for `id` in its phase's run.
  void notePhase(OpId id) {
    const OpNode& op = in_.op(id);
    if (!phased_ || op.executionPhase == kNoExecutionPhase || out().ops().empty()) return;
    if (runs_.empty() || runs_.back().phase != op.executionPhase || runs_.back().microBatch != op.microBatch)
      runs_.push_back({op.executionPhase, op.microBatch, kNoOp});
    runs_.back().last = static_cast<OpId>(out().ops().size()) - 1;
  }

  void writeBack(const TensorNode& node, const Home& home, TensorId current) {
    if (home.kind == Home::Kind::IoTiles) {
      ops::copyInplace(outTensor(home.variable), outTensor(current));
      return;
    }
    storeTo(home.buffer, home.viaIoTiles, outTensor(current), node.name, node.category);
  }

  // The value of input tensor t as op `consumer` reads it.
  Value current(TensorId t, OpId consumer) {
    if (auto home = homes_.find(t); home != homes_.end()) {
      Home& h = home->second;
      if (!h.loaded || (!h.modified && reloadFor(h.phase, consumer))) loadHome(t, h, consumer);
    }
    if (auto activation = activations_.find(t); activation != activations_.end() && readsKept(t, consumer)) {
      OffChipActivation& off = activation->second;
      if (off.loaded != kNoTensor && reloadFor(off.loadedPhase, consumer)) off.loaded = kNoTensor;
      if (off.loaded == kNoTensor && off.onIoTiles) {
        off.loaded = toCompute(outTensor(off.kept), in_.tensor(t).name).id();
      }
      if (off.loaded == kNoTensor) {
        off.loaded = loadFrom(off.buffer, off.viaIoTiles, in_.tensor(t).name, TensorCategory::Activation,
                              std::nullopt, consumer)
                         .id();
        off.loadedPhase = in_.op(consumer).executionPhase;
      }
      return {off.loaded, false, std::nullopt};
    }
    return values_[index(t)];
  }

  // The sharding domain of an input-graph tensor, as far as it is known.
  std::optional<ReplicaGrouping> inDomain(TensorId t) {
    auto& memo = inDomains_[index(t)];
    if (memo.first) return memo.second;
    memo.first = true;
    const TensorNode& node = in_.tensor(t);
    if (!sharded(node) || node.producer == kNoOp) return memo.second;
    const OpNode& op = in_.op(node.producer);
    const int64_t replicas = in_.replicationFactor();
    switch (op.kind) {
      case OpKind::Variable:
        if (node.shardDomain) {
          memo.second = node.shardDomain;
        } else {
          const ReplicaGrouping groups = node.grouping.value_or(ReplicaGrouping(replicas));
          if (groups.groupSize() == node.shardCount) memo.second = groups;
        }
        break;
      case OpKind::ReplicatedReduceScatter:
      case OpKind::ReplicaShardedSlice:
        memo.second = op.attributes.grouping.value_or(ReplicaGrouping(replicas));
        break;
      default:
        for (TensorId input : op.inputs) {
          if (sharded(in_.tensor(input))) {
            memo.second = inDomain(input);
            break;
          }
        }
    }
    return memo.second;
  }

  Value inValue(TensorId t) {
    const bool isShard = sharded(in_.tensor(t));
    return {kNoTensor, isShard, isShard ? inDomain(t) : std::nullopt};
  }

  [[noreturn]] void unknownSharding(TensorId original, std::string_view what) const {
    throw GraphError(
        ErrorCode::InvalidCollective, in_.tensor(original).name,
        fmt::format("{} would be needed, but the tensor was sharded by hand and its sharding domain is "
                    "not known; give it a domain (replicaShardedVariable with a grouping) or keep the "
                    "tensors it is combined with where the graph put them",
                    what));
  }

  // The full value of `v` (the value of input tensor `original`).
  TensorId fullOf(const Value& v, TensorId original) {
    if (!v.sharded) return v.id;
    if (!v.domain) unknownSharding(original, "an all-gather");
    if (auto it = gathers_.find(v.id); it != gathers_.end()) return it->second;
    const Shape full = out().tensor(v.id).metaShape;
    const Tensor gathered = ops::replicatedAllGather(outTensor(v.id), *v.domain, full);
    out().rename(gathered.id(), copy_.freshName(in_.tensor(original).name + ".gathered"));
    out().tensor(gathered.id()).category = in_.tensor(original).category;
    gathers_[v.id] = gathered.id();
    return gathered.id();
  }

  // This replica's shard over `domain` of the value `v`.
  TensorId shardOf(const Value& v, const ReplicaGrouping& domain, TensorId original) {
    if (v.sharded && v.domain == domain) return v.id;
    const TensorId full = fullOf(v, original);
    const std::pair key{full, std::pair{domain.stride(), domain.groupSize()}};
    if (auto it = slices_.find(key); it != slices_.end()) return it->second;
    const Tensor shard = ops::replicaShardedSlice(outTensor(full), domain);
    out().rename(shard.id(), copy_.freshName(in_.tensor(original).name + ".shard"));
    out().tensor(shard.id()).category = in_.tensor(original).category;
    slices_[key] = shard.id();
    return shard.id();
  }

  // `v` held the way the input graph held `original`.
  TensorId asInInput(const Value& v, TensorId original) {
    const Value wanted = inValue(original);
    if (sameHolding(v, wanted)) return v.id;
    if (!wanted.sharded) return fullOf(v, original);
    if (!wanted.domain) unknownSharding(original, "a sharded slice");
    return shardOf(v, *wanted.domain, original);
  }

  // Every input has the op's shape or one element: the op can run on shards.
  bool shardable(const OpNode& op) const {
    if (!isElementwise(op.kind) || op.outputs.empty()) return false;
    const DType dtype = in_.tensor(op.outputs[0]).dtype;
    if (!isFloating(dtype) || dtype == DType::Float64) return false;
    const Shape& shape = in_.tensor(isInplace(op.kind) ? op.inputs[0] : op.outputs[0]).shape;
    for (TensorId t : op.inputs) {
      if (in_.tensor(t).shape != shape && !scalarInput(t)) return false;
    }
    return true;
  }

  // A one-element value that broadcasts (a one-element shard does not).
  bool scalarInput(TensorId t) const {
    const TensorNode& node = in_.tensor(t);
    return numElements(node.shape) == 1 && !sharded(node);
  }

  void copyComputeOp(OpId id) {
    const OpNode& op = in_.op(id);
    std::vector<Value> inputs;
    inputs.reserve(op.inputs.size());
    bool unchanged = true;
    for (TensorId t : op.inputs) {
      inputs.push_back(current(t, id));
      unchanged = unchanged && sameHolding(inputs.back(), inValue(t));
    }
    if (isInplace(op.kind)) invalidate(out().storageOf(inputs[0].id));

    if (unchanged || !shardable(op)) {
      if (!unchanged && isInplace(op.kind) && !sameHolding(inputs[0], inValue(op.inputs[0]))) {
        throw GraphError(
            ErrorCode::InvalidOperand, op.name,
            fmt::format("{} modifies {} in place, which its location holds {}, with operands of "
                        "other shapes; only elementwise updates can be rewritten for a tensor held "
                        "differently from the graph. Change the tensor's replicatedTensorSharding "
                        "setting to {}",
                        op.name, in_.tensor(op.inputs[0]).name, inputs[0].sharded ? "as shards" : "whole",
                        inputs[0].sharded ? "Off" : "On"));
      }
      std::vector<TensorId> operands;
      operands.reserve(inputs.size());
      for (std::size_t i = 0; i < inputs.size(); ++i) operands.push_back(asInInput(inputs[i], op.inputs[i]));
      copy_.copyOp(id, std::move(operands));
      for (TensorId t : op.outputs)
        values_[index(t)] = {copy_.mapped(t), sharded(in_.tensor(t)), inValue(t).domain};
      return;
    }

    // Run the elementwise op on shards when an operand is held as shards
    // (an in-place op follows the tensor it modifies).
    std::optional<ReplicaGrouping> target;
    if (isInplace(op.kind)) {
      if (inputs[0].sharded) target = inputs[0].domain;
    } else {
      for (std::size_t i = 0; i < inputs.size() && !target; ++i) {
        if (!scalarInput(op.inputs[i]) && inputs[i].sharded && inputs[i].domain) target = inputs[i].domain;
      }
    }
    std::vector<TensorId> operands;
    operands.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const TensorId original = op.inputs[i];
      if (i == 0 && isInplace(op.kind)) {
        operands.push_back(inputs[0].id);
      } else if (scalarInput(original) || !target) {
        operands.push_back(fullOf(inputs[i], original));
      } else {
        operands.push_back(shardOf(inputs[i], *target, original));
      }
    }
    const Shape full = in_.tensor(op.outputs[0]).metaShape.empty() ? in_.tensor(op.outputs[0]).shape
                                                                   : in_.tensor(op.outputs[0]).metaShape;
    copy_.copyOp(id, std::move(operands));
    const TensorId y = copy_.mapped(op.outputs[0]);
    out().tensor(y).metaShape = target ? full : Shape{};
    values_[index(op.outputs[0])] = {y, target.has_value(), target};
  }

  // After op `id`: offload what it produced, write homes back after their
  // last update.
  void afterOp(OpId id) {
    const OpNode& op = in_.op(id);
    for (TensorId t : op.outputs) {
      auto activation = activations_.find(t);
      if (activation == activations_.end()) continue;
      OffChipActivation& off = activation->second;
      const Value& value = values_[index(t)];
      if (off.onIoTiles) {
        const Tensor kept = ops::copy(outTensor(value.id));
        out().rename(kept.id(), copy_.freshName(in_.tensor(t).name + ".onIo"));
        out().tensor(kept.id()).tileSet = TileSet::IO;
        off.kept = kept.id();
        continue;
      }
      off.buffer = out().addRemoteBuffer({out().tensor(value.id).shape, out().tensor(value.id).dtype, 1, {}});
      storeTo(off.buffer, off.viaIoTiles, outTensor(value.id), in_.tensor(t).name, std::nullopt);
    }
    if (!isInplace(op.kind)) return;
    const TensorId storage = in_.storageOf(op.inputs[0]);
    if (auto home = homes_.find(storage); home != homes_.end()) home->second.modified = true;
    if (lastWrite_[index(storage)] != id) return;
    if (auto home = homes_.find(storage); home != homes_.end()) {
      writeBack(in_.tensor(storage), home->second, values_[index(op.outputs[0])].id);
    }
  }

  // Conversions of a storage's old contents are stale once it is written.
  void invalidate(TensorId storage) {
    for (auto it = gathers_.begin(); it != gathers_.end();) {
      it = out().storageOf(it->first) == storage ? gathers_.erase(it) : std::next(it);
    }
    for (auto it = slices_.begin(); it != slices_.end();) {
      it = out().storageOf(it->first.first) == storage ? slices_.erase(it) : std::next(it);
    }
  }

  const Graph& in_;
  const SessionOptions& options_;
  GraphCopy copy_;
  std::vector<Value> values_;
  std::vector<std::pair<bool, std::optional<ReplicaGrouping>>> inDomains_;
  std::vector<char> forward_;
  std::vector<OpId> lastWrite_;
  std::unordered_map<TensorId, Home> homes_;
  std::unordered_map<TensorId, OffChipActivation> activations_;
  bool phased_;
  std::vector<PhaseRun> runs_;
  std::map<TensorId, TensorId> gathers_;
  std::map<std::pair<TensorId, std::pair<int64_t, int64_t>>, TensorId> slices_;
};

}  // namespace

ReplicaGrouping shardHolders(const ReplicaGrouping& variableGroups, const ReplicaGrouping& domain,
                             std::string_view tensor) {
  const int64_t replicas = domain.numReplicas();
  const int64_t holders = variableGroups.groupSize() / domain.groupSize();
  // The replicas holding the same shard as r: same variable group, same
  // index in the domain's group.
  const auto shardOf = [&](int64_t r) {
    return std::pair{variableGroups.groupAt(r), domain.indexInGroupAt(r)};
  };
  // Variables with one value on every replica: the holders of a shard are
  // the replicas at the same index of their domain group, the transpose of
  // the domain where it is a grouping (a stride of 1, or groups spanning all
  // replicas), found without a pass over the replicas.
  if (variableGroups.numGroups() == 1 &&
      (domain.stride() == 1 || domain.stride() * domain.groupSize() == replicas)) {
    return domain.transpose();
  }
  // A grouping that matches has replica 0's holders as its group 0, which
  // gives its stride; one pass over the replicas then checks it (a search
  // over strides comparing every pair of replicas is quadratic in them).
  std::vector<int64_t> first;
  for (int64_t r = 0; r < replicas && holders >= 1 && static_cast<int64_t>(first.size()) <= holders; ++r) {
    if (shardOf(r) == shardOf(0)) first.push_back(r);
  }
  if (holders >= 1 && static_cast<int64_t>(first.size()) == holders) {
    const int64_t stride = holders > 1 ? first[1] - first[0] : 1;
    if (replicas % (stride * holders) == 0) {
      const ReplicaGrouping candidate = detail::derivedGrouping(replicas, stride, holders);
      // Each group of the candidate holds one shard, and no two hold the same.
      std::vector<std::optional<std::pair<int64_t, int64_t>>> shardOfGroup(
          static_cast<std::size_t>(candidate.numGroups()));
      bool matches = true;
      for (int64_t r = 0; r < replicas && matches; ++r) {
        auto& shard = shardOfGroup[static_cast<std::size_t>(candidate.groupAt(r))];
        if (!shard) shard = shardOf(r);
        matches = *shard == shardOf(r);
      }
      std::vector<std::pair<int64_t, int64_t>> shards;
      for (const auto& shard : shardOfGroup) shards.push_back(shard.value_or(std::pair{-1, -1}));
      std::sort(shards.begin(), shards.end());
      if (matches && std::adjacent_find(shards.begin(), shards.end()) == shards.end()) return candidate;
    }
  }
  throw GraphError(
      ErrorCode::InvalidCollective, std::string(tensor),
      fmt::format("the replicas holding the same shard over {} within {} do not form a replica "
                  "grouping, so its gradient cannot be reduced over them; choose an All, Consecutive "
                  "or Orthogonal sharding domain that divides the variable's groups evenly",
                  domain.str(), variableGroups.str()));
}

std::optional<ReplicaGrouping> accumulatorShardingDomain(const SessionOptions& options,
                                                         const TensorNode& weight, const std::string& name) {
  const int64_t replicas =
      weight.grouping ? weight.grouping->numReplicas() : options.getGlobalReplicationFactor();
  const ResolvedLocation resolved =
      resolveTensorLocation(options, {name, TensorCategory::Accumulator, logicalElements(weight)});
  TensorNode like = asFull(weight);
  like.name = name;
  const std::optional<ReplicaGrouping> domain = shardingDomainOf(resolved, like, replicas);
  if (!domain || !sharded(weight)) return sharded(weight) ? std::nullopt : domain;
  if (weight.shardDomain != domain) {
    throw ConfigError(
        ErrorCode::UnsupportedCombination, resolved.decidedBy + "/shardingDomain",
        fmt::format("{}: the accumulator asks to be sharded over {} but its weight {} is sharded over "
                    "{}; give the accumulator and the weight the same sharding domain, or set the "
                    "accumulator's replicatedTensorSharding to Off",
                    name, domain->str(), weight.name,
                    weight.shardDomain ? weight.shardDomain->str() : std::string("its own groups")));
  }
  return std::nullopt;
}

Tensor shardedZeroVariable(Tensor weight, std::string name, const ReplicaGrouping& domain) {
  const TensorNode& node = weight.node();
  const int64_t groups = node.grouping ? node.grouping->numGroups() : 1;
  TensorNode state = asShard(node, domain);
  state.name = std::move(name);
  state.category = TensorCategory::Accumulator;
  state.initial = InitialValues::filled(groups * numElements(state.metaShape), 0.0F);
  state.producer = kNoOp;
  state.consumers.clear();
  state.aliasOf = kNoTensor;
  state.remoteBuffer = -1;
  return Tensor{&weight.graph(), weight.graph().addSource(OpKind::Variable, std::move(state))};
}

WeightShardingTransform::WeightShardingTransform(const SessionOptions& options, TrainingTensors* tensors)
    : options_(options), tensors_(tensors) {}

void WeightShardingTransform::apply(Graph& graph) {
  const int64_t replicas = graph.replicationFactor();
  // The weights to shard, decided before anything is copied: most graphs
  // have none, and then nothing is rebuilt.
  std::unordered_map<OpId, ReplicaGrouping> domains;
  for (std::size_t i = 0; i < graph.ops().size(); ++i) {
    const OpNode& op = graph.ops()[i];
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = graph.tensor(op.outputs[0]);
    if (node.category != TensorCategory::Weight || !isFloating(node.dtype) || sharded(node) ||
        node.remoteBuffer >= 0) {
      continue;
    }
    const std::optional<ReplicaGrouping> domain = shardingDomainOf(
        resolveTensorLocation(options_, {node.name, TensorCategory::Weight, numElements(node.shape)}), node,
        replicas);
    if (domain) domains.emplace(static_cast<OpId>(i), *domain);
  }
  if (domains.empty()) return;
  GraphCopy copy(graph);
  std::unordered_map<TensorId, TensorId> variables;  // original weight -> its sharded variable
  for (std::size_t i = 0; i < graph.ops().size(); ++i) {
    const auto id = static_cast<OpId>(i);
    const OpNode& op = graph.op(id);
    if (op.kind == OpKind::Input || op.kind == OpKind::Constant) {
      copy.copySource(id, graph.tensor(op.outputs[0]));
      continue;
    }
    if (op.kind != OpKind::Variable) {
      copyOpWithMappedInputs(copy, id);
      continue;
    }
    const TensorNode& node = graph.tensor(op.outputs[0]);
    const auto domain = domains.find(id);
    if (domain == domains.end()) {
      copy.copySource(id, node);
      continue;
    }
    const TensorId shard = copy.copySource(id, asShard(node, domain->second));
    const Tensor full = ops::replicatedAllGather(Tensor{&copy.out(), shard}, domain->second, node.shape);
    copy.out().rename(full.id(), copy.freshName(node.name + ".gathered"));
    copy.setMapped(op.outputs[0], full.id());
    variables[op.outputs[0]] = shard;
  }
  copy.copyOrder();
  if (tensors_ != nullptr) {
    if (tensors_->loss != kNoTensor) tensors_->loss = copy.mapped(tensors_->loss);
    for (TensorId& w : tensors_->weights) w = variables.count(w) != 0 ? variables.at(w) : copy.mapped(w);
    for (TensorId& g : tensors_->gradients) g = copy.mapped(g);
    if (tensors_->lossScale != kNoTensor) tensors_->lossScale = copy.mapped(tensors_->lossScale);
  }
  graph = copy.take();
}

LocationTransform::LocationTransform(const SessionOptions& options, TrainingTensors* tensors)
    : options_(options), tensors_(tensors) {}

namespace {

// Every per-tensor override names a tensor of the training graph (which has
// them all: weights, gradients, accumulators, optimizer state); a name
// without one is a typo that would otherwise change nothing, silently.
void checkOverridesNameTensors(const Graph& graph, const SessionOptions& options) {
  for (const auto& entry : options.tensorLocationSettingsOverride) {
    const std::string& name = entry.first;
    if (graph.tryFind(name)) continue;
    std::vector<std::string_view> names;
    names.reserve(graph.tensors().size());
    for (const TensorNode& node : graph.tensors()) names.push_back(node.name);
    const std::optional<std::string_view> match = jsonio::closestMatch(name, names);
    throw GraphError(
        ErrorCode::UnknownTensor, detail::overridePath(name),
        fmt::format("the override names tensor \"{}\" but the model has no tensor of that name{}; "
                    "use a name tessera explain lists, or remove the override",
                    jsonio::printable(name),
                    match ? fmt::format(" (did you mean \"{}\"?)", *match) : std::string()));
  }
}

}  // namespace

void LocationTransform::apply(Graph& graph) {
  if (tensors_ != nullptr) checkOverridesNameTensors(graph, options_);
  Relocator relocator(graph, options_, tensors_ != nullptr ? tensors_->loss : kNoTensor);
  if (!relocator.changesAnything()) return;
  Graph rebuilt = relocator.run();
  if (tensors_ != nullptr) {
    if (tensors_->loss != kNoTensor) tensors_->loss = relocator.valueId(tensors_->loss);
    for (TensorId& w : tensors_->weights) w = relocator.mapped(w);
    for (TensorId& g : tensors_->gradients) g = relocator.valueId(g);
    if (tensors_->lossScale != kNoTensor) tensors_->lossScale = relocator.mapped(tensors_->lossScale);
  }
  graph = std::move(rebuilt);
}

}  // namespace tessera
