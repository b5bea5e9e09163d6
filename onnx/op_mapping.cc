// The ONNX mapping table, built from the families in a fixed order.
#include "op_mapping.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {
namespace {

bool sameDomain(std::string_view a, std::string_view b) {
  auto normal = [](std::string_view d) { return d == "ai.onnx" ? std::string_view{} : d; };
  return normal(a) == normal(b);
}

// Sorted case-insensitively, repeats removed (an op type with one entry per
// opset range is named once).
std::vector<std::string> sortedNames(bool (*select)(const OnnxOpMapping&)) {
  std::vector<std::string> names;
  for (const OnnxOpMapping& entry : onnxMappings().entries())
    if (select(entry)) names.emplace_back(entry.opType);
  auto lower = [](const std::string& s) {
    std::string l = s;
    for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return l;
  };
  std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    const std::string la = lower(a);
    const std::string lb = lower(b);
    return la != lb ? la < lb : a < b;
  });
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace

void OnnxMappingTable::add(OnnxOpMapping entry) {
  for (const OnnxOpMapping& e : entries_) {
    if (e.opType != entry.opType || !sameDomain(e.domain, entry.domain)) continue;
    if (e.minOpset <= entry.maxOpset && entry.minOpset <= e.maxOpset)
      throw InternalError(ErrorCode::Internal, "onnx mapping table",
                          fmt::format("{} is registered twice for opsets {} to {} and {} to {}", entry.opType,
                                      e.minOpset, e.maxOpset, entry.minOpset, entry.maxOpset));
  }
  if (entry.minOpset > entry.maxOpset)
    throw InternalError(
        ErrorCode::Internal, "onnx mapping table",
        fmt::format("{} has the empty opset range {} to {}", entry.opType, entry.minOpset, entry.maxOpset));
  entries_.push_back(std::move(entry));
}

const OnnxOpMapping* OnnxMappingTable::find(std::string_view domain, std::string_view opType,
                                            int64_t opset) const {
  for (const OnnxOpMapping& e : entries_)
    if (e.opType == opType && sameDomain(e.domain, domain) && e.minOpset <= opset && opset <= e.maxOpset)
      return &e;
  return nullptr;
}

bool OnnxMappingTable::knows(std::string_view domain, std::string_view opType) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const OnnxOpMapping& e) {
    return e.opType == opType && sameDomain(e.domain, domain);
  });
}

const OnnxMappingTable& onnxMappings() {
  static const OnnxMappingTable instance = [] {
    OnnxMappingTable t;
    addSourceMappings(t);
    addElementwiseMappings(t);
    addMatMulMappings(t);
    addReductionMappings(t);
    addShapeMappings(t);
    addSoftmaxMappings(t);
    addGatherMappings(t);
    addConvMappings(t);
    addPoolingMappings(t);
    addRecurrenceMappings(t);
    addMaskMappings(t);
    addNormalizationMappings(t);
    return t;
  }();
  return instance;
}

std::vector<std::string> supportedOnnxOps() {
  return sortedNames([](const OnnxOpMapping& e) { return e.listed; });
}

std::vector<std::string> knownValueOnnxOps() {
  return sortedNames([](const OnnxOpMapping& e) { return e.onKnownValues; });
}

}  // namespace tessera::onnx_import
