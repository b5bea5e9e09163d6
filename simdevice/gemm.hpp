// The device's matrix product. On x86 CPUs with AVX2 + FMA or AVX-512 it runs
// hand-written packed micro-kernels, chosen at run time from the CPU (so a
// build for the baseline architecture still uses them); elsewhere it runs
// Eigen's GEMM.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace tessera::sim {

enum class GemmIsa { Portable, Avx2, Avx512 };

std::string_view gemmIsaName(GemmIsa isa);
// Every kernel this CPU can run, Portable first and the best last.
std::vector<GemmIsa> availableGemmIsas();
// The best of them, which the device uses.
GemmIsa bestGemmIsa();

// C[m, n] = alpha * op(A) op(B), C row-major and overwritten. A is [m, k]
// row-major, or [k, m] read transposed (transA); likewise B is [k, n] or
// [n, k]. halfOutput: each element of C is rounded to the nearest float16
// once its sum is done (a float16 product), while its block is in cache.
struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transA = false;
  bool transB = false;
  bool halfOutput = false;
};

// Cache blocking chosen at load time for products up to a maximal shape,
// and the packing scratch (floats) it needs. Every product whose m, n and k
// do not exceed the planned ones runs with the same scratch.
struct GemmPlan {
  GemmIsa isa = GemmIsa::Portable;
  int mr = 0;  // rows and columns of a micro-kernel's tile (packed kernels)
  int nr = 0;
  int64_t kc = 0;  // the deepest block of the sum
  int64_t mc = 0;  // Eigen's row block (of C's columns: Eigen computes C^T)
  int64_t nc = 0;  // columns of C per block (packed kernels); Eigen's column block (of C's rows)
  int64_t lhsFloats = 0;
  int64_t rhsFloats = 0;
  // Partial sums (packed kernels, products of two blocks of the sum or
  // more): the second half's sums of a whole product, kept chunk by chunk
  // of C, or of all of C when a product is split over threads by its sum.
  int64_t partialFloats = 0;
};

GemmPlan planGemm(GemmIsa isa, int64_t m, int64_t n, int64_t k);
// A plan for products up to m x n and k deep with each tile shape of the
// packed kernels of `isa` (none for Portable), whichever planGemm would
// pick: any of them gives the same bits.
std::vector<GemmPlan> gemmTilePlans(GemmIsa isa, int64_t m, int64_t n, int64_t k);

// Runs one product. lhs, rhs and partial hold the plan's lhsFloats,
// rhsFloats and partialFloats; lhs and rhs are 64-byte aligned. With the
// packed kernels each element of C is summed over k in the same order
// whatever m and n are, so splitting a product does not change its bits
// (Eigen's kernel does not promise that). The order: k is cut into
// ceil(k / 256) blocks (two for k = 256) that depend on k alone; each
// block's products are added in order of p from 0 (one fused multiply-add
// a step) and scaled by alpha; the first half of the blocks
// (ceil(blocks / 2)) are added in order, the second half likewise, and
// then the two halves. Up to three blocks that is the blocks added in
// order.
void gemm(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b, float* c, float alpha,
          float* lhs, float* rhs, float* partial);

// Splitting a product over threads. A block of C: rows [row0, row1) and
// columns [col0, col1).
struct GemmBlock {
  int64_t row0 = 0;
  int64_t row1 = 0;
  int64_t col0 = 0;
  int64_t col1 = 0;
};

// How many parts (at most `threads`) a product is worth splitting into: 1
// for small products and for Eigen's kernel, whose sums are not in a fixed
// order across blocks.
int gemmParts(const GemmPlan& plan, const GemmShape& shape, int threads);
// Whether a product split into `parts` is cut by its sum: two parts, one
// for each half of the blocks of the sum (the first into C, the second
// into the partial sums), then gemmAddHalves. Taken when C is too narrow
// and short to cut, or when each part reads fewer floats than with rows or
// columns, counting twice those another core wrote (operands taken as
// written by the threads in blocks of rows): a deep product whose large
// operand is its op(B) (a batch against a weight), where each half of the
// sum reads the rows of B that the same thread's half of the weight update
// wrote.
bool splitsBySum(const GemmPlan& plan, const GemmShape& shape, int parts);
// Whether a product split into `parts` is cut into blocks of rows (else of
// columns): the cut with the fewer floats of A and B read per part (every
// part reads all of the operand it does not divide, and packs its own copy
// of a packed B), when both dimensions have a tile for every part; else
// the dimension with more tiles.
bool splitsByRows(const GemmPlan& plan, const GemmShape& shape, int parts);
// Part `part` of `parts`: whole micro-kernel tiles of rows or of columns
// (splitsByRows), split evenly, disjoint and together all of C; or all of C
// when the cut is by the sum.
GemmBlock gemmBlock(const GemmPlan& plan, const GemmShape& shape, int part, int parts);
// Computes part `part` of `parts` of the product (gemm() is part 0 of 1),
// with its own lhs, rhs and partial scratch; but the parts of a product cut
// by its sum share one partial buffer (the second half's sums of all of C).
// With the packed kernels the parts together (and gemmAddHalves after them
// all) are the same bits as the whole product in one call.
void gemmPart(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b, float* c,
              float alpha, float* lhs, float* rhs, float* partial, int part, int parts);
// After all the parts of a product cut by its sum: part `part` of `parts`
// adds the partial sums into its block of rows of C (and rounds them to
// halves for a float16 product). Nothing for other cuts.
void gemmAddHalves(const GemmPlan& plan, const GemmShape& shape, float* c, const float* partial, int part,
                   int parts);

// The step path must not allocate; in builds with assertions enabled, Eigen
// is told so while a program runs.
void forbidEigenMalloc(bool forbid);

}  // namespace tessera::sim
