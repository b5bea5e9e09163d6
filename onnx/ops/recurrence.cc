// ONNX mapping of the recurrence family (lib/ops/recurrence.cc): RNN, GRU
// and LSTM nodes as ops::recurrence:
// layout 0 ([seq, batch, features], as PyTorch exports them, with a
// Transpose around the node for batch_first), the default activations, every
// direction, GRU's linear_before_reset. What the recurrences do not compute
// is refused with the node, the attribute or input and what is allowed
// (OnnxUnsupportedRecurrence).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {
namespace {

struct Cell {
  OpKind kind;
  std::vector<std::string> activations;  // ONNX's defaults, per direction
};

Cell cellOf(const std::string& op) {
  if (op == "GRU") return {OpKind::Gru, {"Sigmoid", "Tanh"}};
  if (op == "LSTM") return {OpKind::Lstm, {"Sigmoid", "Tanh", "Tanh"}};
  return {OpKind::Rnn, {"Tanh"}};
}

[[noreturn]] void refuse(const std::string& subject, std::string_view message) {
  throwOnnx(ErrorCode::OnnxUnsupportedRecurrence, subject, message);
}

}  // namespace

void Importer::mapRecurrence(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  const Cell cell = cellOf(op);
  const std::string direction = stringAttribute(node, "direction", "forward", subject);
  ops::RecurrenceParams params;
  if (direction == "forward") {
    params.direction = RecurrenceDirection::Forward;
  } else if (direction == "reverse") {
    params.direction = RecurrenceDirection::Reverse;
  } else if (direction == "bidirectional") {
    params.direction = RecurrenceDirection::Bidirectional;
  } else {
    refuse(subject,
           fmt::format("attribute direction is \"{}\"; allowed: \"forward\", \"reverse\", \"bidirectional\"",
                       direction));
  }
  const int64_t dirs = params.direction == RecurrenceDirection::Bidirectional ? 2 : 1;

  // Attributes the recurrences compute only at their defaults.
  if (const int64_t layout = intAttribute(node, "layout", 0, subject); layout != 0)
    refuse(subject,
           fmt::format("attribute layout is {}; allowed: 0 ([seq, batch, ...], as PyTorch exports; transpose "
                       "a batch-first input around the node instead)",
                       layout));
  if (findAttribute(node, "clip") != nullptr)
    refuse(subject,
           fmt::format("attribute clip ({}) is not supported; allowed: no clip (the cell state and gates "
                       "unclipped)",
                       floatAttribute(node, "clip", 0.0f, subject)));
  if (op == "LSTM") {
    if (const int64_t forget = intAttribute(node, "input_forget", 0, subject); forget != 0)
      refuse(subject, fmt::format("attribute input_forget is {}; allowed: 0", forget));
  }
  if (op == "GRU") params.linearBeforeReset = intAttribute(node, "linear_before_reset", 0, subject) != 0;
  if (const auto* a = findAttribute(node, "activations")) {
    std::vector<std::string> expected;
    for (int64_t d = 0; d < dirs; ++d)
      expected.insert(expected.end(), cell.activations.begin(), cell.activations.end());
    std::vector<std::string> given(a->strings().begin(), a->strings().end());
    if (given != expected)
      refuse(subject, fmt::format("attribute activations is [{}]; allowed: [{}] (ONNX's default for {} {})",
                                  fmt::join(given, ", "), fmt::join(expected, ", "), direction, op));
  }
  for (const char* name : {"activation_alpha", "activation_beta"})
    if (findAttribute(node, name) != nullptr)
      refuse(subject,
             fmt::format("attribute {} is not supported; allowed: none (the default activations take no "
                         "parameters)",
                         name));
  if (op == "LSTM" && node.input_size() > 7 && !node.input(7).empty())
    refuse(subject, fmt::format("input 7 (P, the peepholes, \"{}\") is not supported; allowed: no peepholes",
                                node.input(7)));

  Tensor x = operand(node, 0, subject);
  Tensor w = operand(node, 1, subject);
  Tensor r = operand(node, 2, subject);
  for (int k = 0; k < 3; ++k) requireFloat(k == 0 ? x : k == 1 ? w : r, node, k, subject);
  const auto optional = [&](int k) {
    if (k >= node.input_size() || node.input(k).empty()) return Tensor{};
    Tensor t = operand(node, k, subject);
    requireFloat(t, node, k, subject);
    return t;
  };
  if (x.shape().size() != 3 || r.shape().size() != 3)
    throwOnnx(
        ErrorCode::OnnxNodeShape, subject,
        fmt::format("X {} and R {} must be [seq, batch, input] and [num_directions, gates*hidden, hidden]",
                    shapeStr(x.shape()), shapeStr(r.shape())));
  const int64_t hidden = intAttribute(node, "hidden_size", r.shape()[2], subject);
  if (hidden != r.shape()[2])
    throwOnnx(
        ErrorCode::OnnxNodeShape, subject,
        fmt::format(
            "attribute hidden_size is {} but R {} is [num_directions, gates*hidden, hidden] with hidden "
            "{}",
            hidden, shapeStr(r.shape()), r.shape()[2]));
  // sequence_lens: every sequence must be the whole of X's sequence axis.
  if (node.input_size() > 4 && !node.input(4).empty()) {
    const Known* lengths = knownInput(node, 4);
    const int64_t steps = x.shape()[0];
    bool full = lengths != nullptr;
    if (full)
      for (int64_t k = 0; k < lengths->size(); ++k)
        full = full && static_cast<int64_t>(lengths->at(k)) == steps;
    if (!full)
      refuse(subject,
             fmt::format("input 4 (sequence_lens, \"{}\") must be known at import and equal to the {} steps "
                         "of X for every sequence; allowed: absent, or all {} (pad the sequences to one "
                         "length)",
                         node.input(4), steps, steps));
  }
  Tensor c0 = op == "LSTM" ? optional(6) : Tensor{};
  const ops::RecurrenceOutputs out =
      ops::recurrence(cell.kind, x, w, r, optional(3), optional(5), c0, params);
  setOutput(node, 0, out.y);
  setOutput(node, 1, out.yH);
  if (op == "LSTM") setOutput(node, 2, out.yC);
}

void addRecurrenceMappings(OnnxMappingTable& table) {
  // Every output is optional (Y_h alone is common); the node needs one.
  for (std::string_view op : {"RNN", "GRU", "LSTM"})
    table.add({.opType = op,
               .map = &Importer::mapRecurrence,
               .requiredInputs = 3,
               .anyOutput = true,
               .differentiable = {0, 1, 2, 3, 5, 6}});
}

}  // namespace tessera::onnx_import
