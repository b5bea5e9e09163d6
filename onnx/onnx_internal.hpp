// Pieces of the ONNX importer shared by its files: values known at import
// (initializers, Constant nodes, folded shape arithmetic) and their reading
// from TensorProto.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <onnx/onnx_pb.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/graph.hpp"

namespace tessera::onnx_import {

// A tensor whose value is known at import. Floating-point types hold their
// values in `f` (float32 and float16 values rounded to their type after every
// operation, so folding computes what their arithmetic would), every other
// type in `i`
// (bools as 0/1).
struct Known {
  int32_t type = onnx::TensorProto::FLOAT;  // onnx::TensorProto::DataType
  Shape shape;
  std::vector<double> f;
  std::vector<int64_t> i;

  bool isFloat() const noexcept;
  int64_t size() const noexcept {
    return isFloat() ? static_cast<int64_t>(f.size()) : static_cast<int64_t>(i.size());
  }
  double at(int64_t k) const {
    return isFloat() ? f[static_cast<std::size_t>(k)] : static_cast<double>(i[static_cast<std::size_t>(k)]);
  }
};

// Values computed at import are refused above this many elements (before
// anything is allocated); shape arithmetic never comes close.
inline constexpr int64_t kMaxFoldedElements = int64_t{1} << 24;
// PopART's node attribute for Builder::recomputeOutputInBackwardPass: an int
// holding a RecomputeType (0 Undefined, 1 Checkpoint, 2 Recompute).
inline constexpr std::string_view kRecomputeAttribute = "__recompute_output_in_backward_pass";
// PopART's Builder::virtualGraph: the IPU of the replica a node runs on.
inline constexpr std::string_view kIpuNumberAttribute = "__ipu_number";
// PopART's Builder::pipelineStage: the pipeline stage of a node.
inline constexpr std::string_view kPipelineStageAttribute = "__pipeline_stage";
// PopART's Builder::executionPhase: the execution phase of a node.
inline constexpr std::string_view kExecutionPhaseAttribute = "__execution_phase";

bool isFloatType(int32_t type) noexcept;
// ONNX's lower-case name of an element type ("float", "int64", ...).
std::string typeName(int32_t type);

// Reads a TensorProto; `subject` names it in errors (OnnxMalformed for
// inconsistent data, OnnxUnsupportedFeature for strings, external data and
// complex numbers).
Known readTensor(const onnx::TensorProto& tensor, const std::string& subject);

// The shape and values of a new known tensor of `type`; the element count is
// checked against kMaxFoldedElements (OnnxTooLarge naming `subject`).
Known makeKnown(int32_t type, Shape shape, const std::string& subject);

// Elements of a shape, with overflow and limit checks for folded values.
int64_t checkedElements(const Shape& shape, const std::string& subject, int64_t limit);

// Evaluates `node` at import when every input is known (absent optional
// inputs are nullopt). Returns nullopt when the op is not one the import-time
// evaluator folds; throws OnnxError for inputs that do not fit the op.
std::optional<std::vector<Known>> foldNode(const onnx::NodeProto& node, int64_t opset,
                                           const std::vector<std::optional<Known>>& inputs,
                                           const std::string& subject);

// --- Attribute and shape helpers shared by folding and mapping ---
const onnx::AttributeProto* findAttribute(const onnx::NodeProto& node, std::string_view name);
int64_t intAttribute(const onnx::NodeProto& node, std::string_view name, int64_t fallback,
                     const std::string& subject);
float floatAttribute(const onnx::NodeProto& node, std::string_view name, float fallback,
                     const std::string& subject);
std::string stringAttribute(const onnx::NodeProto& node, std::string_view name, std::string fallback,
                            const std::string& subject);
std::optional<std::vector<int64_t>> intsAttribute(const onnx::NodeProto& node, std::string_view name,
                                                  const std::string& subject);
// An axis in [-rank, rank) made non-negative; OnnxNodeShape otherwise.
int64_t normalizeAxis(int64_t axis, int64_t rank, const std::string& subject);
// Known int values as a list (shape, starts, axes inputs).
std::vector<int64_t> intList(const Known& value, const std::string& subject, std::string_view what);
// Numpy broadcasting of two shapes; OnnxNodeShape when they do not broadcast.
Shape broadcastShapes(const Shape& a, const Shape& b, const std::string& subject);
// Reshape's target: 0 copies the input dim (unless allowZero), one -1 is inferred.
Shape reshapeTarget(const Shape& input, const std::vector<int64_t>& request, bool allowZero,
                    const std::string& subject);
// Unsqueeze / Squeeze output shapes.
Shape unsqueezeShape(const Shape& input, const std::vector<int64_t>& axes, const std::string& subject);
Shape squeezeShape(const Shape& input, const std::optional<std::vector<int64_t>>& axes,
                   const std::string& subject);
// Slice's per-axis [start, end) with step, clamped as ONNX says.
struct SliceRange {
  std::vector<int64_t> starts, ends, steps;  // one per input axis
  Shape outShape;
};
SliceRange sliceRange(const Shape& input, const std::vector<int64_t>& starts,
                      const std::vector<int64_t>& ends, const std::optional<std::vector<int64_t>>& axes,
                      const std::optional<std::vector<int64_t>>& steps, const std::string& subject);

[[noreturn]] void throwOnnx(ErrorCode code, const std::string& subject, std::string_view message);

// The bytes of a file; IoError(FileUnreadable) when it cannot be read.
std::string readFile(const std::filesystem::path& path);

// A ModelProto from its serialized bytes; OnnxMalformed (naming `source`)
// for bytes that do not parse or a model without a graph.
onnx::ModelProto parseModel(std::string_view bytes, const std::string& source);

}  // namespace tessera::onnx_import
