// Training a session on toy data (toy_data.hpp) step by step, and reading
// what it trained, for the session tests that compare runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/toy_data.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/sessions/session.hpp"

namespace tessera::test {

// Runs steps first .. first + count - 1 of `session`, step s on samples
// [s * batch, (s + 1) * batch) of `data` (the global batch: every replica
// and accumulation step's samples); returns each step's mean loss.
inline std::vector<double> trainToySteps(TrainingSession& session, const ToyData& data, int64_t batch,
                                         int64_t first, int64_t count) {
  const auto features = static_cast<int64_t>(data.images.size() / data.labels.size());
  std::vector<double> losses;
  for (int64_t s = first; s < first + count; ++s) {
    session.run(
        {StepInput("input", std::span<const float>(data.images)
                                .subspan(static_cast<size_t>(s * batch * features),
                                         static_cast<size_t>(batch * features))),
         StepInput("labels", std::span<const int32_t>(data.labels)
                                 .subspan(static_cast<size_t>(s * batch), static_cast<size_t>(batch)))});
    losses.push_back(session.meanLoss());
  }
  return losses;
}

// Every weight and every optimizer state variable of `session` but the
// optimizer's hyper-parameters ("optimizer.*"), sorted by name.
inline std::vector<std::pair<std::string, HostTensor>> trainedVariables(const TrainingSession& session) {
  std::vector<std::pair<std::string, HostTensor>> variables = session.readWeights();
  for (const TensorNode& node : session.graph().tensors()) {
    if (node.category == TensorCategory::OptimizerState && node.producer != kNoOp &&
        session.graph().op(node.producer).kind == OpKind::Variable && !node.name.starts_with("optimizer.")) {
      variables.emplace_back(node.name, session.readVariable(node.name));
    }
  }
  std::sort(variables.begin(), variables.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return variables;
}

// Every variable a checkpoint of `session` saves, by name.
inline std::map<std::string, HostTensor> checkpointValues(const TrainingSession& session) {
  std::map<std::string, HostTensor> values;
  for (CheckpointTensor& tensor : makeCheckpoint(session).tensors)
    values.emplace(tensor.name, std::move(tensor.value));
  return values;
}

}  // namespace tessera::test
