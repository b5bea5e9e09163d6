// DataFlow: how many batches one run() of a session consumes and how each
// output (anchor) comes back to the host. Names, meanings and defaults are
// PopART's:
//
//   tessera::DataFlow flow{4, {{"loss", tessera::AnchorReturnType::all()},
//                               {"logits", tessera::AnchorReturnType::everyN(2)}}};
//
// A step of batchesPerStep batches is, numerically, batchesPerStep separate
// one-batch steps: every batch (accumulationFactor x local replicas x
// micro-batch samples) gets its own weight update, in order.
//
// Host shapes, with D the per-batch host shape of the anchor (e.g.
// [accumulationFactor, localReplicas, ...] for the loss, size-1 dims
// omitted) and D' = D without its accumulation dimension:
//   All        [batchesPerStep, ...D]     every batch's value
//   EveryN(n)  [batchesPerStep / n, ...D] the last batch of every n
//   Final      D'                         the last micro-batch of the last batch
//   Sum        D'                         the sum over every batch and micro-batch
// and a leading dimension of size 1 is omitted. Inputs take
// [batchesPerStep, ...their one-batch host shape] the same way.
//
// As in PopART, an anchor's return type also says how it goes back to the
// host: its tile set and exchange strategy (tessera/lib/input_settings.hpp;
// inputs take theirs from ops::input's InputSettings):
//   {"logits", {AnchorReturnTypeId::All, 0, TileSet::IO, ExchangeStrategy::OverlapInnerLoop}}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/input_settings.hpp"

namespace tessera {

enum class AnchorReturnTypeId { Final, EveryN, All, Sum };

template <>
struct EnumNames<AnchorReturnTypeId> {
  static constexpr std::string_view kTypeName = "AnchorReturnTypeId";
  static constexpr std::array kNames = {std::pair{AnchorReturnTypeId::Final, std::string_view{"Final"}},
                                        std::pair{AnchorReturnTypeId::EveryN, std::string_view{"EveryN"}},
                                        std::pair{AnchorReturnTypeId::All, std::string_view{"All"}},
                                        std::pair{AnchorReturnTypeId::Sum, std::string_view{"Sum"}}};
};

struct AnchorReturnType {
  AnchorReturnTypeId id = AnchorReturnTypeId::All;
  // EveryN's period n (>= 1, dividing batchesPerStep); 0 for the others.
  int64_t returnPeriod = 0;
  // How the anchor goes back to the host (PopART's AnchorReturnType(name,
  // tileSet, exchangeStrategy)); only the modelled time and memory depend
  // on them.
  TileSet tileSet = TileSet::Compute;
  ExchangeStrategy exchangeStrategy = ExchangeStrategy::JustInTime;

  static AnchorReturnType all() { return {AnchorReturnTypeId::All, 0}; }
  static AnchorReturnType final() { return {AnchorReturnTypeId::Final, 0}; }
  static AnchorReturnType sum() { return {AnchorReturnTypeId::Sum, 0}; }
  static AnchorReturnType everyN(int64_t n) { return {AnchorReturnTypeId::EveryN, n}; }
  // PopART's string form: "All", "Final", "Sum", or "EveryN" with a period.
  // Throws ConfigError(InvalidAnchorReturnType) for another name, and for a
  // period given to a type other than EveryN.
  static AnchorReturnType fromName(std::string_view name, int64_t returnPeriod = 0,
                                   TileSet tileSet = TileSet::Compute,
                                   ExchangeStrategy exchangeStrategy = ExchangeStrategy::JustInTime);

  bool operator==(const AnchorReturnType&) const = default;
};

struct DataFlow {
  // No default: a session's `{}` argument stays its list of outputs.
  DataFlow(int64_t batches, std::vector<std::pair<std::string, AnchorReturnType>> anchorTensors = {})
      : batchesPerStep(batches), anchors(std::move(anchorTensors)) {}

  // Batches (weight updates) per run(); >= 1.
  int64_t batchesPerStep = 1;
  // Tensors run() returns, by name, with their return types. A training
  // session always returns its loss: as "All" unless named here.
  std::vector<std::pair<std::string, AnchorReturnType>> anchors{};

  bool operator==(const DataFlow&) const = default;
};

// Checks batchesPerStep >= 1 (ConfigError(InvalidBatchesPerStep)), every
// return type (EveryN: 1 <= n <= batchesPerStep and n divides it,
// ConfigError(InvalidAnchorReturnType)) and that no anchor is named twice
// (ConfigError(InvalidAnchor)). Paths start with `path` (e.g. "/dataFlow").
void validate(const DataFlow& flow, std::string_view path = "/dataFlow");

// The anchor's batches a step returns (All: batchesPerStep, EveryN(n):
// batchesPerStep / n, Final and Sum: 1).
int64_t returnedBatches(const AnchorReturnType& type, int64_t batchesPerStep);

}  // namespace tessera
