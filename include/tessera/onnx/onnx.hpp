// ONNX models in: import an ONNX model (a PyTorch export, a model of ONNX's
// test suite) as a tessera Graph.
//
//   tessera::OnnxImportOptions options;
//   options.dimensions = {{"batch", 8}};  // per replica
//   options.replicationFactor = 2;
//   tessera::OnnxModel model = tessera::importOnnx("mlp.onnx", options);
//   tessera::TrainingSession session(std::move(model.graph), model.graph.find("loss"), ...);
//
// Import binds every symbolic dimension to a number, so every shape is known;
// computations that depend only on shapes and constants (torch's
// Shape/Gather/Unsqueeze/Concat chains, ConstantOfShape, Range, Cast,
// Equal/Where on constants, ...) are evaluated at import and become
// constants or op attributes. Every other node maps onto the ops of
// tessera/lib/ops.hpp; a node that does not is an error naming it.
//
// Float initializers that a gradient reaches from a float graph output are
// Variables of category Weight under their ONNX names; the other initializers
// are constants. Graph inputs are host streams (Input) of the same name; int64
// inputs become Int32 streams (their values must fit in 32 bits).
//
// float16 tensors of the model (TensorProto::FLOAT16) import as they are,
// whatever floatType says: float16 inputs are Float16 streams, initializers
// Float16 Variables or constants holding their halves exactly, Cast to and
// from float16 the device's casts; a node whose float operands disagree in
// type where one is float16 is OnnxInvalidGraph. bfloat16 is refused.
//
// Errors are OnnxError (tessera.onnx.7NN) naming the file, node or tensor;
// IoError(FileUnreadable) for a path that cannot be read. A build without
// ONNX (Meson option -Donnx) throws OnnxError(OnnxUnavailable) from every
// function here; onnxSupported() tells beforehand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/lib/graph.hpp"

namespace tessera {

// A TensorProto read from a file (ONNX test data: input_N.pb, output_N.pb).
struct OnnxTensor {
  std::string name;   // may be empty
  std::string dtype;  // ONNX's name of the element type: "float", "int64", "bool", "double", ...
  Shape shape;
  // The values in row-major order; integers and bools exactly (integers up to
  // 2^53, beyond which files are refused).
  std::vector<double> values;
};

struct OnnxImportOptions {
  // ----- Shapes -----

  // Values of the symbolic dimensions (ONNX dim_param) of the graph inputs,
  // e.g. {"batch", 8}. Shapes are per replica, so the batch dimension is the
  // batch of one replica. A symbolic dimension without a value here is an
  // error naming the input, the axis and the dimension name; a value below 1
  // is an error too. Names that no input uses are ignored.
  std::map<std::string, int64_t, std::less<>> dimensions{};

  // Graph inputs whose values are fixed at import (a frozen input): each
  // becomes a constant, so it can feed what must be known at import
  // (Reshape's shape, Slice's starts, Unsqueeze's axes, ...), and is no
  // longer a host stream. The tensor's dtype must be the input's element
  // type and its shape the input's (symbolic dimensions bound from it).
  std::map<std::string, OnnxTensor, std::less<>> constantInputs{};

  // ----- Host streams -----

  // The InputSettings (tile set, exchange strategy) of graph inputs by name,
  // as PopART's addInputTensor takes them; the others take the defaults. A
  // name that is no graph input (a frozen one included) is
  // GraphError(InvalidInputSettings), tessera.graph.240.
  std::map<std::string, InputSettings, std::less<>> inputSettings{};

  // ----- Element types -----

  // Imports a model of double-precision tensors as float32 (the device
  // computes in float32): every double graph input and output, initializer,
  // Constant and ConstantOfShape value and Cast target becomes float32, the
  // values rounded to nearest. Off: a double input or initializer is
  // tessera.onnx.705.
  bool doubleAsFloat = false;

  // The element type of the model's float (float32) tensors on the device:
  // Float32 (the default) or Float16, which imports a float32 model as
  // float16: float initializers become float16 Variables and Constants (their
  // values rounded to the nearest half, ties to even), float graph inputs
  // float16 host streams, and every float op computes in float16, the
  // scalars and constants the import builds included. Integer and bool
  // tensors and what is folded at import (shape arithmetic) are untouched.
  // The float input of a loss (SoftmaxCrossEntropyLoss,
  // NegativeLogLikelihoodLoss: the logits or log-probabilities, and the
  // class weights) is cast to float32, so the loss and its gradient there
  // are float32, as mixed-precision training keeps them. Composes with
  // doubleAsFloat (double tensors become float, then float16). Any other
  // dtype is tessera.onnx.705.
  DType floatType = DType::Float32;

  // ----- Replication -----

  // The global replication factor of the graph (Graph's constructor
  // argument; SessionOptions::getGlobalReplicationFactor()). Must be >= 1.
  int64_t replicationFactor = 1;

  // ----- Training -----

  // Dropout in training mode with a ratio above 0 (a PyTorch export in
  // training mode): when true, each such node runs tessera's Dropout, whose
  // masks come from the seed, a step counter (state, OnnxModel::state
  // "dropout.step", advanced every run) and each element's index in the
  // global batch, so they do not depend on the replica count; they are not
  // onnxruntime's or PyTorch's masks. When false, such a node is refused
  // (tessera.onnx.705). Inference and ratio 0 pass the input through either way.
  bool randomDropout = false;
  // The seed of Dropout nodes without a `seed` attribute; each node mixes in
  // its own position so that two nodes draw different masks.
  uint64_t dropoutSeed = 0;
};

struct OnnxModel {
  Graph graph;
  // Graph inputs (host streams), in the model's order, initializers and
  // constantInputs excluded.
  std::vector<std::string> inputs;
  // Graph outputs, in the model's order; each names a tensor of `graph`.
  std::vector<std::string> outputs;
  // Every initializer of the model, in the model's order (those the graph
  // does not use included).
  std::vector<std::string> initializers;
  // The initializers that became Variables of category Weight.
  std::vector<std::string> weights;
  // The opset of the default domain the model was written for.
  int64_t opset = 0;
  // The initializers that became Variables of category OptimizerState: state
  // that ops update in place every step and no optimizer trains (the running
  // mean and variance of BatchNormalization in training mode). Checkpoints
  // hold them with the optimizer state.
  std::vector<std::string> state;
};

// True when this build can read ONNX models.
bool onnxSupported() noexcept;

// Reads and imports the model in `path`.
OnnxModel importOnnx(const std::filesystem::path& path, const OnnxImportOptions& options = {});
// Imports a serialized ModelProto; `source` names it in error messages.
OnnxModel importOnnx(std::span<const std::byte> bytes, const OnnxImportOptions& options = {},
                     std::string_view source = "<bytes>");

// Throws IoError(FileUnreadable), OnnxError(OnnxMalformed).
OnnxTensor readOnnxTensor(const std::filesystem::path& path);

// A graph input or output as the model declares it.
struct OnnxValueInfo {
  std::string name;
  // The element type of a tensor ("float", ...), else the kind of value:
  // "sequence", "optional", "map", "sparse_tensor".
  std::string dtype;
  // Per axis: the number, or the symbolic name (dim_param) when it has one;
  // "?" for an axis with neither.
  std::vector<std::string> dims;
};

struct OnnxSignature {
  std::vector<OnnxValueInfo> inputs;  // initializers excluded
  std::vector<OnnxValueInfo> outputs;
};

// The declared inputs and outputs of a model, without importing it.
OnnxSignature readOnnxSignature(const std::filesystem::path& path);

// ----- ONNX out -----

// Values for one initializer of a model: its name, its shape (the
// initializer's dims) and its values in row-major order.
struct OnnxTensorValues {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

// Writes the model `source` (the serialized ModelProto a session was imported
// from; `sourceName` names it in errors) to `destination` with each
// initializer named in `initializers` holding the given values (PopART's
// modelToHost after training): in the initializer's own element type (float
// values as they are, float16 rounded to the nearest half, double widened),
// as raw data. Nodes, opsets, inputs, outputs and metadata are the
// source's, so whatever loaded the source loads the result; ONNX's checker
// accepts it before it is written. The file is written beside `destination`
// and renamed over it, so no reader sees part of a model.
//
// Throws OnnxError(OnnxMalformed) for a source that does not parse,
// OnnxError(OnnxExportMismatch) for a name the model has no initializer of,
// a shape or count other than the initializer's, or an initializer that is
// not float, float16 or double; IoError(FileUnwritable) when the file cannot
// be written.
void writeOnnx(std::span<const std::byte> source, std::string_view sourceName,
               std::span<const OnnxTensorValues> initializers, const std::filesystem::path& destination);
// The same with the source read from the file `source`; IoError(FileUnreadable)
// when it cannot be read.
void writeOnnx(const std::filesystem::path& source, std::span<const OnnxTensorValues> initializers,
               const std::filesystem::path& destination);

}  // namespace tessera
