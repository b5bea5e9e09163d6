// tessera checkpoint inspect FILE [--json]
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/lib/json.hpp"

namespace tessera::cli {
namespace {

struct InspectArgs {
  std::string path;
  bool json = false;
};

// Long metadata values (JSON documents) are cut in the table; --json has
// them whole.
constexpr std::size_t kShownValueChars = 72;

std::string shortened(const std::string& value) {
  if (value.size() <= kShownValueChars) return value;
  return fmt::format("{}... ({} characters)", value.substr(0, kShownValueChars), value.size());
}

// The safetensors name of a dtype.
std::string dtypeName(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::Float16: return "F16";
    case DType::Int32: return "I32";
    case DType::Float64: return "F64";
  }
  return "F32";
}

// A tensor's bytes in the file, from its shape (inspect reads no data).
uint64_t tensorBytes(const CheckpointTensor& tensor) {
  uint64_t elements = 1;
  for (const int64_t dim : tensor.value.shape) elements *= static_cast<uint64_t>(dim);
  return static_cast<uint64_t>(dtypeBytes(tensor.dtype)) * elements;
}

nlohmann::json inspectJson(const std::string& path, const Checkpoint& checkpoint) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const CheckpointTensor& tensor : checkpoint.tensors) {
    tensors.push_back({{"name", tensor.name},
                       {"dtype", dtypeName(tensor.dtype)},
                       {"shape", tensor.value.shape},
                       {"category", toString(tensor.category)},
                       {"shardLayoutVersion", tensor.shardLayoutVersion},
                       {"bytes", tensorBytes(tensor)}});
  }
  return {{"file", path},
          {"bytes", std::filesystem::file_size(path)},
          {"formatVersion", checkpoint.formatVersion},
          {"tesseraVersion", checkpoint.tesseraVersion},
          {"step", checkpoint.step},
          {"optimizerStep", checkpoint.optimizerStep},
          {"optimizer", nlohmann::json(checkpoint.optimizer)},
          {"sessionOptions", parseJsonDocument(checkpoint.sessionOptions, "sessionOptions")},
          {"sessionOptionsHash", checkpoint.sessionOptionsHash},
          {"tensors", std::move(tensors)},
          {"metadata", checkpoint.extraMetadata}};
}

void printInspection(const std::string& path, const Checkpoint& checkpoint) {
  std::string optimizer = fmt::format("{}", checkpoint.optimizer.type);
  const nlohmann::json options = checkpoint.optimizer;
  for (const auto& [key, value] : options.items()) {
    if (key != "type") optimizer += fmt::format("  {} {}", key, value.dump());
  }
  uint64_t totalBytes = 0;
  std::vector<std::vector<std::string>> rows;
  for (const CheckpointTensor& tensor : checkpoint.tensors) {
    const uint64_t bytes = tensorBytes(tensor);
    totalBytes += bytes;
    rows.push_back({tensor.name, dtypeName(tensor.dtype), shapeStr(tensor.value.shape),
                    std::string(toString(tensor.category)), std::to_string(bytes)});
  }
  fmt::print("{}",
             formatTable({"file", path},
                         {
                             {"bytes", std::to_string(std::filesystem::file_size(path))},
                             {"format", fmt::format("tessera.checkpoint {} (written by tessera {})",
                                                    checkpoint.formatVersion, checkpoint.tesseraVersion)},
                             {"step", std::to_string(checkpoint.step)},
                             {"optimizer", optimizer},
                             {"options", checkpoint.sessionOptionsHash},
                         }));
  fmt::print("\n{}", formatTable({"tensor", "dtype", "shape", "category", "bytes"}, rows));
  fmt::print("{} tensors, {} bytes\n", checkpoint.tensors.size(), totalBytes);
  if (checkpoint.extraMetadata.empty()) return;
  std::vector<std::vector<std::string>> metadata;
  for (const auto& [key, value] : checkpoint.extraMetadata) metadata.push_back({key, shortened(value)});
  fmt::print("\n{}", formatTable({"metadata", "value"}, metadata));
}

}  // namespace

Action attachCheckpoint(CLI::App& command) {
  command.require_subcommand(1);
  CLI::App* inspect = command.add_subcommand(
      "inspect", "List a checkpoint's tensors (name, dtype, shape, category, bytes) and its metadata");
  auto args = std::make_shared<InspectArgs>();
  inspect->add_option("FILE", args->path, "Checkpoint file (.safetensors)")->required();
  inspect->add_flag("--json", args->json, "Print one JSON object");
  return [args] {
    // The only subcommand, which CLI11 requires.
    // The header alone: a file of any size is listed reading at most the
    // header's bytes (the parser checks the byte ranges against its size).
    const Checkpoint checkpoint = readCheckpointHeader(args->path);
    if (args->json) {
      printJson(inspectJson(args->path, checkpoint));
    } else {
      printInspection(args->path, checkpoint);
    }
    return kExitOk;
  };
}

}  // namespace tessera::cli
