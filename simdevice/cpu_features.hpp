// What the host CPU can run: the instruction sets of the device's
// hand-written kernels, checked once at run time (the build targets the
// baseline architecture, so a kernel for a later one is chosen here, never
// at compile time). Every answer is false off x86.
#pragma once

namespace tessera::sim {

// AVX-512 with its DQ and VL extensions: what the device's AVX-512 kernels
// use (every AVX-512 CPU has them but the Xeon Phi, which gets the AVX2
// kernels).
bool cpuHasAvx512();
// AVX2 with fused multiply-adds (FMA3).
bool cpuHasAvx2Fma();
// Fused multiply-adds (FMA3): the scalar forms of the vector math use the
// CPU's own where it has one.
bool cpuHasFma();

}  // namespace tessera::sim
