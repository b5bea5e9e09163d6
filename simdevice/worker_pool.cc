#include "worker_pool.hpp"

#include <sched.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "tessera/device_spec.hpp"
#include "tessera/error.hpp"

namespace tessera::sim {
namespace {

// Polls between jobs: about 20 us on a current x86 core (a pause is 40-140
// cycles), longer than the serial work between two parallel steps of a
// training step and far shorter than a scheduler's time slice.
constexpr int kPollIterations = 1 << 9;

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits until `value` differs from `old`: polls briefly, then sleeps.
template <class T>
T awaitChange(const std::atomic<T>& value, T old) {
  for (int i = 0; i < kPollIterations; ++i) {
    const T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
    relax();
  }
  for (;;) {
    value.wait(old, std::memory_order_acquire);
    const T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

}  // namespace

WorkerPool::WorkerPool(int threads) : threads_(threads < 1 ? 1 : threads) {
  workers_.reserve(static_cast<std::size_t>(threads_ - 1));
  for (int t = 1; t < threads_; ++t)
    workers_.emplace_back([this, t](const std::stop_token& stop) { work(stop, t, 0); });
}

WorkerPool::~WorkerPool() {
  for (std::jthread& w : workers_) w.request_stop();
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  workers_.clear();  // joins
}

void WorkerPool::runParts(int thread) {
  for (int p = next_.fetch_add(1, std::memory_order_relaxed); p < parts_;
       p = next_.fetch_add(1, std::memory_order_relaxed))
    call_(context_, p, thread);
}

void WorkerPool::dispatch(int parts, Call call, void* context) {
  call_ = call;
  context_ = context;
  parts_ = parts;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  // The release publishes the job to the workers' acquire of the generation.
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  runParts(0);
  // Every worker checks in, even one that found no part left, so that none
  // reads this job's fields after the next job has replaced them.
  for (int left = pending_.load(std::memory_order_acquire); left != 0;) left = awaitChange(pending_, left);
}

void WorkerPool::work(const std::stop_token& stop, int thread, uint32_t seen) {
  for (;;) {
    seen = awaitChange(generation_, seen);
    if (stop.stop_requested()) return;
    runParts(thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

int affinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int cpus = CPU_COUNT(&set);
  return cpus < 1 ? 1 : cpus;
}

int deviceThreads(const DeviceSpec& spec) {
  if (spec.numThreads > 0) return static_cast<int>(spec.numThreads);
  const char* variable = std::getenv("TESSERA_NUM_THREADS");
  if (variable == nullptr || *variable == '\0') return affinityCpus();
  const std::string_view text(variable);
  int threads = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), threads);
  if (error != std::errc{} || end != text.data() + text.size() || threads < 1 ||
      threads > kMaxDeviceThreads) {
    throw ConfigError(
        ErrorCode::InvalidDeviceSpec, "TESSERA_NUM_THREADS",
        fmt::format("TESSERA_NUM_THREADS is '{}'; it must be a whole number of threads in [1, {}]; "
                    "unset it to use every CPU of the process ({})",
                    text, kMaxDeviceThreads, affinityCpus()));
  }
  return threads;
}

}  // namespace tessera::sim
