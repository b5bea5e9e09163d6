// The matmul family's kernels (lib/ops/matmul.cc defines the op): GEMMs on
// the packed micro-kernels of gemm.hpp. The gradient GEMMs that a
// collective computes fused with its reduction are planned by the
// collective family (simdevice/ops/collectives.cc) and run these kernels.
#include <algorithm>

#include "kernel_table.hpp"

namespace tessera::sim {
namespace {

void gemm(const Step& s, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
          float alpha) {
  runGemm(s, GemmShape{m, n, k, s.transA, s.transB, s.halfOutput}, a, b, c, alpha);
}

void matmul(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* a = inOf(s, run, 0);
    const float* b = inOf(s, run, 1);
    if (run.count == 1 || (!s.transA && run.advance[0] && !run.advance[1])) {
      // Stacked groups against one right operand: a single GEMM.
      gemm(s, run.count * s.rows, s.cols, s.depth, a, b, o, s.scale);
      continue;
    }
    for (int64_t g = 0; g < run.count; ++g) {
      gemm(s, s.rows, s.cols, s.depth, a + (run.advance[0] ? g * s.inElements[0] : 0),
           b + (run.advance[1] ? g * s.inElements[1] : 0), o + g * s.outElements, s.scale);
    }
  }
}

// One product per batch index of each group: operands [batch, rows, depth]
// and [batch, depth, cols].
void batchedMatmul(const Step& s) {
  const int64_t aStride = s.rows * s.depth;
  const int64_t bStride = s.depth * s.cols;
  const int64_t oStride = s.rows * s.cols;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* a = inOf(s, run, 0) + (run.advance[0] ? g * s.inElements[0] : 0);
      const float* b = inOf(s, run, 1) + (run.advance[1] ? g * s.inElements[1] : 0);
      float* o = outOf(s, run) + g * s.outElements;
      for (int64_t t = 0; t < s.groups; ++t)
        gemm(s, s.rows, s.cols, s.depth, a + t * aStride, b + t * bStride, o + t * oStride, s.scale);
    }
  }
}

void matmulSlices(const Step& s) {
  for (std::size_t i = 0; i < s.runs.size(); ++i) {
    const Run& run = s.runs[i];
    gemm(s, s.rows, s.cols, s.depth, inOf(s, run, 0), inOf(s, run, 1), s.scratch->product, s.scale);
    const int64_t* slice = s.table2.data() + 3 * i;
    std::copy_n(s.scratch->product + slice[1], slice[2], s.out + slice[0]);
  }
}

// A reduce-scatter's fused gradient GEMM when the shards carry padding: per
// run the product of one group into scratch, then each of the group's
// shards on this device: table[2i] is run i's first triple of table2 and
// table[2i + 1] their count; a triple is (output offset, product offset,
// real elements), and the rest of the shard is padding, zeroed.
void matmulShards(const Step& s) {
  float* product = s.scratch->product;
  for (std::size_t i = 0; i < s.runs.size(); ++i) {
    const Run& run = s.runs[i];
    gemm(s, s.rows, s.cols, s.depth, inOf(s, run, 0), inOf(s, run, 1), product, s.scale);
    const int64_t* shard = s.table2.data() + 3 * s.table[2 * i];
    for (int64_t k = 0; k < s.table[2 * i + 1]; ++k, shard += 3) {
      float* out = s.out + shard[0];
      std::copy_n(product + shard[1], shard[2], out);
      std::fill_n(out + shard[2], s.outElements - shard[2], 0.0f);
    }
  }
}

}  // namespace

void runGemmOn(const Step& s, int thread, const GemmShape& shape, const float* a, const float* b, float* c,
               float alpha) {
  const GemmScratch& scratch = *s.scratch;
  sim::gemm(s.gemmPlan, shape, a, b, c, alpha, scratch.lhs + thread * scratch.lhsStride,
            scratch.rhs + thread * scratch.rhsStride, scratch.partial + thread * scratch.partialStride);
}

// Each part packs into its thread's scratch and, a block of C, keeps its
// chunks' partial sums in its thread's too; a product cut by its sum keeps
// its second half's sums in the partial sums of the thread that runs the
// step, and a second job adds them into C by blocks of rows.
void runGemm(const Step& s, const GemmShape& shape, const float* a, const float* b, float* c, float alpha) {
  const int parts = s.pool == nullptr ? 1 : gemmParts(s.gemmPlan, shape, s.pool->threads());
  const int caller = callerThread(s);
  if (parts == 1) return runGemmOn(s, caller, shape, a, b, c, alpha);
  const GemmScratch& scratch = *s.scratch;
  const bool bySum = splitsBySum(s.gemmPlan, shape, parts);
  float* halves = scratch.partial + caller * scratch.partialStride;
  s.pool->run(parts, [&](int part, int thread) {
    gemmPart(s.gemmPlan, shape, a, b, c, alpha, scratch.lhs + thread * scratch.lhsStride,
             scratch.rhs + thread * scratch.rhsStride,
             bySum ? halves : scratch.partial + thread * scratch.partialStride, part, parts);
  });
  if (bySum)
    s.pool->run(parts, [&](int part, int) { gemmAddHalves(s.gemmPlan, shape, c, halves, part, parts); });
}

void planGemm(Step& step) {
  int64_t rows = step.rows;
  for (const Run& run : step.runs) {
    if (step.kernel == matmul && !step.transA && run.advance[0] && !run.advance[1])
      rows = std::max(rows, run.count * step.rows);
  }
  step.gemmPlan = sim::planGemm(bestGemmIsa(), rows, step.cols, step.depth);
}

Kernel matmulKernel() { return matmul; }
Kernel matmulSlicesKernel() { return matmulSlices; }
Kernel matmulShardsKernel() { return matmulShards; }
Kernel batchedMatmulKernel() { return batchedMatmul; }

void addMatMulKernels(KernelTable& table) {
  table.add({.kind = OpKind::MatMul, .plan = [](StepPlanner& planner, Step& step) {
               const Graph& graph = planner.graph();
               const OpNode& op = planner.op();
               // A folded Transpose is read from its input, transposed.
               auto operand = [&](TensorId t, bool& transposed) {
                 const OpId producer = graph.tensor(t).producer;
                 transposed = planner.foldedTranspose(producer);
                 return transposed ? graph.op(producer).inputs[0] : t;
               };
               const TensorId a = operand(op.inputs[0], step.transA);
               const TensorId b = operand(op.inputs[1], step.transB);
               const Shape& bShape = planner.shape(op.inputs[1]);
               step.depth = bShape[0];
               step.cols = bShape[1];
               step.rows = step.depth == 0 ? 0 : planner.elements(op.inputs[0]) / step.depth;
               if (step.depth == 0) step.rows = step.cols == 0 ? 0 : step.outElements / step.cols;
               // Folded operands keep the transposed tensor's layout (it is the same).
               planner.runsOver(step, {{a, 0}, {b, 0}});
               step.kernel = matmulKernel();
               step.halfOutput = planner.halfOutput();
               planner.emit(std::move(step));
             }});
  table.add({.kind = OpKind::BatchMatMul, .plan = [](StepPlanner& planner, Step& step) {
               const OpNode& op = planner.op();
               const Shape& a = planner.shape(op.inputs[0]);
               step.rows = a[a.size() - 2];
               step.depth = a.back();
               step.cols = planner.shape(op.inputs[1]).back();
               step.groups = numElements(Shape(a.begin(), a.end() - 2));
               planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
               step.kernel = batchedMatmulKernel();
               step.halfOutput = planner.halfOutput();
               planner.emit(std::move(step));
             }});
}

}  // namespace tessera::sim
