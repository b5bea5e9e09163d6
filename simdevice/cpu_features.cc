// The host CPU's instruction sets (see cpu_features.hpp).
#include "cpu_features.hpp"

namespace tessera::sim {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

namespace {

struct Features {
  bool avx512 = false;
  bool avx2Fma = false;
  bool fma = false;
};

const Features& features() {
  static const Features f = [] {
    __builtin_cpu_init();
    Features r;
    r.fma = __builtin_cpu_supports("fma") != 0;
    r.avx2Fma = r.fma && __builtin_cpu_supports("avx2") != 0;
    r.avx512 = __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512dq") != 0 &&
               __builtin_cpu_supports("avx512vl") != 0;
    return r;
  }();
  return f;
}

}  // namespace

bool cpuHasAvx512() { return features().avx512; }
bool cpuHasAvx2Fma() { return features().avx2Fma; }
bool cpuHasFma() { return features().fma; }

#else

bool cpuHasAvx512() { return false; }
bool cpuHasAvx2Fma() { return false; }
bool cpuHasFma() { return false; }

#endif

}  // namespace tessera::sim
