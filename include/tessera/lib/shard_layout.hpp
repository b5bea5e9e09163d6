// ShardLayout: how a tensor of n elements is split over k replica shards
// (replicated tensor sharding with collective-balanced padding).
//
// Every shard has shardElements() = ceil(n/k) slots. The elements are split
// into balanced contiguous parts (n=30, k=4: 7, 8, 7, 8 real elements); each
// shard holds its part at the start and zero padding after it. This value
// is the only code that maps between host order and shard order; its
// version is recorded in checkpoints.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tessera {

class ShardLayout {
 public:
  // Bumped whenever the mapping between host and shard order changes.
  static constexpr int kVersion = 1;

  // Throws ConfigError(InvalidShardLayout) for elements < 0 or shards < 1.
  ShardLayout(int64_t elements, int64_t shards);

  int64_t elements() const noexcept { return elements_; }
  int64_t shards() const noexcept { return shards_; }
  // Slots per shard: ceil(elements / shards).
  int64_t shardElements() const noexcept { return shardElements_; }
  // shards * shardElements.
  int64_t paddedElements() const noexcept { return shardElements_ * shards_; }
  // Zero slots in total: paddedElements - elements.
  int64_t padding() const noexcept { return paddedElements() - elements_; }
  // Real (non-padding) elements in shard s.
  int64_t realElements(int64_t shard) const;
  // Host index of shard s's first real element.
  int64_t hostOffset(int64_t shard) const;
  // realElements(s) for every shard.
  std::vector<int64_t> realElementsPerShard() const;
  int version() const noexcept { return kVersion; }

  // host (elements) -> shards (paddedElements, shard after shard), padding
  // zeroed. Throws ConfigError(ShardBufferSizeMismatch) on wrong sizes.
  void hostToShards(std::span<const float> host, std::span<float> shards) const;
  // One shard's slots (shardElements) from host order.
  void hostToShard(std::span<const float> host, int64_t shard, std::span<float> out) const;
  // shards (paddedElements) -> host (elements); padding is dropped.
  void shardsToHost(std::span<const float> shards, std::span<float> host) const;

  std::string str() const;  // "ShardLayout(elements=30, shards=4, shardElements=8)"
  bool operator==(const ShardLayout&) const = default;

 private:
  int64_t elements_;
  int64_t shards_;
  int64_t shardElements_;
  int64_t parts_;  // shards holding at least one element
};

}  // namespace tessera
