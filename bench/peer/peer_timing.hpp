// The timing loop of the libtorch peers of bench/models.sh: 10 steps of
// warm-up, then `steps` timed steps; prints one line ending in
// "samples_per_s=N", the form bench/models.sh reads.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdio>

template <typename Step>
void timeSteps(const char* model, int batch, int threads, int steps, Step step) {
  for (int i = 0; i < 10; ++i) step();
  const auto start = std::chrono::steady_clock::now();
  float last = 0;
  for (int i = 0; i < steps; ++i) {
    torch::Tensor loss = step();
    if (i == steps - 1) last = loss.item<float>();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("torch %s batch=%d threads=%d steps=%d loss=%.4f step_us=%.1f samples_per_s=%.0f\n", model,
              batch, threads, steps, last, 1e6 * s / steps, batch * steps / s);
}
