// tessera cbr --elements N --replicas K [--json]: the shard layout of a
// replica-sharded tensor.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera::cli {
namespace {

struct CbrArgs {
  int64_t elements = 0;
  int64_t replicas = 0;
  bool json = false;
};

// Runs this short are listed one by one ("3,4" rather than "3..4").
constexpr int64_t kMaxListedRun = 3;

// One shard's slots in host terms, e.g. "[0..6,p]" or "[p,p]": the range of
// host indices it holds, then one "p" per zero pad (or "p*N" for long runs).
std::string shardContent(const ShardLayout& layout, int64_t shard) {
  std::vector<std::string> items;
  const int64_t real = layout.realElements(shard);
  if (real > kMaxListedRun) {
    const int64_t first = layout.hostOffset(shard);
    items.push_back(fmt::format("{}..{}", first, first + real - 1));
  } else if (real > 0) {
    const int64_t first = layout.hostOffset(shard);
    for (int64_t i = 0; i < real; ++i) items.push_back(std::to_string(first + i));
  }
  const int64_t pads = layout.shardElements() - real;
  if (pads > kMaxListedRun) {
    items.push_back(fmt::format("p*{}", pads));
  } else {
    for (int64_t i = 0; i < pads; ++i) items.emplace_back("p");
  }
  return fmt::format("[{}]", fmt::join(items, ","));
}

}  // namespace

Action attachCbr(CLI::App& command) {
  auto args = std::make_shared<CbrArgs>();
  command.add_option("--elements", args->elements, "Elements of the tensor (N)")->required();
  command.add_option("--replicas", args->replicas, "Shards, i.e. replicas of the sharding domain (K)")
      ->required()
      ->check(listableCount());
  command.add_flag("--json", args->json, "Print JSON instead of text");
  return [args] {
    const ShardLayout layout(args->elements, args->replicas);
    const std::vector<int64_t> real = layout.realElementsPerShard();
    if (args->json) {
      printJson({
          {"elements", layout.elements()},
          {"replicas", layout.shards()},
          {"shardElements", layout.shardElements()},
          {"padding", layout.padding()},
          {"realElements", real},
      });
      return kExitOk;
    }
    std::vector<std::string> shards;
    for (int64_t s = 0; s < layout.shards(); ++s) shards.push_back(shardContent(layout, s));
    fmt::print("elements       {}\n", layout.elements());
    fmt::print("shards         {}\n", layout.shards());
    fmt::print("shard length   {}\n", layout.shardElements());
    fmt::print("padding        {}\n", layout.padding());
    fmt::print("real elements  {}\n", joinInts(real));
    fmt::print("layout         {}\n", fmt::join(shards, " "));
    return kExitOk;
  };
}

}  // namespace tessera::cli
