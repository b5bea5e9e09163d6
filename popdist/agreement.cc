// checkInstancesAgree: every instance sends its settings to every other, so
// that each can name the first difference itself and all fail alike.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"

namespace tessera::dist {
namespace {

using nlohmann::json;

// The JSON pointer of the first leaf (in document order: object keys sorted,
// array elements by index) where `a` and `b` differ, or nullopt when equal.
// A key or element present on one side only differs there.
std::optional<std::string> firstDifference(const json& a, const json& b, const std::string& path) {
  if (a == b) return std::nullopt;
  if (a.is_object() && b.is_object()) {
    auto ia = a.begin();
    auto ib = b.begin();
    while (ia != a.end() || ib != b.end()) {
      if (ib == b.end() || (ia != a.end() && ia.key() < ib.key()))
        return path + "/" + jsonPointerToken(ia.key());
      if (ia == a.end() || ib.key() < ia.key()) return path + "/" + jsonPointerToken(ib.key());
      if (auto d = firstDifference(ia.value(), ib.value(), path + "/" + jsonPointerToken(ia.key()))) return d;
      ++ia;
      ++ib;
    }
    return std::nullopt;
  }
  if (a.is_array() && b.is_array()) {
    const std::size_t common = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < common; ++i) {
      if (auto d = firstDifference(a[i], b[i], fmt::format("{}/{}", path, i))) return d;
    }
    return fmt::format("{}/{}", path, common);
  }
  return path;
}

// Where a document order of pointers puts `p`: compared segment by segment,
// array indices as numbers.
bool before(const std::string& p, const std::string& q) {
  const json::json_pointer a(p);
  const json::json_pointer b(q);
  std::vector<std::string> sa;
  std::vector<std::string> sb;
  for (json::json_pointer x = a; !x.empty(); x = x.parent_pointer()) sa.insert(sa.begin(), x.back());
  for (json::json_pointer x = b; !x.empty(); x = x.parent_pointer()) sb.insert(sb.begin(), x.back());
  for (std::size_t i = 0; i < std::min(sa.size(), sb.size()); ++i) {
    if (sa[i] == sb[i]) continue;
    const bool numeric = !sa[i].empty() && !sb[i].empty() &&
                         sa[i].find_first_not_of("0123456789") == std::string::npos &&
                         sb[i].find_first_not_of("0123456789") == std::string::npos;
    if (numeric && sa[i].size() != sb[i].size()) return sa[i].size() < sb[i].size();
    return sa[i] < sb[i];
  }
  return sa.size() < sb.size();
}

std::string valueAt(const json& document, const std::string& pointer) {
  const json::json_pointer at(pointer);
  if (!document.contains(at)) return "(absent)";
  const json& value = document.at(at);
  if (value.is_structured())
    return fmt::format("{} (with {} entries)", value.is_array() ? "a list" : "an object", value.size());
  return value.dump();
}

}  // namespace

void checkInstancesAgree(Communicator& communicator, const json& settings, std::string_view what) {
  const std::vector<std::string> all = communicator.allGatherBytes(settings.dump());
  const auto same = [&](const std::string& s) { return s == all.front(); };
  if (std::all_of(all.begin(), all.end(), same)) return;

  std::vector<json> documents;
  documents.reserve(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    try {
      documents.push_back(json::parse(all[i]));
    } catch (const json::exception&) {
      throw DistError(
          ErrorCode::InstanceMismatch, fmt::format("instance {}", i),
          fmt::format("instance {} sent {} that are not JSON; is it running another program?", i, what));
    }
  }
  // The earliest difference from instance 0 over all instances.
  std::optional<std::string> first;
  for (std::size_t i = 1; i < documents.size(); ++i) {
    const std::optional<std::string> d = firstDifference(documents[0], documents[i], "");
    if (d && (!first || before(*d, *first))) first = d;
  }
  const std::string pointer = first.value_or("");
  const std::string reference = valueAt(documents[0], pointer);
  std::vector<std::string> others;
  std::vector<std::size_t> differing;
  for (std::size_t i = 1; i < documents.size(); ++i) {
    if (all[i] == all[0]) continue;
    differing.push_back(i);
    const std::string value = valueAt(documents[i], pointer);
    if (value != reference) others.push_back(fmt::format("{} on instance {}", value, i));
  }
  throw DistError(
      ErrorCode::InstanceMismatch, pointer.empty() ? "/" : pointer,
      fmt::format("the instances' {} differ here: {} on instance 0, {} (instance(s) {} differ from "
                  "instance 0); start every instance with the same program, config and tessera "
                  "version",
                  what, reference, fmt::join(others, ", "), fmt::join(differing, ", ")));
}

}  // namespace tessera::dist
