// The device's matrix product, every kernel this CPU can run: against a
// double-precision product, with scratch of exactly the planned size,
// reading only its operands and writing only its product; the packed
// kernels bitwise the same whichever way a product is split by rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "device_checks.hpp"
#include "gemm.hpp"
#include "half.hpp"

namespace tessera::sim {
namespace {

// A 64-byte aligned buffer of exactly n floats (so that an overrun of the
// planned scratch is an error under AddressSanitizer).
struct Aligned {
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  explicit Aligned(int64_t n)
      : data(static_cast<float*>(::operator new[](static_cast<std::size_t>(std::max<int64_t>(n, 1)) * sizeof(float),
                                                  std::align_val_t{64}))) {}
  std::unique_ptr<float, Free> data;
};

struct Case {
  int64_t m, n, k;
  bool transA, transB;
};

std::string describe(GemmIsa isa, const Case& c) {
  return std::string(gemmIsaName(isa)) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
         " k=" + std::to_string(c.k) + (c.transA ? " A^T" : "") + (c.transB ? " B^T" : "");
}

// op(A) op(B) in double; A and B as stored.
std::vector<double> oracle(const Case& c, const std::vector<float>& a, const std::vector<float>& b, double alpha) {
  std::vector<double> out(static_cast<std::size_t>(c.m * c.n), 0.0);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = a[static_cast<std::size_t>(c.transA ? p * c.m + i : i * c.k + p)];
        const double y = b[static_cast<std::size_t>(c.transB ? j * c.k + p : p * c.n + j)];
        sum += x * y;
      }
      out[static_cast<std::size_t>(i * c.n + j)] = alpha * sum;
    }
  }
  return out;
}

// Exactly the scratch a plan asks for.
struct Scratch {
  explicit Scratch(const GemmPlan& plan)
      : lhs(plan.lhsFloats), rhs(plan.rhsFloats), partial(plan.partialFloats) {}
  Aligned lhs;
  Aligned rhs;
  Aligned partial;
};

// Runs one product with scratch planned for (planM, planN) and the case's k.
std::vector<float> run(GemmIsa isa, const Case& c, const float* a, const float* b, float alpha, int64_t planM,
                       int64_t planN) {
  const GemmPlan plan = planGemm(isa, planM, planN, c.k);
  Scratch scratch(plan);
  // Poisoned: the product must overwrite every element.
  std::vector<float> out(static_cast<std::size_t>(c.m * c.n), std::numeric_limits<float>::quiet_NaN());
  gemm(plan, GemmShape{c.m, c.n, c.k, c.transA, c.transB}, a, b, out.data(), alpha, scratch.lhs.data.get(),
       scratch.rhs.data.get(), scratch.partial.data.get());
  return out;
}

// The parts of a product split as `parts` threads would run it, in reverse
// order, each with scratch of its own (the partial sums shared when the cut
// is by the sum), then the halves of a product cut by its sum added, into a
// poisoned C.
std::vector<float> runParts(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b,
                            float alpha, int parts) {
  std::vector<float> out(static_cast<std::size_t>(shape.m * shape.n),
                         std::numeric_limits<float>::quiet_NaN());
  Aligned halves(plan.partialFloats);
  const bool bySum = splitsBySum(plan, shape, parts);
  for (int p = parts - 1; p >= 0; --p) {
    Scratch own(plan);
    gemmPart(plan, shape, a, b, out.data(), alpha, own.lhs.data.get(), own.rhs.data.get(),
             bySum ? halves.data.get() : own.partial.data.get(), p, parts);
  }
  for (int p = 0; p < parts; ++p) gemmAddHalves(plan, shape, out.data(), halves.data.get(), p, parts);
  return out;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> out;
    // Whole tiles, edges in both directions, sums split into several
    // blocks (k > 256) and into halves of two blocks or more (k > 768),
    // more columns than one packed block (n > 512), the benchmark MLP's
    // shapes, odd sizes that threads split by columns (37 x 224), by rows
    // (200 x 37; 40 x 200 x 100 in two parts) and by the sum (3 x 5 x 1100),
    // degenerate sizes, and small products of up to 16 x 16 and one block
    // of the sum (an attention head's: 8 x 8 x 8), which go unpacked, and
    // one just past them (16 x 16 x 256, two blocks).
    const int64_t shapes[][3] = {
        {1, 1, 1},      {8, 32, 16},   {12, 16, 7},    {13, 33, 5},    {64, 256, 784}, {64, 10, 128},
        {128, 10, 64},  {784, 40, 64}, {7, 600, 300},  {30, 17, 513},  {5, 3, 0},      {3, 70, 2},
        {25, 1, 9},     {96, 48, 257}, {37, 224, 300}, {200, 37, 129}, {40, 200, 100}, {3, 5, 1100},
        {13, 40, 1300}, {8, 8, 8},     {16, 16, 255},  {11, 5, 33},    {16, 16, 256}};
    for (const auto& s : shapes)
      for (int t = 0; t < 4; ++t) out.push_back({s[0], s[1], s[2], (t & 1) != 0, (t & 2) != 0});
    return out;
  }();
  return all;
}

TEST_CASE("every kernel matches the double product, with exactly the planned scratch") {
  for (GemmIsa isa : availableGemmIsas()) {
    for (const Case& c : cases()) {
      CAPTURE(describe(isa, c));
      const auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 11 + c.k);
      const auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 29 + c.n);
      const float alpha = 0.75f;
      const std::vector<float> got = run(isa, c, a.data(), b.data(), alpha, c.m, c.n);
      const std::vector<double> want = oracle(c, a, b, alpha);
      double worst = 0.0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        // Float sums of k products of values in [-1, 1): error below
        // k * eps * sum |terms| <= k * eps * k.
        const double bound = 1e-6 + static_cast<double>(c.k) * static_cast<double>(c.k) * 6e-8;
        worst = std::max(worst, std::abs(got[i] - want[i]) / bound);
      }
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("every kernel is exact on small integers") {
  // Products and sums of integers in [-3, 3] stay far below 2^24, so any
  // kernel that sums every term once gets them exactly: an element missed,
  // counted twice or read from the wrong place shows.
  for (GemmIsa isa : availableGemmIsas()) {
    for (const Case& c : cases()) {
      CAPTURE(describe(isa, c));
      auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 7 + c.m, -3.0f, 4.0f);
      auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 13 + c.k, -3.0f, 4.0f);
      for (float& x : a) x = std::floor(x);
      for (float& x : b) x = std::floor(x);
      const std::vector<float> got = run(isa, c, a.data(), b.data(), 0.5f, c.m, c.n);
      const std::vector<double> want = oracle(c, a, b, 0.5);
      int64_t wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i) wrong += static_cast<double>(got[i]) != want[i] ? 1 : 0;
      CHECK(wrong == 0);
    }
  }
}

// n floats that end where an inaccessible page begins: reading past them
// faults.
class BeforeGuardPage {
 public:
  explicit BeforeGuardPage(int64_t n) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = static_cast<std::size_t>(std::max<int64_t>(n, 1)) * sizeof(float);
    size_ = (bytes + page - 1) / page * page + page;
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    base_ = static_cast<char*>(p);
    REQUIRE(mprotect(base_ + size_ - page, page, PROT_NONE) == 0);
    data_ = reinterpret_cast<float*>(base_ + size_ - page) - n;
  }
  ~BeforeGuardPage() { munmap(base_, size_); }
  BeforeGuardPage(const BeforeGuardPage&) = delete;
  BeforeGuardPage& operator=(const BeforeGuardPage&) = delete;
  float* data() const { return data_; }

 private:
  char* base_ = nullptr;
  std::size_t size_ = 0;
  float* data_ = nullptr;
};

TEST_CASE("every kernel reads only A and B and writes only C") {
  // A and B end at an inaccessible page (an edge tile or strip read past
  // them faults); C sits between guard values that must stay unchanged.
  constexpr int64_t kGuard = 64;
  constexpr float kSentinel = 12345.0f;
  for (GemmIsa isa : availableGemmIsas()) {
    for (const Case& c : cases()) {
      CAPTURE(describe(isa, c));
      const auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 3 + c.k);
      const auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 5 + c.n);
      BeforeGuardPage aEnd(c.m * c.k);
      BeforeGuardPage bEnd(c.k * c.n);
      std::copy(a.begin(), a.end(), aEnd.data());
      std::copy(b.begin(), b.end(), bEnd.data());
      const GemmPlan plan = planGemm(isa, c.m, c.n, c.k);
      Scratch scratch(plan);
      std::vector<float> out(static_cast<std::size_t>(c.m * c.n + 2 * kGuard), kSentinel);
      gemm(plan, GemmShape{c.m, c.n, c.k, c.transA, c.transB}, aEnd.data(), bEnd.data(), out.data() + kGuard,
           1.0f, scratch.lhs.data.get(), scratch.rhs.data.get(), scratch.partial.data.get());
      const std::vector<float> want = run(isa, c, a.data(), b.data(), 1.0f, c.m, c.n);
      int64_t guardsChanged = 0;
      for (int64_t i = 0; i < kGuard; ++i) {
        guardsChanged += out[static_cast<std::size_t>(i)] != kSentinel ? 1 : 0;
        guardsChanged += out[static_cast<std::size_t>(kGuard + c.m * c.n + i)] != kSentinel ? 1 : 0;
      }
      CHECK(guardsChanged == 0);
      CHECK(std::equal(want.begin(), want.end(), out.begin() + kGuard));
    }
  }
}

TEST_CASE("packed kernels: splitting a product by rows does not change its bits") {
  for (GemmIsa isa : availableGemmIsas()) {
    if (isa == GemmIsa::Portable) continue;
    for (const Case& c : cases()) {
      if (c.m < 2 || c.transA) continue;  // row blocks of A [m, k] are contiguous
      CAPTURE(describe(isa, c));
      const auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 3);
      const auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 5);
      const std::vector<float> whole = run(isa, c, a.data(), b.data(), 1.0f, c.m, c.n);
      // Rows [0, top) and [top, m), top not a multiple of any tile height,
      // each with scratch planned for the whole product.
      const int64_t top = c.m / 2 + 1 < c.m ? c.m / 2 + 1 : c.m / 2;
      const Case upper{top, c.n, c.k, false, c.transB};
      const Case lower{c.m - top, c.n, c.k, false, c.transB};
      std::vector<float> split = run(isa, upper, a.data(), b.data(), 1.0f, c.m, c.n);
      const std::vector<float> rest = run(isa, lower, a.data() + top * c.k, b.data(), 1.0f, c.m, c.n);
      split.insert(split.end(), rest.begin(), rest.end());
      CHECK(split == whole);
      // One row at a time.
      std::vector<float> rows;
      for (int64_t i = 0; i < c.m; ++i) {
        const std::vector<float> row =
            run(isa, Case{1, c.n, c.k, false, c.transB}, a.data() + i * c.k, b.data(), 1.0f, c.m, c.n);
        rows.insert(rows.end(), row.begin(), row.end());
      }
      CHECK(rows == whole);
    }
  }
}

TEST_CASE("packed kernels: the parts of a product split over threads cover it once, in the same bits") {
  for (GemmIsa isa : availableGemmIsas()) {
    if (isa == GemmIsa::Portable) continue;
    for (const Case& c : cases()) {
      CAPTURE(describe(isa, c));
      const auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 17);
      const auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 19);
      const std::vector<float> whole = run(isa, c, a.data(), b.data(), 0.5f, c.m, c.n);
      const GemmPlan plan = planGemm(isa, c.m, c.n, c.k);
      const GemmShape shape{c.m, c.n, c.k, c.transA, c.transB};
      for (int parts = 2; parts <= 5; ++parts) {
        CAPTURE(parts);
        // Every element in exactly one block (or, cut by the sum, in both
        // halves' blocks); blocks start on tile edges.
        const int each = splitsBySum(plan, shape, parts) ? parts : 1;
        std::vector<int> cover(static_cast<std::size_t>(c.m * c.n), 0);
        for (int p = 0; p < parts; ++p) {
          const GemmBlock block = gemmBlock(plan, shape, p, parts);
          CHECK((block.row0 % plan.mr == 0 && block.col0 % plan.nr == 0));
          for (int64_t i = block.row0; i < block.row1; ++i)
            for (int64_t j = block.col0; j < block.col1; ++j) ++cover[static_cast<std::size_t>(i * c.n + j)];
        }
        CHECK(std::count(cover.begin(), cover.end(), each) == static_cast<std::ptrdiff_t>(cover.size()));
        CHECK(runParts(plan, shape, a.data(), b.data(), 0.5f, parts) == whole);
      }
    }
  }
}

// The packed kernels' documented order: k cut into ceil(k / 256) blocks, two
// for k = 256, that depend on k alone (block b is [k b / blocks,
// k (b + 1) / blocks)), each
// block's products added into a float from 0 in order of p with one
// rounding per step (a fused multiply-add) and scaled by alpha; the first
// ceil(blocks / 2) blocks added in order, the rest likewise, then the two
// halves.
std::vector<float> summedInOrder(const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                                 float alpha) {
  std::vector<float> out(static_cast<std::size_t>(c.m * c.n), 0.0f);
  const int64_t blocks = std::max<int64_t>((c.k + 255) / 256, c.k >= 256 ? 2 : 1);
  const int64_t half = (blocks + 1) / 2;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      float halves[2] = {0.0f, 0.0f};
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t p0 = c.k * kb / blocks;
        const int64_t p1 = c.k * (kb + 1) / blocks;
        float acc = 0.0f;
        for (int64_t p = p0; p < p1; ++p) {
          const float x = a[static_cast<std::size_t>(c.transA ? p * c.m + i : i * c.k + p)];
          const float y = b[static_cast<std::size_t>(c.transB ? j * c.k + p : p * c.n + j)];
          acc = std::fma(x, y, acc);
        }
        // Rounded before the addition (volatile: never fused into one).
        const volatile float scaled = acc * alpha;
        float& sum = halves[kb < half ? 0 : 1];
        sum = kb == 0 || kb == half ? scaled : scaled + sum;
      }
      out[static_cast<std::size_t>(i * c.n + j)] = blocks > half ? halves[0] + halves[1] : halves[0];
    }
  }
  return out;
}

TEST_CASE("packed kernels: every tile shape sums each element in the documented order, split or not") {
  // The test cases up to 2 M multiply-adds and shapes with edges for every
  // tile (6, 8, 12 rows; 16, 32, 64 columns), tall enough for the widest.
  std::vector<Case> shapes;
  for (const Case& c : cases())
    if (c.m * c.n * c.k <= (int64_t{1} << 21)) shapes.push_back(c);
  const int64_t extra[][3] = {{197, 130, 300}, {250, 64, 33},  {13, 65, 17}, {61, 97, 520},
                              {192, 200, 1},   {21, 70, 1040}, {19, 50, 256}};
  for (const auto& s : extra)
    for (int t = 0; t < 4; ++t) shapes.push_back({s[0], s[1], s[2], (t & 1) != 0, (t & 2) != 0});
  for (GemmIsa isa : availableGemmIsas()) {
    if (isa == GemmIsa::Portable) continue;
    for (const Case& c : shapes) {
      const auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 41 + c.m);
      const auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 43 + c.n);
      const float alpha = 0.3f;
      const std::vector<float> want = summedInOrder(c, a, b, alpha);
      const GemmShape shape{c.m, c.n, c.k, c.transA, c.transB};
      const std::vector<GemmPlan> plans = gemmTilePlans(isa, c.m, c.n, c.k);
      CHECK(plans.size() >= 2);
      for (GemmPlan plan : plans) {
        const std::string tile =
            describe(isa, c) + " tile " + std::to_string(plan.mr) + "x" + std::to_string(plan.nr);
        CAPTURE(tile);
        for (int parts = 1; parts <= 4; ++parts) {
          CAPTURE(parts);
          // Four parts: one thread with partial sums for 3 tiles only, so a
          // deep product adds its halves chunk by chunk.
          if (parts == 4 && plan.partialFloats > 0) plan.partialFloats = 3 * plan.mr * plan.nr;
          const std::vector<float> got =
              runParts(plan, shape, a.data(), b.data(), alpha, parts == 4 ? 1 : parts);
          int64_t different = 0;
          for (std::size_t i = 0; i < got.size(); ++i)
            different += std::memcmp(&got[i], &want[i], sizeof(float)) != 0 ? 1 : 0;
          CHECK(different == 0);
        }
      }
    }
  }
}

TEST_CASE("float16 products: every kernel rounds each element to the nearest half once its sum is done") {
  // The rounded product is the float product rounded element by element:
  // with every tile shape, split into parts or not, over several blocks of
  // the sum (k > 256), with edges and zero depth.
  std::vector<Case> shapes;
  for (const Case& c : cases())
    if (c.m * c.n * c.k <= (int64_t{1} << 21)) shapes.push_back(c);
  for (GemmIsa isa : availableGemmIsas()) {
    for (const Case& c : shapes) {
      // Values up to 8 so that products reach past a half's 11 bits.
      auto a = test::pseudoRandom(static_cast<std::size_t>(c.m * c.k), 51 + c.m);
      auto b = test::pseudoRandom(static_cast<std::size_t>(c.k * c.n), 53 + c.n);
      for (float& x : a) x *= 8.0f;
      const GemmShape plain{c.m, c.n, c.k, c.transA, c.transB};
      GemmShape half = plain;
      half.halfOutput = true;
      std::vector<GemmPlan> plans = gemmTilePlans(isa, c.m, c.n, c.k);
      if (plans.empty()) plans.push_back(planGemm(isa, c.m, c.n, c.k));
      for (const GemmPlan& plan : plans) {
        const std::string tile =
            describe(isa, c) + " tile " + std::to_string(plan.mr) + "x" + std::to_string(plan.nr);
        CAPTURE(tile);
        Scratch scratch(plan);
        std::vector<float> want(static_cast<std::size_t>(c.m * c.n), std::numeric_limits<float>::quiet_NaN());
        gemm(plan, plain, a.data(), b.data(), want.data(), 0.7f, scratch.lhs.data.get(),
             scratch.rhs.data.get(), scratch.partial.data.get());
        std::size_t changed = 0;
        for (float& x : want) {
          const float rounded = roundToHalf(x);
          changed += rounded != x ? 1 : 0;
          x = rounded;
        }
        if (c.k > 1) CHECK(changed > 0);  // the rounding is not vacuous
        const int maxParts = plan.mr == 0 ? 1 : 3;
        for (int parts = 1; parts <= maxParts; ++parts) {
          CAPTURE(parts);
          const std::vector<float> got = runParts(plan, half, a.data(), b.data(), 0.7f, parts);
          int64_t different = 0;
          for (std::size_t i = 0; i < got.size(); ++i)
            different += std::memcmp(&got[i], &want[i], sizeof(float)) != 0 ? 1 : 0;
          CHECK(different == 0);
        }
      }
    }
  }
}

TEST_CASE("the widest tile is taken only by products tall and wide enough to fill it") {
  for (GemmIsa isa : availableGemmIsas()) {
    if (isa != GemmIsa::Avx512) continue;
    CHECK(planGemm(isa, 64, 256, 784).nr == 32);   // the MLP's forward product: 8 x 32
    CHECK(planGemm(isa, 64, 256, 784).mr == 8);
    CHECK(planGemm(isa, 256, 128, 64).nr == 64);   // its weight gradient: 6 x 64
    CHECK(planGemm(isa, 256, 128, 64).mr == 6);
    CHECK(planGemm(isa, 256, 40, 64).nr == 32);    // too narrow for 64 columns
    CHECK(planGemm(isa, 100, 10, 64).nr == 16);
  }
}

TEST_CASE("a product is split across the operand that costs each part more to read") {
  for (GemmIsa isa : availableGemmIsas()) {
    if (isa == GemmIsa::Portable) continue;
    CAPTURE(std::string(gemmIsaName(isa)));
    // The MLP's first layer: a batch of 64 against a 784 x 256 weight. By
    // rows each part would read the whole weight; by columns, its half and
    // all of the batch; by the sum (784 = 4 blocks of 196), half of each and
    // half of the other half's partial sums.
    const GemmShape forward{64, 256, 784, false, false};
    const GemmPlan forwardPlan = planGemm(isa, forward.m, forward.n, forward.k);
    CHECK(splitsBySum(forwardPlan, forward, 2));
    const GemmBlock all = gemmBlock(forwardPlan, forward, 1, 2);
    CHECK((all.row0 == 0 && all.row1 == 64 && all.col0 == 0 && all.col1 == 256));
    // In three parts (the sum is cut in two only): by columns.
    CHECK_FALSE(splitsBySum(forwardPlan, forward, 3));
    CHECK_FALSE(splitsByRows(forwardPlan, forward, 3));
    const GemmBlock third = gemmBlock(forwardPlan, forward, 0, 3);
    CHECK((third.row0 == 0 && third.row1 == 64 && third.col0 == 0));
    CHECK(third.col1 == 256 / forwardPlan.nr / 3 * forwardPlan.nr);
    // The second layer (k = 256, two blocks of 128): by the sum too. Its
    // input gradient (k = 128, one block): no halves to cut.
    const GemmShape second{64, 128, 256, false, false};
    CHECK(splitsBySum(planGemm(isa, second.m, second.n, second.k), second, 2));
    const GemmShape back{64, 256, 128, false, true};
    CHECK_FALSE(splitsBySum(planGemm(isa, back.m, back.n, back.k), back, 2));
    // A C of one tile over a deep sum (a convolution's weight gradient):
    // only the sum can be cut, even in two blocks.
    const GemmShape tiny{6, 20, 8000, false, true};
    const GemmPlan tinyPlan = planGemm(isa, tiny.m, tiny.n, tiny.k);
    CHECK(gemmParts(tinyPlan, tiny, 4) == 2);
    CHECK(splitsBySum(tinyPlan, tiny, 2));
    // Its weight gradient: 784 rows of x^T against the batch's 256-wide
    // gradient; by rows each part reads its rows of x and the narrow
    // operand.
    const GemmShape gradient{784, 256, 64, true, false};
    CHECK(splitsByRows(planGemm(isa, gradient.m, gradient.n, gradient.k), gradient, 2));
    // Fewer column tiles than parts: rows.
    const GemmShape narrow{640, 10, 784, false, false};
    CHECK(splitsByRows(planGemm(isa, narrow.m, narrow.n, narrow.k), narrow, 2));
    // The test cases cut every way at every part count the cover test
    // runs (by the sum in two parts only), so the bits of every cut are
    // checked there.
    for (int parts = 2; parts <= 5; ++parts) {
      CAPTURE(parts);
      int byRows = 0;
      int byColumns = 0;
      int bySum = 0;
      for (const Case& c : cases()) {
        const GemmShape shape{c.m, c.n, c.k, c.transA, c.transB};
        const GemmPlan plan = planGemm(isa, c.m, c.n, c.k);
        if (gemmParts(plan, shape, parts) < 2) continue;
        if (splitsBySum(plan, shape, parts)) {
          ++bySum;
        } else {
          (splitsByRows(plan, shape, parts) ? byRows : byColumns) += 1;
        }
      }
      CHECK(byRows > 0);
      CHECK(byColumns > 0);
      CHECK((bySum > 0) == (parts == 2));
    }
  }
}

TEST_CASE("products are split over threads when they are worth it") {
  for (GemmIsa isa : availableGemmIsas()) {
    CAPTURE(std::string(gemmIsaName(isa)));
    const GemmShape large{64, 256, 784, false, false};
    const GemmPlan plan = planGemm(isa, large.m, large.n, large.k);
    CHECK(gemmParts(plan, large, 1) == 1);
    // Eigen's kernel does not sum in a fixed order across blocks: one part.
    CHECK(gemmParts(plan, large, 3) == (isa == GemmIsa::Portable ? 1 : 3));
    const GemmShape small{8, 10, 16, false, false};
    CHECK(gemmParts(planGemm(isa, small.m, small.n, small.k), small, 4) == 1);
  }
}

TEST_CASE("the device uses the best kernel the CPU has") {
  const std::vector<GemmIsa> isas = availableGemmIsas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == GemmIsa::Portable);
  CHECK(bestGemmIsa() == isas.back());
  for (GemmIsa isa : isas) {
    const GemmPlan plan = planGemm(isa, 64, 256, 784);
    CHECK(plan.isa == isa);
    CHECK(plan.lhsFloats > 0);
    CHECK(plan.rhsFloats > 0);
  }
  MESSAGE("GEMM kernels on this CPU: ", isas.size(), ", using ", std::string(gemmIsaName(bestGemmIsa())));
}

}  // namespace
}  // namespace tessera::sim
