#include "tessera/lib/shard_layout.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// Host values 1..n, so that a zero in the shards is padding.
std::vector<float> iota(int64_t n) {
  std::vector<float> host(static_cast<std::size_t>(n));
  std::iota(host.begin(), host.end(), 1.0f);
  return host;
}

std::vector<float> toShards(const ShardLayout& layout, const std::vector<float>& host) {
  std::vector<float> shards(static_cast<std::size_t>(layout.paddedElements()), -1.0f);
  layout.hostToShards(host, shards);
  return shards;
}

}  // namespace

TEST_CASE("shard sizes and layouts of the reference table") {
  struct Row {
    int64_t n, shards, shardElements, padded, padding;
    std::vector<int64_t> real;
    // Host index + 1 of every slot, shard after shard; 0 is padding. Empty
    // when the table does not list the layout.
    std::vector<float> slots;
  };
  const std::vector<Row> rows = {
      {30, 4, 8, 32, 2, {7, 8, 7, 8}, {1,  2,  3,  4,  5,  6,  7,  0, 8,  9,  10, 11, 12, 13, 14, 15,
                                       16, 17, 18, 19, 20, 21, 22, 0, 23, 24, 25, 26, 27, 28, 29, 30}},
      {5, 4, 2, 8, 3, {1, 2, 2, 0}, {1, 0, 2, 3, 4, 5, 0, 0}},
      {6, 4, 2, 8, 2, {2, 2, 2, 0}, {1, 2, 3, 4, 5, 6, 0, 0}},
      {10, 4, 3, 12, 2, {2, 3, 2, 3}, {1, 2, 0, 3, 4, 5, 6, 7, 0, 8, 9, 10}},
      {1, 4, 1, 4, 3, {1, 0, 0, 0}, {1, 0, 0, 0}},
      {16, 4, 4, 16, 0, {4, 4, 4, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}},
      {8192, 16, 512, 8192, 0, std::vector<int64_t>(16, 512), {}},
      {0, 4, 0, 0, 0, {0, 0, 0, 0}, {}},
      {3, 1, 3, 3, 0, {3}, {1, 2, 3}},
  };
  for (const Row& row : rows) {
    const ShardLayout layout(row.n, row.shards);
    CAPTURE(layout.str());
    CHECK(layout.elements() == row.n);
    CHECK(layout.shards() == row.shards);
    CHECK(layout.shardElements() == row.shardElements);
    CHECK(layout.paddedElements() == row.padded);
    CHECK(layout.padding() == row.padding);
    CHECK(layout.realElementsPerShard() == row.real);
    if (!row.slots.empty()) CHECK(toShards(layout, iota(row.n)) == row.slots);
  }
}

TEST_CASE("host offsets follow the balanced split") {
  const ShardLayout layout(30, 4);
  CHECK(layout.hostOffset(0) == 0);
  CHECK(layout.hostOffset(1) == 7);
  CHECK(layout.hostOffset(2) == 15);
  CHECK(layout.hostOffset(3) == 22);
  // Shards past the last part hold nothing and start at the end.
  CHECK(ShardLayout(5, 4).hostOffset(3) == 5);
  CHECK(layout.version() == ShardLayout::kVersion);
  CHECK(layout.str() == "ShardLayout(elements=30, shards=4, shardElements=8)");
}

TEST_CASE("one shard at a time matches the whole buffer") {
  const ShardLayout layout(10, 4);
  const std::vector<float> host = iota(10);
  const std::vector<float> all = toShards(layout, host);
  for (int64_t s = 0; s < layout.shards(); ++s) {
    std::vector<float> one(3, -1.0f);
    layout.hostToShard(host, s, one);
    CHECK(one == std::vector<float>(all.begin() + s * 3, all.begin() + s * 3 + 3));
  }
}

TEST_CASE("property: host -> shards -> host round-trips for n in 0..300 and k in 1..17") {
  for (int64_t n = 0; n <= 300; ++n) {
    const std::vector<float> host = iota(n);
    for (int64_t k = 1; k <= 17; ++k) {
      const ShardLayout layout(n, k);
      CAPTURE(layout.str());
      REQUIRE(layout.shardElements() == (n + k - 1) / k);
      const std::vector<float> shards = toShards(layout, host);

      int64_t realTotal = 0;
      int64_t zeros = 0;
      for (int64_t s = 0; s < k; ++s) {
        const int64_t real = layout.realElements(s);
        REQUIRE(real >= 0);
        REQUIRE(real <= layout.shardElements());
        realTotal += real;
        for (int64_t slot = 0; slot < layout.shardElements(); ++slot) {
          const float value = shards[static_cast<std::size_t>(s * layout.shardElements() + slot)];
          // Real elements first, padding zeroed after them.
          if (slot < real) {
            REQUIRE(value == host[static_cast<std::size_t>(layout.hostOffset(s) + slot)]);
          } else {
            REQUIRE(value == 0.0f);
            ++zeros;
          }
        }
      }
      REQUIRE(realTotal == n);
      REQUIRE(zeros == layout.padding());

      std::vector<float> back(static_cast<std::size_t>(n), -1.0f);
      layout.shardsToHost(shards, back);
      REQUIRE(back == host);
    }
  }
}

TEST_CASE("invalid layouts and wrong buffer sizes are rejected") {
  struct Row {
    int64_t n, shards;
  };
  for (const Row row : {Row{-1, 4}, Row{4, 0}, Row{4, -2}}) {
    const auto error = test::catchError<ConfigError>([&] { ShardLayout(row.n, row.shards); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::InvalidShardLayout);
    CHECK(error->subject() == fmt::format("ShardLayout(elements={}, shards={})", row.n, row.shards));
  }

  const ShardLayout layout(30, 4);
  const std::string subject = layout.str();
  std::vector<float> host(30), shortHost(29), shards(32), shortShards(31), shard(8), shortShard(7);
  struct Call {
    const char* name;
    std::function<void()> fn;
    std::string detail;
  };
  const std::vector<Call> calls = {
      {"hostToShards short host", [&] { layout.hostToShards(shortHost, shards); },
       "the host buffer has 29 elements, expected 30"},
      {"hostToShards short shards", [&] { layout.hostToShards(host, shortShards); },
       "the shard buffer has 31 elements, expected paddedElements 32 (4 shards of 8)"},
      {"hostToShard short out", [&] { layout.hostToShard(host, 1, shortShard); },
       "the buffer of shard 1 has 7 elements, expected shardElements 8"},
      {"hostToShard short host", [&] { layout.hostToShard(shortHost, 1, shard); },
       "the host buffer has 29 elements, expected 30"},
      {"shardsToHost short shards", [&] { layout.shardsToHost(shortShards, host); },
       "the shard buffer has 31 elements, expected paddedElements 32 (4 shards of 8)"},
      {"shardsToHost short host", [&] { layout.shardsToHost(shards, shortHost); },
       "the host buffer has 29 elements, expected 30"},
  };
  for (const Call& call : calls) {
    CAPTURE(call.name);
    const auto error = test::catchError<ConfigError>(call.fn);
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::ShardBufferSizeMismatch);
    CHECK(error->subject() == subject);
    CHECK(error->detail() == call.detail);
  }

  for (const int64_t shardIndex : {int64_t{-1}, int64_t{4}}) {
    const auto error = test::catchError<ConfigError>([&] { (void)layout.realElements(shardIndex); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::ReplicaIndexOutOfRange);
    CHECK(error->subject() == subject);
  }
  const auto error = test::catchError<ConfigError>([&] { layout.hostToShard(host, 4, shard); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::ReplicaIndexOutOfRange);
}
