// One name table per enum. The table drives printing (fmt), JSON and the
// schema, so the string a user writes in a config, the string in an error and
// the enumerator in the code are the same identifier.
#pragma once

#include <array>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/core.h>

namespace tessera {

// Specialise with `static constexpr std::string_view kTypeName` and
// `static constexpr std::array<std::pair<E, std::string_view>, N> kNames`.
template <class E>
struct EnumNames;

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires {
  EnumNames<E>::kNames;
  EnumNames<E>::kTypeName;
};

// toString(value): the enumerator's name. A function object rather than a
// function so that argument-dependent lookup from other libraries' generic
// printers (e.g. doctest's toString) never finds it.
struct ToStringFn {
  template <NamedEnum E>
  constexpr std::string_view operator()(E value) const noexcept {
    for (const auto& [v, name] : EnumNames<E>::kNames)
      if (v == value) return name;
    return "<invalid>";
  }
};
inline constexpr ToStringFn toString{};

// Exact (case-sensitive) lookup.
template <NamedEnum E>
constexpr std::optional<E> enumFromString(std::string_view name) noexcept {
  for (const auto& [v, n] : EnumNames<E>::kNames)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace tessera

template <tessera::NamedEnum E>
struct fmt::formatter<E> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(E value, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessera::toString(value), ctx);
  }
};
