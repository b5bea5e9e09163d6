// The device's host threads: a pool that runs the parts of one step on
// every thread it has, the calling thread included.
//
// Parts are independent by construction (blocks of a product's rows or
// columns, slices of a chain), and which thread runs a part never changes
// what the part computes, so every result is the same bits at any thread
// count. Idle workers sleep on a futex (std::atomic::wait): after a job they
// poll for the next one for about 20 microseconds, which covers the serial
// work between two parallel steps, then block, so a pool does not hold a
// core that another process (another instance under `tessera launch`)
// needs. While a program runs, the calling thread calls stayAwake() before
// each step: a worker then polls until 20 microseconds after the latest
// call instead of falling asleep in a serial stretch of the step (waking a
// thread costs the waker a system call and the woken thread tens of
// microseconds on a virtual machine, longer than many parallel steps take),
// so it spins only while the program it serves is running, and at most 20
// microseconds after the program's last step began.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace tessera {
struct DeviceSpec;
}

namespace tessera::sim {

class WorkerPool {
 public:
  // `threads` >= 1: the caller plus threads - 1 workers, started here (so
  // that running a loaded program allocates nothing, not even once).
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const noexcept { return threads_; }
  // The thread of this pool that is calling: inside a part, the thread
  // running it; anywhere else 0, the calling thread. Work done outside
  // run() uses this thread's scratch.
  int currentThread() const noexcept;

  // The calling thread is running a program and may hand out parts soon:
  // polling workers keep polling for the next 20 microseconds rather than
  // fall asleep. A sleeping worker is left asleep (a program without
  // parallel steps never wakes it); the next job wakes it. One clock read.
  void stayAwake();

  // Host work that workers do while they poll for the next job (a host-side
  // prefetch beside the program): `work` is called in short pieces, each
  // returning whether it did anything, from worker threads only, never
  // while the worker has a part; it must not throw. An empty function
  // removes it; this returns once no worker is inside a piece of the old
  // one. The calling thread owns what `work` refers to until it sets another.
  void setIdleWork(std::function<bool()> work);

  // Calls task(part, thread) for every part in [0, parts), spread over the
  // threads, and returns when every call has returned. `thread` is below
  // threads() and no two calls running at once get the same one (it picks
  // per-thread scratch). A job of at most 20 parts runs part p on thread p
  // whenever that thread is there to take it (the calling thread is thread
  // 0), so that consecutive jobs split alike keep each part's data in one
  // core's cache; free parts go to whichever thread comes first. One job at
  // a time: called from inside a part (steps run side by side, each on its
  // own thread), run() calls every part there, in order, on that thread.
  template <class Task>
  void run(int parts, Task&& task) {
    if (parts <= 1 || threads_ == 1 || inPart()) {
      const int thread = currentThread();
      for (int p = 0; p < parts; ++p) task(p, thread);
      return;
    }
    dispatch(
        parts, [](void* context, int part, int thread) { (*static_cast<Task*>(context))(part, thread); },
        &task);
  }

 private:
  using Call = void (*)(void*, int, int);
  // Whether the calling thread is running a part of this pool's job.
  bool inPart() const noexcept;
  void dispatch(int parts, Call call, void* context);
  void work(const std::stop_token& stop, int thread);
  // Waits until `value` differs from `old`: polls, then sleeps. A worker
  // (kIdleWork) does pieces of the idle work while it polls.
  template <bool kIdleWork, class T>
  T awaitChange(const std::atomic<T>& value, T old);
  // One piece of the idle work, if there is some: whether it did anything.
  bool idlePiece();
  // Takes and runs parts of job `generation` while it has some left.
  void runParts(uint64_t generation, int thread);

  int threads_;
  // The current job: set before its generation is published, left alone
  // until all its parts are done.
  Call call_ = nullptr;
  void* context_ = nullptr;
  // The job's generation, part count and next part to take in one word, so
  // that a worker that wakes late cannot take a part of a job that is being
  // set up: a part is taken by a compare-exchange that also checks the
  // generation.
  alignas(64) std::atomic<uint64_t> job_{0};
  alignas(64) std::atomic<int> done_{0};             // parts of the current job that have returned
  alignas(64) std::atomic<uint32_t> generation_{0};  // the futex the workers sleep on
  alignas(64) std::atomic<int64_t> awakeUntil_{0};   // steady-clock nanoseconds (stayAwake)
  std::atomic<int> sleeping_{0};                     // threads blocked in a futex wait
  std::function<bool()> idleWork_;                   // set while hasIdleWork_ is false
  std::atomic<bool> hasIdleWork_{false};
  alignas(64) std::atomic<int> inIdleWork_{0};  // workers inside a piece, or about to look
  std::vector<std::jthread> workers_;
};

// The threads a device runs on: `spec.numThreads` when it is > 0, else
// TESSERA_NUM_THREADS when it is set (a positive integer; anything else is
// a ConfigError(InvalidDeviceSpec) naming the variable), else the CPUs of
// the process's affinity mask.
int deviceThreads(const DeviceSpec& spec);

// The CPUs this process may run on (sched_getaffinity), at least 1.
int affinityCpus();

}  // namespace tessera::sim
