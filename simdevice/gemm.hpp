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
};

GemmPlan planGemm(GemmIsa isa, int64_t m, int64_t n, int64_t k);
// A plan for products up to n columns and k deep with each tile shape of
// the packed kernels of `isa` (none for Portable), whichever planGemm would
// pick: any of them gives the same bits.
std::vector<GemmPlan> gemmTilePlans(GemmIsa isa, int64_t n, int64_t k);

// Runs one product. lhs and rhs hold the plan's lhsFloats and rhsFloats and
// are 64-byte aligned. With the packed kernels each element of C is summed
// over k in the same order whatever m and n are, so splitting a product by
// rows does not change its bits (Eigen's kernel does not promise that).
void gemm(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b, float* c, float alpha,
          float* lhs, float* rhs);

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
// Whether a product split into `parts` is cut into blocks of rows (else of
// columns): the cut with the fewer floats of A and B read per part (every
// part reads all of the operand it does not divide, and packs its own copy
// of a packed B), when both dimensions have a tile for every part; else
// the dimension with more tiles.
bool splitsByRows(const GemmPlan& plan, const GemmShape& shape, int parts);
// Part `part` of `parts`: whole micro-kernel tiles of rows or of columns
// (splitsByRows), split evenly. Disjoint, and together all of C.
GemmBlock gemmBlock(const GemmPlan& plan, const GemmShape& shape, int part, int parts);
// Computes part `part` of `parts` of the product (gemm() is part 0 of 1),
// with its own lhs and rhs scratch. With the packed kernels the parts
// together are the same bits as the whole product in one call.
void gemmPart(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b, float* c,
              float alpha, float* lhs, float* rhs, int part, int parts);

// The step path must not allocate; in builds with assertions enabled, Eigen
// is told so while a program runs.
void forbidEigenMalloc(bool forbid);

}  // namespace tessera::sim
