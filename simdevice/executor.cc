#include "executor.hpp"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "collectives.hpp"
#include "half.hpp"
#include "kernel_table.hpp"
#include "memory_planner.hpp"
#include "op_def.hpp"
#include "tessera/popdist/communicator.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/shard_layout.hpp"
#include "time_model.hpp"

namespace tessera::sim {
namespace {

constexpr int64_t kAlignFloats = 16;  // 64-byte aligned buffers

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

int64_t alignUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Floats one value of a tensor takes in the arena and in host buffers (a
// float64 element takes two).
int64_t floatsOf(const TensorNode& node) { return numElements(node.shape) * dtypeSlots(node.dtype); }

// Whether an op reads or makes a float64 tensor (its steps compute in double).
bool touchesFloat64(const Graph& graph, const OpNode& op) {
  const auto wide = [&](TensorId t) { return graph.tensor(t).dtype == DType::Float64; };
  return std::any_of(op.inputs.begin(), op.inputs.end(), wide) ||
         std::any_of(op.outputs.begin(), op.outputs.end(), wide);
}

// One operand of a step: its layout, elements per group and an extra offset
// inside each group (slices).
struct Operand {
  const ReplicaGrouping* layout = nullptr;
  int64_t elements = 0;
  int64_t offset = 0;
};

// Runs of output groups (see kernels.hpp). `maxCount` is 1 in the
// per-replica reference plan.
std::vector<Run> makeRuns(const ReplicaGrouping& out, int64_t outElements, int64_t outOffset,
                          std::span<const Operand> operands, int64_t maxCount) {
  const int64_t groups = out.numGroups();
  std::vector<std::vector<int64_t>> source(operands.size());
  for (std::size_t i = 0; i < operands.size(); ++i) {
    source[i].reserve(at(groups));
    for (int64_t j = 0; j < groups; ++j)
      source[i].push_back(operands[i].layout->groupAt(out.replicaAt(j, 0)));
  }
  std::vector<Run> runs;
  for (int64_t j0 = 0; j0 < groups;) {
    Run run;
    run.out = j0 * outElements + outOffset;
    run.advance.fill(true);
    for (std::size_t i = 0; i < operands.size(); ++i) {
      run.in[i] = source[i][at(j0)] * operands[i].elements + operands[i].offset;
    }
    int64_t count = 1;
    for (; j0 + count < groups && count < maxCount; ++count) {
      const int64_t j = j0 + count;
      bool fits = true;
      for (std::size_t i = 0; i < operands.size() && fits; ++i) {
        const int64_t delta = source[i][at(j)] - source[i][at(j0)];
        if (count == 1) {
          if (delta != 0 && delta != 1) fits = false;
          run.advance[i] = delta == 1;
        } else {
          fits = delta == (run.advance[i] ? count : 0);
        }
      }
      if (!fits) break;
    }
    if (count == 1) run.advance.fill(true);
    run.count = count;
    runs.push_back(run);
    j0 += count;
  }
  return runs;
}

// Elements of a step that a TileKernel can run in slices: one run, a loop of
// at most one dimension over contiguous output, inputs read contiguously at
// the output's index or as a scalar. -1 for any other step.
int64_t flatElements(const Step& step) {
  if (tileKernel(step.kind) == nullptr || step.float64 || step.runs.size() != 1 || step.zeroFirst ||
      step.outLoopOffset != 0)
    return -1;
  const Run& run = step.runs.front();
  const StridedLoop& loop = run.loop;
  if (loop.rank == 0) return 1;
  if (loop.rank != 1 || loop.stride[0][0] != 1) return -1;
  for (std::size_t i = 1; i < kMaxOperands; ++i)
    if (loop.stride[i][0] != 0 && loop.stride[i][0] != 1) return -1;
  return loop.size[0] == run.count * step.outElements ? loop.size[0] : -1;
}

// Collectives split a step from 2^14 elements a part, reductions with an
// output of more than one element from 2^12, the strided copies, the
// elementwise ops and Where from loopParts' size (Step::splitsLoop; the
// other kernels outside the ones below never), so a step of fewer elements
// than two collective parts runs on one thread.
constexpr int64_t kWholeStepElements = int64_t{1} << 15;

// A step worth running beside another has at least this many elements (or
// multiply-adds of a product): a few microseconds of work. Below it, handing
// it to another core costs more than it saves, chiefly because the next
// steps read its output from that core's cache (bench/RESULTS.md).
constexpr int64_t kBesideElements = int64_t{1} << 13;
constexpr int64_t kBesideProductWork = int64_t{1} << 17;

// Whether `step` would run on one thread anyway on a pool of `threads`
// (then running it beside other steps takes nothing from it) and has work
// enough to be worth another thread's while.
bool runsBeside(const Step& step, int threads) {
  if (step.kernel == chainKernel())
    return chainParts(step.chainElements, threads) == 1 && step.chainElements >= kBesideElements;
  int64_t count = 1;
  for (const Run& run : step.runs) count = std::max(count, run.count);
  // Steps that split themselves over the threads when large enough.
  if (step.splitsLoop) {
    for (const Run& run : step.runs)
      if (loopParts(run.loop.elements(), threads) > 1) return false;  // forLoopParts
  }
  if (step.kind == OpKind::ReduceSum || step.kind == OpKind::ReduceMean ||
      step.kind == OpKind::ReduceToShape) {
    for (const Run& run : step.runs)
      if (reduceParts(run.loop, threads) > 1) return false;  // reduceKernel
  }
  if (step.kernel == matmulKernel() || step.kernel == batchedMatmulKernel()) {
    const GemmShape largest{count * step.rows, step.cols,   step.depth,
                            step.transA,       step.transB, step.halfOutput};
    return gemmParts(step.gemmPlan, largest, threads) == 1 &&
           count * step.rows * step.cols * step.depth >= kBesideProductWork;
  }
  switch (step.kind) {
    case OpKind::Conv:
    case OpKind::ConvTranspose:
    case OpKind::ConvGradWeight:
    case OpKind::MaxPool:
    case OpKind::MaxPoolGrad:
    case OpKind::AveragePool:
    case OpKind::AveragePoolGrad: return false;  // split by samples, planes or blocks of work
    case OpKind::Rnn:
    case OpKind::Gru:
    case OpKind::Lstm:
    case OpKind::RecurrenceGrad:
    case OpKind::RecurrenceWeightGrad:
    case OpKind::RecurrenceInputGrad: return false;  // split by lanes or rows (simdevice/ops/recurrence.cc)
    case OpKind::BatchNormStats:
    case OpKind::BatchNorm:
    case OpKind::BatchNormGradStats:
    case OpKind::BatchNormGrad:
      // Split by channels when there are enough (simdevice/ops/normalization.cc).
      if (normalizationParts(step, threads) > 1) return false;
      break;
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      // Split by rows when there are enough (softmaxKernel).
      if (step.cols > 0 && rowParts(count * step.outElements / step.cols, step.cols, threads) > 1)
        return false;
      break;
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::SoftmaxCrossEntropyGrad:
      if (rowParts(step.rows, step.cols, threads) > 1) return false;
      break;
    default: break;
  }
  int64_t elements = step.outElements;
  for (const int64_t n : step.inElements) elements = std::max(elements, n);
  int64_t total = 0;
  for (const Run& run : step.runs) total += run.count * elements;
  return total < kWholeStepElements && total >= kBesideElements;
}

// Whether every memory access of a step is to its op's storages (or its
// chain's ops'): not an exchange between instances, a remote transfer or a
// step of no op.
bool touchesOnlyItsOps(const Step& step) {
  return step.op != kNoOp && step.exchange == nullptr && step.kind != OpKind::RemoteLoad &&
         step.kind != OpKind::RemoteStore;
}

// Whether two lists of storages share one.
bool meets(const std::vector<TensorId>& a, const std::vector<TensorId>& b) {
  return std::any_of(a.begin(), a.end(),
                     [&](TensorId t) { return std::find(b.begin(), b.end(), t) != b.end(); });
}

// The step that runs `first` and the steps after it as one (a fused chain,
// a group side by side), named after the first.
Step stepOfSteps(const Step& first, Kernel kernel) {
  Step step;
  step.kind = first.kind;
  step.op = first.op;
  step.name = first.name;
  step.kernel = kernel;
  return step;
}

// A memory range a flat step reads or writes.
struct Access {
  const float* begin = nullptr;
  int64_t size = 0;
  bool write = false;
};

std::vector<Access> flatAccesses(const Step& step, int64_t n) {
  const Run& run = step.runs.front();
  std::vector<Access> accesses{{step.out + run.out, n, true}};
  for (std::size_t i = 0; i < kMaxOperands; ++i) {
    if (step.in[i] == nullptr) continue;
    const bool whole = run.loop.rank == 0 || run.loop.stride[i + 1][0] == 1;
    accesses.push_back({step.in[i] + run.in[i], whole ? n : 1, false});
  }
  return accesses;
}

// Slice-by-slice order gives every step the values that step-by-step order
// gives when the only memory that one step writes and another touches is the
// same whole range: element e of a step then depends only on element e of
// the steps before it. Any other overlap (a scalar or a shifted range inside
// a written buffer) keeps the steps apart.
bool sliceable(const std::vector<std::vector<Access>>& chain, const std::vector<Access>& next) {
  for (const std::vector<Access>& earlier : chain) {
    for (const Access& a : earlier) {
      for (const Access& b : next) {
        if (!a.write && !b.write) continue;
        const bool overlap = a.begin < b.begin + b.size && b.begin < a.begin + a.size;
        if (overlap && (a.begin != b.begin || a.size != b.size)) return false;
      }
    }
  }
  return true;
}

}  // namespace

SimExecutable::SimExecutable(Program program, const DeviceSpec& spec, ExecutionMode mode,
                             std::shared_ptr<Communicator> communicator)
    : program_(std::move(program)), mode_(mode), communicator_(std::move(communicator)) {
  checkProgram();
  const Graph& graph = program_.graph;
  schedule_ = graph.schedule();
  // A program that does not fit is rejected before any buffer is allocated.
  memory_ = planMemory(program_, schedule_, spec);
  requireFits(memory_);
  time_ = modelTime(graph, program_.replicas, schedule_, spec);
  addHostStreams(time_, program_, spec);
  position_.assign(graph.ops().size(), -1);
  for (std::size_t p = 0; p < schedule_.size(); ++p) position_[at(schedule_[p])] = static_cast<int64_t>(p);
  layouts_ = inferLayouts(graph, schedule_, program_.replicas, mode_, &bufferLayouts_);
  writes_.assign(graph.tensors().size(), {});
  for (OpId id : schedule_) {
    const OpNode& op = graph.op(id);
    if (isInplace(op.kind)) writes_[at(graph.storageOf(op.inputs[0]))].push_back(position_[at(id)]);
  }
  pool_ = std::make_unique<WorkerPool>(deviceThreads(spec));
  planFusions();
  planRemoteAliases();
  planSharedOutputs();
  planBuffers();
  initialiseValues();
  planSteps();
}

void SimExecutable::checkProgram() const {
  const Program& p = program_;
  // Every op needs kernels here (an op registered at run time may have none),
  // and a float64 kernel when it reads or makes a float64 tensor.
  for (const OpNode& op : p.graph.ops()) {
    const KernelDef& kernels = kernelDef(op.kind, op.name);
    if (kernels.planFloat64 != nullptr || kernels.plan == nullptr || !touchesFloat64(p.graph, op)) continue;
    throw DeviceError(
        ErrorCode::InvalidProgram, op.name,
        fmt::format("op \"{}\" ({}) reads or makes a float64 tensor, and the simulated device has "
                    "no float64 kernel for {} (it computes float64 in the elementwise ops, Where, "
                    "the casts and the shape ops); cast to float32 with ops::cast around the op, "
                    "or import ONNX doubles with doubleAsFloat",
                    op.name, op.kind, op.kind));
  }
  for (std::size_t b = 0; b < p.graph.remoteBuffers().size(); ++b) {
    if (p.graph.remoteBuffers()[b].dtype != DType::Float64) continue;
    throw DeviceError(ErrorCode::InvalidProgram, fmt::format("remote buffer #{}", b),
                      "the buffer holds float64 values; streaming memory holds float32, float16 and int32 "
                      "tensors (keep float64 values on chip)");
  }
  // The replica topology was derived and checked against the graph where
  // the program was made (ReplicaTopology::fromOptions, checkReplicationFactor).
  assert(p.replicas.consistent() && p.replicas.globalReplicas == p.graph.replicationFactor());
  if (p.numIOTiles < 0) {
    throw DeviceError(ErrorCode::InvalidProgram, "Program.numIOTiles",
                      fmt::format("numIOTiles is {}; it must be >= 0", p.numIOTiles));
  }
  if (p.hostReads) {
    const auto tensors = static_cast<int64_t>(p.graph.tensors().size());
    for (TensorId t : *p.hostReads) {
      if (t < 0 || t >= tensors) {
        throw DeviceError(ErrorCode::InvalidProgram, "Program.hostReads",
                          fmt::format("tensor id {} is not in the graph; ids are 0..{}", t, tensors - 1));
      }
    }
  }
  // The other replicas live on other instances: instance i simulates
  // replicas i * localReplicas onwards and is the communicator's rank i.
  // (Without a communicator, only collectives that stay within this
  // device's replicas can run; planning the others says so.)
  if (!p.replicas.distributed() || communicator_ == nullptr) return;
  const int64_t instances = p.replicas.instances();
  const int64_t instance = p.replicas.instance();
  if (communicator_->size() != instances || communicator_->rank() != instance) {
    throw DeviceError(
        ErrorCode::InvalidProgram, "Program.globalReplicas",
        fmt::format("the program runs replicas {}..{} of {} as instance {} of {}, but the device is "
                    "instance {} of {}; give each instance the communicator of its rank in a communicator of "
                    "the run's instances",
                    p.replicas.replicaOffset, p.replicas.replicaOffset + p.replicas.localReplicas - 1,
                    p.replicas.globalReplicas, instance, instances, communicator_->rank(),
                    communicator_->size()));
  }
}

void SimExecutable::planFusions() {
  const Graph& graph = program_.graph;
  const std::size_t opCount = graph.ops().size();
  foldedTranspose_.assign(opCount, 0);
  fusedInto_.assign(opCount, kNoOp);
  if (mode_ == ExecutionMode::PerReplicaReference) return;
  // True when no in-place op writes t's storage strictly between positions.
  auto unchanged = [&](TensorId t, int64_t from, int64_t to) {
    for (int64_t p : writes_[at(graph.storageOf(t))])
      if (p > from && p < to) return false;
    return true;
  };
  auto isPlainTranspose = [&](TensorId t) {
    const OpNode& op = graph.op(graph.tensor(t).producer);
    return op.kind == OpKind::Transpose && op.attributes.axes == std::vector<int64_t>{1, 0};
  };
  const int64_t replicas = program_.replicas.localReplicas;

  for (OpId id : schedule_) {
    const OpNode& ar = graph.op(id);
    const bool scatters = ar.kind == OpKind::ReplicatedReduceScatter;
    if (ar.kind != OpKind::ReplicatedAllReduce && !scatters) continue;
    const TensorId product = ar.inputs[0];
    const OpId mm = graph.tensor(product).producer;
    const OpNode& matmul = graph.op(mm);
    if (matmul.kind != OpKind::MatMul || graph.tensor(product).consumers.size() != 1) continue;
    if (!isPlainTranspose(matmul.inputs[0])) continue;
    const OpId tr = graph.tensor(matmul.inputs[0]).producer;
    const TensorId x = graph.op(tr).inputs[0];
    const TensorId dy = matmul.inputs[1];
    if (graph.tensor(dy).shape.size() != 2) continue;
    if (layouts_[at(x)].numGroups() != replicas || layouts_[at(dy)].numGroups() != replicas) continue;
    const ReplicaGrouping& out = layouts_[at(product)];
    const ReplicaGrouping& reduced = layouts_[at(ar.outputs[0])];
    // Groups of consecutive replicas: group c is replicas c*g .. c*g+g-1.
    const ReplicaGrouping grouping =
        ar.attributes.grouping.value_or(ReplicaGrouping(program_.replicas.globalReplicas));
    if (out.numGroups() != replicas) continue;
    if (scatters ? !scatteredByGroup(grouping, reduced)
                 : !consecutiveGroupsLayout(program_.replicas, grouping, reduced))
      continue;
    const int64_t reducedAt = position_[at(id)];
    if (!unchanged(x, position_[at(tr)], reducedAt) || !unchanged(dy, position_[at(mm)], reducedAt)) continue;
    fusedInto_[at(mm)] = id;
  }

  for (OpId id : schedule_) {
    const OpNode& op = graph.op(id);
    if (op.kind != OpKind::Transpose || !isPlainTranspose(op.outputs[0])) continue;
    const TensorNode& out = graph.tensor(op.outputs[0]);
    if (out.consumers.empty()) continue;
    int64_t lastRead = position_[at(id)];
    bool onlyGemms = true;
    for (OpId c : out.consumers) {
      onlyGemms = onlyGemms && graph.op(c).kind == OpKind::MatMul;
      const OpId reader = fusedInto_[at(c)] != kNoOp ? fusedInto_[at(c)] : c;
      lastRead = std::max(lastRead, position_[at(reader)]);
    }
    if (onlyGemms && unchanged(op.inputs[0], position_[at(id)], lastRead)) {
      foldedTranspose_[at(id)] = 1;
      ++stats_.foldedTransposes;
    }
  }
  for (OpId ar : fusedInto_)
    if (ar != kNoOp) ++stats_.fusedGemmAllReduces;
}

bool SimExecutable::scatteredByGroup(const ReplicaGrouping& grouping,
                                     const ReplicaGrouping& scattered) const {
  // Without the other instances, members they hold cannot be read; planning
  // the unfused collective names them.
  if (crossesInstances(program_.replicas, grouping) && communicator_ == nullptr) return false;
  if (!consecutiveGroups(program_.replicas, grouping) ||
      scattered.numGroups() != program_.replicas.localReplicas)
    return false;
  for (int64_t r = 0; r < program_.replicas.localReplicas; ++r)
    if (scattered.groupAt(r) != r) return false;
  return true;
}

void SimExecutable::planBuffers() {
  const Graph& graph = program_.graph;
  offset_.assign(graph.tensors().size(), -1);
  int64_t total = 0;
  for (std::size_t t = 0; t < graph.tensors().size(); ++t) {
    const TensorNode& node = graph.tensors()[t];
    if (graph.storageOf(static_cast<TensorId>(t)) != static_cast<TensorId>(t)) continue;
    const OpId producer = node.producer;
    if (foldedTranspose_[at(producer)] || fusedInto_[at(producer)] != kNoOp) continue;
    if (aliasOf_[t].first >= 0 || sharedWith_[t] >= 0) continue;
    offset_[t] = total;
    total += alignUp(layouts_[t].numGroups() * floatsOf(node));
  }
  stats_.arenaFloats = total;
  // Remote buffers follow in the same array, so that a loaded value can
  // live in its entry (planRemoteAliases).
  for (const RemoteBufferInfo& info : graph.remoteBuffers()) {
    remoteBase_.push_back(total);
    total += alignUp(info.entries * program_.replicas.localReplicas * numElements(info.shape));
  }
  arena_.assign(at(total), 0.0f);
  for (std::size_t t = 0; t < graph.tensors().size(); ++t) {
    const auto [buffer, entry] = aliasOf_[t];
    if (buffer < 0) continue;
    offset_[t] = remoteEntry(buffer, entry, graph.tensors()[t].name) - arena_.data();
  }
  // The sources are planned (each is a root storage, see planSharedOutputs).
  for (std::size_t t = 0; t < graph.tensors().size(); ++t)
    if (sharedWith_[t] >= 0) offset_[t] = offset_[at(sharedWith_[t])];
}

std::vector<char> SimExecutable::hostReadStorages() const {
  const Graph& graph = program_.graph;
  std::vector<char> read(graph.tensors().size(), 0);
  for (TensorId t : *program_.hostReads) read[at(graph.storageOf(t))] = 1;
  return read;
}

int64_t SimExecutable::readPosition(OpId reader) const {
  if (fusedInto_[at(reader)] != kNoOp) return position_[at(fusedInto_[at(reader)])];
  if (!foldedTranspose_[at(reader)]) return position_[at(reader)];
  int64_t last = position_[at(reader)];
  for (OpId c : program_.graph.tensor(program_.graph.op(reader).outputs[0]).consumers)
    last = std::max(last, readPosition(c));
  return last;
}

void SimExecutable::planSharedOutputs() {
  const Graph& graph = program_.graph;
  sharedWith_.assign(graph.tensors().size(), -1);
  if (mode_ != ExecutionMode::Vectorized || !program_.hostReads) return;
  const std::vector<char> hostRead = hostReadStorages();
  const int64_t replicas = program_.replicas.localReplicas;
  for (OpId id : schedule_) {
    const OpNode& op = graph.op(id);
    const bool cast = op.kind == OpKind::CastToFloat32;
    const bool gather = op.kind == OpKind::ReplicatedAllGather;
    const bool reshape = op.kind == OpKind::Reshape;
    if ((!cast && !gather && !reshape) || elided_[at(id)]) continue;
    const TensorId x = op.inputs[0];
    const TensorId y = op.outputs[0];
    const TensorNode& in = graph.tensor(x);
    // A float64 value's cast rounds (a reshape of one moves its two floats
    // as they are).
    if ((in.dtype == DType::Float64 && !reshape) || graph.storageOf(y) != y || hostRead[at(y)] ||
        !writes_[at(y)].empty())
      continue;
    const TensorId source = memoryOf(x);
    const OpId producer = graph.tensor(source).producer;
    // Unstored values (folded transposes, fused products) and values living
    // in a remote entry keep their copy.
    if (producer == kNoOp || foldedTranspose_[at(producer)] || fusedInto_[at(producer)] != kNoOp ||
        aliasOf_[at(source)].first >= 0 || numElements(graph.tensor(source).shape) != numElements(in.shape))
      continue;
    // A cast keeps the shape, a reshape the elements in their order: either
    // is its operand's memory when both are laid out over the same groups.
    if (cast && in.shape != graph.tensor(y).shape) continue;
    if ((cast || reshape) && !(layouts_[at(source)] == layouts_[at(y)])) continue;
    if (gather) {
      // On one instance, groups of consecutive replicas gathering shards
      // without padding, stored in replica order: each group's gathered
      // value is its members' shards as they are, and the groups follow
      // each other as the gathered values' groups do.
      const ReplicaGrouping& shards = layouts_[at(source)];
      const ReplicaGrouping& gathered = layouts_[at(y)];
      const ReplicaGrouping grouping =
          op.attributes.grouping.value_or(ReplicaGrouping(program_.replicas.globalReplicas));
      const int64_t g = grouping.groupSize();
      bool inOrder = program_.replicas.globalReplicas == replicas && (g == 1 || grouping.stride() == 1) &&
                     gathered.numGroups() * g == replicas && shards.numGroups() == replicas &&
                     numElements(graph.tensor(y).shape) == g * numElements(in.shape);
      for (int64_t r = 0; r < replicas && inOrder; ++r)
        inOrder = shards.groupAt(r) == r && gathered.groupAt(r) == r / g;
      if (!inOrder) continue;
    }
    // Nothing writes the memory from the op until y's last reader.
    int64_t lastRead = position_[at(id)];
    for (OpId reader : graph.tensor(y).consumers) lastRead = std::max(lastRead, readPosition(reader));
    const std::vector<int64_t>& written = writes_[at(source)];
    if (std::any_of(written.begin(), written.end(),
                    [&](int64_t p) { return p > position_[at(id)] && p <= lastRead; }))
      continue;
    sharedWith_[at(y)] = source;
    elided_[at(id)] = 1;
    ++(cast ? stats_.castAliases : gather ? stats_.gatherAliases : stats_.reshapeAliases);
  }
}

void SimExecutable::planRemoteAliases() {
  const Graph& graph = program_.graph;
  aliasOf_.assign(graph.tensors().size(), {-1, -1});
  elided_.assign(graph.ops().size(), 0);
  if (mode_ != ExecutionMode::Vectorized || !program_.hostReads) return;
  const std::vector<char> hostRead = hostReadStorages();
  // Where each storage is last read or written; a fused or folded reader
  // reads where the step that computes it runs.
  std::vector<int64_t> lastAccess(graph.tensors().size(), -1);
  for (OpId id : schedule_) {
    const OpNode& op = graph.op(id);
    for (TensorId in : op.inputs) {
      int64_t& last = lastAccess[at(graph.storageOf(in))];
      last = std::max(last, readPosition(id));
    }
    for (TensorId out : op.outputs) {
      int64_t& last = lastAccess[at(graph.storageOf(out))];
      last = std::max(last, position_[at(id)]);
    }
  }
  // Transfers of each entry, in schedule order.
  std::map<std::pair<int64_t, int64_t>, std::vector<OpId>> transfers;
  for (OpId id : schedule_) {
    const OpNode& op = graph.op(id);
    if (op.kind == OpKind::RemoteLoad || op.kind == OpKind::RemoteStore)
      transfers[{op.attributes.remoteBuffer, op.attributes.entry}].push_back(id);
  }
  const int64_t replicas = program_.replicas.localReplicas;
  for (const auto& transfer : transfers) {
    // Not a structured binding: lambdas below capture these.
    const std::pair<int64_t, int64_t>& entry = transfer.first;
    const std::vector<OpId>& ops = transfer.second;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const OpNode& load = graph.op(ops[i]);
      if (load.kind != OpKind::RemoteLoad) continue;
      const TensorId t = load.outputs[0];
      const ReplicaGrouping& layout = layouts_[at(t)];
      // The entry stores one value per local replica, in replica order.
      bool inOrder = layout.numGroups() == replicas && graph.storageOf(t) == t && !hostRead[at(t)] &&
                     bufferLayouts_[at(entry.first)].numGroups() == replicas;
      for (int64_t r = 0; r < replicas && inOrder; ++r) inOrder = layout.groupAt(r) == r;
      if (!inOrder) continue;
      // A store into the entry among its transfers from index `from` on,
      // while t is still read or written.
      const auto storedWhileLive = [&](std::size_t from) {
        for (std::size_t j = from; j < ops.size() && position_[at(ops[j])] <= lastAccess[at(t)]; ++j)
          if (graph.op(ops[j]).kind == OpKind::RemoteStore) return true;
        return false;
      };
      const OpId next = i + 1 < ops.size() ? ops[i + 1] : kNoOp;
      if (writes_[at(t)].empty()) {
        // Read only: the entry keeps the value while the tensor is live.
        if (storedWhileLive(i + 1)) continue;
        elided_[at(ops[i])] = 1;
      } else {
        // Updated in place, then stored back as the entry's next transfer,
        // and only read after that while no other value is stored into the
        // entry: the entry is the tensor's memory.
        if (next == kNoOp || graph.op(next).kind != OpKind::RemoteStore ||
            graph.storageOf(graph.op(next).inputs[0]) != t || writes_[at(t)].back() > position_[at(next)] ||
            storedWhileLive(i + 2))
          continue;
        elided_[at(ops[i])] = 1;
        elided_[at(next)] = 1;
      }
      aliasOf_[at(t)] = entry;
      ++stats_.remoteAliases;
    }
  }
}

void SimExecutable::initialiseValues() {
  const Graph& graph = program_.graph;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Variable && op.kind != OpKind::Constant) continue;
    const TensorId t = op.outputs[0];
    const TensorNode& node = graph.tensor(t);
    const ReplicaGrouping& layout = layouts_[at(t)];
    const int64_t n = floatsOf(node);
    float* base = arena_.data() + offset_[at(t)];
    // A variable's host values are made here, once, and only while it is
    // written to the arena.
    std::vector<float> made;
    if (op.kind == OpKind::Variable && node.initial.explicitValues() == nullptr) made = node.initial.values();
    const std::vector<float>& hostData = op.kind != OpKind::Variable ? node.data
                                         : node.initial.explicitValues() != nullptr
                                             ? *node.initial.explicitValues()
                                             : made;
    for (int64_t j = 0; j < layout.numGroups(); ++j) {
      float* value = base + j * n;
      if (op.kind == OpKind::Constant) {
        std::copy(node.data.begin(), node.data.end(), value);
        continue;
      }
      const int64_t global = layout.replicaAt(j, 0) + program_.replicas.replicaOffset;
      const ReplicaGrouping grouping =
          node.grouping.value_or(ReplicaGrouping(program_.replicas.globalReplicas));
      const int64_t group = grouping.numGroups() > 1 ? grouping.groupAt(global) : 0;
      const bool sharded = !node.metaShape.empty();
      const int64_t hostElements = sharded ? numElements(node.metaShape) : n;
      const std::span<const float> host(hostData.data() + group * hostElements, at(hostElements));
      if (sharded) {
        const ShardLayout shards(hostElements, node.shardCount);
        shards.hostToShard(host, shardIndexAt(node, program_.replicas.globalReplicas, global),
                           std::span<float>(value, at(n)));
      } else {
        std::copy(host.begin(), host.end(), value);
      }
    }
    // Float16 values are held as halves (constants are rounded already).
    if (node.dtype == DType::Float16) roundToHalves(base, at(layout.numGroups() * n));
    if (node.remoteBuffer >= 0) {
      for (int64_t r = 0; r < program_.replicas.localReplicas; ++r) {
        float* entry = remoteEntry(node.remoteBuffer, node.remoteEntry, node.name) + r * n;
        std::copy_n(base + layout.groupAt(r) * n, n, entry);
      }
    }
  }
}

float* SimExecutable::remoteEntry(int64_t buffer, int64_t entry, std::string_view who) const {
  const Graph& graph = program_.graph;
  if (buffer < 0 || at(buffer) >= graph.remoteBuffers().size()) {
    throw DeviceError(ErrorCode::InvalidProgram, std::string(who),
                      fmt::format("remote buffer #{} does not exist; the program has {} remote buffers",
                                  buffer, graph.remoteBuffers().size()));
  }
  const RemoteBufferInfo& info = graph.remoteBuffer(buffer);
  if (entry < 0 || entry >= info.entries) {
    throw DeviceError(ErrorCode::InvalidProgram, std::string(who),
                      fmt::format("entry {} of remote buffer #{} is out of range; entries are 0..{}", entry,
                                  buffer, info.entries - 1));
  }
  const int64_t perEntry = program_.replicas.localReplicas * numElements(info.shape);
  return const_cast<float*>(arena_.data()) + remoteBase_[at(buffer)] + entry * perEntry;
}

void SimExecutable::planSteps() {
  const Graph& graph = program_.graph;
  inputSlot_.assign(graph.tensors().size(), -1);
  steps_.reserve(schedule_.size());
  for (OpId id : schedule_) planStep(id);
  batchExchanges();
  fuseChains();
  int64_t lhs = 0;
  int64_t rhs = 0;
  int64_t partial = 0;
  int64_t work = 0;
  int64_t product = 0;
  int64_t sums = 0;
  for (Step& step : steps_) {
    sums = std::max(sums, alignUp(step.sumDoubles));
    // Other kernels with GEMMs (convolutions) planned theirs with the step.
    const bool keepsParts = step.kernel == matmulSlicesKernel() || step.kernel == matmulShardsKernel();
    if (step.kernel == matmulKernel() || keepsParts || step.kernel == batchedMatmulKernel()) planGemm(step);
    lhs = std::max(lhs, alignUp(step.gemmPlan.lhsFloats));
    rhs = std::max(rhs, alignUp(step.gemmPlan.rhsFloats));
    partial = std::max(partial, alignUp(step.gemmPlan.partialFloats));
    work = std::max(work, alignUp(step.workFloats));
    if (keepsParts) product = std::max(product, alignUp(step.rows * step.cols));
  }
  // Packed blocks are read with aligned loads. Each thread packs into its
  // own pair of buffers and has its own workspace and partial sums.
  const int64_t threads = pool_->threads();
  // A whole product (one, on the calling thread) and the threads'
  // workspaces are never used by the same step, so they share memory.
  const int64_t shared = std::max(product, threads * work);
  gemmScratch_.assign(at(threads * (lhs + rhs + partial) + shared), 0.0f);
  float* base = gemmScratch_.data();
  scratch_ = {base,
              base + threads * lhs,
              base + threads * (lhs + rhs),
              lhs,
              rhs,
              work,
              base + threads * (lhs + rhs) + shared,
              partial};
  sumScratch_.assign(static_cast<std::size_t>(threads * sums), 0.0);
  scratch_.sums = sumScratch_.data();
  scratch_.sumsStride = sums;
  for (Step& step : steps_) {
    step.scratch = &scratch_;
    step.pool = pool_.get();
    stats_.kernelRuns += std::max<int64_t>(static_cast<int64_t>(step.runs.size()), 1);
  }
  feeds_.resize(static_cast<std::size_t>(
      std::count_if(inputSlot_.begin(), inputSlot_.end(), [](int32_t s) { return s >= 0; })));
  fed_.assign(feeds_.size(), 0);
  for (Step& step : steps_)
    if (step.kind == OpKind::Input) step.feed = &feeds_[at(inputSlot_[at(graph.op(step.op).outputs[0])])];
  stats_.steps = static_cast<int64_t>(steps_.size());
  planSideBySide();
}

void SimExecutable::planSideBySide() {
  const int threads = pool_->threads();
  if (threads < 2 || mode_ == ExecutionMode::PerReplicaReference) return;
  // A step may run beside others when it runs on one thread anyway, touches
  // only its ops' storages (and no feed) and uses no scratch but its
  // thread's (the sliced products write a whole product into memory the
  // threads' workspaces share).
  const auto eligible = [&](const Step& step) {
    return touchesOnlyItsOps(step) && step.kind != OpKind::Input && step.kernel != matmulSlicesKernel() &&
           step.kernel != matmulShardsKernel() && runsBeside(step, threads);
  };
  std::vector<Step> planned;
  std::vector<Step> group;
  std::vector<TensorId> groupReads;
  std::vector<TensorId> groupWrites;
  std::vector<TensorId> reads;
  std::vector<TensorId> writes;
  const auto flush = [&] {
    if (group.size() == 1) planned.push_back(std::move(group.front()));
    if (group.size() > 1) {
      Step step = stepOfSteps(group.front(), besideKernel());
      step.pool = pool_.get();
      ++stats_.besideGroups;
      stats_.besideSteps += static_cast<int64_t>(group.size());
      step.beside = std::move(group);
      planned.push_back(std::move(step));
    }
    group.clear();
    groupReads.clear();
    groupWrites.clear();
  };
  for (Step& step : steps_) {
    if (!eligible(step)) {
      flush();
      planned.push_back(std::move(step));
      continue;
    }
    // What the step touches: its op's storages, or every op's of a chain.
    std::vector<TensorId> stepReads;
    std::vector<TensorId> stepWrites;
    const auto add = [&](OpId op) {
      accesses(op, reads, writes);
      stepReads.insert(stepReads.end(), reads.begin(), reads.end());
      stepWrites.insert(stepWrites.end(), writes.begin(), writes.end());
    };
    if (step.chain.empty()) add(step.op);
    for (const Step& part : step.chain) add(part.op);
    // Beside the group only if it neither reads nor writes what a step of
    // the group writes, nor writes what one reads: in any interleaving
    // each step then reads and writes what it would in order.
    if (!group.empty() && (static_cast<int>(group.size()) == threads || meets(stepReads, groupWrites) ||
                           meets(stepWrites, groupWrites) || meets(stepWrites, groupReads)))
      flush();
    group.push_back(std::move(step));
    groupReads.insert(groupReads.end(), stepReads.begin(), stepReads.end());
    groupWrites.insert(groupWrites.end(), stepWrites.begin(), stepWrites.end());
  }
  flush();
  steps_ = std::move(planned);
}

void SimExecutable::sinkIntoChains() {
  if (mode_ == ExecutionMode::PerReplicaReference) return;
  // What each step touches, computed once (the steps move, their entries
  // with them).
  struct Touches {
    int64_t n = -1;  // flat elements, or -1
    bool barrier = false;
    std::vector<TensorId> reads;
    std::vector<TensorId> writes;
  };
  std::vector<Touches> touches(steps_.size());
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    Touches& t = touches[i];
    t.barrier = !touchesOnlyItsOps(steps_[i]);
    t.n = flatElements(steps_[i]);
    if (!t.barrier) accesses(steps_[i].op, t.reads, t.writes);
  }
  // A step moves past steps that neither write what it reads or writes nor
  // read what it writes: it computes the same values there.
  constexpr std::size_t kLookahead = 32;
  for (std::size_t i = steps_.size(); i-- > 0;) {
    const Touches& step = touches[i];
    if (step.n < 0 || step.barrier) continue;
    std::size_t j = i + 1;
    bool separated = false;  // by a step that ends a chain
    for (; j < steps_.size() && j <= i + kLookahead; ++j) {
      const Touches& later = touches[j];
      if (later.barrier || meets(later.writes, step.reads) || meets(later.writes, step.writes) ||
          meets(later.reads, step.writes))
        break;
      separated = separated || later.n != step.n;
    }
    // Only next to a reader of its output that can chain with it, past a
    // step that would keep them apart (a chain's own order stays).
    if (!separated || j >= steps_.size() || j > i + kLookahead) continue;
    const Touches& reader = touches[j];
    if (reader.barrier || reader.n != step.n || !meets(reader.reads, step.writes) ||
        meets(reader.writes, step.reads))
      continue;
    const auto first = static_cast<std::ptrdiff_t>(i);
    const auto last = static_cast<std::ptrdiff_t>(j);
    std::rotate(steps_.begin() + first, steps_.begin() + first + 1, steps_.begin() + last);
    std::rotate(touches.begin() + first, touches.begin() + first + 1, touches.begin() + last);
    ++stats_.sunkSteps;
  }
}

void SimExecutable::fuseChains() {
  sinkIntoChains();
  std::vector<Step> fused;
  std::vector<Step> chain;
  std::vector<std::vector<Access>> accesses;  // of each step of `chain`
  int64_t chainElements = 0;
  const std::vector<char> scratchable = scratchableValues();
  int32_t slots = 0;  // most scratch slots any chain needs
  auto flush = [&] {
    if (chain.size() == 1) fused.push_back(std::move(chain.front()));
    if (chain.size() > 1) {
      Step step = stepOfSteps(chain.front(), chainKernel());
      step.chainElements = chainElements;
      stats_.chainedSteps += static_cast<int64_t>(chain.size());
      ++stats_.fusedChains;
      step.chain = std::move(chain);
      slots = std::max(slots, planChainScratch(step, scratchable));
      fused.push_back(std::move(step));
    }
    chain.clear();
    accesses.clear();
  };
  for (Step& step : steps_) {
    const int64_t n = mode_ == ExecutionMode::PerReplicaReference ? -1 : flatElements(step);
    if (n < 0) {
      flush();
      fused.push_back(std::move(step));
      continue;
    }
    std::vector<Access> own = flatAccesses(step, n);
    // A chain is checked against every access of its steps, so its length is
    // capped: longer chains would make planning quadratic and gain nothing
    // once a tile's operands stay in cache.
    constexpr std::size_t kMaxChainSteps = 32;
    if (!chain.empty() &&
        (n != chainElements || chain.size() >= kMaxChainSteps || !sliceable(accesses, own))) {
      flush();
    }
    step.tile = tileKernel(step.kind);
    const StridedLoop& loop = step.runs.front().loop;
    for (std::size_t i = 0; i < step.tileStride.size(); ++i)
      step.tileStride[i] = loop.rank == 0 ? 0 : loop.stride[i + 1][0];
    chainElements = n;
    chain.push_back(std::move(step));
    accesses.push_back(std::move(own));
  }
  flush();
  steps_ = std::move(fused);
  const int64_t perThread = int64_t{slots} * kChainSlice;
  chainScratch_.assign(at(pool_->threads() * perThread), 0.0f);
  for (Step& step : steps_) {
    if (step.kernel != chainKernel()) continue;
    step.chainScratch = chainScratch_.data();
    step.chainScratchStride = perThread;
  }
}

std::vector<char> SimExecutable::scratchableValues() const {
  const Graph& graph = program_.graph;
  if (!program_.hostReads || mode_ != ExecutionMode::Vectorized) return {};
  std::vector<char> scratchable(graph.tensors().size(), 1);
  for (TensorId t : *program_.hostReads) scratchable[at(t)] = 0;
  for (std::size_t t = 0; t < graph.tensors().size(); ++t) {
    const TensorId storage = graph.storageOf(static_cast<TensorId>(t));
    if (storage == static_cast<TensorId>(t)) continue;
    // Shared storage (in-place outputs, variables updated in place) is
    // written by more than one op.
    scratchable[t] = 0;
    scratchable[at(storage)] = 0;
  }
  return scratchable;
}

int32_t SimExecutable::planChainScratch(Step& fusedStep, const std::vector<char>& scratchable) {
  if (scratchable.empty()) return 0;
  const Graph& graph = program_.graph;
  std::vector<Step>& parts = fusedStep.chain;
  // The value a part writes when it need not be stored: its op's one output,
  // which the host does not read, written where the arena keeps it.
  auto unstoredOutput = [&](const Step& part) -> std::optional<TensorId> {
    const OpNode& op = graph.op(part.op);
    if (op.outputs.size() != 1 || !scratchable[at(op.outputs.front())]) return std::nullopt;
    const TensorId t = op.outputs.front();
    if (offset_[at(t)] < 0 || part.out + part.runs.front().out != arena_.data() + offset_[at(t)])
      return std::nullopt;
    return t;
  };
  // A value that only the copy right after it reads (`x = copyInplace(x,
  // f(...))`) is written where the copy would write it, and the copy goes:
  // every overlap inside a chain is the same whole range, so no part between
  // them sees the destination early.
  for (std::size_t p = 0; p + 1 < parts.size(); ++p) {
    Step& copy = parts[p + 1];
    if (copy.kind != OpKind::Copy && copy.kind != OpKind::CopyInplace) continue;
    const std::optional<TensorId> value = unstoredOutput(parts[p]);
    if (!value) continue;
    const TensorId t = *value;
    const float* address = parts[p].out + parts[p].runs.front().out;
    const std::vector<OpId>& readers = graph.tensor(t).consumers;
    if (readers.size() != 1 || readers.front() != copy.op || copy.tileStride[0] != 1 ||
        copy.in[0] + copy.runs.front().in[0] != address) {
      continue;
    }
    parts[p].out = copy.out;
    parts[p].runs.front().out = copy.runs.front().out;
    offset_[at(t)] = -1;  // never stored: host reads are refused by name
    ++stats_.elidedCopies;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(p) + 1);
  }
  // The part whose output goes to scratch, by the arena address it would
  // have: the last part that reads it there.
  std::vector<std::pair<const float*, std::size_t>> kept;  // (address, part)
  std::vector<int64_t> lastReader(parts.size(), -1);
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const std::optional<TensorId> value = unstoredOutput(parts[p]);
    if (!value) continue;
    const TensorId t = *value;
    const float* address = parts[p].out + parts[p].runs.front().out;
    const std::vector<OpId>& readers = graph.tensor(t).consumers;
    bool inside = !readers.empty();
    int64_t last = -1;
    for (OpId reader : readers) {
      std::size_t q = p + 1;
      while (q < parts.size() && parts[q].op != reader) ++q;
      inside = inside && q < parts.size();
      last = std::max(last, static_cast<int64_t>(q));
    }
    if (!inside) continue;
    lastReader[p] = last;
    kept.emplace_back(address, p);
  }
  if (kept.empty()) return 0;
  // Slots are reused once the last reader of their value has run.
  std::vector<int32_t> slotOf(parts.size(), -1);
  std::vector<int32_t> free;
  int32_t slots = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    Step& part = parts[p];
    const Run& run = part.runs.front();
    std::vector<int32_t> released;
    for (std::size_t i = 0; i < part.inSlot.size(); ++i) {
      if (part.in[i] == nullptr) continue;
      const float* address = part.in[i] + run.in[i];
      for (const auto& [keptAddress, producer] : kept) {
        if (producer >= p || keptAddress != address) continue;
        part.inSlot[i] = slotOf[producer];
        if (lastReader[producer] == static_cast<int64_t>(p)) released.push_back(slotOf[producer]);
      }
    }
    if (lastReader[p] >= 0) {
      if (free.empty()) free.push_back(slots++);
      slotOf[p] = free.back();
      free.pop_back();
      part.outSlot = slotOf[p];
      const TensorId t = graph.op(part.op).outputs.front();
      offset_[at(t)] = -1;  // never stored: host reads are refused by name
      ++stats_.scratchValues;
    }
    std::sort(released.begin(), released.end());
    released.erase(std::unique(released.begin(), released.end()), released.end());
    free.insert(free.end(), released.begin(), released.end());
  }
  return slots;
}

const float* SimExecutable::exchanged(TensorId tensor, const OpNode& op) {
  const Graph& graph = program_.graph;
  if (!communicator_) {
    // Names the first member this device does not simulate.
    const ReplicaGrouping grouping =
        op.attributes.grouping.value_or(ReplicaGrouping(program_.replicas.globalReplicas));
    for (int64_t r = 0; r < program_.replicas.localReplicas; ++r)
      localMembers(program_.replicas, grouping, r, op.name);
  }
  exchanges_.push_back(std::make_unique<Exchange>());
  steps_.push_back(planExchange(*exchanges_.back(), communicator_.get(), tensor,
                                arena_.data() + offset_[at(graph.storageOf(tensor))], layouts_[at(tensor)],
                                numElements(graph.tensor(tensor).shape), program_.replicas, op));
  return exchanges_.back()->tensors.front().values.data();
}

void SimExecutable::accesses(OpId id, std::vector<TensorId>& reads, std::vector<TensorId>& writes) const {
  const Graph& graph = program_.graph;
  reads.clear();
  writes.clear();
  // A folded transpose or a fused product is computed inside its reader's
  // step, which then reads their operands.
  std::vector<TensorId> pending(graph.op(id).inputs);
  while (!pending.empty()) {
    const TensorId t = pending.back();
    pending.pop_back();
    const OpId producer = graph.tensor(t).producer;
    if (producer != kNoOp && (foldedTranspose_[at(producer)] || fusedInto_[at(producer)] != kNoOp)) {
      pending.insert(pending.end(), graph.op(producer).inputs.begin(), graph.op(producer).inputs.end());
      continue;
    }
    reads.push_back(memoryOf(t));
  }
  for (TensorId t : graph.op(id).outputs) writes.push_back(memoryOf(t));
}

TensorId SimExecutable::memoryOf(TensorId t) const {
  const TensorId storage = program_.graph.storageOf(t);
  return sharedWith_[at(storage)] >= 0 ? sharedWith_[at(storage)] : storage;
}

void SimExecutable::batchExchanges() {
  if (!communicator_) return;
  const Graph& graph = program_.graph;
  // A cross-instance collective: its exchange steps and the step reading them.
  struct Unit {
    std::vector<Exchange*> exchanges;
    std::vector<TensorId> sources;  // storages the exchanges read
    TensorId output = kNoTensor;    // storage the collective writes
    Step collective;
  };
  const auto contains = [](const std::vector<TensorId>& list, TensorId t) {
    return std::find(list.begin(), list.end(), t) != list.end();
  };
  std::vector<Unit> pending;
  std::vector<Step> planned;
  const auto flush = [&] {
    if (pending.empty()) return;
    std::vector<Exchange*> parts;
    for (const Unit& unit : pending) parts.insert(parts.end(), unit.exchanges.begin(), unit.exchanges.end());
    exchanges_.push_back(std::make_unique<Exchange>());
    planned.push_back(mergeExchanges(*exchanges_.back(), parts));
    ++stats_.exchanges;
    for (Unit& unit : pending) planned.push_back(std::move(unit.collective));
    pending.clear();
  };
  std::vector<TensorId> reads;
  std::vector<TensorId> writes;
  for (std::size_t i = 0; i < steps_.size();) {
    if (steps_[i].exchange != nullptr) {
      Unit unit;
      for (; steps_[i].exchange != nullptr; ++i) {
        unit.exchanges.push_back(steps_[i].exchange);
        for (const ExchangedTensor& t : steps_[i].exchange->tensors)
          unit.sources.push_back(memoryOf(t.tensor));
      }
      unit.collective = std::move(steps_[i++]);
      unit.output = memoryOf(graph.op(unit.collective.op).outputs[0]);
      for (const Unit& earlier : pending) {
        if (contains(unit.sources, earlier.output)) {
          flush();
          break;
        }
      }
      pending.push_back(std::move(unit));
      continue;
    }
    if (!pending.empty()) {
      accesses(steps_[i].op, reads, writes);
      bool conflict = false;
      for (const Unit& unit : pending) {
        conflict = conflict || contains(reads, unit.output) || contains(writes, unit.output);
        for (TensorId source : unit.sources) conflict = conflict || contains(writes, source);
      }
      if (conflict) flush();
    }
    planned.push_back(std::move(steps_[i++]));
  }
  flush();
  steps_ = std::move(planned);
}

void SimExecutable::planStep(OpId id) {
  const Graph& graph = program_.graph;
  const OpNode& op = graph.op(id);
  if (foldedTranspose_[at(id)] || fusedInto_[at(id)] != kNoOp || elided_[at(id)]) return;
  const KernelDef& kernels = kernelDef(op.kind, op.name);
  const bool float64 = touchesFloat64(graph, op);
  const auto plan = float64 ? kernels.planFloat64 : kernels.plan;
  if (plan == nullptr) return;
  Step step;
  step.kind = op.kind;
  step.op = id;
  step.name = op.name;
  step.float64 = float64;
  if (!op.outputs.empty()) {
    const TensorId y = op.outputs[0];
    step.out = arena_.data() + offset_[at(graph.storageOf(y))];
    step.outElements = floatsOf(graph.tensor(y));
  }
  StepPlanner planner(*this, id);
  const std::size_t before = steps_.size();
  plan(planner, step);
  if (steps_.size() == before || op.kind == OpKind::CastToFloat16 || float64) return;
  // Steps that round their own output (products, convolutions, float16
  // feeds: Step::halfOutput).
  if (std::all_of(steps_.begin() + static_cast<std::ptrdiff_t>(before), steps_.end(),
                  [](const Step& s) { return s.halfOutput; }))
    return;
  // Ops that only move, select, negate or zero elements of float16 operands
  // write halves already.
  if (opDef(op.kind).keepsHalves) {
    bool halfOperands = true;
    for (const TensorId x : op.inputs) {
      const DType d = graph.tensor(x).dtype;
      halfOperands = halfOperands && (d == DType::Float16 || !isFloating(d) || op.kind == OpKind::Where);
    }
    if (halfOperands) return;
  }
  // Float16 outputs are held as halves: a rounding step in place over the
  // whole storage follows the op's steps. It is flat, so the chain fusion
  // runs it slice by slice with the op's own kernel when that is flat too:
  // no extra pass over memory.
  for (const TensorId y : op.outputs) {
    if (graph.tensor(y).dtype != DType::Float16) continue;
    const TensorId storage = graph.storageOf(y);
    if (offset_[at(storage)] < 0) continue;
    const int64_t n = numElements(graph.tensor(storage).shape);
    const int64_t groups = layouts_[at(storage)].numGroups();
    if (n * groups == 0) continue;
    Step round;
    round.kind = OpKind::CastToFloat16;
    round.op = id;
    round.name = op.name;
    round.kernel = roundToHalfKernel;
    round.out = arena_.data() + offset_[at(storage)];
    round.in[0] = round.out;
    round.outElements = n;
    round.inElements[0] = n;
    Run run;
    run.count = groups;
    run.advance.fill(true);
    run.loop.push(n * groups, {1, 1, 0, 0});
    round.runs.push_back(run);
    steps_.push_back(std::move(round));
  }
}

// StepPlanner: the executor's state, as the families' plans see it.

const Graph& StepPlanner::graph() const { return executable_.program_.graph; }
const OpNode& StepPlanner::op() const { return graph().op(op_); }

float* StepPlanner::buffer(TensorId t) const {
  return executable_.arena_.data() + executable_.offset_[at(graph().storageOf(t))];
}

int64_t StepPlanner::elements(TensorId t) const { return floatsOf(graph().tensor(t)); }
const Shape& StepPlanner::shape(TensorId t) const { return graph().tensor(t).shape; }
bool StepPlanner::halfOutput() const { return graph().tensor(op().outputs[0]).dtype == DType::Float16; }
const ReplicaGrouping& StepPlanner::layout(TensorId t) const { return executable_.layouts_[at(t)]; }

void StepPlanner::runsOver(Step& step, std::initializer_list<std::pair<TensorId, int64_t>> inputs,
                           int64_t outOffset) const {
  const int64_t maxCount = executable_.mode_ == ExecutionMode::PerReplicaReference
                               ? 1
                               : executable_.program_.replicas.localReplicas;
  std::vector<Operand> operands;
  std::size_t i = 0;
  for (const auto& [t, extra] : inputs) {
    const int64_t slots = dtypeSlots(graph().tensor(t).dtype);
    step.in[i] = buffer(t);
    step.inElements[i] = elements(t);
    step.slots[i + 1] = slots;
    operands.push_back({&layout(t), elements(t), extra * slots});
    ++i;
  }
  const TensorId y = op().outputs[0];
  step.slots[0] = dtypeSlots(graph().tensor(y).dtype);
  step.runs = makeRuns(layout(y), step.outElements, outOffset * step.slots[0], operands, maxCount);
}

void StepPlanner::emit(Step step) { executable_.steps_.push_back(std::move(step)); }

void StepPlanner::takeInputSlot() {
  std::vector<int32_t>& slots = executable_.inputSlot_;
  const auto slot = std::count_if(slots.begin(), slots.end(), [](int32_t s) { return s >= 0; });
  slots[at(op().outputs[0])] = static_cast<int32_t>(slot);
}

bool StepPlanner::foldedTranspose(OpId producer) const {
  return executable_.foldedTranspose_[at(producer)] != 0;
}

OpId StepPlanner::fusedMatMul() const {
  const OpNode& node = op();
  if (node.inputs.size() != 1) return kNoOp;
  const OpId producer = graph().tensor(node.inputs[0]).producer;
  return producer != kNoOp && executable_.fusedInto_[at(producer)] == op_ ? producer : kNoOp;
}

int64_t StepPlanner::localReplicas() const { return executable_.program_.replicas.localReplicas; }
int64_t StepPlanner::globalReplicas() const { return executable_.program_.replicas.globalReplicas; }
const ReplicaTopology& StepPlanner::topology() const { return executable_.program_.replicas; }

const ExchangedTensor& StepPlanner::exchanged(TensorId t) {
  executable_.exchanged(t, op());
  return executable_.exchanges_.back()->tensors.front();
}

float* StepPlanner::remoteEntry(int64_t buffer, int64_t entry) const {
  return executable_.remoteEntry(buffer, entry, op().name);
}

const ReplicaGrouping& StepPlanner::bufferLayout(int64_t buffer) const {
  return executable_.bufferLayouts_[at(buffer)];
}

ReplicaGrouping SimExecutable::layout(TensorId tensor) const {
  program_.graph.tensor(tensor);
  return layouts_[at(tensor)];
}

std::span<float> SimExecutable::hostBuffer(TensorId tensor, std::string_view who) const {
  const Graph& graph = program_.graph;
  if (tensor < 0 || at(tensor) >= graph.tensors().size()) {
    throw DeviceError(ErrorCode::InvalidProgram, fmt::format("tensor #{}", tensor),
                      fmt::format("{}: no tensor has id {}; the program has {} tensors", who, tensor,
                                  graph.tensors().size()));
  }
  const TensorNode& node = graph.tensor(tensor);
  const int64_t offset = offset_[at(graph.storageOf(tensor))];
  if (offset < 0) {
    throw DeviceError(
        ErrorCode::InvalidProgram, node.name,
        fmt::format("{}: the device computes this tensor inside a fused step and never stores it; "
                    "read the tensor it feeds instead",
                    who));
  }
  const TensorId shared = sharedWith_[at(graph.storageOf(tensor))];
  if (shared >= 0) {
    // A read could see the operand changed after the value's last reader,
    // and a write would change the operand.
    throw DeviceError(
        ErrorCode::InvalidProgram, node.name,
        fmt::format("{}: the device keeps this value (a float32 cast, a reshape or an all-gather) in the "
                    "memory of its operand \"{}\", which later steps may change; list the tensor "
                    "in Program::hostReads to read it, or use \"{}\"",
                    who, graph.tensor(shared).name, graph.tensor(shared).name));
  }
  const auto size = at(layouts_[at(tensor)].numGroups() * floatsOf(node));
  return {const_cast<float*>(arena_.data()) + offset, size};
}

void SimExecutable::write(TensorId tensor, std::span<const float> groups) {
  const std::span<float> target = hostBuffer(tensor, "write");
  if (groups.size() != target.size()) {
    throw DeviceError(ErrorCode::InvalidProgram, program_.graph.tensor(tensor).name,
                      fmt::format("write: {} values given; the layout {} needs {} groups x {} floats = {}",
                                  groups.size(), layouts_[at(tensor)].str(), layouts_[at(tensor)].numGroups(),
                                  floatsOf(program_.graph.tensor(tensor)), target.size()));
  }
  std::copy(groups.begin(), groups.end(), target.begin());
  if (program_.graph.tensor(tensor).dtype == DType::Float16) roundToHalves(target.data(), target.size());
}

void SimExecutable::read(TensorId tensor, std::span<float> groups) const {
  const std::span<float> source = hostBuffer(tensor, "read");
  if (groups.size() != source.size()) {
    throw DeviceError(
        ErrorCode::InvalidProgram, program_.graph.tensor(tensor).name,
        fmt::format("read: room for {} values given; the layout {} holds {} groups x {} floats = {}",
                    groups.size(), layouts_[at(tensor)].str(), layouts_[at(tensor)].numGroups(),
                    floatsOf(program_.graph.tensor(tensor)), source.size()));
  }
  std::copy(source.begin(), source.end(), groups.begin());
}

void SimExecutable::writeRemote(int64_t buffer, int64_t entry, std::span<const float> replicas) {
  float* target = remoteEntry(buffer, entry, "writeRemote");
  const auto size =
      at(program_.replicas.localReplicas * numElements(program_.graph.remoteBuffer(buffer).shape));
  if (replicas.size() != size) {
    throw DeviceError(
        ErrorCode::InvalidProgram, fmt::format("remote buffer #{}", buffer),
        fmt::format("writeRemote: {} values given; an entry holds {} replicas x {} elements = {}",
                    replicas.size(), program_.replicas.localReplicas,
                    numElements(program_.graph.remoteBuffer(buffer).shape), size));
  }
  std::copy(replicas.begin(), replicas.end(), target);
  if (program_.graph.remoteBuffer(buffer).dtype == DType::Float16) roundToHalves(target, size);
}

void SimExecutable::readRemote(int64_t buffer, int64_t entry, std::span<float> replicas) const {
  const float* source = remoteEntry(buffer, entry, "readRemote");
  const auto size =
      at(program_.replicas.localReplicas * numElements(program_.graph.remoteBuffer(buffer).shape));
  if (replicas.size() != size) {
    throw DeviceError(
        ErrorCode::InvalidProgram, fmt::format("remote buffer #{}", buffer),
        fmt::format("readRemote: room for {} values given; an entry holds {} replicas x {} elements "
                    "= {}",
                    replicas.size(), program_.replicas.localReplicas,
                    numElements(program_.graph.remoteBuffer(buffer).shape), size));
  }
  // Replicas whose entries the program keeps equal read their group's
  // first replica's, the one loads read and stores write.
  const ReplicaGrouping& held = bufferLayouts_[at(buffer)];
  const auto n = at(numElements(program_.graph.remoteBuffer(buffer).shape));
  for (int64_t r = 0; r < program_.replicas.localReplicas; ++r) {
    const int64_t first = held.replicaAt(held.groupAt(r), 0);
    std::copy_n(source + at(first) * n, n, replicas.begin() + static_cast<std::ptrdiff_t>(at(r) * n));
  }
}

void SimExecutable::run(std::span<const Feed> inputs) {
  const Graph& graph = program_.graph;
  std::fill(fed_.begin(), fed_.end(), 0);
  for (const Feed& feed : inputs) {
    if (feed.tensor < 0 || at(feed.tensor) >= inputSlot_.size() || inputSlot_[at(feed.tensor)] < 0) {
      throw DeviceError(ErrorCode::InvalidProgram, fmt::format("tensor #{}", feed.tensor),
                        "run: the fed tensor is not an Input of the program");
    }
    const TensorNode& node = graph.tensor(feed.tensor);
    const auto expected = at(program_.replicas.localReplicas * floatsOf(node));
    if (feed.data.size() != expected) {
      throw DeviceError(
          ErrorCode::InvalidProgram, node.name,
          fmt::format("run: {} floats fed; the input needs [{} replicas] + {}{} = {} floats",
                      feed.data.size(), program_.replicas.localReplicas, shapeStr(node.shape),
                      node.dtype == DType::Float64 ? " float64 (2 floats an element)" : "", expected));
    }
    const auto slot = at(inputSlot_[at(feed.tensor)]);
    feeds_[slot] = feed.data;
    fed_[slot] = 1;
  }
  for (std::size_t t = 0; t < inputSlot_.size(); ++t) {
    if (inputSlot_[t] >= 0 && !fed_[at(inputSlot_[t])]) {
      throw DeviceError(ErrorCode::InvalidProgram, graph.tensors()[t].name,
                        "run: this Input was not fed; every Input needs host data for each run");
    }
  }
  struct Guard {
    Guard() { forbidEigenMalloc(true); }
    ~Guard() { forbidEigenMalloc(false); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
  } guard;
  for (const Step& step : steps_) {
    // Workers poll through the step's serial stretches instead of falling
    // asleep in one and taking tens of microseconds to wake for the next
    // parallel step (worker_pool.hpp).
    pool_->stayAwake();
    step.kernel(step);
  }
}

}  // namespace tessera::sim
