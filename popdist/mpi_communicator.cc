// The instances of an mpirun launch, over MPI_COMM_WORLD.
//
// Every operation is point to point (each instance sends its block to every
// instance that needs it) with non-blocking MPI and a poll loop, so that an
// instance that never answers is noticed after the timeout and named,
// instead of blocking everyone for ever inside a collective. Messages of one
// operation share a tag; MPI keeps messages between two processes in order,
// so operations cannot mix as long as every instance runs them in the same
// order.

// Only MPI's C interface: its deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Tags cycle below the smallest MPI_TAG_UB the standard allows.
constexpr int kTagSpace = 32767;
// How long a waiting instance polls without pause, and its pauses after.
constexpr auto kSpinTime = std::chrono::microseconds(200);
constexpr auto kFirstPause = std::chrono::microseconds(50);
constexpr auto kLongestPause = std::chrono::microseconds(100);

std::string mpiMessage(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::chrono::milliseconds timeout) : timeout_(timeout) {
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rank_ = rank;
    size_ = size;
  }

  int64_t size() const noexcept override { return size_; }
  int64_t rank() const noexcept override { return rank_; }
  bool failed() const noexcept { return failed_; }

  void allGather(std::span<const float> local, std::span<float> all) override {
    const std::size_t n = local.size();
    if (all.size() != n * static_cast<std::size_t>(size_)) {
      throw DistError(ErrorCode::InstanceMismatch, fmt::format("instance {}", rank_),
                      fmt::format("allGather: room for {} values given; {} instances x {} values need {}",
                                  all.size(), size_, n, n * static_cast<std::size_t>(size_)));
    }
    transfers_.clear();
    for (int64_t q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      send(q, std::as_bytes(local));
      receive(q, std::as_writable_bytes(all.subspan(static_cast<std::size_t>(q) * n, n)));
    }
    run("allGather");
    float* own = all.data() + static_cast<std::size_t>(rank_) * n;
    if (own != local.data()) std::memmove(own, local.data(), local.size_bytes());
  }

  std::vector<std::string> allGatherBytes(std::string_view local) override {
    std::vector<int64_t> lengths(static_cast<std::size_t>(size_));
    const int64_t mine = static_cast<int64_t>(local.size());
    transfers_.clear();
    for (int64_t q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      send(q, std::as_bytes(std::span<const int64_t>(&mine, 1)));
      receive(q, std::as_writable_bytes(std::span<int64_t>(&lengths[static_cast<std::size_t>(q)], 1)));
    }
    run("allGatherBytes (lengths)");
    std::vector<std::string> out(static_cast<std::size_t>(size_));
    out[static_cast<std::size_t>(rank_)] = std::string(local);
    transfers_.clear();
    for (int64_t q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      std::string& s = out[static_cast<std::size_t>(q)];
      s.resize(static_cast<std::size_t>(lengths[static_cast<std::size_t>(q)]));
      send(q, std::as_bytes(std::span<const char>(local)));
      receive(q, std::as_writable_bytes(std::span<char>(s)));
    }
    run("allGatherBytes");
    return out;
  }

  void allReduceSum(std::span<float> values) override {
    gathered_.resize(values.size() * static_cast<std::size_t>(size_));
    allGather(values, gathered_);
    // Rank order on every instance: the same bits everywhere.
    for (std::size_t k = 0; k < values.size(); ++k) {
      float sum = gathered_[k];
      for (int64_t q = 1; q < size_; ++q) sum += gathered_[static_cast<std::size_t>(q) * values.size() + k];
      values[k] = sum;
    }
  }

  void broadcast(std::span<float> values, int64_t root) override {
    if (root < 0 || root >= size_) {
      throw DistError(
          ErrorCode::InstanceMismatch, fmt::format("instance {}", rank_),
          fmt::format("broadcast from instance {}, which is not one of the {} instances", root, size_));
    }
    transfers_.clear();
    if (root == rank_) {
      for (int64_t q = 0; q < size_; ++q)
        if (q != rank_) send(q, std::as_bytes(values));
    } else {
      receive(root, std::as_writable_bytes(values));
    }
    run("broadcast");
  }

  void barrier() override {
    transfers_.clear();
    for (int64_t q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      send(q, {});
      receive(q, {});
    }
    run("barrier");
  }

 private:
  struct Transfer {
    int64_t peer = 0;
    bool receive = false;
    std::byte* data = nullptr;
    std::size_t bytes = 0;
  };
  void send(int64_t peer, std::span<const std::byte> data) {
    transfers_.push_back({peer, false, const_cast<std::byte*>(data.data()), data.size()});
  }
  void receive(int64_t peer, std::span<std::byte> data) {
    transfers_.push_back({peer, true, data.data(), data.size()});
  }

  [[noreturn]] void fail(ErrorCode code, std::string subject, std::string message) {
    failed_ = true;
    failure_ = message;
    failedSubject_ = subject;
    throw DistError(code, std::move(subject), message);
  }

  // Posts every transfer of transfers_, then polls until all are done or
  // the timeout. The buffers are kept between calls: a training step
  // allocates nothing here once they have grown.
  void run(std::string_view operation) {
    if (failed_) {
      throw DistError(ErrorCode::InstanceLost, failedSubject_,
                      fmt::format("{} after an earlier failure: {}", operation, failure_));
    }
    const uint64_t number = sequence_++;
    const int tag = static_cast<int>(number % kTagSpace);
    const std::size_t count = transfers_.size();
    requests_.assign(count, MPI_REQUEST_NULL);
    for (std::size_t i = 0; i < count; ++i) {
      const Transfer& t = transfers_[i];
      if (t.bytes > static_cast<std::size_t>(INT_MAX)) {
        fail(ErrorCode::InstanceMismatch, fmt::format("instance {}", rank_),
             fmt::format("{} #{}: {} bytes in one message exceed MPI's limit of {}", operation, number,
                         t.bytes, INT_MAX));
      }
      const int bytes = static_cast<int>(t.bytes);
      const int peer = static_cast<int>(t.peer);
      const int status = t.receive
                             ? MPI_Irecv(t.data, bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &requests_[i])
                             : MPI_Isend(t.data, bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &requests_[i]);
      if (status != MPI_SUCCESS) {
        fail(ErrorCode::InstanceLost, fmt::format("instance {}", t.peer),
             fmt::format("{} #{} with instance {} could not start: {}", operation, number, t.peer,
                         mpiMessage(status)));
      }
    }
    done_.assign(count, 0);
    std::size_t remaining = count;
    indices_.resize(count);
    statuses_.resize(count);
    const auto deadline = Clock::now() + timeout_;
    auto lastProgress = Clock::now();
    auto pause = kFirstPause;
    while (remaining > 0) {
      int completed = 0;
      const int status = MPI_Testsome(static_cast<int>(count), requests_.data(), &completed, indices_.data(),
                                      statuses_.data());
      if (status != MPI_SUCCESS && status != MPI_ERR_IN_STATUS) {
        fail(ErrorCode::InstanceLost, fmt::format("instance {}", rank_),
             fmt::format("{} #{} failed: {}", operation, number, mpiMessage(status)));
      }
      if (completed == MPI_UNDEFINED) break;
      for (int k = 0; k < completed; ++k) {
        const auto i = static_cast<std::size_t>(indices_[static_cast<std::size_t>(k)]);
        const Transfer& t = transfers_[i];
        const MPI_Status& s = statuses_[static_cast<std::size_t>(k)];
        // The error field is only defined when MPI_ERR_IN_STATUS says so.
        const int error = status == MPI_ERR_IN_STATUS ? s.MPI_ERROR : MPI_SUCCESS;
        int received = 0;
        if (t.receive && error == MPI_SUCCESS) MPI_Get_count(&s, MPI_BYTE, &received);
        if (error != MPI_SUCCESS || (t.receive && static_cast<std::size_t>(received) != t.bytes)) {
          fail(ErrorCode::InstanceMismatch, fmt::format("instance {}", t.peer),
               fmt::format(
                   "{} #{}: instance {} sent {} where {} bytes were expected; the instances run different "
                   "programs or call collectives in a different order",
                   operation, number, t.peer,
                   error != MPI_SUCCESS ? mpiMessage(error) : fmt::format("{} bytes", received), t.bytes));
        }
        done_[i] = 1;
        --remaining;
      }
      if (remaining == 0) break;
      const auto now = Clock::now();
      if (now >= deadline) {
        std::vector<int64_t> absent;
        for (std::size_t i = 0; i < count; ++i) {
          const int64_t peer = transfers_[i].peer;
          if (!done_[i] && std::find(absent.begin(), absent.end(), peer) == absent.end())
            absent.push_back(peer);
        }
        std::sort(absent.begin(), absent.end());
        const double seconds = std::chrono::duration<double>(timeout_).count();
        fail(ErrorCode::InstanceLost, fmt::format("instance {}", fmt::join(absent, ", ")),
             fmt::format(
                 "instance {} waited {:.1f} s in {} #{} for instance(s) {}, which did not take part: they "
                 "stopped, left early or run a different program (timeout {}={})",
                 rank_, seconds, operation, number, fmt::join(absent, ", "), kTimeoutVar, seconds));
      }
      // Poll hard while transfers move (MPI progresses only inside its
      // calls), then back off: the other instances may be computing on the
      // same cores.
      if (completed > 0) {
        lastProgress = now;
        pause = kFirstPause;
      }
      if (now - lastProgress < kSpinTime) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kLongestPause);
      }
    }
  }

  std::chrono::milliseconds timeout_;
  std::vector<Transfer> transfers_;  // of the operation being run
  std::vector<MPI_Request> requests_;
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::vector<char> done_;
  std::vector<float> gathered_;  // allReduceSum's every-instance values
  int64_t rank_ = 0;
  int64_t size_ = 1;
  uint64_t sequence_ = 0;
  bool failed_ = false;
  std::string failure_;
  std::string failedSubject_;
};

// MPI may be started once per process and closed once: the communicator
// lives until the process exits.
struct World {
  std::mutex mutex;
  std::shared_ptr<MpiCommunicator> communicator;
  bool aborted = false;

  World() = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    if (!communicator || aborted) return;
    // After a lost instance, finalizing would wait for it for ever.
    if (communicator->failed()) {
      MPI_Abort(MPI_COMM_WORLD, 1);
      return;
    }
    MPI_Finalize();
  }
};

// MPI_Init waits until every instance has called it, so one instance that
// never does (a command that fails before it, or is not tessera) would keep
// the others waiting for ever. While MPI starts, a thread watches the clock:
// after the timeout it reports tessera.dist.507 and ends the process with
// exit code 1, after which mpirun stops the whole job.
class StartWatchdog {
 public:
  explicit StartWatchdog(std::chrono::milliseconds timeout) {
    const char* rank = std::getenv(std::string(kMpiWorldRankVar).c_str());
    const double seconds = std::chrono::duration<double>(timeout).count();
    const DistError error(
        ErrorCode::InstancesNotJoined, fmt::format("instance {}", rank != nullptr ? rank : "?"),
        fmt::format("not every instance started MPI within {:.1f} s: an instance failed or ran a command "
                    "other than tessera before it started, or is slow to start (timeout {}={:g}); look at "
                    "the other instances' output, or raise tessera launch --timeout",
                    seconds, kTimeoutVar, seconds));
    message_ = fmt::format("error: {}\n", error.what());
    thread_ = std::thread([this, timeout] {
      std::unique_lock lock(mutex_);
      if (changed_.wait_for(lock, timeout, [this] { return started_; })) return;
      // Only the message and the exit: MPI is half started and holds locks.
      std::fputs(message_.c_str(), stderr);
      std::fflush(stderr);
      ::_exit(1);
    });
  }
  ~StartWatchdog() {
    {
      std::lock_guard lock(mutex_);
      started_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  StartWatchdog(const StartWatchdog&) = delete;
  StartWatchdog& operator=(const StartWatchdog&) = delete;

 private:
  std::string message_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool started_ = false;
  std::thread thread_;
};

World& world() {
  static World instance;
  return instance;
}

}  // namespace

bool mpiAvailable() noexcept { return true; }

std::shared_ptr<Communicator> instanceCommunicator() {
  World& w = world();
  std::lock_guard lock(w.mutex);
  if (w.communicator) return w.communicator;
  const std::chrono::milliseconds timeout = exchangeTimeout();
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised == 0) {
    int provided = 0;
    const int status = [&] {
      const StartWatchdog watchdog(timeout);
      return MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }();
    if (status != MPI_SUCCESS) {
      throw DistError(ErrorCode::MpiUnavailable, "MPI_Init",
                      fmt::format("MPI could not start: {}; launch the instances with `tessera launch`",
                                  mpiMessage(status)));
    }
  }
  // Errors come back as codes, so that they become DistErrors naming the
  // instance instead of aborting the run.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  w.communicator = std::make_shared<MpiCommunicator>(timeout);
  return w.communicator;
}

void abortInstances(int exitCode) noexcept {
  World& w = world();
  std::lock_guard lock(w.mutex);
  if (!w.communicator) return;
  w.aborted = true;
  MPI_Abort(MPI_COMM_WORLD, exitCode);
}

}  // namespace tessera::dist
