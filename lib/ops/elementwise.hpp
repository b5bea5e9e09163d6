// Math that the elementwise family's reference (lib/ops/elementwise.cc) and
// its device kernels (simdevice/ops/elementwise.cc) share, so both compute
// the same function.
#pragma once

#include <cmath>
#include <numbers>

namespace tessera {

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline double geluOf(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

inline double geluDerivative(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

}  // namespace tessera
