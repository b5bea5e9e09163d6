// Instances as threads of one process: every exchange is a rendezvous in
// which each thread lends its block, reads everyone's, and leaves once all
// have read, so that no block is reused while another thread copies it.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/popdist/communicator.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

using Block = std::span<const std::byte>;
using Clock = std::chrono::steady_clock;

template <class T>
Block bytesOf(std::span<const T> values) {
  return std::as_bytes(values);
}

class Hub {
 public:
  Hub(int64_t instances, std::chrono::milliseconds timeout)
      : instances_(instances), timeout_(timeout), blocks_(static_cast<std::size_t>(instances)),
        present_(static_cast<std::size_t>(instances), 0) {}

  int64_t instances() const noexcept { return instances_; }

  // Lends `mine` as instance `rank`'s block of exchange `round`, calls `read`
  // with every instance's block once all are there, and returns after every
  // instance has read. An exception from `read` is rethrown after leaving.
  void exchange(int64_t rank, uint64_t round, std::string_view operation, Block mine,
                const std::function<void(std::span<const Block>)>& read) {
    std::unique_lock lock(mutex_);
    if (failure_) throw DistError(ErrorCode::InstanceLost, failedSubject_, *failure_);
    blocks_[static_cast<std::size_t>(rank)] = mine;
    present_[static_cast<std::size_t>(rank)] = 1;
    if (++arrived_ == instances_) changed_.notify_all();
    const auto deadline = Clock::now() + timeout_;
    if (!changed_.wait_until(lock, deadline, [&] { return arrived_ == instances_ || failure_; })) {
      std::vector<int64_t> absent;
      for (int64_t i = 0; i < instances_; ++i)
        if (present_[static_cast<std::size_t>(i)] == 0) absent.push_back(i);
      failedSubject_ = fmt::format("instance {}", fmt::join(absent, ", "));
      failure_ = fmt::format(
          "instance {} waited {} ms in {} #{} for instance(s) {}, which did not take part: "
          "they stopped, left early or run a different program",
          rank, timeout_.count(), operation, round, fmt::join(absent, ", "));
      changed_.notify_all();
    }
    if (failure_) throw DistError(ErrorCode::InstanceLost, failedSubject_, *failure_);

    lock.unlock();
    std::exception_ptr error;
    try {
      read(blocks_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (++left_ == instances_) {
      arrived_ = 0;
      left_ = 0;
      std::fill(present_.begin(), present_.end(), 0);
      ++completed_;
      changed_.notify_all();
    } else {
      // Everyone else is only copying; they leave without waiting on anyone.
      changed_.wait(lock, [&] { return completed_ > round || failure_; });
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  const int64_t instances_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Block> blocks_;
  std::vector<char> present_;
  int64_t arrived_ = 0;
  int64_t left_ = 0;
  uint64_t completed_ = 0;  // exchanges every instance has left
  std::optional<std::string> failure_;
  std::string failedSubject_;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Hub> hub, int64_t rank) : hub_(std::move(hub)), rank_(rank) {}

  int64_t size() const noexcept override { return hub_->instances(); }
  int64_t rank() const noexcept override { return rank_; }

  void allGather(std::span<const float> local, std::span<float> all) override {
    const std::size_t n = local.size();
    checkGatherSize(n, all.size());
    exchange("allGather", bytesOf(local), [&](std::span<const Block> blocks) {
      checkSameSizes(blocks, "allGather");
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        float* to = all.data() + i * n;
        if (static_cast<int64_t>(i) == rank_ && static_cast<const void*>(to) == local.data()) continue;
        std::memmove(to, blocks[i].data(), blocks[i].size());
      }
    });
  }

  std::vector<std::string> allGatherBytes(std::string_view local) override {
    std::vector<std::string> out;
    exchange("allGatherBytes", bytesOf(std::span<const char>(local)), [&](std::span<const Block> blocks) {
      for (const Block& b : blocks) out.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    });
    return out;
  }

  void allReduceSum(std::span<float> values) override {
    std::vector<float> sum(values.size(), 0.0f);
    exchange("allReduceSum", bytesOf(std::span<const float>(values)), [&](std::span<const Block> blocks) {
      checkSameSizes(blocks, "allReduceSum");
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const auto* x = reinterpret_cast<const float*>(blocks[i].data());
        for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = i == 0 ? x[k] : sum[k] + x[k];
      }
    });
    // Others read `values` until the exchange ends.
    std::copy(sum.begin(), sum.end(), values.begin());
  }

  void broadcast(std::span<float> values, int64_t root) override {
    checkRoot(root);
    exchange("broadcast", bytesOf(std::span<const float>(values)), [&](std::span<const Block> blocks) {
      checkSameSizes(blocks, "broadcast");
      if (root != rank_)
        std::memcpy(values.data(), blocks[static_cast<std::size_t>(root)].data(), values.size_bytes());
    });
  }

  void barrier() override {
    exchange("barrier", {}, [](std::span<const Block>) {});
  }

 private:
  void exchange(std::string_view operation, Block mine,
                const std::function<void(std::span<const Block>)>& read) {
    hub_->exchange(rank_, round_++, operation, mine, read);
  }

  void checkGatherSize(std::size_t local, std::size_t all) const {
    if (all != local * static_cast<std::size_t>(size())) {
      throw DistError(ErrorCode::InstanceMismatch, fmt::format("instance {}", rank_),
                      fmt::format("allGather: room for {} values given; {} instances x {} values need {}",
                                  all, size(), local, local * static_cast<std::size_t>(size())));
    }
  }

  void checkSameSizes(std::span<const Block> blocks, std::string_view operation) const {
    for (std::size_t i = 1; i < blocks.size(); ++i) {
      if (blocks[i].size() == blocks[0].size()) continue;
      throw DistError(
          ErrorCode::InstanceMismatch, fmt::format("instance {}", i),
          fmt::format("{} #{}: instance {} passed {} bytes but instance 0 passed {}; the instances run "
                      "different programs",
                      operation, round_ - 1, i, blocks[i].size(), blocks[0].size()));
    }
  }

  void checkRoot(int64_t root) const {
    if (root < 0 || root >= size()) {
      throw DistError(
          ErrorCode::InstanceMismatch, fmt::format("instance {}", rank_),
          fmt::format("broadcast from instance {}, which is not one of the {} instances", root, size()));
    }
  }

  std::shared_ptr<Hub> hub_;
  int64_t rank_;
  uint64_t round_ = 0;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> makeInProcessCommunicators(int64_t instances,
                                                                      std::chrono::milliseconds timeout) {
  if (instances < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "makeInProcessCommunicators",
                      fmt::format("{} instances requested; at least 1 is needed", instances));
  }
  auto hub = std::make_shared<Hub>(instances, timeout);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int64_t i = 0; i < instances; ++i) out.push_back(std::make_shared<InProcessCommunicator>(hub, i));
  return out;
}

}  // namespace tessera
