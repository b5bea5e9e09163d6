// The strided copies and sums that run a plane at a time: every point the
// value a point-by-point loop gives, every sum the same bits as adding each
// output element's terms in the loop's order, and no element outside the
// output's points written.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpu_features.hpp"
#include "device_checks.hpp"
#include "planes.hpp"
#include "vector_math.hpp"

namespace tessera::sim {
namespace {

// A loop over `size` with the output's and the input's strides per
// dimension (outer to inner), coalesced as the planner coalesces it.
StridedLoop loopOf(const std::vector<int64_t>& size, const std::vector<int64_t>& out,
                   const std::vector<int64_t>& in) {
  StridedLoop loop;
  for (std::size_t d = 0; d < size.size(); ++d) loop.push(size[d], {out[d], in[d], 0, 0});
  loop.coalesce();
  return loop;
}

std::vector<int64_t> contiguous(const std::vector<int64_t>& size) {
  std::vector<int64_t> strides(size.size(), 1);
  for (std::size_t d = size.size(); d-- > 1;) strides[d - 1] = strides[d] * size[d];
  return strides;
}

int64_t product(const std::vector<int64_t>& size) {
  return std::accumulate(size.begin(), size.end(), int64_t{1}, std::multiplies<>());
}

// The point-by-point order: a row of kRowSumLanes values or more into one
// output element through rowSum, every other point added in turn.
void sumByPoints(const StridedLoop& loop, float* out, const float* in) {
  forEachRow(loop, [&](int64_t n, int64_t s0, int64_t s1, int64_t, int64_t o0, int64_t o1, int64_t) {
    if (s0 == 0 && s1 == 1 && n >= kRowSumLanes) {
      out[o0] += rowSum(in + o1, n);
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[o0 + i * s0] += in[o1 + i * s1];
  });
}

void copyByPoints(const StridedLoop& loop, float* out, const float* in) {
  forEach(loop, [&](int64_t io, int64_t ix, int64_t) { out[io] = in[ix]; });
}

// Values whose sums depend on the order of the terms: magnitudes from
// 2^-20 to 2^20, both signs.
std::vector<float> orderSensitive(int64_t n, uint32_t seed) {
  std::vector<float> v = test::pseudoRandom(n, seed, -1.0f, 1.0f);
  const std::vector<float> scale = test::pseudoRandom(n, seed + 1, -20.0f, 20.0f);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(scale[i]));
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

constexpr int64_t kGuard = 37;

// Every permutation of the dimensions of `size`: the output contiguous in
// the permuted order, the input in the original one (Transpose's loops).
void checkTransposes(const std::vector<int64_t>& size) {
  std::vector<std::size_t> axes(size.size());
  std::iota(axes.begin(), axes.end(), std::size_t{0});
  const std::vector<int64_t> inStrides = contiguous(size);
  const std::vector<float> in = orderSensitive(product(size), 11);
  do {
    std::vector<int64_t> outSize;
    std::vector<int64_t> strides;
    for (std::size_t a : axes) {
      outSize.push_back(size[a]);
      strides.push_back(inStrides[a]);
    }
    const StridedLoop loop = loopOf(outSize, contiguous(outSize), strides);
    std::vector<float> expected(static_cast<std::size_t>(product(size) + kGuard), -7.5f);
    std::vector<float> got = expected;
    copyByPoints(loop, expected.data(), in.data());
    copyStrided(loop, got.data(), in.data());
    CAPTURE(fmt::format("size {} axes {}", fmt::join(size, "x"), fmt::join(axes, ",")));
    CHECK(sameBits(got, expected));
  } while (std::next_permutation(axes.begin(), axes.end()));
}

TEST_CASE("strided copies: transposes of every order, rows and edges of every width") {
  INFO("AVX-512 kernels: " << cpuHasAvx512());
  for (const std::vector<int64_t>& size : std::vector<std::vector<int64_t>>{{1},
                                                                            {5},
                                                                            {70},
                                                                            {3, 5},
                                                                            {8, 8},
                                                                            {16, 8},
                                                                            {9, 17},
                                                                            {64, 2, 8, 8},
                                                                            {4, 8, 2, 8},
                                                                            {2, 3, 16, 5},
                                                                            {7, 1, 13},
                                                                            {3, 65, 2},
                                                                            {17, 9, 8}})
    checkTransposes(size);
}

TEST_CASE("strided copies: slices into wider rows, broadcasts, and a whole flat copy") {
  // A slice's rows land in rows of a wider output, a broadcast reads one
  // element again (stride 0) along a dimension, in every position.
  for (int64_t cols : {1, 7, 8, 15, 16, 17, 33, 64, 65, 130}) {
    for (int64_t rows : {1, 3, 9}) {
      const int64_t width = cols + 5;
      const std::vector<float> in = orderSensitive(rows * width, 3);
      const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> layouts{
          {{width, 1}, {cols, 1}},  // rows of `cols` into rows of `width`
          {{cols, 1}, {width, 1}},  // a slice of rows of `width`
          {{cols, 1}, {1, 0}},      // each row filled with one value
          {{cols, 1}, {0, 1}},      // one row repeated
          {{1, rows}, {width, 1}},  // a transposed slice
      };
      for (const auto& layout : layouts) {
        // (Named, not bound: a structured binding cannot be captured.)
        const std::vector<int64_t>& outStrides = layout.first;
        const std::vector<int64_t>& inStrides = layout.second;
        const StridedLoop loop = loopOf({rows, cols}, outStrides, inStrides);
        std::vector<float> expected(static_cast<std::size_t>(rows * width + kGuard), -7.5f);
        std::vector<float> got = expected;
        copyByPoints(loop, expected.data(), in.data());
        copyStrided(loop, got.data(), in.data());
        CAPTURE(fmt::format("{} x {}, out strides {} in strides {}", rows, cols, fmt::join(outStrides, ","),
                            fmt::join(inStrides, ",")));
        CHECK(sameBits(got, expected));
      }
    }
  }
  const std::vector<float> in = orderSensitive(40'000, 5);
  std::vector<float> expected(in.size() + kGuard, -7.5f);
  std::vector<float> got = expected;
  const StridedLoop flat = loopOf({40'000}, {1}, {1});
  copyByPoints(flat, expected.data(), in.data());
  copyStrided(flat, got.data(), in.data());
  CHECK(sameBits(got, expected));
}

TEST_CASE("strided sums: every set of reduced dimensions, each element's terms in the loop's order") {
  int64_t checked = 0;
  for (const std::vector<int64_t>& size : std::vector<std::vector<int64_t>>{{37},
                                                                            {70},
                                                                            {512, 16},
                                                                            {1024, 8},
                                                                            {9, 16},
                                                                            {64, 64},
                                                                            {3, 65},
                                                                            {130, 3},
                                                                            {7, 8, 16},
                                                                            {4, 5, 70},
                                                                            {8, 9, 48},
                                                                            {2, 3, 4, 5}}) {
    const std::vector<int64_t> inStrides = contiguous(size);
    const std::vector<float> in = orderSensitive(product(size), 17);
    for (uint32_t reduced = 0; reduced < (1u << size.size()); ++reduced) {
      std::vector<int64_t> kept = size;
      for (std::size_t d = 0; d < size.size(); ++d)
        if ((reduced >> d & 1u) != 0) kept[d] = 1;
      std::vector<int64_t> outStrides = contiguous(kept);
      for (std::size_t d = 0; d < size.size(); ++d)
        if (kept[d] == 1) outStrides[d] = 0;
      const StridedLoop loop = loopOf(size, outStrides, inStrides);
      // The outputs start from a value, as a slice of a split reduction's
      // output does not (zero there), so the first term's order shows too.
      std::vector<float> expected = orderSensitive(product(kept) + kGuard, 23);
      std::vector<float> got = expected;
      sumByPoints(loop, expected.data(), in.data());
      sumStrided(loop, got.data(), in.data());
      CAPTURE(fmt::format("size {}, reduced mask {}", fmt::join(size, "x"), reduced));
      CHECK(sameBits(got, expected));
      ++checked;
    }
  }
  CHECK(checked == 68);
}

TEST_CASE("strided sums keep IEEE edge values: -0, infinities and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in(512 * 16, -0.0f);
  in[17] = inf;
  in[18] = -inf;
  in[40] = std::numeric_limits<float>::quiet_NaN();
  in[100] = inf;
  for (const auto& [outStrides, kept] :
       std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{1, 0}, 512}, {{0, 1}, 16}, {{0, 0}, 1}}) {
    const StridedLoop loop = loopOf({512, 16}, outStrides, {16, 1});
    std::vector<float> expected(static_cast<std::size_t>(kept), -0.0f);
    std::vector<float> got = expected;
    sumByPoints(loop, expected.data(), in.data());
    sumStrided(loop, got.data(), in.data());
    CHECK(sameBits(got, expected));
  }
}

}  // namespace
}  // namespace tessera::sim
