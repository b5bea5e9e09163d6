// Host streams: how an input reaches the device and an output (anchor) goes
// back to the host. Names, meanings and defaults are PopART's:
//
//   ops::input(g, "x", {B, 784}, DType::Float32,
//              InputSettings{TileSet::IO, ExchangeStrategy::OverlapInnerLoop});
//
// tileSet: the tiles a host transfer lands on (or leaves from). IO needs
// SessionOptions::numIOTiles > 0; the overlap strategies need it to
// overlap anything (on the compute tiles a transfer blocks compute, so
// PopART compiles them and nothing overlaps).
//
// exchangeStrategy: when the transfer runs, in PopART's loops (the inner
// loop of accumulationFactor micro-batches, the outer loop of
// batchesPerStep batches; a loop of one iteration is not there):
//   JustInTime        right before the first use (inputs) or right after the
//                     producer (outputs): on the critical path, no overlap;
//   OverlapInnerLoop  the next iteration's input is loaded, and the previous
//                     iteration's output stored, while this iteration
//                     computes, within the inner loop (of N iterations,
//                     the exchanges between them overlap; the first load and
//                     the last store do not);
//   OverlapLoops      the same across the iterations of both loops;
//   OverlapStep       across host steps as well. PopART declares it and does
//                     not support it; neither does tessera
//                     (tessera.config.184).
// The strategies never change the numbers a session computes, only the
// modelled time and the IO tiles' memory (docs/memory-and-time.md).
#pragma once

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

enum class ExchangeStrategy { JustInTime, OverlapInnerLoop, OverlapLoops, OverlapStep };

template <>
struct EnumNames<ExchangeStrategy> {
  static constexpr std::string_view kTypeName = "ExchangeStrategy";
  static constexpr std::array kNames = {
      std::pair{ExchangeStrategy::JustInTime, std::string_view{"JustInTime"}},
      std::pair{ExchangeStrategy::OverlapInnerLoop, std::string_view{"OverlapInnerLoop"}},
      std::pair{ExchangeStrategy::OverlapLoops, std::string_view{"OverlapLoops"}},
      std::pair{ExchangeStrategy::OverlapStep, std::string_view{"OverlapStep"}}};
};

// Whether a strategy asks for any overlap.
constexpr bool overlaps(ExchangeStrategy strategy) { return strategy != ExchangeStrategy::JustInTime; }

struct InputSettings {
  TileSet tileSet = TileSet::Compute;
  ExchangeStrategy exchangeStrategy = ExchangeStrategy::JustInTime;
  bool operator==(const InputSettings&) const = default;
};

}  // namespace tessera
