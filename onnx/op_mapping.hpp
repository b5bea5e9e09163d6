// The ONNX mapping table: for each op type the importer knows, the opsets it
// takes, the inputs a node needs, the inputs a gradient flows through and the
// function that emits its tessera ops. Each op family registers its entries
// from its file onnx/ops/<family>.cc (docs/adding-an-op.md); Importer::mapNode
// looks the node up and calls the function.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <onnx/onnx_pb.h>

namespace tessera::onnx_import {

class Importer;

// Opsets of the default domain (ai.onnx) the importer takes: a model from
// kMinOpset to kMaxOpset as it is, an older one upgraded to kMinOpset first.
inline constexpr int64_t kMinOpset = 11;
inline constexpr int64_t kMaxOpset = 17;

// Emits the ops of one node (a member of Importer, defined in its family's
// onnx/ops/<family>.cc).
using MapFunction = void (Importer::*)(const onnx::NodeProto& node, const std::string& subject);

struct OnnxOpMapping {
  std::string_view opType{};
  std::string_view domain{};  // "" for the default domain, ai.onnx
  // The opsets of `domain` the entry covers; an op whose rules change at an
  // opset has one entry per range.
  int64_t minOpset = 1;
  int64_t maxOpset = kMaxOpset;
  // The function that emits the node's ops; nullptr for an op computed only
  // on values known at import (onnx/const_eval.cc folds it).
  MapFunction map = nullptr;
  // Inputs that must be present (OnnxInvalidGraph otherwise, checked before
  // folding).
  int requiredInputs = 1;
  // The node needs some output (a recurrence's are all optional) rather than
  // its output 0.
  bool anyOutput = false;
  // The inputs through which a gradient flows to the outputs (data
  // operands; not shapes, indices, labels or conditions); allInputs: every
  // input.
  std::vector<int> differentiable{};
  bool allInputsDifferentiable = false;
  // The float operands are checked to share one ONNX type before `map` runs
  // (Importer::checkFloatOperands).
  bool checksFloatOperands = true;
  // Named among the ops supported on computed values in OnnxUnsupportedOp's
  // list, and among those supported on values known at import only.
  bool listed = true;
  bool onKnownValues = false;
};

class OnnxMappingTable {
 public:
  // InternalError for an op type registered twice over overlapping opsets.
  void add(OnnxOpMapping entry);
  // The entry of `opType` in `domain` ("ai.onnx" is "") at `opset`; nullptr
  // for an op type without one.
  const OnnxOpMapping* find(std::string_view domain, std::string_view opType, int64_t opset) const;
  // True when some opset of `domain` has an entry for `opType`.
  bool knows(std::string_view domain, std::string_view opType) const;
  const std::vector<OnnxOpMapping>& entries() const noexcept { return entries_; }

 private:
  std::vector<OnnxOpMapping> entries_;
};

// The families' registration functions, called in a fixed order by
// onnxMappings() (an explicit list, so that a static library links every
// family without relying on static initializers).
void addSourceMappings(OnnxMappingTable& table);
void addElementwiseMappings(OnnxMappingTable& table);
void addMatMulMappings(OnnxMappingTable& table);
void addReductionMappings(OnnxMappingTable& table);
void addShapeMappings(OnnxMappingTable& table);
void addSoftmaxMappings(OnnxMappingTable& table);
void addGatherMappings(OnnxMappingTable& table);
void addConvMappings(OnnxMappingTable& table);
void addPoolingMappings(OnnxMappingTable& table);
void addRecurrenceMappings(OnnxMappingTable& table);
void addMaskMappings(OnnxMappingTable& table);
void addNormalizationMappings(OnnxMappingTable& table);

// OnnxUnsupportedFeature: `op` is supported on values known at import only.
[[noreturn]] void refuseComputedInput(const std::string& op, const std::string& subject);

// The table, built once on first use.
const OnnxMappingTable& onnxMappings();

// The op types supported on computed values, and those supported on values
// known at import only, each sorted (case-insensitively) without repeats:
// the lists of OnnxUnsupportedOp's message.
std::vector<std::string> supportedOnnxOps();
std::vector<std::string> knownValueOnnxOps();

}  // namespace tessera::onnx_import
