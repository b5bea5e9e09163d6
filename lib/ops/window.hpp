// Windows over the spatial axes of NC[D]HW tensors, shared by the
// convolution and pooling families (lib/ops/conv.cc, lib/ops/pooling.cc) and
// their device kernels: the attribute checks of the shape rules, the output
// extent of an axis, and the table of the input position each tap of each
// window reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "op_def.hpp"

namespace tessera {

// One window op over `in` (the spatial extents of the input it slides over)
// producing `out`; pads are every axis's begin, then every axis's end.
struct WindowGeometry {
  Shape in;
  Shape kernel;
  Shape out;
  std::vector<int64_t> strides;
  std::vector<int64_t> pads;
  std::vector<int64_t> dilations;

  int64_t rank() const { return static_cast<int64_t>(in.size()); }
  int64_t inPositions() const { return numElements(in); }
  int64_t taps() const { return numElements(kernel); }
  int64_t outPositions() const { return numElements(out); }
};

// The spatial part of an NC[D]HW shape.
inline Shape spatialOf(const Shape& shape) { return Shape(shape.begin() + 2, shape.end()); }

// The geometry of a window op whose attributes the shape rule normalised.
inline WindowGeometry windowOf(const Shape& in, const Shape& kernel, const Shape& out,
                               const OpAttributes& a) {
  return {in, kernel, out, a.strides, a.pads, a.dilations};
}

// Element k * outPositions + p is the input position (row-major over `in`)
// that tap k (row-major over `kernel`) of window p (row-major over `out`)
// reads, or -1 when it falls into the padding.
inline std::vector<int64_t> windowTaps(const WindowGeometry& w) {
  const auto r = static_cast<std::size_t>(w.rank());
  const int64_t taps = w.taps();
  const int64_t positions = w.outPositions();
  std::vector<int64_t> table(static_cast<std::size_t>(taps * positions), -1);
  std::vector<int64_t> k(r, 0);
  for (int64_t tap = 0; tap < taps; ++tap) {
    std::vector<int64_t> o(r, 0);
    for (int64_t p = 0; p < positions; ++p) {
      int64_t at = 0;
      bool inside = true;
      for (std::size_t d = 0; d < r; ++d) {
        const int64_t i = o[d] * w.strides[d] - w.pads[d] + k[d] * w.dilations[d];
        if (i < 0 || i >= w.in[d]) inside = false;
        at = at * w.in[d] + i;
      }
      table[static_cast<std::size_t>(tap * positions + p)] = inside ? at : -1;
      for (std::size_t d = r; d-- > 0;) {
        if (++o[d] < w.out[d]) break;
        o[d] = 0;
      }
    }
    for (std::size_t d = r; d-- > 0;) {
      if (++k[d] < w.kernel[d]) break;
      k[d] = 0;
    }
  }
  return table;
}

// The divisor of each window's mean (AveragePool): its taps inside the
// input, or with countIncludePad inside the input and its pads.
inline std::vector<int64_t> windowDivisors(const WindowGeometry& w, bool countIncludePad) {
  const auto r = static_cast<std::size_t>(w.rank());
  const int64_t taps = w.taps();
  std::vector<int64_t> divisors(static_cast<std::size_t>(w.outPositions()), 0);
  std::vector<int64_t> o(r, 0);
  for (int64_t& divisor : divisors) {
    std::vector<int64_t> k(r, 0);
    for (int64_t tap = 0; tap < taps; ++tap) {
      bool counts = true;
      for (std::size_t d = 0; d < r; ++d) {
        const int64_t i = o[d] * w.strides[d] - w.pads[d] + k[d] * w.dilations[d];
        const int64_t lo = countIncludePad ? -w.pads[d] : 0;
        const int64_t hi = countIncludePad ? w.in[d] + w.pads[d + r] : w.in[d];
        if (i < lo || i >= hi) counts = false;
      }
      if (counts) ++divisor;
      for (std::size_t d = r; d-- > 0;) {
        if (++k[d] < w.kernel[d]) break;
        k[d] = 0;
      }
    }
    for (std::size_t d = r; d-- > 0;) {
      if (++o[d] < w.out[d]) break;
      o[d] = 0;
    }
  }
  return divisors;
}

// Which window op the checks are for.
enum class WindowUse { Conv, ConvTranspose, Pool };

// Fills the defaults of strides, pads, dilations (and outputPadding) for
// `r` spatial axes and checks their sizes and values (GraphError naming the
// op and the allowed values).
inline void normaliseWindow(const OpChecker& c, OpAttributes& a, int64_t r, const Shape& kernel,
                            WindowUse use) {
  auto fill = [&](std::vector<int64_t>& v, const char* name, int64_t size, int64_t value, int64_t least) {
    if (v.empty()) v.assign(static_cast<std::size_t>(size), value);
    if (static_cast<int64_t>(v.size()) != size) {
      c.fail(ErrorCode::InvalidOperand,
             fmt::format("`{}` has {} values {}, needs {} for {} spatial axes", name, v.size(), v, size, r));
    }
    for (int64_t x : v) {
      if (x < least) {
        c.fail(ErrorCode::InvalidOperand, fmt::format("`{}` {} must be >= {} on every axis", name, v, least));
      }
    }
  };
  for (int64_t k : kernel) {
    if (k < 1)
      c.fail(ErrorCode::InvalidOperand, fmt::format("the kernel {} must be >= 1 on every axis", kernel));
  }
  fill(a.strides, "strides", r, 1, 1);
  fill(a.pads, "pads", 2 * r, 0, 0);
  fill(a.dilations, "dilations", r, 1, 1);
  if (use == WindowUse::ConvTranspose) {
    fill(a.outputPadding, "outputPadding", r, 0, 0);
    for (std::size_t d = 0; d < static_cast<std::size_t>(r); ++d) {
      if (a.outputPadding[d] >= a.strides[d]) {
        c.fail(ErrorCode::InvalidOperand,
               fmt::format("`outputPadding` {} must be below the stride of its axis (strides {})",
                           a.outputPadding, a.strides));
      }
    }
  } else if (!a.outputPadding.empty()) {
    c.fail(ErrorCode::InvalidOperand, "`outputPadding` is for ConvTranspose only");
  }
  if (use == WindowUse::Pool) {
    for (std::size_t d = 0; d < static_cast<std::size_t>(r); ++d) {
      const int64_t extent = a.dilations[d] * (kernel[d] - 1) + 1;
      if (a.pads[d] >= extent || a.pads[d + static_cast<std::size_t>(r)] >= extent) {
        c.fail(ErrorCode::InvalidOperand,
               fmt::format("`pads` {} must be smaller than the window {} (dilations {}) on every axis",
                           a.pads, kernel, a.dilations));
      }
    }
  }
}

// The output extents of a window sliding over `in` (ceilMode: a last
// partial window counts when it starts inside the input or its begin pad).
// ShapeMismatch naming the input when the window does not fit.
inline Shape windowOutput(const OpChecker& c, const Shape& in, const Shape& kernel, const OpAttributes& a,
                          bool ceilMode) {
  const std::size_t r = in.size();
  Shape out(r);
  for (std::size_t d = 0; d < r; ++d) {
    const int64_t span = in[d] + a.pads[d] + a.pads[d + r] - a.dilations[d] * (kernel[d] - 1) - 1;
    if (span < 0) {
      c.fail(ErrorCode::ShapeMismatch,
             fmt::format(
                 "the window {} (dilations {}) does not fit into input {} padded by {} on spatial axis {}",
                 kernel, a.dilations, c.desc(0), a.pads, d));
    }
    out[d] = span / a.strides[d] + 1;
    if (ceilMode && span % a.strides[d] != 0) {
      out[d] = ceilDiv(span, a.strides[d]) + 1;
      if ((out[d] - 1) * a.strides[d] >= in[d] + a.pads[d]) --out[d];
    }
  }
  return out;
}

// Input i must be NC[D]HW with 1 to 3 spatial axes; returns the spatial rank.
inline int64_t spatialRank(const OpChecker& c, std::size_t i) {
  if (c.rank(i) < 3 || c.rank(i) > 5) {
    c.fail(
        ErrorCode::ShapeMismatch,
        fmt::format("input {} {} must be [N, C, D..] with 1 to 3 spatial axes (rank 3 to 5)", i, c.desc(i)));
  }
  return c.rank(i) - 2;
}

}  // namespace tessera
