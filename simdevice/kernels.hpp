// Precompiled steps and the kernels that run them.
//
// At load time every op becomes one Step (a few become several or none):
// a kernel pointer plus everything it needs precomputed (arena pointers,
// runs of groups, strided loops, matrix sizes). Running a step reads only
// that data, so the step path allocates nothing.
//
// Groups and runs. A buffer stores one value per group of its layout, group
// after group. An op's output groups are processed in runs: consecutive
// output groups along which every input either advances to its next group or
// stays on one group (a shared weight under per-replica activations). A
// run is one kernel call over the stacked groups, e.g. one GEMM of
// [count*B, K] x [K, N]. Vectorized plans usually have one run per op;
// the per-replica reference plan has runs of one group.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gemm.hpp"
#include "tessera/lib/graph.hpp"
#include "worker_pool.hpp"

namespace tessera {
class Communicator;
}

namespace tessera::sim {

struct Exchange;

inline constexpr int kMaxDims = 12;
// The output and up to three inputs (Where's cond, x and y). The shared
// loops (forEach) move the output and two inputs; forEach3 all three.
inline constexpr int kMaxOperands = 4;

// A loop nest over `size` where operand i (0 = output) moves by stride[i][d]
// along dimension d. Dimensions are coalesced at load time.
struct StridedLoop {
  int rank = 0;
  std::array<int64_t, kMaxDims> size{};
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> stride{};

  // Appends a dimension (outer to inner).
  void push(int64_t extent, std::array<int64_t, kMaxOperands> strides);
  // Drops extent-1 dimensions and merges dimensions that are contiguous for
  // every operand.
  void coalesce();
  int64_t elements() const;
};

struct Run {
  int64_t count = 1;                         // output groups in the run
  int64_t out = 0;                           // offset of the first output group
  std::array<int64_t, kMaxOperands> in{};    // offset of each input's first group
  std::array<bool, kMaxOperands> advance{};  // input moves with the output group
  StridedLoop loop;                          // strided kernels: the whole run
};

struct Step;
using Kernel = void (*)(const Step&);

// Where one slice of a flat elementwise step (see flatElements in the
// executor) reads and writes: the output and each input at the slice's
// first element (a scalar input: its one element).
struct TileOperands {
  float* out = nullptr;
  std::array<const float*, kMaxOperands - 1> in{};
};
// Runs `n` elements of a flat elementwise step: output stride 1, input
// strides Step::tileStride (1, or 0 for a scalar).
using TileKernel = void (*)(const Step&, const TileOperands&, int64_t n);

// Elements per slice of a chain: small enough that a slice of every operand
// of a typical chain stays in L1.
inline constexpr int64_t kChainSlice = 512;

// Scratch shared by every GEMM of a plan: the packing buffers, one pair
// per thread (thread t's at lhs + t * lhsStride, rhs + t * rhsStride), and
// a workspace per thread (thread t's at product + t * productStride): the
// whole product of a GEMM of which a step keeps slices or shards
// (matmulSlicesKernel, matmulShardsKernel: thread 0's), the column matrices
// of convolutions; and partial sums per thread (GemmPlan::partialFloats, at
// partial + t * partialStride): a product split over threads by its sum
// uses those of the thread that runs the step.
struct GemmScratch {
  float* lhs = nullptr;
  float* rhs = nullptr;
  float* product = nullptr;
  int64_t lhsStride = 0;
  int64_t rhsStride = 0;
  int64_t productStride = 0;
  float* partial = nullptr;
  int64_t partialStride = 0;
  // The reductions' double sums, one block per thread (thread t's at
  // sums + t * sumsStride): the sums of the step's run on the thread that
  // runs the step (Step::sumDoubles of them).
  double* sums = nullptr;
  int64_t sumsStride = 0;
};

struct Step {
  Kernel kernel = nullptr;
  OpKind kind = OpKind::Input;
  OpId op = kNoOp;
  std::string name;  // the op's, for errors
  float* out = nullptr;
  std::array<const float*, kMaxOperands> in{};
  int64_t outElements = 0;  // per group
  std::array<int64_t, kMaxOperands> inElements{};
  std::vector<Run> runs;
  // Float slots per element of the output and of each input: 2 for a
  // float64 tensor (a double's bytes in two floats), else 1. Run offsets,
  // outElements, inElements and loop strides count floats, so a loop over
  // elements moves a float64 operand by 2 floats an element.
  std::array<int64_t, kMaxOperands> slots{1, 1, 1, 1};
  // Computed in double (the op reads or makes a float64 tensor): never fused
  // into a chain.
  bool float64 = false;

  // Scalars: the attributes a and b (ScaledAddInplace, the parameterised
  // activations); the factor of means, Mean cross entropy and Mean
  // collectives (scale).
  float a = 1.0f;
  float b = 1.0f;
  float scale = 1.0f;
  bool zeroFirst = false;     // pads clear the output run first
  int64_t outLoopOffset = 0;  // where a run's loop starts inside its first output group

  // MatMul: per group C[m, n] = sum_k A[m, k] B[k, n]; `rows` counts every
  // row of a group's (possibly batched) left operand. Transposed operands
  // are read in place.
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t depth = 0;
  bool transA = false;
  bool transB = false;
  // The step rounds each element of its float16 output to the nearest half
  // itself, so no rounding step follows: a product (GemmShape::halfOutput),
  // a convolution or the copy of a float16 input's feed.
  bool halfOutput = false;
  // The kernel splits its loop over the pool's threads (forLoopParts): the
  // strided copies of floats, every elementwise op run outside a chain
  // (unary or binary, on floats or float64) and Where.
  bool splitsLoop = false;
  // The product's kernel and cache blocking, chosen at load time.
  GemmPlan gemmPlan;
  const GemmScratch* scratch = nullptr;
  // Floats of each thread's GemmScratch::product workspace the step uses
  // (the column matrices of convolutions); their kernels plan their own
  // GEMMs.
  int64_t workFloats = 0;
  // Doubles of each thread's GemmScratch::sums the step uses (a reduction's
  // output elements of one run).
  int64_t sumDoubles = 0;
  // The threads that run the step's parts (products, chains); null runs
  // everything on the calling thread.
  WorkerPool* pool = nullptr;

  // Softmax-like kernels: `cols` classes per row. Collectives and remote
  // transfers: tables of offsets (see collectives.hpp). Gather and
  // GatherGrad: `groups` blocks of `rows` slices of `cols` elements.
  std::vector<int64_t> table;
  std::vector<int64_t> table2;
  int64_t groups = 0;
  int64_t groupSize = 0;

  // Input: the host data for this run (set by the executor before run).
  const std::span<const float>* feed = nullptr;

  // Exchange steps: what a cross-instance collective gathers from the other
  // instances (collectives.hpp).
  Exchange* exchange = nullptr;

  // Flat elementwise steps: the same work in slices, or null.
  TileKernel tile = nullptr;
  // A fused chain (chainKernel): consecutive flat steps over the same
  // `chainElements`, run slice by slice so that each slice of every operand
  // stays in cache from the first step to the last instead of every step
  // streaming its whole buffers from memory.
  std::vector<Step> chain;
  int64_t chainElements = 0;
  // A value that only later steps of its chain read never goes to the
  // arena: each slice of it lives in a slot of `chainScratch` (kChainSlice
  // floats per slot). A step of a chain: the slot of its output and of each
  // input, or -1 for arena memory; the stride of each input (tileStride).
  // Each thread has its own slots: thread t's start at chainScratch + t *
  // chainScratchStride.
  float* chainScratch = nullptr;
  int64_t chainScratchStride = 0;
  int32_t outSlot = -1;
  std::array<int32_t, kMaxOperands - 1> inSlot{-1, -1, -1};
  std::array<int64_t, kMaxOperands - 1> tileStride{};

  // Steps run side by side (besideKernel): adjacent steps that touch no
  // memory another of them writes and that each run on one thread, one
  // step a part of one job of the pool.
  std::vector<Step> beside;
};

// The thread of the step's pool that runs the calling code
// (WorkerPool::currentThread), whose scratch work outside a split uses: 0
// on the calling thread, another when the step runs beside others.
inline int callerThread(const Step& s) { return s.pool == nullptr ? 0 : s.pool->currentThread(); }

// Kernels that several families use. The kernels of each op live with its
// family (simdevice/ops/, listed in kernel_table.hpp).
Kernel matmulKernel();
// Per run: the product [rows, cols] into scratch, then table2's triple i
// (output offset, product offset, count) of it into the output.
Kernel matmulSlicesKernel();
// Per run: the product [rows, cols] into scratch, then padded shards of it
// into the output (the fused gradient GEMM of a reduce-scatter whose shards
// carry padding; see simdevice/ops/matmul.cc for the tables).
Kernel matmulShardsKernel();
// Per group, one product per batch index (Step::groups of them).
Kernel batchedMatmulKernel();
Kernel copyKernel();  // strided copy (Copy, Reshape, Transpose, Slice, pads, Concat parts)
Kernel copyDoublesKernel();  // the same over float64 operands: a whole double per element
Kernel inputKernel();
Kernel chainKernel();
Kernel besideKernel();
// The parts runChain splits a chain of `elements` into on `threads`.
int chainParts(int64_t elements, int threads);
// The parts a reduction (ReduceSum, ReduceMean, ReduceToShape) of `loop`
// splits into on `threads` (forLoopParts): along its outermost dimension
// when that is kept, from 2 x 4,096 terms, each part a cache line of the
// input wide at the least; one otherwise.
int reduceParts(const StridedLoop& loop, int threads);
// The parts a step with Step::splitsLoop cuts a loop of `points` output
// points into on `threads`.
int loopParts(int64_t points, int threads);
// The parts a row-wise step of the softmax family (softmax, log-softmax,
// cross entropy and its gradient) splits `rows` rows of `cols` into on
// `threads`.
int rowParts(int64_t rows, int64_t cols, int threads);
// The parts a batch normalisation step (simdevice/ops/normalization.cc)
// splits its channels into on `threads`.
int normalizationParts(const Step& step, int threads);

// Plans a matmul step's product (the largest it runs) into step.gemmPlan.
void planGemm(Step& step);
// C[m, n] = alpha * op(A) op(B) with the step's plan and scratch, on the
// calling thread's scratch or split over the step's threads (gemm.hpp):
// the same bits either way.
void runGemm(const Step& s, const GemmShape& shape, const float* a, const float* b, float* c, float alpha);
// One whole product on thread `thread` of the step's pool, with that
// thread's scratch (a part of a job that splits something else).
void runGemmOn(const Step& s, int thread, const GemmShape& shape, const float* a, const float* b, float* c,
               float alpha);

// Loops and kernel templates for the families' kernels.

// The innermost dimension with strides known at compile time, so the
// compiler vectorizes it; a stride of 0 is a broadcast operand.
template <int kS0, int kS1, int kS2, class F>
void innerFixed(int64_t n, int64_t o0, int64_t o1, int64_t o2, F& f) {
  for (int64_t i = 0; i < n; ++i) f(o0 + i * kS0, o1 + i * kS1, o2 + i * kS2);
}

// Dispatches the common contiguous and broadcast patterns of the innermost
// dimension (after coalescing, elementwise ops are mostly one of these).
template <class F>
void inner(int64_t n, int64_t s0, int64_t s1, int64_t s2, int64_t o0, int64_t o1, int64_t o2, F& f) {
  if (s0 == 1 && s1 == 1 && s2 == 1) return innerFixed<1, 1, 1>(n, o0, o1, o2, f);
  if (s0 == 1 && s1 == 1 && s2 == 0) return innerFixed<1, 1, 0>(n, o0, o1, o2, f);
  if (s0 == 1 && s1 == 0 && s2 == 1) return innerFixed<1, 0, 1>(n, o0, o1, o2, f);
  if (s0 == 1 && s1 == 0 && s2 == 0) return innerFixed<1, 0, 0>(n, o0, o1, o2, f);
  if (s0 == 0 && s1 == 1 && s2 == 0) return innerFixed<0, 1, 0>(n, o0, o1, o2, f);
  for (int64_t i = 0; i < n; ++i) f(o0 + i * s0, o1 + i * s1, o2 + i * s2);
}

// Calls row(n, s0, s1, s2, o0, o1, o2) for every row of the loop's innermost
// dimension: n points from offsets o0 (output), o1 and o2 (inputs) with
// strides s0, s1 and s2. A loop of rank 0 is one row of one point.
template <class Row>
void forEachRow(const StridedLoop& loop, Row&& row) {
  for (int d = 0; d < loop.rank; ++d)
    if (loop.size[static_cast<std::size_t>(d)] == 0) return;
  if (loop.rank == 0) {
    row(int64_t{1}, int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  const auto innermost = static_cast<std::size_t>(loop.rank - 1);
  const int64_t n = loop.size[innermost];
  const int64_t s0 = loop.stride[0][innermost];
  const int64_t s1 = loop.stride[1][innermost];
  const int64_t s2 = loop.stride[2][innermost];
  std::array<int64_t, kMaxDims> index{};
  int64_t o0 = 0;
  int64_t o1 = 0;
  int64_t o2 = 0;
  for (;;) {
    row(n, s0, s1, s2, o0, o1, o2);
    std::size_t d = innermost;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++index[d] < loop.size[d]) {
        o0 += loop.stride[0][d];
        o1 += loop.stride[1][d];
        o2 += loop.stride[2][d];
        break;
      }
      o0 -= loop.stride[0][d] * (loop.size[d] - 1);
      o1 -= loop.stride[1][d] * (loop.size[d] - 1);
      o2 -= loop.stride[2][d] * (loop.size[d] - 1);
      index[d] = 0;
    }
  }
}

// Calls f(outOffset, in0Offset, in1Offset) for every point of the loop.
template <class F>
void forEach(const StridedLoop& loop, F&& f) {
  forEachRow(loop, [&](int64_t n, int64_t s0, int64_t s1, int64_t s2, int64_t o0, int64_t o1, int64_t o2) {
    inner(n, s0, s1, s2, o0, o1, o2, f);
  });
}

// The innermost dimension of forEach3 with strides known at compile time.
template <int kS0, int kS1, int kS2, int kS3, class F>
void innerFixed3(int64_t n, const std::array<int64_t, kMaxOperands>& o, F& f) {
  for (int64_t i = 0; i < n; ++i) f(o[0] + i * kS0, o[1] + i * kS1, o[2] + i * kS2, o[3] + i * kS3);
}

// Dispatches a contiguous output with every input contiguous or broadcast
// (stride 1 or 0: Where's masks and fill values) to innerFixed3.
template <class F>
void inner3(int64_t n, const std::array<int64_t, kMaxOperands>& s, const std::array<int64_t, kMaxOperands>& o,
            F& f) {
  const auto unitOrZero = [](int64_t stride) { return stride == 0 || stride == 1; };
  if (s[0] == 1 && unitOrZero(s[1]) && unitOrZero(s[2]) && unitOrZero(s[3])) {
    switch (s[1] + 2 * s[2] + 4 * s[3]) {
      case 0: return innerFixed3<1, 0, 0, 0>(n, o, f);
      case 1: return innerFixed3<1, 1, 0, 0>(n, o, f);
      case 2: return innerFixed3<1, 0, 1, 0>(n, o, f);
      case 3: return innerFixed3<1, 1, 1, 0>(n, o, f);
      case 4: return innerFixed3<1, 0, 0, 1>(n, o, f);
      case 5: return innerFixed3<1, 1, 0, 1>(n, o, f);
      case 6: return innerFixed3<1, 0, 1, 1>(n, o, f);
      default: return innerFixed3<1, 1, 1, 1>(n, o, f);
    }
  }
  for (int64_t i = 0; i < n; ++i) f(o[0] + i * s[0], o[1] + i * s[1], o[2] + i * s[2], o[3] + i * s[3]);
}

// Calls f(outOffset, in0Offset, in1Offset, in2Offset) for every point of
// the loop (ops of three inputs).
template <class F>
void forEach3(const StridedLoop& loop, F&& f) {
  for (int d = 0; d < loop.rank; ++d)
    if (loop.size[static_cast<std::size_t>(d)] == 0) return;
  if (loop.rank == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  const auto innermost = static_cast<std::size_t>(loop.rank - 1);
  const int64_t n = loop.size[innermost];
  std::array<int64_t, kMaxOperands> step{};
  for (std::size_t i = 0; i < step.size(); ++i) step[i] = loop.stride[i][innermost];
  std::array<int64_t, kMaxDims> index{};
  std::array<int64_t, kMaxOperands> o{};
  for (;;) {
    inner3(n, step, o, f);
    std::size_t d = innermost;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++index[d] < loop.size[d]) {
        for (std::size_t k = 0; k < o.size(); ++k) o[k] += loop.stride[k][d];
        break;
      }
      for (std::size_t k = 0; k < o.size(); ++k) o[k] -= loop.stride[k][d] * (loop.size[d] - 1);
      index[d] = 0;
    }
  }
}

// The loop's outermost dimension of more than one point (rank when none).
inline int outermostDimension(const StridedLoop& loop) {
  int d = 0;
  while (d < loop.rank && loop.size[static_cast<std::size_t>(d)] == 1) ++d;
  return d;
}

// Runs body(part, offsets) over `parts` parts of `loop` on the step's pool:
// the loop cut along its outermost dimension (outermostDimension) into
// ranges, part p the p-th range (so that consecutive steps cut alike leave
// each range's values in one core's cache), offsets[i] where operand i's
// range begins. Each point is computed once, by the code that computes it
// unsplit, so the values do not depend on the parts.
template <class F>
void forLoopParts(const Step& s, const StridedLoop& loop, int parts, F&& body) {
  const int d = outermostDimension(loop);
  const auto at = static_cast<std::size_t>(d);
  if (d < loop.rank) parts = static_cast<int>(std::min<int64_t>(parts, loop.size[at]));
  if (parts <= 1 || d == loop.rank || s.pool == nullptr) {
    body(loop, std::array<int64_t, kMaxOperands>{});
    return;
  }
  s.pool->run(parts, [&](int part, int) {
    const int64_t first = loop.size[at] * part / parts;
    StridedLoop slice = loop;
    slice.size[at] = loop.size[at] * (part + 1) / parts - first;
    std::array<int64_t, kMaxOperands> offsets{};
    for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = first * loop.stride[i][at];
    body(slice, offsets);
  });
}

// The same in loopParts(points) parts: the steps with Step::splitsLoop.
template <class F>
void forLoopParts(const Step& s, const StridedLoop& loop, F&& body) {
  forLoopParts(s, loop, loopParts(loop.elements(), s.pool == nullptr ? 1 : s.pool->threads()),
               std::forward<F>(body));
}

inline float* outOf(const Step& s, const Run& run) { return s.out + run.out; }
inline const float* inOf(const Step& s, const Run& run, std::size_t i) { return s.in[i] + run.in[i]; }
void zeroRun(const Step& s, const Run& run);

// Float16 storage in float slots: every element of the output becomes the
// half nearest to the input's element (round to nearest even; F16C in bulk
// where the CPU has it). CastToFloat16's kernels, and those of the rounding
// step the executor plans after each op writing a float16 output (in place:
// the input is the output).
void roundToHalfKernel(const Step& s);
void roundToHalfTile(const Step& s, const TileOperands& t, int64_t n);

// The flat step of the copies (Copy, CopyInplace, Reshape, BroadcastTo and
// casts that keep the float slots): a block copy, nothing when the output is
// the input, or the scalar repeated.
void copyTile(const Step& s, const TileOperands& t, int64_t n);

// Float64 values in float slots: a double's 8 bytes in two floats, read and
// written whole (buffers start on cache lines and every group and element
// offset of a float64 tensor is even, so doubles are 8-byte aligned).
inline double loadDouble(const float* p) {
  double v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storeDouble(float* p, double v) { std::memcpy(p, &v, sizeof v); }
// A value read as T (a float from one slot, a double from two), and a value
// stored as its own type.
template <class T>
T loadSlots(const float* p) {
  if constexpr (std::is_same_v<T, double>) {
    return loadDouble(p);
  } else {
    return *p;
  }
}
inline void storeSlots(float* p, float v) { *p = v; }
inline void storeSlots(float* p, double v) { storeDouble(p, v); }

// A strided kernel computing F per element of one input, or of two. The
// operands are read as In and the result stored as Out: floats, or doubles
// in the kernels of KernelDef::planFloat64 (the casts to and from float64
// read one type and store the other).
// Both split their loops over the threads (forLoopParts; planned with
// Step::splitsLoop).
template <class F, class In = float, class Out = In>
void unaryKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forLoopParts(s, run.loop, [&](const StridedLoop& loop, const std::array<int64_t, kMaxOperands>& at) {
      float* po = o + at[0];
      const float* px = x + at[1];
      forEach(loop, [&](int64_t io, int64_t ix, int64_t) {
        storeSlots(po + io, static_cast<Out>(F{}(loadSlots<In>(px + ix))));
      });
    });
  }
}

template <class F, class T = float>
void binaryKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    const float* y = inOf(s, run, 1);
    forLoopParts(s, run.loop, [&](const StridedLoop& loop, const std::array<int64_t, kMaxOperands>& at) {
      float* po = o + at[0];
      const float* px = x + at[1];
      const float* py = y + at[2];
      forEach(loop, [&](int64_t io, int64_t ix, int64_t iy) {
        storeSlots(po + io, static_cast<T>(F{}(loadSlots<T>(px + ix), loadSlots<T>(py + iy))));
      });
    });
  }
}

// Flat steps (TileKernel): n elements from the slice's operands; an input
// of stride 0 is a scalar read at every element.
template <class F>
void flatTile(const Step& s, int64_t n, F&& f) {
  inner(n, 1, s.tileStride[0], s.tileStride[1], 0, 0, 0, f);
}

template <class F>
void unaryTile(const Step& s, const TileOperands& t, int64_t n) {
  float* o = t.out;
  const float* x = t.in[0];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t) { o[io] = F{}(x[ix]); });
}

template <class F>
void binaryTile(const Step& s, const TileOperands& t, int64_t n) {
  float* o = t.out;
  const float* x = t.in[0];
  const float* y = t.in[1];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t iy) { o[io] = F{}(x[ix], y[iy]); });
}

// Kernels of ops with the scalar attributes a and b (Step::a, Step::b):
// F{}(x, a, b) per element of one input, F{}(x, y, a, b) of two.
template <class F>
void unaryParamKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t) { o[io] = F{}(x[ix], s.a, s.b); });
  }
}

template <class F>
void binaryParamKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    const float* y = inOf(s, run, 1);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t iy) { o[io] = F{}(x[ix], y[iy], s.a, s.b); });
  }
}

template <class F>
void unaryParamTile(const Step& s, const TileOperands& t, int64_t n) {
  float* o = t.out;
  const float* x = t.in[0];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t) { o[io] = F{}(x[ix], s.a, s.b); });
}

template <class F>
void binaryParamTile(const Step& s, const TileOperands& t, int64_t n) {
  float* o = t.out;
  const float* x = t.in[0];
  const float* y = t.in[1];
  flatTile(s, n, [&](int64_t io, int64_t ix, int64_t iy) { o[io] = F{}(x[ix], y[iy], s.a, s.b); });
}

struct IdentityF {
  template <class T>
  T operator()(T x) const {
    return x;
  }
};

}  // namespace tessera::sim
