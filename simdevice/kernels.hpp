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

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gemm.hpp"
#include "tessera/graph.hpp"

namespace tessera {
class Communicator;
}

namespace tessera::sim {

struct Exchange;

inline constexpr int kMaxDims = 12;
inline constexpr int kMaxOperands = 3;

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

// Scratch shared by every GEMM of a plan: the packing buffers, and the
// whole product of a GEMM of which a step keeps slices (matmulSlicesKernel).
struct GemmScratch {
  float* lhs = nullptr;
  float* rhs = nullptr;
  float* product = nullptr;
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

  // Scalars: ScaledAddInplace (a, b); the factor of means, Mean cross
  // entropy and Mean collectives (scale).
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
  // The product's kernel and cache blocking, chosen at load time.
  GemmPlan gemmPlan;
  const GemmScratch* scratch = nullptr;

  // Softmax-like kernels: `cols` classes per row. Collectives and remote
  // transfers: tables of offsets (see collectives.hpp).
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
  float* chainScratch = nullptr;
  int32_t outSlot = -1;
  std::array<int32_t, kMaxOperands - 1> inSlot{-1, -1};
  std::array<int64_t, kMaxOperands - 1> tileStride{};
};

// The kernel of a dense (non-collective, non-transfer) op kind.
Kernel denseKernel(OpKind kind);
Kernel matmulKernel();
// Per run: the product [rows, cols] into scratch, then table2's triple i
// (output offset, product offset, count) of it into the output.
Kernel matmulSlicesKernel();
Kernel copyKernel();  // strided copy (Copy, Reshape, Transpose, Slice, pads, Concat parts)
Kernel inputKernel();
Kernel chainKernel();
// The slice kernel of an elementwise kind, or null for kinds that have none.
TileKernel tileKernel(OpKind kind);

// Plans a matmul step's product (the largest it runs) and returns the
// packing scratch it needs (lhs, rhs floats).
std::array<int64_t, 2> planGemm(Step& step);

}  // namespace tessera::sim
