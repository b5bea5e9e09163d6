// The device's vector math: its exponential within 1 ulp of std::exp from
// -708 on and exact at the edges (0, overflow, 0 below -708, NaN); erf,
// e^x, tanh and the sigmoid of floats the nearest floats (bar near-ties)
// and exact at their edges; and every vector form the same bits as the
// scalar form.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cpu_features.hpp"
#include "device_checks.hpp"
#include "vector_math.hpp"

namespace tessera::sim {
namespace {

// How many doubles (or floats) lie between a and b (0: equal), for finite
// a, b of the same sign.
template <class T>
int64_t ulpsBetween(T a, T b) {
  int64_t steps = 0;
  while (a != b && steps < 1000) {
    a = std::nextafter(a, b);
    ++steps;
  }
  return steps;
}

TEST_CASE("the exponential is within 1 ulp of std::exp over its range") {
  const std::vector<float> wide = test::pseudoRandom(200'000, 3, -708.0f, 709.0f);
  const std::vector<float> near = test::pseudoRandom(200'000, 4, -1.0f, 1.0f);
  int64_t worst = 0;
  int64_t exact = 0;
  int64_t checked = 0;
  for (const std::vector<float>* inputs : {&wide, &near}) {
    for (const float f : *inputs) {
      // Doubles that are not floats too: the reduction sees every bit.
      const double x = static_cast<double>(f) * (1.0 + 0x1p-30);
      const double want = std::exp(x);
      const double got = exponential(x);
      const int64_t ulps = ulpsBetween(got, want);
      worst = std::max(worst, ulps);
      exact += ulps == 0 ? 1 : 0;
      ++checked;
      if (ulps > 1) {
        CAPTURE(x);
        CHECK(got == want);
      }
    }
  }
  CHECK(worst <= 1);
  // Almost always the correctly rounded value (std::exp is, in glibc).
  CHECK(static_cast<double>(exact) >= 0.9 * static_cast<double>(checked));
}

TEST_CASE("the exponential at its edges") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(exponential(0.0) == 1.0);
  CHECK(exponential(-0.0) == 1.0);
  CHECK(exponential(1.0) == std::exp(1.0));
  CHECK(exponential(-inf) == 0.0);
  CHECK(exponential(inf) == inf);
  CHECK(std::isnan(exponential(std::numeric_limits<double>::quiet_NaN())));
  // Overflow, and the largest finite results.
  CHECK(exponential(709.79) == inf);
  CHECK(exponential(1e6) == inf);
  CHECK(ulpsBetween(exponential(709.78), std::exp(709.78)) <= 1);
  // Down to -708 the value; below, 0 (no subnormal results).
  CHECK(ulpsBetween(exponential(-708.0), std::exp(-708.0)) <= 1);
  CHECK(exponential(-708.0) > 0x1p-1022);
  for (const double x : {std::nextafter(-708.0, -1e9), -708.5, -720.0, -745.2, -1e6}) {
    CAPTURE(x);
    CHECK(exponential(x) == 0.0);
  }
}

TEST_CASE("shifted exponentials: the vector form gives the scalar form's bits") {
  // Lengths around the vector width, logits of a wide range with infinities
  // and NaN among them (a masked attention score is -inf).
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{61}, int64_t{4'096}}) {
    CAPTURE(n);
    std::vector<float> x = test::pseudoRandom(static_cast<std::size_t>(n), 9, -90.0f, 30.0f);
    if (n > 20) {
      x[2] = -700.0f;  // next to the flush to 0
      x[3] = -std::numeric_limits<float>::infinity();
      x[11] = std::numeric_limits<float>::quiet_NaN();
      x[17] = 30.0f;
    }
    for (const float max : {30.0f, 0.0f, -5.5f}) {
      CAPTURE(max);
      std::vector<double> out(static_cast<std::size_t>(n));
      shiftedExponentials(x.data(), n, max, out.data());
      for (int64_t j = 0; j < n; ++j) {
        const auto at = static_cast<std::size_t>(j);
        const double want = exponential(static_cast<double>(x[at] - max));
        CAPTURE(j);
        if (std::isnan(want)) {
          CHECK(std::isnan(out[at]));
        } else {
          CHECK(out[at] == want);
        }
      }
    }
  }
}

// f(v) for every 97th float x from 0 up to `below` and its negative; the
// count of values.
template <class F>
int64_t forEvery97thFloat(float below, F&& f) {
  int64_t count = 0;
  for (uint32_t bits = 0;; bits += 97) {
    const float x = std::bit_cast<float>(bits);
    if (!(x < below)) return count;
    f(x);
    f(-x);
    count += 2;
  }
}

// Every 97th float from 0 to 4 and its negative (about 22 million values),
// then beyond: erfOf is erf rounded to the nearest float but for values
// within the approximation's error of a tie, which a float of the long
// double erf would have to hit.
TEST_CASE("erf of floats is the nearest float to erf") {
  int64_t off = 0;
  const int64_t checked = forEvery97thFloat(4.5f, [&](float v) {
    const long double exact = std::erf(static_cast<long double>(v));
    const float got = erfOf(v);
    const auto nearest = static_cast<float>(exact);
    if (got == nearest) return;
    ++off;
    CAPTURE(v);
    CHECK(ulpsBetween(got, nearest) == 1);
    // Off by one only at a near-tie: the two floats' midpoint within 1e-14
    // of erf relative to it.
    const long double midpoint = (static_cast<long double>(got) + nearest) / 2;
    CHECK(std::fabs(static_cast<double>((midpoint - exact) / exact)) < 1e-14);
  });
  CHECK(checked > 20'000'000);
  CHECK(off <= 8);
}

TEST_CASE("erf of floats at its edges") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(erfOf(0.0f) == 0.0f);
  CHECK(!std::signbit(erfOf(0.0f)));
  CHECK(erfOf(-0.0f) == 0.0f);
  CHECK(std::signbit(erfOf(-0.0f)));
  CHECK(erfOf(inf) == 1.0f);
  CHECK(erfOf(-inf) == -1.0f);
  CHECK(std::isnan(erfOf(std::numeric_limits<float>::quiet_NaN())));
  // Subnormal and tiny x keep their precision: erf(x) = 2x / sqrt(pi) there.
  for (const float x : {0x1p-149f, 0x1p-140f, 1e-30f, 1e-10f}) {
    CAPTURE(x);
    CHECK(erfOf(x) == static_cast<float>(std::erf(static_cast<long double>(x))));
  }
  // Where the pieces meet, and where erf reaches 1 in float.
  for (const float x : {0.5f, 1.0f, 1.5f, 2.0f, 3.5f, 3.9f, 3.92f, 4.0f, 1e30f}) {
    CAPTURE(x);
    CHECK(erfOf(x) == static_cast<float>(std::erf(static_cast<long double>(x))));
    CHECK(erfOf(-x) == -erfOf(x));
  }
}

// The floats' exponential against the C library's double one, rounded.
TEST_CASE("e^x of floats is the float of the device's exponential") {
  const float inf = std::numeric_limits<float>::infinity();
  int64_t off = 0;
  const std::vector<float> x = test::pseudoRandom(400'000, 5, -110.0f, 90.0f);
  for (const float v : x) {
    const float got = exponentialOf(v);
    CHECK(got == static_cast<float>(exponential(static_cast<double>(v))));
    if (got != static_cast<float>(std::exp(static_cast<double>(v)))) ++off;
  }
  CHECK(off <= 4);
  CHECK(exponentialOf(0.0f) == 1.0f);
  CHECK(exponentialOf(-inf) == 0.0f);
  CHECK(exponentialOf(inf) == inf);
  CHECK(exponentialOf(88.8f) == inf);  // beyond the greatest float
  CHECK(exponentialOf(-104.0f) == 0.0f);
  CHECK(exponentialOf(-100.0f) == static_cast<float>(std::exp(-100.0)));  // subnormal
  CHECK(std::isnan(exponentialOf(std::numeric_limits<float>::quiet_NaN())));
}

// Every 97th float up to 10 (tanh rounds to 1 from 9.01 on) and up to 110
// for the sigmoid (whose float is 0 below -104), and their negatives,
// against the nearest floats of the long double functions: equal but for
// near-ties.
TEST_CASE("tanh and the sigmoid of floats are the nearest floats") {
  int64_t offTanh = 0;
  int64_t offSigmoid = 0;
  const int64_t checked = forEvery97thFloat(110.0f, [&](float v) {
    const long double wide = v;
    CAPTURE(v);
    if (std::fabs(v) < 10.0f && tanhOf(v) != static_cast<float>(std::tanh(wide))) {
      ++offTanh;
      CHECK(ulpsBetween(tanhOf(v), static_cast<float>(std::tanh(wide))) == 1);
    }
    const long double sigmoid = 1.0L / (1.0L + std::exp(-wide));
    if (sigmoidOf(v) != static_cast<float>(sigmoid)) {
      ++offSigmoid;
      CHECK(ulpsBetween(sigmoidOf(v), static_cast<float>(sigmoid)) == 1);
    }
  });
  CHECK(checked > 20'000'000);
  CHECK(offTanh <= 20);
  CHECK(offSigmoid <= 20);
}

TEST_CASE("tanh and the sigmoid of floats at their edges") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(tanhOf(0.0f) == 0.0f);
  CHECK(!std::signbit(tanhOf(0.0f)));
  CHECK(std::signbit(tanhOf(-0.0f)));
  CHECK(tanhOf(inf) == 1.0f);
  CHECK(tanhOf(-inf) == -1.0f);
  CHECK(tanhOf(400.0f) == 1.0f);  // e^800 overflows: 1 - 2 / inf
  CHECK(std::isnan(tanhOf(nan)));
  // Tiny and subnormal x, and both sides of the switch to the exponential.
  for (const float x : {0x1p-149f, 1e-30f, 1e-4f, 0.0625f, std::nextafter(0.0625f, 0.0f), 0.5f, 9.0f}) {
    CAPTURE(x);
    CHECK(tanhOf(x) == static_cast<float>(std::tanh(static_cast<long double>(x))));
    CHECK(tanhOf(-x) == -tanhOf(x));
  }
  CHECK(sigmoidOf(0.0f) == 0.5f);
  CHECK(sigmoidOf(inf) == 1.0f);
  CHECK(sigmoidOf(-inf) == 0.0f);
  CHECK(sigmoidOf(-800.0f) == 0.0f);
  CHECK(sigmoidOf(-100.0f) == static_cast<float>(std::exp(-100.0L)));  // a subnormal float
  CHECK(std::isnan(sigmoidOf(nan)));
}

TEST_CASE("erf, e^x, tanh and the sigmoid of floats: the vector forms give the scalar forms' bits") {
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{15}, int64_t{16},
                          int64_t{17}, int64_t{61}, int64_t{4'096}}) {
    CAPTURE(n);
    std::vector<float> x = test::pseudoRandom(static_cast<std::size_t>(n), 13, -6.0f, 6.0f);
    if (n > 40) {
      x[30] = 0.01f;  // tanh's polynomial
      x[31] = -0.0625f;
      x[32] = -120.0f;
    }
    if (n > 20) {
      x[2] = std::numeric_limits<float>::infinity();
      x[3] = -std::numeric_limits<float>::infinity();
      x[11] = std::numeric_limits<float>::quiet_NaN();
      x[17] = -0.0f;
      x[18] = 0x1p-140f;
      x[19] = 4.0f;
      x[20] = 95.0f;
    }
    // Guards on both sides: the tails write no float past n.
    std::vector<float> erfs(static_cast<std::size_t>(n) + 2, 7.0f);
    std::vector<float> exps(static_cast<std::size_t>(n) + 2, 7.0f);
    std::vector<float> tanhs(static_cast<std::size_t>(n) + 2, 7.0f);
    std::vector<float> sigmoids(static_cast<std::size_t>(n) + 2, 7.0f);
    erfOf(x.data(), n, erfs.data() + 1);
    exponentialOf(x.data(), n, exps.data() + 1);
    tanhOf(x.data(), n, tanhs.data() + 1);
    sigmoidOf(x.data(), n, sigmoids.data() + 1);
    for (const std::vector<float>* out : {&erfs, &exps, &tanhs, &sigmoids}) {
      CHECK(out->front() == 7.0f);
      CHECK(out->back() == 7.0f);
    }
    for (int64_t j = 0; j < n; ++j) {
      const auto at = static_cast<std::size_t>(j);
      CAPTURE(x[at]);
      const std::array<std::pair<float, float>, 4> pairs = {{{erfs[at + 1], erfOf(x[at])},
                                                             {exps[at + 1], exponentialOf(x[at])},
                                                             {tanhs[at + 1], tanhOf(x[at])},
                                                             {sigmoids[at + 1], sigmoidOf(x[at])}}};
      for (const auto& [got, want] : pairs) {
        if (std::isnan(x[at])) {
          CHECK(std::isnan(got));
        } else {
          CHECK(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want));
        }
      }
    }
  }
}

// The documented order, one value at a time.
double laneOrder(const std::vector<double>& v) {
  std::array<double, 8> lanes{};
  for (std::size_t j = 0; j < v.size(); ++j) lanes[j % 8] += v[j];
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

TEST_CASE("a lane sum adds in its documented order, however the values come") {
  // Values of very different sizes, so that another order gives other bits.
  std::vector<double> v;
  for (const float f : test::pseudoRandom(2'001, 12, -30.0f, 10.0f))
    v.push_back(std::exp(static_cast<double>(f)));
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{13},
                              std::size_t{1'024}, std::size_t{2'001}}) {
    CAPTURE(n);
    const std::vector<double> first(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
    const double want = laneOrder(first);
    LaneSum whole;
    whole.add(first.data(), static_cast<int64_t>(n));
    CHECK(whole.total() == want);
    // In pieces that leave the lanes unaligned, and in blocks of 1,024.
    for (const int64_t piece : {int64_t{3}, int64_t{8}, int64_t{1'024}}) {
      CAPTURE(piece);
      LaneSum pieces;
      for (int64_t at = 0; at < static_cast<int64_t>(n); at += piece)
        pieces.add(first.data() + at, std::min(piece, static_cast<int64_t>(n) - at));
      CHECK(pieces.total() == want);
    }
  }
  // Not the plain order: the sum of the first 2,001 differs from it.
  double plain = 0.0;
  for (const double x : v) plain += x;
  CHECK(plain != laneOrder(v));
}

TEST_CASE("probabilities: the vector form gives the scalar form's bits") {
  std::vector<double> e;
  for (const float f : test::pseudoRandom(77, 13, -20.0f, 0.0f))
    e.push_back(exponential(static_cast<double>(f)));
  const double sum = laneOrder(e);
  for (const int64_t label : {int64_t{-1}, int64_t{0}, int64_t{9}, int64_t{76}}) {
    for (const double factor : {1.0, -0.37}) {
      CAPTURE(label);
      CAPTURE(factor);
      std::vector<float> out(e.size());
      probabilities(e.data(), static_cast<int64_t>(e.size()), sum, label, factor, out.data());
      for (std::size_t j = 0; j < e.size(); ++j) {
        CAPTURE(j);
        const double hot = static_cast<int64_t>(j) == label ? 1.0 : 0.0;
        CHECK(out[j] == static_cast<float>((e[j] / sum - hot) * factor));
      }
    }
  }
}

// Whether a and b are the same value: equal, or both NaN.
bool sameValue(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

TEST_CASE("short rows, 8 at a time: the row-by-row forms' bits") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t c : {1, 2, 3, 7, 8, 9, 16, 31, 32, 33, 63, 64}) {
    for (const int64_t rows : {1, 5, 8, 13, 19}) {
      CAPTURE(c);
      CAPTURE(rows);
      std::vector<float> x = test::pseudoRandom(static_cast<std::size_t>(rows * c), 21, -3.0f, 3.0f);
      auto at = [&](int64_t r, int64_t j) -> float& { return x[static_cast<std::size_t>(r * c + j)]; };
      // Masked scores (some or all -inf), ties at the max with zeros of
      // both signs, and NaNs first or later in a row.
      for (int64_t j = 1; j < c; j += 2) at(0, j) = -kInf;
      if (rows > 1) std::fill_n(&at(1, 0), c, -kInf);
      if (rows > 2) {
        std::fill_n(&at(2, 0), c, -1.0f);
        at(2, 0) = -0.0f;
        at(2, c - 1) = 0.0f;
      }
      if (rows > 3) at(3, 0) = kNaN;
      if (rows > 4) at(4, c - 1) = kNaN;
      std::vector<float> labels;
      for (int64_t r = 0; r < rows; ++r) labels.push_back(static_cast<float>((r * 5) % c));
      // Each row by the row-by-row forms.
      std::vector<float> softmax;
      std::vector<float> gradient;
      std::vector<float> logSoftmax;
      std::vector<double> logSumExp;
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = &at(r, 0);
        const float max = *std::max_element(row, row + c);
        std::vector<double> e(static_cast<std::size_t>(c));
        shiftedExponentials(row, c, max, e.data());
        const double sum = laneOrder(e);
        std::vector<float> p(static_cast<std::size_t>(c));
        probabilities(e.data(), c, sum, -1, 1.0, p.data());
        softmax.insert(softmax.end(), p.begin(), p.end());
        probabilities(e.data(), c, sum, static_cast<int64_t>(labels[static_cast<std::size_t>(r)]), -0.37,
                      p.data());
        gradient.insert(gradient.end(), p.begin(), p.end());
        for (int64_t j = 0; j < c; ++j)
          logSoftmax.push_back(static_cast<float>(static_cast<double>(row[j] - max) - std::log(sum)));
        logSumExp.push_back(static_cast<double>(max) + std::log(sum));
      }
      // The short-row forms, with guards after the last row.
      const float guard = 12345.0f;
      const auto n = static_cast<std::size_t>(rows * c);
      std::vector<float> out(n + 8, guard);
      std::vector<double> sums(static_cast<std::size_t>(rows) + 8, guard);
      const int64_t done = shortRowProbabilities(x.data(), rows, c, nullptr, 1.0, out.data());
      // Every CPU with AVX-512 takes them (the others go row by row).
      REQUIRE(done == (cpuHasAvx512() ? rows : 0));
      if (done == 0) continue;
      auto check = [&](const auto& got, const auto& want) {
        for (std::size_t i = 0; i < want.size(); ++i) {
          CAPTURE(i);
          CHECK(sameValue(got[i], want[i]));
        }
        for (std::size_t i = want.size(); i < got.size(); ++i) CHECK(got[i] == guard);
      };
      check(out, softmax);
      CHECK(shortRowProbabilities(x.data(), rows, c, labels.data(), -0.37, out.data()) == rows);
      check(out, gradient);
      CHECK(shortRowLogSoftmax(x.data(), rows, c, out.data()) == rows);
      check(out, logSoftmax);
      CHECK(shortRowLogSumExps(x.data(), rows, c, sums.data()) == rows);
      check(sums, logSumExp);
    }
  }
  // Longer rows, and empty ones, are left to the row-by-row forms.
  std::vector<float> x(200, 1.0f);
  std::vector<float> out(200, 0.0f);
  CHECK(shortRowProbabilities(x.data(), 2, 65, nullptr, 1.0, out.data()) == 0);
  CHECK(shortRowLogSoftmax(x.data(), 2, 0, out.data()) == 0);
  CHECK(out == std::vector<float>(200, 0.0f));
}

// rowSum's documented order, one value at a time.
float rowOrder(const float* x, int64_t n) {
  float total = 0.0f;
  if (n < 64) {
    for (int64_t j = 0; j < n; ++j) total += x[j];
    return total;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kRowSumBlock) {
    std::array<float, 64> lanes{};
    for (int64_t j = j0; j < std::min(n, j0 + kRowSumBlock); ++j)
      lanes[static_cast<std::size_t>((j - j0) % 64)] += x[j];
    for (std::size_t w = 32; w >= 1; w /= 2) {
      for (std::size_t i = 0; i < w; ++i) lanes[i] = lanes[i] + lanes[i + w];
    }
    total += lanes[0];
  }
  return total;
}

TEST_CASE("a row sum adds in its documented order") {
  // Values of very different sizes and both signs, so that another order
  // gives other bits.
  std::vector<float> x;
  for (const float f : test::pseudoRandom(10'000, 14, -12.0f, 12.0f))
    x.push_back(std::ldexp(1.0f + f / 24.0f, static_cast<int>(f)));
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{63}, int64_t{64},
                          int64_t{65}, int64_t{100}, int64_t{4'096}, int64_t{4'097}, int64_t{10'000}}) {
    CAPTURE(n);
    CHECK(rowSum(x.data(), n) == rowOrder(x.data(), n));
    // From an unaligned start too.
    if (n < 10'000) CHECK(rowSum(x.data() + 1, n) == rowOrder(x.data() + 1, n));
  }
  float plain = 0.0f;
  for (const float v : x) plain += v;
  CHECK(plain != rowSum(x.data(), 10'000));
}

}  // namespace
}  // namespace tessera::sim
