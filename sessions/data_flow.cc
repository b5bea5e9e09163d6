#include "tessera/sessions/data_flow.hpp"

#include <set>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera {

AnchorReturnType AnchorReturnType::fromName(std::string_view name, int64_t returnPeriod, TileSet tileSet,
                                            ExchangeStrategy exchangeStrategy) {
  for (const auto& [id, text] : EnumNames<AnchorReturnTypeId>::kNames) {
    if (text != name) continue;
    if (id != AnchorReturnTypeId::EveryN && returnPeriod != 0) {
      throw ConfigError(ErrorCode::InvalidAnchorReturnType, "/dataFlow/anchors",
                        fmt::format("a return period ({}) only belongs to \"EveryN\", not to \"{}\"",
                                    returnPeriod, name));
    }
    return {id, id == AnchorReturnTypeId::EveryN ? returnPeriod : 0, tileSet, exchangeStrategy};
  }
  throw ConfigError(ErrorCode::InvalidAnchorReturnType, "/dataFlow/anchors",
                    fmt::format("invalid AnchorReturnType \"{}\"; expected one of \"All\", \"Final\", "
                                "\"EveryN\", \"Sum\"",
                                name));
}

void validate(const DataFlow& flow, std::string_view path) {
  if (flow.batchesPerStep < 1) {
    throw ConfigError(ErrorCode::InvalidBatchesPerStep, fmt::format("{}/batchesPerStep", path),
                      fmt::format("batchesPerStep is {}; it must be >= 1 (the batches, each with its own "
                                  "weight update, that one run() consumes)",
                                  flow.batchesPerStep));
  }
  std::set<std::string> seen;
  for (const auto& [name, type] : flow.anchors) {
    const std::string where = fmt::format("{}/anchors/{}", path, name);
    if (!seen.insert(name).second) {
      throw ConfigError(ErrorCode::InvalidAnchor, where, "the anchor is named twice; name each tensor once");
    }
    if (type.id != AnchorReturnTypeId::EveryN) {
      if (type.returnPeriod != 0) {
        throw ConfigError(ErrorCode::InvalidAnchorReturnType, where,
                          fmt::format("a return period ({}) only belongs to \"EveryN\", not to \"{}\"",
                                      type.returnPeriod, type.id));
      }
      continue;
    }
    const int64_t n = type.returnPeriod;
    if (n < 1 || n > flow.batchesPerStep || flow.batchesPerStep % n != 0) {
      throw ConfigError(ErrorCode::InvalidAnchorReturnType, where,
                        fmt::format("EveryN's return period is {}; it must be >= 1 and divide batchesPerStep "
                                    "({}), so that every step returns the same batches",
                                    n, flow.batchesPerStep));
    }
  }
}

int64_t returnedBatches(const AnchorReturnType& type, int64_t batchesPerStep) {
  switch (type.id) {
    case AnchorReturnTypeId::All: return batchesPerStep;
    case AnchorReturnTypeId::EveryN: return type.returnPeriod > 0 ? batchesPerStep / type.returnPeriod : 0;
    case AnchorReturnTypeId::Final:
    case AnchorReturnTypeId::Sum: return 1;
  }
  return 1;
}

}  // namespace tessera
