// ReductionType: how gradients are combined over accumulation steps and
// replicas (PopART's ReductionType). Its own header because both the graph
// (collective ops reduce with it) and the session options (the accumulation
// and replication reduction) name it, and the graph needs nothing else of the
// options.
#pragma once

#include <array>
#include <string_view>
#include <utility>

#include "tessera/lib/enum_names.hpp"

namespace tessera {

enum class ReductionType {
  Sum,   // gradients are added
  Mean,  // gradients are averaged (see MeanReductionStrategy)
};

template <>
struct EnumNames<ReductionType> {
  static constexpr std::string_view kTypeName = "ReductionType";
  static constexpr std::array kNames = {std::pair{ReductionType::Sum, std::string_view{"Sum"}},
                                        std::pair{ReductionType::Mean, std::string_view{"Mean"}}};
};

}  // namespace tessera
