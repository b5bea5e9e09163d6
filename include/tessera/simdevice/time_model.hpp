// The modelled time of one step: how long the hardware the DeviceSpec
// describes would take to run a Program once. Like memory, time is modelled
// from the program, never measured on the host.
//
// Every op that does work gets a duration and a lane:
//  - ComputeTiles: arithmetic, at DeviceSpec::computeFlopsPerSecond. FLOPs per
//    op, n the output's elements unless said otherwise:
//      MatMul                                   2 M N K (per batch entry)
//      Add Sub Mul Div Neg Relu ReluGrad Copy
//      CopyInplace Transpose Slice Concat
//      BroadcastTo SlicePad ReplicaShardedSlice
//      ReplicaShardedPad                        1 n
//      ScaledAddInplace                         3 n (a x + b y)
//      Exp Log Sqrt Tanh Sigmoid                4 n
//      Softmax LogSoftmax                       5 n
//      SoftmaxCrossEntropy(Grad)                5 per logit
//      Gelu GeluGrad                            8 n
//      ReduceSum ReduceMean ReduceToShape
//      ArgMax                                   1 per input element
//      Reshape                                  0 (a view)
//  - Link: collectives as ring transfers over a group of g replicas, B the
//    bytes of the tensor (for ReduceScatter and AllGather the padded full
//    tensor, g ceil(n/g) elements): AllReduce moves 2 (g-1)/g B, ReduceScatter
//    and AllGather (g-1)/g B, at linkBandwidthBytesPerSecond, or at
//    interInstanceBandwidthBytesPerSecond when a group spans instances (an
//    instance holds Program::replicas.localReplicas consecutive replicas), plus
//    transferLatencySeconds. A group of one replica costs nothing.
//  - Streaming / IOTiles: RemoteLoad and RemoteStore move one buffer entry at
//    streamingBandwidthBytesPerSecond, plus transferLatencySeconds. A
//    transfer whose tensor lives on the IO tiles (TensorNode::tileSet IO) runs
//    on the IOTiles lane; any other runs on the Streaming lane.
//  - IpuLink: an IpuCopy moves its tensor's bytes between two IPUs of a
//    replica at DeviceSpec::interIpuBandwidthBytesPerSecond, plus
//    interIpuLatencySeconds.
//
// Each IPU of a replica (DeviceSpec::ipusPerReplica; an op runs on
// OpNode::virtualGraph, IPU 0 when it names none) has its own compute and IO
// tiles: ops on different IPUs occupy different tiles. An IpuCopy occupies
// the compute tiles of both IPUs and the IPU-Links of the replica.
//
// Pipelined programs (ops with a pipeline stage and a micro-batch; see
// PipelineTime) take their ops cycle by cycle instead, each cycle's copies
// between IPUs last, and start no op of a cycle before the previous cycle
// has ended.
//
// Phased programs (ops with an execution phase) are scheduled like any
// other: a load of phase p carries the program order of its IO schedule
// (after the ops of phase p - 1 for OnDemand, p - 2 for Preload), so through
// the IO tiles a preloaded transfer overlaps the compute of the phase before;
// TimeReport::phases sums each phase's compute and traffic (PhaseTime).
//
// Scheduling: ops are taken in schedule order; an op starts when its inputs
// and the ops it must run after are done and the resources it occupies are
// free. Compute ops, Streaming transfers and collectives whose tensors are on
// the compute tiles all occupy the compute tiles, so they run one after the
// other; transfers and collectives through the IO tiles occupy the IO tiles
// instead and overlap compute (their consumers still wait for them). Every
// streaming transfer also occupies the streaming link, and every collective
// the link of its group. Sources (inputs, variables, constants) take no time.
//
// Host streams (Program::hostStreams): every input and output moves over the
// host link of its processor, a stream s taking
//   t_s = transfersPerStep x hostLatencySeconds + bytesPerStep / hostBandwidthBytesPerSecond
// per step of N = batchesPerStep batches of A = accumulationFactor
// micro-batches. The step is N A iterations of compute c = D / A, D the
// device time of one batch (the schedule above), and each stream takes
// t_s / (N A) per iteration: J summed over the JustInTime streams (those
// asking for overlap on the compute tiles included), I over OverlapInnerLoop
// and P over OverlapLoops (OverlapInnerLoop when N = 1), with I_in, P_in their
// inputs' and I_out, P_out their outputs' shares. With e = c + J, the step takes
//   I_in + P_in + e + g_inner max(e, I + P) + g_outer (max(e, P) + I) + I_out + P_out
// where g_inner = N (A - 1) gaps between iterations of the inner loop and
// g_outer = N - 1 boundaries of the outer one (A = 1: the batch loop is the
// inner loop, g_inner = N - 1 and g_outer = 0). All JustInTime, that is
// N (D + A J): every transfer on the critical path. stepSeconds is the step
// divided by N.
//
// With several IPUs per replica each IPU has a host link of its own and a
// stream uses its IPU's (HostStream::ipu). J sums the JustInTime streams of
// every IPU (the IPUs of a replica take turns, so each of them waits on the
// critical path); I_in, I_out, P_in and P_out are one IPU's, the closed form
// is taken per IPU and the step is its largest (an IPU without overlapped
// streams gives N A e). One IPU: the form above.
//
// The ops of the HostIO lane show one batch: the JustInTime loads first, one
// after the other (the device's ops start after them), the overlapped
// transfers beside the compute on their IPU's link, the JustInTime stores
// after the compute.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/graph.hpp"

namespace tessera {

struct Program;

enum class TimeLane {
  ComputeTiles,  // arithmetic on the compute tiles
  IOTiles,       // streaming transfers through the IO tiles, overlapped with compute
  Link,          // collectives between replicas
  Streaming,     // streaming transfers through the compute tiles (they block compute)
  IpuLink,       // copies between the IPUs of one replica
  HostIO,        // host streams over the host links (Program::hostStreams)
};

template <>
struct EnumNames<TimeLane> {
  static constexpr std::string_view kTypeName = "TimeLane";
  static constexpr std::array kNames = {std::pair{TimeLane::ComputeTiles, std::string_view{"ComputeTiles"}},
                                        std::pair{TimeLane::IOTiles, std::string_view{"IOTiles"}},
                                        std::pair{TimeLane::Link, std::string_view{"Link"}},
                                        std::pair{TimeLane::Streaming, std::string_view{"Streaming"}},
                                        std::pair{TimeLane::IpuLink, std::string_view{"IpuLink"}},
                                        std::pair{TimeLane::HostIO, std::string_view{"HostIO"}}};
};

// One op of the step.
struct OpTime {
  std::string name;
  OpKind kind = OpKind::Input;
  TimeLane lane = TimeLane::ComputeTiles;
  // Link: the collective's group (ReplicaGrouping::str()); empty otherwise.
  std::string group;
  // Link: true when a group spans instances (the slower bandwidth applies).
  bool interInstance = false;
  double start = 0.0;     // seconds from the start of the step
  double duration = 0.0;  // seconds
  double flops = 0.0;     // ComputeTiles: arithmetic of one replica
  double bytes = 0.0;     // bytes one replica moves over the link or to or from streaming memory
  int64_t ipu = 0;        // the IPU of the replica it runs on (an IpuCopy: the IPU it copies to; HostIO:
                          // the IPU whose host link it uses)
  // Pipelined programs: the op's pipeline stage and micro-batch
  // (kNoPipelineStage / kNoMicroBatch for the ops that run once per step).
  int64_t pipelineStage = kNoPipelineStage;
  int64_t microBatch = kNoMicroBatch;
  // Phased execution: the op's execution phase (kNoExecutionPhase without).
  int64_t executionPhase = kNoExecutionPhase;
};

// One host stream of the step (Program::hostStreams) as modelled.
struct StreamTime {
  std::string name;
  bool input = true;
  TileSet tileSet = TileSet::Compute;
  ExchangeStrategy requested = ExchangeStrategy::JustInTime;  // as set
  // As modelled: an overlap on the compute tiles is JustInTime, OverlapLoops
  // with batchesPerStep 1 is OverlapInnerLoop.
  ExchangeStrategy applied = ExchangeStrategy::JustInTime;
  double bytesPerStep = 0.0;    // one replica, a step of batchesPerStep batches
  double seconds = 0.0;         // the host link's busy time for it per step
  bool overlapped = false;      // some of its transfers overlap compute
  int64_t ipu = 0;              // the IPU whose host link carries it
};

// A pipelined step (SessionOptions::enablePipelining): micro-batch m of
// pipeline stage p runs in cycle m + p; N micro-batches over P = 2 S - 1
// stages (S forward stages, one per IPU) take N + P - 1 cycles. The fill is
// cycles 0 .. P-2, the main phase P-1 .. N-1 (every stage busy), the flush
// N .. N+P-2. Each cycle starts when the previous one has ended on every
// IPU (PopART's pipeline cycle ends with the copies between IPUs and a
// sync); the ops that run once per step run before (those that need no
// micro-batch) or after (those that do, such as the weight update).
struct PipelineTime {
  bool enabled = false;
  int64_t stages = 0;         // P, forward and backward
  int64_t forwardStages = 0;  // S, the IPUs the pipeline runs on
  int64_t microBatches = 0;   // N
  int64_t cycles = 0;         // N + P - 1
  double startSeconds = 0.0;  // when cycle 0 starts
  double fillSeconds = 0.0;
  double mainSeconds = 0.0;
  double flushSeconds = 0.0;
  // 1 - the compute the IPUs do in the cycles / (S x the cycles' time): for
  // S uniform stages and free copies (S - 1) / (N + S - 1).
  double bubbleFraction = 0.0;
  // The compute time of one micro-batch in each pipeline stage (averaged
  // over the micro-batches): stage p < S forward, p >= S - 1 backward.
  std::vector<double> stageSeconds;
  // When each cycle ends.
  std::vector<double> cycleEnds;
};

// One execution phase of a phased program (SessionOptions::
// executionPhaseSettings), summed over the micro-batches of a step. A load
// for phase p is scheduled after the ops of phase p - 2 (Preload) or p - 1
// (OnDemand); through the IO tiles it overlaps the compute before it, through
// the compute tiles it waits for them.
struct PhaseTime {
  int64_t phase = 0;
  int64_t ipu = 0;                  // phase % stages: the IPU of its compute ops
  double computeSeconds = 0.0;      // ComputeTiles
  double loadBytes = 0.0;           // RemoteLoad: streamed in for the phase
  double storeBytes = 0.0;          // RemoteStore: streamed out by the phase
  double streamingSeconds = 0.0;    // its transfers through the compute tiles (Streaming lane)
  double overlappedSeconds = 0.0;   // its transfers through the IO tiles (IOTiles lane)
  double ipuCopyBytes = 0.0;        // IpuCopy into the phase
};

struct TimeReport {
  std::vector<OpTime> ops;   // in schedule order; sources are not listed; HostIO ops last
  // The modelled time of one batch: the device's work (`deviceSeconds`) plus
  // the host transfers that are not hidden, i.e. runSeconds / batchesPerStep.
  double stepSeconds = 0.0;
  // Sums of durations per lane. compute + streaming (+ collectives on the
  // compute tiles) run one after the other; overlapped streaming runs beside
  // them, so the step is shorter than the sum of all four when it helps.
  double computeSeconds = 0.0;              // ComputeTiles
  double collectiveSeconds = 0.0;           // Link
  double streamingSeconds = 0.0;            // Streaming
  double overlappedStreamingSeconds = 0.0;  // IOTiles
  double flops = 0.0;                       // every op's flops
  double linkBytes = 0.0;                   // every collective's bytes
  double streamingBytes = 0.0;              // every transfer's bytes, both lanes
  double ipuCopySeconds = 0.0;              // IpuLink
  double ipuCopyBytes = 0.0;                // every IpuCopy's bytes
  int64_t ipuCopies = 0;                    // IpuCopy ops
  // Host streams (see "Host streams" above).
  int64_t batchesPerStep = 1;
  double deviceSeconds = 0.0;  // one batch without host transfers: when its last op ends
  double runSeconds = 0.0;     // a step (session run) of batchesPerStep batches, host transfers included
  double hostSeconds = 0.0;    // the host links' busy time per step, every IPU's
  double hostBytes = 0.0;      // bytes one replica moves over its host links per step
  std::vector<StreamTime> streams;
  PipelineTime pipeline;                    // enabled for a pipelined program
  std::vector<PhaseTime> phases;            // phased programs: one per phase in order; empty otherwise
};

// The modelled time of one run of `program` on the hardware `spec` describes,
// without loading it. Throws GraphError(InvalidProgramOrder) for a cyclic
// graph. program.replicas must be consistent() (asserted: sessions derive
// it once, ReplicaTopology::fromOptions).
TimeReport modelTime(const Program& program, const DeviceSpec& spec);

}  // namespace tessera
