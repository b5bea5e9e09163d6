#include "worker_pool.hpp"

#include <sched.h>

#include <bit>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::sim {
namespace {

// Polls between jobs for about 20 us (by the clock: a pause takes 10 to 140
// cycles depending on the CPU), longer than the serial work between two
// parallel steps of a training step and far shorter than a scheduler's time
// slice; while a program runs, the calling thread extends the poll before
// each step (WorkerPool::stayAwake), so workers sleep only once the calling
// thread has started no step for that long.
constexpr int64_t kPollNanoseconds = 20'000;
// Pauses between two reads of the clock.
constexpr int kPausesPerCheck = 16;

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

int64_t nowNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// job_: generation (bits 40-63), part count (bits 20-39), and the parts
// taken (bits 0-19): a mask of them when the job has at most kPartBits
// parts, else the count taken so far (parts are taken in order).
constexpr int kPartBits = 20;
constexpr uint64_t kPartMask = (uint64_t{1} << kPartBits) - 1;
uint64_t generationOf(uint64_t job) { return job >> (2 * kPartBits); }
int partsOf(uint64_t job) { return static_cast<int>((job >> kPartBits) & kPartMask); }
uint64_t takenOf(uint64_t job) { return job & kPartMask; }

// The part `thread` takes next from `job`, or -1 when every part is taken.
// With a mask, a thread takes the part of its own index first when it is
// free, then the lowest free one: while every thread is awake, part p of a
// job of `threads` parts runs on thread p at every step, so a buffer that
// one step's part writes is read by the same core in the next step's part
// instead of crossing to another core's cache (a thread that comes late
// finds its part taken and the job done).
int partToTake(uint64_t job, int thread) {
  const int parts = partsOf(job);
  const uint64_t taken = takenOf(job);
  if (parts > kPartBits) return taken < static_cast<uint64_t>(parts) ? static_cast<int>(taken) : -1;
  const uint64_t free = ~taken & ((uint64_t{1} << parts) - 1);
  if (free == 0) return -1;
  if (thread < parts && ((free >> thread) & 1) != 0) return thread;
  return std::countr_zero(free);
}

uint64_t withPartTaken(uint64_t job, int part) {
  return partsOf(job) > kPartBits ? job + 1 : job | (uint64_t{1} << part);
}

}  // namespace

WorkerPool::WorkerPool(int threads) : threads_(threads < 1 ? 1 : threads) {
  workers_.reserve(static_cast<std::size_t>(threads_ - 1));
  for (int t = 1; t < threads_; ++t)
    workers_.emplace_back([this, t](const std::stop_token& stop) { work(stop, t); });
}

WorkerPool::~WorkerPool() {
  for (std::jthread& w : workers_) w.request_stop();
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  workers_.clear();  // joins
}

// Polls until the later of kPollNanoseconds from now and awakeUntil_,
// then sleeps (counted in sleeping_, so that a change with nobody asleep
// costs no system call).
template <bool kIdleWork, class T>
T WorkerPool::awaitChange(const std::atomic<T>& value, T old) {
  int64_t start = nowNanoseconds();
  for (;;) {
    for (int i = 0; i < kPausesPerCheck; ++i) {
      const T now = value.load(std::memory_order_acquire);
      if (now != old) return now;
      relax();
    }
    if constexpr (kIdleWork) {
      // A piece of idle work, then the job is looked for again; the poll
      // restarts, as for a part.
      if (idlePiece()) {
        start = nowNanoseconds();
        continue;
      }
    }
    const int64_t now = nowNanoseconds();
    if (now - start > kPollNanoseconds && now > awakeUntil_.load(std::memory_order_relaxed)) break;
  }
  for (;;) {
    sleeping_.fetch_add(1, std::memory_order_seq_cst);
    value.wait(old, std::memory_order_seq_cst);
    sleeping_.fetch_sub(1, std::memory_order_relaxed);
    const T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

bool WorkerPool::idlePiece() {
  // Counted in before looking: setIdleWork() clears the flag, then waits
  // for the count to drop, so a worker either sees the flag cleared or is
  // waited for (every access sequentially consistent).
  inIdleWork_.fetch_add(1, std::memory_order_seq_cst);
  bool did = false;
  if (hasIdleWork_.load(std::memory_order_seq_cst)) did = idleWork_();
  inIdleWork_.fetch_sub(1, std::memory_order_seq_cst);
  return did;
}

void WorkerPool::setIdleWork(std::function<bool()> work) {
  hasIdleWork_.store(false, std::memory_order_seq_cst);
  while (inIdleWork_.load(std::memory_order_seq_cst) != 0) relax();
  idleWork_ = std::move(work);
  if (idleWork_ && threads_ > 1) hasIdleWork_.store(true, std::memory_order_seq_cst);
}

void WorkerPool::stayAwake() {
  if (threads_ > 1) awakeUntil_.store(nowNanoseconds() + kPollNanoseconds, std::memory_order_relaxed);
}

namespace {

// The pool whose part this thread is running, and as which of its threads.
struct RunningPart {
  const WorkerPool* pool = nullptr;
  int thread = 0;
};
thread_local RunningPart runningPart;

}  // namespace

bool WorkerPool::inPart() const noexcept { return runningPart.pool == this; }

int WorkerPool::currentThread() const noexcept { return inPart() ? runningPart.thread : 0; }

void WorkerPool::runParts(uint64_t generation, int thread) {
  uint64_t job = job_.load(std::memory_order_acquire);
  for (;;) {
    if (generationOf(job) != generation) return;
    const int part = partToTake(job, thread);
    if (part < 0) return;
    if (!job_.compare_exchange_weak(job, withPartTaken(job, part), std::memory_order_acq_rel,
                                    std::memory_order_acquire))
      continue;
    const int parts = partsOf(job);
    runningPart = {this, thread};
    call_(context_, part, thread);
    runningPart = {};
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == parts &&
        sleeping_.load(std::memory_order_seq_cst) > 0)
      done_.notify_all();
    job = job_.load(std::memory_order_acquire);
  }
}

void WorkerPool::dispatch(int parts, Call call, void* context) {
  if (static_cast<uint64_t>(parts) > kPartMask) {
    for (int p = 0; p < parts; ++p) call(context, p, 0);
    return;
  }
  call_ = call;
  context_ = context;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t generation = (generationOf(job_.load(std::memory_order_relaxed)) + 1) & 0xffffff;
  // The release publishes the job's fields to every acquire of job_.
  job_.store((generation << (2 * kPartBits)) | (static_cast<uint64_t>(parts) << kPartBits),
             std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  runParts(generation, 0);
  // Only parts in flight are waited for: a worker that wakes after every
  // part was taken finds none and leaves the job alone.
  for (int finished = done_.load(std::memory_order_acquire); finished != parts;)
    finished = awaitChange<false>(done_, finished);
}

void WorkerPool::work(const std::stop_token& stop, int thread) {
  uint32_t seen = 0;
  for (;;) {
    seen = awaitChange<true>(generation_, seen);
    if (stop.stop_requested()) return;
    runParts(generationOf(job_.load(std::memory_order_acquire)), thread);
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
