#include "tessera/lib/shard_layout.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

int64_t ceilDiv(int64_t a, int64_t b) noexcept { return a == 0 ? 0 : (a - 1) / b + 1; }

}  // namespace

ShardLayout::ShardLayout(int64_t elements, int64_t shards)
    : elements_(elements), shards_(shards), shardElements_(0), parts_(0) {
  if (elements < 0 || shards < 1) {
    throw ConfigError(ErrorCode::InvalidShardLayout,
                      fmt::format("ShardLayout(elements={}, shards={})", elements, shards),
                      fmt::format("a layout needs elements >= 0 and shards >= 1, found {} elements over {} "
                                  "shards",
                                  elements, shards));
  }
  shardElements_ = ceilDiv(elements, shards);
  // The balanced split of the collective-balanced reorder: the fewest parts
  // of at most shardElements each, as equal in size as possible.
  parts_ = elements == 0 ? 0 : ceilDiv(elements, shardElements_);
}

int64_t ShardLayout::hostOffset(int64_t shard) const {
  if (shard < 0 || shard >= shards_) {
    throw ConfigError(ErrorCode::ReplicaIndexOutOfRange, str(),
                      fmt::format("shard {} is out of range; shards are 0..{}", shard, shards_ - 1));
  }
  if (shard >= parts_) return elements_;
  // floor(shard * elements / parts) without forming the product, which could
  // overflow for large tensors.
  const int64_t quotient = elements_ / parts_;
  const int64_t remainder = elements_ % parts_;
  return shard * quotient + shard * remainder / parts_;
}

int64_t ShardLayout::realElements(int64_t shard) const {
  const int64_t begin = hostOffset(shard);
  return shard + 1 >= shards_ ? elements_ - begin : hostOffset(shard + 1) - begin;
}

std::vector<int64_t> ShardLayout::realElementsPerShard() const {
  std::vector<int64_t> counts(static_cast<std::size_t>(shards_));
  for (int64_t s = 0; s < shards_; ++s) counts[static_cast<std::size_t>(s)] = realElements(s);
  return counts;
}

void ShardLayout::hostToShards(std::span<const float> host, std::span<float> shards) const {
  if (static_cast<int64_t>(shards.size()) != paddedElements()) {
    throw ConfigError(
        ErrorCode::ShardBufferSizeMismatch, str(),
        fmt::format("the shard buffer has {} elements, expected paddedElements {} ({} shards of {})",
                    shards.size(), paddedElements(), shards_, shardElements_));
  }
  for (int64_t s = 0; s < shards_; ++s) {
    hostToShard(host, s,
                shards.subspan(static_cast<std::size_t>(s * shardElements_),
                               static_cast<std::size_t>(shardElements_)));
  }
}

void ShardLayout::hostToShard(std::span<const float> host, int64_t shard, std::span<float> out) const {
  if (static_cast<int64_t>(host.size()) != elements_) {
    throw ConfigError(ErrorCode::ShardBufferSizeMismatch, str(),
                      fmt::format("the host buffer has {} elements, expected {}", host.size(), elements_));
  }
  if (static_cast<int64_t>(out.size()) != shardElements_) {
    throw ConfigError(ErrorCode::ShardBufferSizeMismatch, str(),
                      fmt::format("the buffer of shard {} has {} elements, expected shardElements {}", shard,
                                  out.size(), shardElements_));
  }
  const auto begin = static_cast<std::size_t>(hostOffset(shard));
  const auto count = static_cast<std::size_t>(realElements(shard));
  const auto tail = std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(begin), count, out.begin());
  std::fill(tail, out.end(), 0.0f);
}

void ShardLayout::shardsToHost(std::span<const float> shards, std::span<float> host) const {
  if (static_cast<int64_t>(shards.size()) != paddedElements()) {
    throw ConfigError(
        ErrorCode::ShardBufferSizeMismatch, str(),
        fmt::format("the shard buffer has {} elements, expected paddedElements {} ({} shards of {})",
                    shards.size(), paddedElements(), shards_, shardElements_));
  }
  if (static_cast<int64_t>(host.size()) != elements_) {
    throw ConfigError(ErrorCode::ShardBufferSizeMismatch, str(),
                      fmt::format("the host buffer has {} elements, expected {}", host.size(), elements_));
  }
  for (int64_t s = 0; s < shards_; ++s) {
    const auto from = shards.begin() + static_cast<std::ptrdiff_t>(s * shardElements_);
    const auto to = host.begin() + static_cast<std::ptrdiff_t>(hostOffset(s));
    std::copy_n(from, static_cast<std::size_t>(realElements(s)), to);
  }
}

std::string ShardLayout::str() const {
  return fmt::format("ShardLayout(elements={}, shards={}, shardElements={})", elements_, shards_,
                     shardElements_);
}

}  // namespace tessera
