// ONNX mapping of the normalisations: BatchNormalization in training mode
// becomes the normalization family's ops (lib/ops/normalization.cc: a
// measured hot path of convolutional training, so an op of its own despite
// CONVENTIONS' "a composition gets no op"); in inference mode (the running
// statistics given), InstanceNormalization and LayerNormalization are
// compositions of reductions and elementwise ops.

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapBatchNormalization(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Over the channel axis 1: statistics over N and the spatial axes
  // (BatchNormalization in training mode: the ops BatchNormStats and
  // BatchNorm), over the spatial axes of each (n, c) (InstanceNormalization,
  // composed of reductions and elementwise ops), or the running statistics
  // given (inference, composed).
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  const Shape shape = x.shape();
  const auto rank = static_cast<int64_t>(shape.size());
  if (rank < 2)
    unsupported(fmt::format("input {} has no channel axis: [N, C, ...] expected", shapeStr(shape)));
  const double epsilon = floatAttribute(node, "epsilon", 1e-5F, subject);
  Shape channel(static_cast<std::size_t>(rank), 1);
  channel[1] = shape[1];
  auto channelOperand = [&](int k, std::string_view what) {
    Tensor t = operand(node, k, subject);
    requireFloat(t, node, k, subject);
    if (t.shape() != Shape{shape[1]})
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("{} {} must be [C] = [{}]", what, shapeStr(t.shape()), shape[1]));
    return t;
  };
  auto perChannel = [&](int k, std::string_view what) { return ops::reshape(channelOperand(k, what), channel); };
  const bool instance = op == "InstanceNormalization";
  const bool training = !instance && opset_ >= 14 && intAttribute(node, "training_mode", 0, subject) != 0;
  // Training mode on float32 and float16: the normalization family's ops (a
  // measured hot path of convolutional networks' training steps); float64
  // and InstanceNormalization stay compositions.
  const bool fused = training && x.dtype() != DType::Float64;
  int outputs = 0;
  for (int k = 0; k < node.output_size(); ++k) outputs = node.output(k).empty() ? outputs : k + 1;
  if (!instance && !training && outputs > 1)
    unsupported(
        fmt::format("{} outputs: before opset 14 the running statistics are outputs of training, "
                    "which this importer computes from opset 14 on (training_mode = 1)",
                    outputs));
  Tensor y;
  if (instance || training) {
    Tensor batchMean;
    Tensor batchVariance;
    if (fused) {
      const Tensor scale = channelOperand(1, "scale");
      const Tensor bias = channelOperand(2, "bias");
      const ops::BatchNormOutputs bn = ops::batchNormTraining(x, scale, bias, epsilon);
      y = bn.y;
      batchMean = bn.mean;
      batchVariance = bn.variance;
    } else {
      const Tensor scale = perChannel(1, "scale");
      const Tensor bias = perChannel(2, "bias");
      std::vector<int64_t> axes;
      for (int64_t a = instance ? 2 : 0; a < rank; ++a)
        if (a != 1) axes.push_back(a);
      if (axes.empty()) unsupported("InstanceNormalization of an input without spatial axes");
      const Tensor mean = ops::reduceMean(x, axes, true);
      const Tensor centred = ops::sub(x, mean);
      const Tensor variance = ops::reduceMean(ops::mul(centred, centred), axes, true);
      y = ops::add(
          ops::mul(ops::div(centred, ops::sqrt(ops::add(variance, scalar(epsilon, variance.dtype())))), scale),
          bias);
      if (training) {
        batchMean = ops::reshape(mean, {shape[1]});
        batchVariance = ops::reshape(variance, {shape[1]});
      }
    }
    if (training && outputs > 1) {
      // ONNX's running statistics: input * momentum + batch * (1 - momentum).
      const double momentum = floatAttribute(node, "momentum", 0.9F, subject);
      if (knownInput(node, 3) != nullptr || knownInput(node, 4) != nullptr) {
        // Initializers (a PyTorch export in training mode): the model's
        // state, updated in place every step as PyTorch updates its
        // buffers, with the unbiased batch variance. The outputs are the
        // updated values.
        const int64_t count = numElements(shape) / shape[1];
        if (count < 2)
          unsupported(
              fmt::format("{} values per channel: the unbiased variance of the running statistics "
                          "needs at least 2",
                          count));
        const Tensor runningMean = stateVariable(node, 3, subject);
        const Tensor runningVariance = stateVariable(node, 4, subject);
        const Tensor unbiased = ops::mul(
            batchVariance,
            scalar(static_cast<double>(count) / static_cast<double>(count - 1), batchVariance.dtype()));
        setOutput(node, 1, ops::scaledAddInplace(runningMean, batchMean, momentum, 1.0 - momentum));
        if (outputs > 2)
          setOutput(node, 2, ops::scaledAddInplace(runningVariance, unbiased, momentum, 1.0 - momentum));
      } else {
        // Computed inputs (ONNX's node tests): the spec's formula with the
        // population variance.
        auto running = [&](int k, const Tensor& batch) {
          const Tensor input = operand(node, k, subject);
          requireFloat(input, node, k, subject);
          return ops::add(ops::mul(input, scalar(momentum, input.dtype())),
                          ops::mul(batch, scalar(1.0 - momentum, batch.dtype())));
        };
        if (!node.output(1).empty()) setOutput(node, 1, running(3, batchMean));
        if (outputs > 2 && !node.output(2).empty()) setOutput(node, 2, running(4, batchVariance));
      }
    }
  } else {
    const Tensor scale = perChannel(1, "scale");
    const Tensor bias = perChannel(2, "bias");
    const Tensor mean = perChannel(3, "mean");
    const Tensor variance = perChannel(4, "var");
    y = ops::add(ops::mul(ops::div(ops::sub(x, mean),
                                   ops::sqrt(ops::add(variance, scalar(epsilon, variance.dtype())))),
                          scale),
                 bias);
  }
  setOutput(node, 0, y);
}

void Importer::mapLayerNormalization(const onnx::NodeProto& node, const std::string& subject) {
  // Composed of the existing ops (CONVENTIONS: a composition gets no op of
  // its own): statistics over the axes from `axis` on, in float32.
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  Tensor scale = operand(node, 1, subject);
  requireFloat(scale, node, 1, subject);
  const auto rank = static_cast<int64_t>(x.shape().size());
  const int64_t axis = normalizeAxis(intAttribute(node, "axis", -1, subject), rank, subject);
  const double epsilon = floatAttribute(node, "epsilon", 1e-5F, subject);
  std::vector<int64_t> axes;
  for (int64_t a = axis; a < rank; ++a) axes.push_back(a);
  const Tensor mean = ops::reduceMean(x, axes, true);
  const Tensor centred = ops::sub(x, mean);
  const Tensor variance = ops::reduceMean(ops::mul(centred, centred), axes, true);
  const Tensor invStdDev =
      ops::reciprocal(ops::sqrt(ops::add(variance, ops::scalar(graph_, epsilon, x.dtype()))));
  Tensor y = ops::mul(ops::mul(centred, invStdDev), scale);
  if (node.input_size() > 2 && !node.input(2).empty()) {
    Tensor bias = operand(node, 2, subject);
    requireFloat(bias, node, 2, subject);
    y = ops::add(y, bias);
  }
  setOutput(node, 0, y);
  if (node.output_size() > 1 && !node.output(1).empty()) setOutput(node, 1, mean);
  if (node.output_size() > 2 && !node.output(2).empty()) setOutput(node, 2, invStdDev);
}

void addNormalizationMappings(OnnxMappingTable& table) {
  table.add({.opType = "BatchNormalization",
             .map = &Importer::mapBatchNormalization,
             .requiredInputs = 5,
             .differentiable = {0, 1, 2}});
  table.add({.opType = "InstanceNormalization",
             .map = &Importer::mapBatchNormalization,
             .requiredInputs = 3,
             .differentiable = {0, 1, 2}});
  table.add({.opType = "LayerNormalization",
             .map = &Importer::mapLayerNormalization,
             .requiredInputs = 2,
             .differentiable = {0, 1, 2}});
}

}  // namespace tessera::onnx_import
