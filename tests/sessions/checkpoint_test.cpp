#include "tessera/app/checkpoint.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atomic_file.hpp"
#include "half.hpp"
#include "support/process.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/app/trainer.hpp"
#include "support/toy_training.hpp"
#include "test_support.hpp"

using namespace tessera;
using nlohmann::json;

namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Sessions on a toy problem: 12 features, 4 classes, 8 samples per step.
// ---------------------------------------------------------------------------

constexpr int64_t kFeatures = 12;
constexpr int64_t kGlobalBatch = 8;

using test::ToyData;

ToyData toyData(int64_t samples) { return test::toyData(samples, kFeatures, 99); }

ModelConfig toyModel(int64_t hidden = 8, DType dtype = DType::Float32) {
  ModelConfig model;
  model.layers = {kFeatures, hidden, 4};
  model.dtype = dtype;
  return model;
}

OptimizerConfig sgdMomentum(double momentum = 0.9) {
  OptimizerConfig config;
  config.sgd.learningRate = 0.1;
  config.sgd.momentum = momentum;
  return config;
}

OptimizerConfig adam() {
  OptimizerConfig config;
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.01;
  return config;
}

struct Setup {
  int64_t replicas = 1;
  bool rts = false;  // weights and optimizer state sharded over Consecutive(2) domains
  int64_t accumulation = 1;
  bool offChip = false;  // optimizer state in streaming memory
};

SessionOptions optionsFor(const Setup& setup) {
  SessionOptions options;
  options.enableReplicatedGraphs = setup.replicas > 1;
  options.replicatedGraphCount = setup.replicas;
  options.enableGradientAccumulation = setup.accumulation > 1;
  options.accumulationFactor = setup.accumulation;
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  if (setup.rts) {
    for (TensorCategory category : {TensorCategory::Weight, TensorCategory::OptimizerState}) {
      TensorLocationSettings& settings = options.locationSettings(category);
      settings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
      settings.location.shardingDomain = CommGroup(CommGroupType::Consecutive, 2);
      settings.minElementsForReplicatedTensorSharding = 4;
    }
  }
  if (setup.offChip) {
    options.optimizerStateTensorLocationSettings.location.storage = TensorStorage::OffChip;
  }
  return options;
}

TrainingSession makeSession(const Setup& setup, const OptimizerConfig& optimizer, int64_t hidden = 8,
                            DType dtype = DType::Float32) {
  const SessionOptions options = optionsFor(setup);
  MlpGraph mlp =
      buildMlp(toyModel(hidden, dtype), kGlobalBatch / (setup.replicas * setup.accumulation), setup.replicas, 3);
  return TrainingSession(std::move(mlp.graph), mlp.loss, makeOptimizer(optimizer), options, makeSimDevice());
}

// Runs steps [first, first + count) of the toy data, the same 8 samples per
// step whatever the split into replicas and micro-batches.
std::vector<double> runSteps(TrainingSession& session, const ToyData& data, int64_t first, int64_t count) {
  return test::trainToySteps(session, data, kGlobalBatch, first, count);
}

// The largest difference relative to the magnitude of what is compared:
// per loss, and per tensor relative to its largest element.
double worstLossDifference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

double worstTensorDifference(const std::map<std::string, HostTensor>& a,
                             const std::map<std::string, HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& entry : b) {
    const std::string& name = entry.first;
    const HostTensor& tensor = entry.second;
    INFO(name);
    REQUIRE(a.count(name) == 1);
    const HostTensor& other = a.at(name);
    REQUIRE(other.shape == tensor.shape);
    double scale = 0;
    for (float v : tensor.data) scale = std::max(scale, std::abs(static_cast<double>(v)));
    for (size_t i = 0; i < tensor.data.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(other.data[i]) - tensor.data[i]) / scale);
    }
  }
  return worst;
}

bool isSharded(const TrainingSession& session, const std::string& name) {
  return !session.graph().tensor(session.graph().find(name)).metaShape.empty();
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

// A small checkpoint of every kind of tensor, built by hand.
Checkpoint handMade() {
  Checkpoint checkpoint;
  checkpoint.tesseraVersion = "0.1.0";
  checkpoint.step = 7;
  checkpoint.optimizerStep = 7;
  checkpoint.optimizer = sgdMomentum();
  checkpoint.sessionOptions = json(SessionOptions{}).dump();
  checkpoint.sessionOptionsHash = sessionOptionsHash(SessionOptions{});
  checkpoint.tensors = {
      {"a", DType::Float32, TensorCategory::Weight, 1,
       HostTensor{{2, 3}, {1.5f, -2, 3, 0.25f, 5e-30f, -0.0f}}},
      {"a.momentum", DType::Float32, TensorCategory::OptimizerState, 1,
       HostTensor{{2, 3}, {0, 1, 2, 3, 4, 5}}},
      {"c", DType::Int32, TensorCategory::Weight, 1, HostTensor{{2}, {-7, 123456}}},
  };
  checkpoint.extraMetadata = {{"note", "hand made"}};
  return checkpoint;
}

// A file split into its header (parsed) and data section, to be damaged and
// put together again.
struct Parts {
  json header;
  std::vector<uint8_t> data;
};

Parts split(const std::vector<uint8_t>& bytes) {
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[static_cast<size_t>(i)];
  Parts parts;
  parts.header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(length));
  parts.data.assign(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(length), bytes.end());
  return parts;
}

std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::vector<uint8_t> assemble(const Parts& parts) { return assemble(parts.header.dump(), parts.data); }

std::vector<uint8_t> withLength(std::vector<uint8_t> bytes, uint64_t length) {
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(length >> (8 * i));
  return bytes;
}

std::vector<std::string> filesIn(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

// ---------------------------------------------------------------------------
// Format
// ---------------------------------------------------------------------------

TEST_CASE("a checkpoint is a safetensors file with tessera's metadata") {
  const Checkpoint checkpoint = handMade();
  const std::vector<uint8_t> bytes = encodeCheckpoint(checkpoint);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[static_cast<size_t>(i)];
  CHECK(length % 8 == 0);  // the data starts 8-byte aligned
  const Parts parts = split(bytes);
  CHECK(parts.data.size() == 4 * (6 + 6 + 2));
  CHECK(parts.header["a"] == json{{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}});
  CHECK(parts.header["a.momentum"]["data_offsets"] == json{24, 48});
  CHECK(parts.header["c"] == json{{"dtype", "I32"}, {"shape", {2}}, {"data_offsets", {48, 56}}});
  // Little-endian data: 1.5f is 0x3fc00000, -7 is 0xfffffff9.
  CHECK(std::vector<uint8_t>(parts.data.begin(), parts.data.begin() + 4) ==
        std::vector<uint8_t>{0, 0, 0xc0, 0x3f});
  CHECK(std::vector<uint8_t>(parts.data.begin() + 48, parts.data.begin() + 52) ==
        std::vector<uint8_t>{0xf9, 0xff, 0xff, 0xff});

  const json& metadata = parts.header["__metadata__"];
  CHECK(metadata["format"] == "tessera.checkpoint");
  CHECK(metadata["formatVersion"] == "1");
  CHECK(metadata["tesseraVersion"] == "0.1.0");
  CHECK(metadata["step"] == "7");
  CHECK(metadata["optimizerStep"] == "7");
  CHECK(json::parse(metadata["optimizer"].get<std::string>()) == json{{"type", "SGD"},
                                                                      {"learningRate", 0.1},
                                                                      {"momentum", 0.9},
                                                                      {"dampening", 0.0},
                                                                      {"weightDecay", 0.0},
                                                                      {"nesterov", false},
                                                                      {"lossScaling", 1.0},
                                                                      {"accumType", "float32"},
                                                                      {"accl1Type", "float32"},
                                                                      {"masterWeights", true}});
  CHECK(metadata["sessionOptions"] == json(SessionOptions{}).dump());
  CHECK(metadata["sessionOptionsHash"] == sessionOptionsHash(SessionOptions{}));
  CHECK(json::parse(metadata["tensors"].get<std::string>()) ==
        json{{"a", {{"category", "Weight"}, {"shardLayoutVersion", 1}}},
             {"a.momentum", {{"category", "OptimizerState"}, {"shardLayoutVersion", 1}}},
             {"c", {{"category", "Weight"}, {"shardLayoutVersion", 1}}}});
  CHECK(metadata["note"] == "hand made");

  CHECK(decodeCheckpoint(bytes, "hand.safetensors") == checkpoint);
}

TEST_CASE("float16 tensors are stored as F16 with their exact half bits") {
  // Every half that is not a NaN (a NaN stays a NaN, its payload quieted).
  std::vector<float> halves;
  std::vector<uint16_t> bits;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0) continue;
    bits.push_back(static_cast<uint16_t>(b));
    halves.push_back(halfToFloat(static_cast<uint16_t>(b)));
  }
  Checkpoint checkpoint = handMade();
  checkpoint.tensors.push_back({"h", DType::Float16, TensorCategory::Weight, 1,
                                HostTensor{{static_cast<int64_t>(halves.size())}, halves}});
  checkpoint.tensors.push_back(
      {"h.master", DType::Float32, TensorCategory::OptimizerState, 1, HostTensor{{2}, {0.1f, -3.0f}}});
  const std::vector<uint8_t> bytes = encodeCheckpoint(checkpoint);
  const Parts parts = split(bytes);
  CHECK(parts.header["h"]["dtype"] == "F16");
  CHECK(parts.header["h"]["shape"] == json{halves.size()});
  const uint64_t begin = parts.header["h"]["data_offsets"][0].get<uint64_t>();
  CHECK(parts.header["h"]["data_offsets"][1].get<uint64_t>() - begin == 2 * halves.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < bits.size(); ++i) {
    const auto stored = static_cast<uint16_t>(parts.data[begin + 2 * i] | parts.data[begin + 2 * i + 1] << 8);
    wrong += stored != bits[i];
  }
  CHECK(wrong == 0);
  CHECK(parts.header["h.master"]["dtype"] == "F32");
  // Read back: the same values, bit for bit (-0 included).
  const Checkpoint read = decodeCheckpoint(bytes, "half.safetensors");
  CHECK(read == checkpoint);
  const std::vector<float>& values = read.tensors.at(3).value.data;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    differing += std::bit_cast<uint32_t>(values[i]) != std::bit_cast<uint32_t>(halves[i]);
  CHECK(differing == 0);

  // A value that is not a half (a hand-made checkpoint) is rounded to nearest
  // even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  Checkpoint rounded = handMade();
  rounded.tensors = {{"r", DType::Float16, TensorCategory::Weight, 1,
                      HostTensor{{3}, {1.0f + 0x1.0p-11f, 1.0f + 0x1.8p-11f, 70000.0f}}}};
  CHECK(decodeCheckpoint(encodeCheckpoint(rounded), "r").tensors.at(0).value.data ==
        std::vector<float>{1.0f, 1.0f + 0x1.0p-10f, std::numeric_limits<float>::infinity()});
}

TEST_CASE("a damaged F16 payload is refused like an F32 one") {
  Checkpoint checkpoint = handMade();
  checkpoint.tensors = {{"h", DType::Float16, TensorCategory::Weight, 1, HostTensor{{3}, {1, 2, 3}}}};
  const std::vector<uint8_t> valid = encodeCheckpoint(checkpoint);
  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    const char* message;
  };
  Parts odd = split(valid);
  odd.header["h"]["data_offsets"] = {0, 5};
  odd.data.pop_back();
  Parts f32Bytes = split(valid);
  f32Bytes.header["h"]["shape"] = {2};
  Parts f64 = split(valid);
  f64.header["h"]["dtype"] = "BF16";
  const std::vector<Case> cases = {
      {"an odd byte count", assemble(odd), "has shape [3] of F16 = 6 bytes but its data_offsets 0..5 span 5 bytes"},
      {"a shape that disagrees", assemble(f32Bytes), "has shape [2] of F16 = 4 bytes but its data_offsets 0..6 span 6 bytes"},
      {"cut short", std::vector<uint8_t>(valid.begin(), valid.end() - 1),
       "tensor \"h\" claims bytes 0..6 but the data section has 5 bytes"},
      {"another 2-byte type", assemble(f64), "tensor \"h\" has dtype BF16; tessera checkpoints hold F32, F16 and I32 only"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<IoError>([&] { decodeCheckpoint(c.bytes, "h.safetensors"); });
    REQUIRE(error);
    INFO(std::string(error->what()));
    CHECK(error->subject() == "h.safetensors");
    CHECK(error->code() == (std::string_view(c.name) == "another 2-byte type" ? ErrorCode::UnsupportedCheckpoint
                                                                              : ErrorCode::CorruptCheckpoint));
    CHECK(error->detail().find(c.message) != std::string::npos);
  }
}

TEST_CASE("the options hash is a stable FNV-1a of the canonical options dump") {
  SessionOptions options;
  const std::string hash = sessionOptionsHash(options);
  CHECK(hash.starts_with("fnv1a64:"));
  CHECK(hash.size() == 8 + 16);
  CHECK(sessionOptionsHash(options) == hash);
  options.replicatedGraphCount = 2;
  options.enableReplicatedGraphs = true;
  CHECK(sessionOptionsHash(options) != hash);
  // The reader checks the hash against the recorded options text: FNV-1a 64
  // of "{}" is 08f44b07b5901a25 (offset basis cbf29ce484222325, prime
  // 100000001b3).
  Checkpoint checkpoint = handMade();
  checkpoint.sessionOptions = "{}";
  checkpoint.sessionOptionsHash = "fnv1a64:08f44b07b5901a25";
  CHECK(decodeCheckpoint(encodeCheckpoint(checkpoint), "x") == checkpoint);
  checkpoint.sessionOptionsHash = "fnv1a64:08f44b07b5901a26";
  CHECK_THROWS_AS(decodeCheckpoint(encodeCheckpoint(checkpoint), "x"), IoError);
}

TEST_CASE("reading is strict: every defect is an IoError naming the file and the problem") {
  const std::vector<uint8_t> valid = encodeCheckpoint(handMade());
  const auto damaged = [&valid](const std::function<void(Parts&)>& change) {
    Parts parts = split(valid);
    change(parts);
    return assemble(parts);
  };
  const auto metadata = [&damaged](const std::function<void(json&)>& change) {
    return damaged([&change](Parts& parts) { change(parts.header["__metadata__"]); });
  };
  const auto tensorsMetadata = [&metadata](const std::function<void(json&)>& change) {
    return metadata([&change](json& m) {
      json tensors = json::parse(m["tensors"].get<std::string>());
      change(tensors);
      m["tensors"] = tensors.dump();
    });
  };
  const std::string header = split(valid).header.dump();
  const std::vector<uint8_t> data = split(valid).data;

  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    ErrorCode code;
    const char* message;  // a part of the detail
  };
  const std::vector<Case> cases = {
      // The container.
      {"empty file", {}, ErrorCode::CorruptCheckpoint, "the file has 0 byte(s)"},
      {"shorter than the length field", {1, 0, 0}, ErrorCode::CorruptCheckpoint, "8-byte header length"},
      {"header length past the end", withLength(valid, valid.size()), ErrorCode::CorruptCheckpoint,
       "the file is truncated"},
      {"absurd header length", withLength(valid, uint64_t{1} << 40), ErrorCode::CorruptCheckpoint,
       "over the limit of 67108864"},
      {"truncated data", std::vector<uint8_t>(valid.begin(), valid.end() - 4), ErrorCode::CorruptCheckpoint,
       "tensor \"c\" claims bytes 48..56 but the data section has 52 bytes"},
      {"invalid JSON", assemble("{\"a\": ", data), ErrorCode::CorruptCheckpoint,
       "the header is not valid JSON"},
      {"header not an object", assemble("[1, 2]", data), ErrorCode::CorruptCheckpoint, "not a JSON object"},
      {"duplicate tensor",
       assemble("{\"c\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[48,56]}," + header.substr(1),
                data),
       ErrorCode::CorruptCheckpoint, "duplicate key"},
      {"unknown dtype", damaged([](Parts& p) { p.header["c"]["dtype"] = "F33"; }),
       ErrorCode::CorruptCheckpoint, "\"F33\" is not a safetensors dtype"},
      {"dtype not a string", damaged([](Parts& p) { p.header["c"]["dtype"] = 4; }),
       ErrorCode::CorruptCheckpoint, "dtype is 4, not a string"},
      {"negative dimension", damaged([](Parts& p) { p.header["c"]["shape"] = {-2}; }),
       ErrorCode::CorruptCheckpoint, "expected non-negative integers"},
      {"fractional dimension", damaged([](Parts& p) { p.header["c"]["shape"] = {2.0}; }),
       ErrorCode::CorruptCheckpoint, "expected non-negative integers"},
      {"shape overflows", damaged([](Parts& p) {
         p.header["c"]["shape"] = {uint64_t{1} << 32, uint64_t{1} << 32};
       }),
       ErrorCode::CorruptCheckpoint, "overflows a 64-bit size"},
      {"shape overflows behind a zero", damaged([](Parts& p) {
         p.header["c"]["shape"] = {0, uint64_t{1} << 62, 4};
       }),
       ErrorCode::CorruptCheckpoint, "overflows a 64-bit size"},
      {"shape does not match the byte range", damaged([](Parts& p) { p.header["c"]["shape"] = {3}; }),
       ErrorCode::CorruptCheckpoint,
       "tensor \"c\" has shape [3] of I32 = 12 bytes but its data_offsets 48..56 span 8 bytes"},
      {"offsets out of range", damaged([](Parts& p) {
         p.header["c"]["data_offsets"] = {48, 64};
       }),
       ErrorCode::CorruptCheckpoint, "claims bytes 48..64 but the data section has 56 bytes"},
      {"offsets reversed", damaged([](Parts& p) {
         p.header["c"]["data_offsets"] = {56, 48};
       }),
       ErrorCode::CorruptCheckpoint, "end before they begin"},
      {"offsets not a pair", damaged([](Parts& p) { p.header["c"]["data_offsets"] = {48}; }),
       ErrorCode::CorruptCheckpoint, "expected [BEGIN, END]"},
      {"overlapping tensors", damaged([](Parts& p) {
         p.header["a.momentum"]["data_offsets"] = {0, 24};
       }),
       ErrorCode::CorruptCheckpoint, "overlaps tensor"},
      {"a gap between tensors", damaged([](Parts& p) {
         p.header["c"]["data_offsets"] = {52, 60};
         p.data.insert(p.data.end(), 4, 0);
       }),
       ErrorCode::CorruptCheckpoint, "bytes 48..52 of the data section belong to no tensor"},
      {"bytes after the last tensor", damaged([](Parts& p) { p.data.insert(p.data.end(), 4, 0); }),
       ErrorCode::CorruptCheckpoint, "bytes 56..60 at the end of the data section belong to no tensor"},
      {"unknown key in a tensor", damaged([](Parts& p) { p.header["c"]["scale"] = 1; }),
       ErrorCode::CorruptCheckpoint, "unknown key \"scale\""},
      {"missing shape", damaged([](Parts& p) { p.header["c"].erase("shape"); }), ErrorCode::CorruptCheckpoint,
       "tensor \"c\" has no \"shape\""},
      {"metadata not an object", damaged([](Parts& p) { p.header["__metadata__"] = 3; }),
       ErrorCode::CorruptCheckpoint, "not an object of strings"},
      {"metadata value not a string", metadata([](json& m) { m["step"] = 7; }), ErrorCode::CorruptCheckpoint,
       "metadata values must be strings"},
      // Tessera's metadata.
      {"no metadata", damaged([](Parts& p) { p.header.erase("__metadata__"); }),
       ErrorCode::UnsupportedCheckpoint, "not a tessera checkpoint"},
      {"another format", metadata([](json& m) { m["format"] = "pt"; }), ErrorCode::UnsupportedCheckpoint,
       "metadata \"format\" is \"pt\""},
      {"a newer format version", metadata([](json& m) { m["formatVersion"] = "2"; }),
       ErrorCode::UnsupportedCheckpoint, "format version 2 is newer"},
      {"format version not a number", metadata([](json& m) { m["formatVersion"] = "one"; }),
       ErrorCode::CorruptCheckpoint, "expected a non-negative integer"},
      {"missing step", metadata([](json& m) { m.erase("step"); }), ErrorCode::CorruptCheckpoint,
       "metadata has no \"step\""},
      {"negative step", metadata([](json& m) { m["step"] = "-1"; }), ErrorCode::CorruptCheckpoint,
       "\"step\" is \"-1\""},
      {"step with trailing characters", metadata([](json& m) { m["step"] = "7x"; }),
       ErrorCode::CorruptCheckpoint, "\"step\" is \"7x\""},
      {"optimizer step differs", metadata([](json& m) { m["optimizerStep"] = "6"; }),
       ErrorCode::CorruptCheckpoint, "\"optimizerStep\" is 6 but \"step\" is 7"},
      {"optimizer not JSON", metadata([](json& m) { m["optimizer"] = "{"; }), ErrorCode::CorruptCheckpoint,
       "metadata \"optimizer\" is not valid JSON"},
      {"optimizer out of range",
       metadata([](json& m) { m["optimizer"] = R"({"type": "SGD", "learningRate": -1})"; }),
       ErrorCode::CorruptCheckpoint, "not a valid optimizer (/learningRate"},
      {"options hash differs",
       metadata([](json& m) { m["sessionOptionsHash"] = "fnv1a64:0000000000000000"; }),
       ErrorCode::CorruptCheckpoint, "\"sessionOptions\" hashes to"},
      {"a tensor without metadata", tensorsMetadata([](json& t) { t.erase("c"); }),
       ErrorCode::CorruptCheckpoint, "tensor \"c\" has no entry in metadata \"tensors\""},
      {"metadata of a tensor not in the file", tensorsMetadata([](json& t) { t["z"] = t["c"]; }),
       ErrorCode::CorruptCheckpoint, "describes tensor \"z\", which the file does not hold"},
      {"an accumulator", tensorsMetadata([](json& t) { t["c"]["category"] = "Accumulator"; }),
       ErrorCode::CorruptCheckpoint, "expected \"Weight\" or \"OptimizerState\""},
      {"an unknown category", tensorsMetadata([](json& t) { t["c"]["category"] = "weight"; }),
       ErrorCode::CorruptCheckpoint, "metadata category is \"weight\""},
      {"shard layout version 0", tensorsMetadata([](json& t) { t["c"]["shardLayoutVersion"] = 0; }),
       ErrorCode::CorruptCheckpoint, "expected an integer >= 1"},
      {"a newer shard layout", tensorsMetadata([](json& t) { t["c"]["shardLayoutVersion"] = 2; }),
       ErrorCode::UnsupportedCheckpoint, "shard layout version 2, newer"},
      {"a dtype tessera does not hold", damaged([](Parts& p) {
         p.header["c"]["dtype"] = "BF16";
         p.header["c"]["shape"] = {4};
       }),
       ErrorCode::UnsupportedCheckpoint,
       "tensor \"c\" has dtype BF16; tessera checkpoints hold F32, F16 and I32 only"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<IoError>([&] { decodeCheckpoint(c.bytes, "case.safetensors"); });
    REQUIRE_MESSAGE(error, "accepted: ", c.name);
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == "case.safetensors");
    CHECK(error->detail().find(c.message) != std::string::npos);
  }
}

TEST_CASE("damaged bytes are rejected with an IoError, never anything else") {
  const std::vector<uint8_t> valid = encodeCheckpoint(handMade());
  // Every truncation.
  for (size_t size = 0; size < valid.size(); ++size) {
    INFO("size " << size);
    const std::vector<uint8_t> cut(valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(size));
    CHECK_THROWS_AS(decodeCheckpoint(cut, "cut"), IoError);
  }
  // Random byte changes: either a valid checkpoint (a changed data byte) or
  // an IoError.
  std::mt19937_64 random(7);
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> bytes = valid;
    for (int k = 0; k < 1 + i % 3; ++k) {
      bytes[random() % bytes.size()] = static_cast<uint8_t>(random());
    }
    try {
      decodeCheckpoint(bytes, "flipped");
    } catch (const IoError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 1000);
}

// ---------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------

TEST_CASE(
    "a checkpoint holds weights and optimizer state as logical tensors, not hyper-parameters or "
    "accumulators") {
  Setup setup{4, true, 1};
  const TrainingSession sharded = makeSession(setup, adam());
  REQUIRE(isSharded(sharded, "W0"));
  REQUIRE(isSharded(sharded, "W0.adamM"));
  const Checkpoint checkpoint = makeCheckpoint(sharded);
  std::vector<std::string> names;
  for (const CheckpointTensor& t : checkpoint.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"W0", "W0.adamM", "W0.adamV", "W1", "W1.adamM", "W1.adamV", "b0",
                                          "b0.adamM", "b0.adamV", "b1", "b1.adamM", "b1.adamV"});
  for (const CheckpointTensor& t : checkpoint.tensors) {
    INFO(t.name);
    CHECK(t.category ==
          (t.name.find('.') == std::string::npos ? TensorCategory::Weight : TensorCategory::OptimizerState));
    CHECK(t.shardLayoutVersion == ShardLayout::kVersion);
  }
  const auto w0 = std::find_if(checkpoint.tensors.begin(), checkpoint.tensors.end(),
                               [](const CheckpointTensor& t) { return t.name == "W0"; });
  CHECK(w0->value.shape == Shape{kFeatures, 8});
  CHECK(w0->value == sharded.readVariable("W0", RetrievalMode::OnePerGroup));
  CHECK(checkpoint.optimizer == adam());
  CHECK(checkpoint.sessionOptionsHash == sessionOptionsHash(optionsFor(setup)));

  // Accumulators carry nothing between steps: the first micro-batch of a
  // step overwrites them.
  const TrainingSession accumulating = makeSession(Setup{2, false, 2}, sgdMomentum());
  REQUIRE(accumulating.graph().tryFind("W0.accum"));
  for (const CheckpointTensor& t : makeCheckpoint(accumulating).tensors) {
    CHECK(t.name.find(".accum") == std::string::npos);
    CHECK(!t.name.starts_with("optimizer."));
  }
}

TEST_CASE(
    "training resumed from a checkpoint continues as if uninterrupted, at any replication and sharding") {
  constexpr int64_t kBefore = 3;
  constexpr int64_t kAfter = 4;
  const ToyData data = toyData(kGlobalBatch * (kBefore + kAfter));
  const Setup source{4, true, 1};
  for (const OptimizerConfig& optimizer : {sgdMomentum(), adam()}) {
    INFO(toString(optimizer.type));
    TrainingSession reference = makeSession(source, optimizer);
    REQUIRE(isSharded(reference, "W0"));
    const std::vector<double> referenceLosses = runSteps(reference, data, 0, kBefore + kAfter);
    const std::map<std::string, HostTensor> referenceValues = test::checkpointValues(reference);

    const test::TempDir dir;
    const std::string path = (dir.path() / "model.safetensors").string();
    TrainingSession first = makeSession(source, optimizer);
    runSteps(first, data, 0, kBefore);
    saveCheckpoint(first, path);

    for (const Setup& target : {Setup{2, false, 1}, Setup{1, false, 1}, Setup{2, false, 2},
                                Setup{2, false, 1, true}, Setup{4, true, 1}}) {
      INFO("R = " << target.replicas << (target.rts ? " RTS" : "") << " accumulation " << target.accumulation
                  << (target.offChip ? " OffChip" : ""));
      TrainingSession resumed = makeSession(target, optimizer);
      const std::string state = optimizer.type == OptimizerType::Sgd ? "W0.momentum" : "W0.adamM";
      CHECK((resumed.graph().tensor(resumed.graph().find(state)).remoteBuffer >= 0) == target.offChip);
      const CheckpointLoadReport report = loadCheckpoint(resumed, path);
      CHECK(report.step == kBefore);
      CHECK(resumed.step() == kBefore);
      const std::vector<double> losses = runSteps(resumed, data, kBefore, kAfter);
      const std::vector<double> expected(referenceLosses.begin() + kBefore, referenceLosses.end());
      CHECK(worstLossDifference(losses, expected) <= 1e-6);
      CHECK(worstTensorDifference(test::checkpointValues(resumed), referenceValues) <= 1e-6);
      CHECK(report.warnings.size() == (target.replicas == 4 && target.rts ? 0u : 1u));
    }

    // The step matters (SGD's first-step momentum, Adam's bias correction):
    // restoring everything else is not enough.
    TrainingSession stepless = makeSession(Setup{2, false, 1}, optimizer);
    loadCheckpoint(stepless, path);
    stepless.setStep(0);
    const std::vector<double> losses = runSteps(stepless, data, kBefore, kAfter);
    CHECK(worstLossDifference(
              losses, std::vector<double>(referenceLosses.begin() + kBefore, referenceLosses.end())) > 1e-4);
  }
}

TEST_CASE("a float16 run resumed from its checkpoint continues exactly, and in other replica counts") {
  // float16 weights and activations, float32 master weights and state.
  constexpr int64_t kBefore = 3;
  constexpr int64_t kAfter = 4;
  const ToyData data = toyData(kGlobalBatch * (kBefore + kAfter));
  const Setup source{2, false, 1};
  for (const OptimizerConfig& optimizer : {sgdMomentum(), adam()}) {
    INFO(toString(optimizer.type));
    TrainingSession reference = makeSession(source, optimizer, 8, DType::Float16);
    REQUIRE(reference.graph().tensor(reference.graph().find("W0")).dtype == DType::Float16);
    REQUIRE(reference.graph().tryFind("W0.master"));
    const std::vector<double> referenceLosses = runSteps(reference, data, 0, kBefore + kAfter);
    const std::map<std::string, HostTensor> referenceValues = test::checkpointValues(reference);
    const std::vector<double> expected(referenceLosses.begin() + kBefore, referenceLosses.end());

    const test::TempDir dir;
    const std::string path = (dir.path() / "half.safetensors").string();
    TrainingSession first = makeSession(source, optimizer, 8, DType::Float16);
    runSteps(first, data, 0, kBefore);
    saveCheckpoint(first, path);

    // The same split: the same bits.
    TrainingSession same = makeSession(source, optimizer, 8, DType::Float16);
    loadCheckpoint(same, path);
    CHECK(runSteps(same, data, kBefore, kAfter) == expected);
    CHECK(test::checkpointValues(same) == referenceValues);

    // Other splits of the same global batch (R, accumulation, sharded or
    // OffChip state): the float16 rounding of other partial sums.
    for (const Setup& target : {Setup{1, false, 1}, Setup{4, false, 1}, Setup{2, false, 2},
                                Setup{2, false, 1, true}, Setup{4, true, 1}}) {
      INFO("R = " << target.replicas << (target.rts ? " RTS" : "") << " accumulation " << target.accumulation
                  << (target.offChip ? " OffChip" : ""));
      TrainingSession resumed = makeSession(target, optimizer, 8, DType::Float16);
      const CheckpointLoadReport report = loadCheckpoint(resumed, path);
      CHECK(report.step == kBefore);
      const std::vector<double> losses = runSteps(resumed, data, kBefore, kAfter);
      // Seen: losses within 4.3e-5, tensors within 4.0e-4 of their largest
      // element (half's ulp is 9.8e-4 of a value).
      CHECK(worstLossDifference(losses, expected) <= 1e-4);
      CHECK(worstTensorDifference(test::checkpointValues(resumed), referenceValues) <= 1e-3);
    }
  }
}

TEST_CASE("grouped variables are saved with their group dimension") {
  const auto makeGrouped = [](std::vector<float> initial) {
    Graph g(4);
    Tensor x = ops::input(g, "x", {3});
    Tensor w = ops::variable(g, "w", std::move(initial), {3}, ReplicaGrouping(4, 1, 2));
    Tensor loss = ops::reduceSum(ops::mul(x, w));
    OptimizerConfig sgd;
    sgd.sgd.learningRate = 1.0;
    return TrainingSession(std::move(g), loss.id(), makeOptimizer(sgd), optionsFor(Setup{4, false, 1}),
                           makeSimDevice());
  };
  TrainingSession source = makeGrouped({1, 2, 3, 10, 20, 30});
  const Checkpoint checkpoint = makeCheckpoint(source);
  REQUIRE(checkpoint.tensors.size() == 1);
  CHECK(checkpoint.tensors[0].value == HostTensor{{2, 3}, {1, 2, 3, 10, 20, 30}});
  TrainingSession target = makeGrouped({0, 0, 0, 0, 0, 0});
  restoreCheckpoint(target, decodeCheckpoint(encodeCheckpoint(checkpoint), "grouped"), "grouped");
  CHECK(target.readVariable("w") == HostTensor{{2, 3}, {1, 2, 3, 10, 20, 30}});
}

TEST_CASE("a checkpoint that does not fit the model is rejected before anything is written") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "model.safetensors").string();
  TrainingSession source = makeSession(Setup{2, false, 1}, sgdMomentum());
  runSteps(source, toyData(kGlobalBatch), 0, 1);
  saveCheckpoint(source, path);

  struct Case {
    const char* name;
    std::function<TrainingSession()> make;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"another width",
       [] {
         return makeSession(Setup{2, false, 1}, sgdMomentum(), 6);
       },
       "tensor \"W0\" has shape [12, 8] in the checkpoint but [12, 6] in the model"},
      {"another optimizer",
       [] {
         return makeSession(Setup{2, false, 1}, adam());
       },
       "the checkpoint holds the state of optimizer SGD but the session's optimizer is Adam"},
      {"state the model does not have",
       [] {
         return makeSession(Setup{2, false, 1}, sgdMomentum(0.0));
       },
       "tensor \"W0.momentum\" (OptimizerState) is in the checkpoint but not in the model"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    TrainingSession target = c.make();
    const std::map<std::string, HostTensor> before = test::checkpointValues(target);
    const auto error = test::catchError<IoError>([&] { loadCheckpoint(target, path); });
    REQUIRE(error);
    INFO(std::string(error->what()));
    CHECK(error->code() == ErrorCode::CheckpointMismatch);
    CHECK(error->subject() == path);
    CHECK(error->detail().find(c.message) != std::string::npos);
    CHECK(test::checkpointValues(target) == before);
    CHECK(target.step() == 0);
  }

  SUBCASE("a variable the checkpoint does not have") {
    const std::string plain = (dir.path() / "plain.safetensors").string();
    saveCheckpoint(makeSession(Setup{2, false, 1}, sgdMomentum(0.0)), plain);
    TrainingSession target = makeSession(Setup{2, false, 1}, sgdMomentum());
    const auto error = test::catchError<IoError>([&] { loadCheckpoint(target, plain); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::CheckpointMismatch);
    CHECK(error->subject() == plain);
    CHECK(error->detail().find(
              "the model's OptimizerState variable \"W0.momentum\" is not in the checkpoint") !=
          std::string::npos);
  }
}

TEST_CASE("F16 tensors load into float32 variables exactly; integers and floats do not convert") {
  TrainingSession source = makeSession(Setup{1, false, 1}, sgdMomentum());
  runSteps(source, toyData(kGlobalBatch), 0, 1);
  const Checkpoint saved = makeCheckpoint(source);

  // The checkpoint of a float16 run (values that are halves) into a float32 run.
  Checkpoint halves = saved;
  for (CheckpointTensor& tensor : halves.tensors) {
    tensor.dtype = DType::Float16;
    std::vector<uint16_t> bits(tensor.value.data.size());
    floatsToHalves(tensor.value.data.data(), bits.data(), bits.size());
    halvesToFloats(bits.data(), tensor.value.data.data(), bits.size());
  }
  const Checkpoint read = decodeCheckpoint(encodeCheckpoint(halves), "half");
  CHECK(read == halves);
  TrainingSession target = makeSession(Setup{2, false, 1}, sgdMomentum());
  const CheckpointLoadReport report = restoreCheckpoint(target, read, "half");
  for (const CheckpointTensor& tensor : halves.tensors) {
    INFO(tensor.name);
    CHECK(target.readVariable(tensor.name, RetrievalMode::OnePerGroup) == tensor.value);
  }
  const auto widened =
      std::find_if(report.warnings.begin(), report.warnings.end(), [](const CheckpointWarning& w) {
        return w.text.starts_with(
            "8 float32 variable(s) of the model took the checkpoint's F16 values (exactly): ");
      });
  REQUIRE(widened != report.warnings.end());
  CHECK(widened->kind == CheckpointWarningKind::WidenedFromHalf);
  CHECK(!concernsTrainingOnly(widened->kind));

  // An integer tensor where the model has a float one.
  Checkpoint integers = saved;
  integers.tensors.front().dtype = DType::Int32;
  for (float& v : integers.tensors.front().value.data) v = std::round(v);
  const std::map<std::string, HostTensor> before = test::checkpointValues(target);
  const auto error = test::catchError<IoError>([&] { restoreCheckpoint(target, integers, "ints"); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::CheckpointMismatch);
  CHECK(error->detail() ==
        fmt::format("tensor \"{}\" is I32 in the checkpoint but F32 (float32) in the model; F32 and F16 "
                    "convert into each other, integers into nothing else",
                    integers.tensors.front().name));
  CHECK(test::checkpointValues(target) == before);
}

TEST_CASE("master weights: taken from their weight when the checkpoint lacks them, skipped when the run has none") {
  // A session whose variable "w" has a master weight "w.master" (optimizer
  // state), as a float16 run's optimizer keeps; here both are float32 so that
  // only the names matter.
  const auto makeWithMaster = [] {
    Graph g(1);
    const Tensor x = ops::input(g, "x", {3});
    const Tensor w = ops::variable(g, "w", std::vector<float>{1, 2, 3}, {3});
    ops::variable(g, "w.master", std::vector<float>{0, 0, 0}, {3}, std::nullopt, RetrievalMode::OnePerGroup,
                  TensorCategory::OptimizerState);
    const Tensor loss = ops::reduceSum(ops::mul(x, w));
    OptimizerConfig sgd;
    sgd.sgd.learningRate = 1.0;
    return TrainingSession(std::move(g), loss.id(), makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  };
  const auto makePlain = [] {
    Graph g(1);
    const Tensor x = ops::input(g, "x", {3});
    const Tensor w = ops::variable(g, "w", std::vector<float>{1, 2, 3}, {3});
    const Tensor loss = ops::reduceSum(ops::mul(x, w));
    OptimizerConfig sgd;
    sgd.sgd.learningRate = 1.0;
    return TrainingSession(std::move(g), loss.id(), makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  };
  Checkpoint plain = makeCheckpoint(makePlain());
  plain.tensors.at(0).value.data = {0.1f, -0.2f, 0.3f};

  TrainingSession withMaster = makeWithMaster();
  REQUIRE(withMaster.graph().tryFind("w.master"));
  const CheckpointLoadReport report = restoreCheckpoint(withMaster, plain, "plain");
  CHECK(withMaster.readVariable("w").data == std::vector<float>{0.1f, -0.2f, 0.3f});
  CHECK(withMaster.readVariable("w.master").data == std::vector<float>{0.1f, -0.2f, 0.3f});
  CHECK(std::find(
            report.warnings.begin(), report.warnings.end(),
            CheckpointWarning{CheckpointWarningKind::MastersFromWeights,
                              "the checkpoint has no master weights; 1 master weight(s) took their weight's "
                              "value: w.master"}) != report.warnings.end());

  // The other way: the checkpoint's master weight is not loaded into a run
  // that keeps none.
  Checkpoint mastered = makeCheckpoint(withMaster);
  for (CheckpointTensor& tensor : mastered.tensors) {
    if (tensor.name == "w.master") tensor.value.data = {7, 8, 9};
  }
  TrainingSession target = makePlain();
  const CheckpointLoadReport skipped = restoreCheckpoint(target, mastered, "mastered");
  CHECK(target.readVariable("w").data == std::vector<float>{0.1f, -0.2f, 0.3f});
  CHECK(std::find_if(skipped.warnings.begin(), skipped.warnings.end(), [](const CheckpointWarning& w) {
          return w.kind == CheckpointWarningKind::UnusedMasters &&
                 w.text.starts_with(
                     "the model keeps no master weights; the checkpoint's w.master were not loaded");
        }) != skipped.warnings.end());

  // A master weight of another shape than its weight is a mismatch.
  Checkpoint wrong = plain;
  wrong.tensors.at(0).value = HostTensor{{2}, {1, 2}};
  TrainingSession other = makeWithMaster();
  const auto error = test::catchError<IoError>([&] { restoreCheckpoint(other, wrong, "wrong"); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::CheckpointMismatch);
}

TEST_CASE("loading reports what differs from the checkpoint's session and restores the learning rate") {
  TrainingSession source = makeSession(Setup{2, false, 1}, sgdMomentum());
  source.setLearningRate(0.025);
  runSteps(source, toyData(kGlobalBatch * 2), 0, 2);
  const Checkpoint checkpoint = makeCheckpoint(source);
  CHECK(checkpoint.optimizer.sgd.learningRate == 0.025);

  SUBCASE("the same session options") {
    TrainingSession target = makeSession(Setup{2, false, 1}, sgdMomentum());
    const CheckpointLoadReport report = restoreCheckpoint(target, checkpoint, "c");
    REQUIRE(report.warnings.size() == 1);
    CHECK(report.warnings[0] ==
          CheckpointWarning{CheckpointWarningKind::LearningRate,
                            "the learning rate 0.025 of the checkpoint replaces the session's "
                            "0.1"});
    CHECK(concernsTrainingOnly(report.warnings[0].kind));
    CHECK(target.learningRate() == 0.025);
    CHECK(report.learningRate == 0.025);
    CHECK(target.step() == 2);
  }
  SUBCASE("other session options and hyper-parameters") {
    OptimizerConfig other = sgdMomentum(0.5);
    other.sgd.learningRate = 0.025;
    TrainingSession target = makeSession(Setup{1, false, 1}, other);
    const CheckpointLoadReport report = restoreCheckpoint(target, checkpoint, "c");
    REQUIRE(report.warnings.size() == 2);
    CHECK(report.warnings[0].kind == CheckpointWarningKind::SessionOptions);
    CHECK(report.warnings[0].text.find(
              "other session options (/sessionOptions/enableReplicatedGraphs true -> false, "
              "/sessionOptions/replicatedGraphCount 2 -> 1)") != std::string::npos);
    CHECK(report.warnings[1].kind == CheckpointWarningKind::OptimizerHyperParameters);
    CHECK(
        report.warnings[1].text ==
        "the checkpoint's optimizer had other hyper-parameters (/optimizer/momentum 0.9 -> 0.5); the session "
        "keeps its own");
    for (const CheckpointWarning& warning : report.warnings) CHECK(concernsTrainingOnly(warning.kind));
  }
}

TEST_CASE("extra metadata is stored, but not under tessera's own keys") {
  const TrainingSession session = makeSession(Setup{1, false, 1}, sgdMomentum());
  const Checkpoint checkpoint = makeCheckpoint(session, {{"run", "42"}});
  CHECK(decodeCheckpoint(encodeCheckpoint(checkpoint), "x").extraMetadata ==
        std::map<std::string, std::string>{{"run", "42"}});
  const auto error = test::catchError<ConfigError>([&] { makeCheckpoint(session, {{"step", "1"}}); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::DuplicateKey);
  CHECK(error->subject() == "step");
}

// ---------------------------------------------------------------------------
// Atomic writes
// ---------------------------------------------------------------------------

TEST_CASE("a write interrupted at any byte or step leaves the previous checkpoint") {
  // With an unnamed temporary file (O_TMPFILE) and, as on filesystems
  // without it, a named one.
  bool unnamed = true;
  SUBCASE("unnamed temporary file") { unnamed = true; }
  SUBCASE("named temporary file") { unnamed = false; }
  detail::setUnnamedTemporaryFiles(unnamed);
  const test::TempDir dir;
  const std::string path = (dir.path() / "model.safetensors").string();
  Checkpoint old = handMade();
  writeCheckpoint(old, path);
  Checkpoint next = handMade();
  next.step = next.optimizerStep = 8;
  next.tensors[0].value.data[0] = 99;
  const uint64_t size = encodeCheckpoint(next).size();

  const auto failAt = [&](detail::WriteStage stage, uint64_t afterBytes) {
    detail::setWriteFault(detail::WriteFault{stage, afterBytes, {}});
    const auto error = test::catchError<IoError>([&] { writeCheckpoint(next, path); });
    detail::setWriteFault(std::nullopt);
    return error;
  };
  for (uint64_t bytes = 0; bytes <= size; ++bytes) {
    INFO("after " << bytes << " bytes");
    const auto error = failAt(detail::WriteStage::Data, bytes);
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::FileUnwritable);
    CHECK(error->subject() == path);
    REQUIRE(readCheckpoint(path) == old);
    REQUIRE(filesIn(dir.path()) == std::vector<std::string>{"model.safetensors"});
  }
  for (const auto stage :
       {detail::WriteStage::Create, detail::WriteStage::Sync, detail::WriteStage::Rename}) {
    INFO("stage " << static_cast<int>(stage));
    const auto error = failAt(stage, 0);
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::FileUnwritable);
    CHECK(error->detail().find("the previous file, if any, is unchanged") != std::string::npos);
    CHECK(readCheckpoint(path) == old);
    CHECK(filesIn(dir.path()) == std::vector<std::string>{"model.safetensors"});
  }
  // Syncing the folder comes after the rename: the new file is in place.
  const auto error = failAt(detail::WriteStage::SyncFolder, 0);
  REQUIRE(error);
  CHECK(error->detail().find("cannot be synced") != std::string::npos);
  CHECK(readCheckpoint(path) == next);

  writeCheckpoint(old, path);
  CHECK(readCheckpoint(path) == old);
  CHECK(filesIn(dir.path()) == std::vector<std::string>{"model.safetensors"});
  detail::setUnnamedTemporaryFiles(true);
}

TEST_CASE("a process killed while writing a checkpoint leaves the previous one and no litter") {
  bool unnamed = true;
  SUBCASE("unnamed temporary file") { unnamed = true; }
  SUBCASE("named temporary file") { unnamed = false; }
  const test::TempDir dir;
  const std::string path = (dir.path() / "model.safetensors").string();
  TrainingSession session = makeSession(Setup{2, false, 1}, sgdMomentum());
  saveCheckpoint(session, path);
  const Checkpoint old = readCheckpoint(path);
  runSteps(session, toyData(kGlobalBatch), 0, 1);
  const uint64_t half = encodeCheckpoint(makeCheckpoint(session)).size() / 2;

  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Halfway through the file, tell the parent and wait to be killed.
    ::close(ready[0]);
    detail::setUnnamedTemporaryFiles(unnamed);
    detail::setWriteFault(detail::WriteFault{detail::WriteStage::Data, half, [&] {
                                               const char byte = 1;
                                               (void)!::write(ready[1], &byte, 1);
                                               while (true) ::pause();
                                             }});
    try {
      saveCheckpoint(session, path);
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(ready[1]);
  char byte = 0;
  const ssize_t got = ::read(ready[0], &byte, 1);
  ::close(ready[0]);
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(got == 1);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);

  CHECK(readCheckpoint(path) == old);
  const fs::path temporary = path + ".tmp." + std::to_string(child);
  if (unnamed) {
    // The file being written had no name: the kill left nothing.
    CHECK(filesIn(dir.path()) == std::vector<std::string>{"model.safetensors"});
  } else {
    // The named file stays behind until the next write; nothing reads it.
    REQUIRE(fs::exists(temporary));
    CHECK(fs::file_size(temporary) == half);
  }
  TrainingSession restored = makeSession(Setup{1, false, 1}, sgdMomentum());
  CHECK(loadCheckpoint(restored, path).step == 0);
  // The next write removes what a dead process left.
  saveCheckpoint(session, path);
  CHECK(filesIn(dir.path()) == std::vector<std::string>{"model.safetensors"});
  CHECK(readCheckpoint(path).step == 1);
}

TEST_CASE("a write removes the temporary files of processes that no longer run, and only those") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "model.safetensors").string();
  // A process that has ended (and been reaped): its id names no process.
  const pid_t ended = ::fork();
  REQUIRE(ended >= 0);
  if (ended == 0) ::_exit(0);
  REQUIRE(::waitpid(ended, nullptr, 0) == ended);
  const std::string dead = dir.write("model.safetensors.tmp." + std::to_string(ended), "half");
  const std::string live = dir.write("model.safetensors.tmp." + std::to_string(::getppid()), "writing");
  const std::string other = dir.write("other.safetensors.tmp." + std::to_string(ended), "not ours");
  const std::string unrelated = dir.write("model.safetensors.tmp.notapid", "kept");
  writeCheckpoint(handMade(), path);
  CHECK(!fs::exists(dead));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
  CHECK(fs::exists(unrelated));
  CHECK(readCheckpoint(path) == handMade());
}

TEST_CASE("files that cannot be read or written are named with the system's reason") {
  const test::TempDir dir;
  const std::string missing = (dir.path() / "missing.safetensors").string();
  const auto unreadable = test::catchError<IoError>([&] { readCheckpoint(missing); });
  REQUIRE(unreadable);
  CHECK(unreadable->code() == ErrorCode::FileUnreadable);
  CHECK(unreadable->subject() == missing);
  CHECK(unreadable->detail() == "cannot read the file: No such file or directory");

  const std::string nowhere = (dir.path() / "no-folder" / "model.safetensors").string();
  const auto unwritable = test::catchError<IoError>([&] { writeCheckpoint(handMade(), nowhere); });
  REQUIRE(unwritable);
  CHECK(unwritable->code() == ErrorCode::FileUnwritable);
  CHECK(unwritable->subject() == nowhere);
  CHECK(unwritable->detail().find("No such file or directory") != std::string::npos);
}

// ---------------------------------------------------------------------------
// train(): checkpoints, resume, interruption
// ---------------------------------------------------------------------------

namespace {

RunConfig syntheticRun(const std::string& checkpoint, int64_t replicas = 2) {
  RunConfig config;
  config.sessionOptions = optionsFor(Setup{replicas, false, 1});
  config.model.layers = {784, 16, 10};
  config.optimizer = adam();
  config.data.dataset = DatasetKind::Synthetic;
  config.data.batchSize = 16 / replicas;
  config.data.epochs = 2;
  config.data.limitTrainSamples = 160;  // 10 steps per epoch
  config.data.limitTestSamples = 50;
  config.output.checkpoint = checkpoint;
  return config;
}

}  // namespace

TEST_CASE("a learning-rate schedule sets each step's rate, and a resumed run continues it") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "run.safetensors").string();
  const TrainSummary constant = train(syntheticRun(""));
  auto cosine = [](const std::string& checkpoint) {
    RunConfig config = syntheticRun(checkpoint);
    config.schedule.type = ScheduleType::Cosine;
    return config;
  };
  const TrainSummary full = train(cosine(""));
  REQUIRE(full.losses.size() == 20);
  // The first update uses the full rate; the later ones less.
  CHECK(full.losses[1] == constant.losses[1]);
  CHECK(full.losses[2] != constant.losses[2]);
  CHECK(full.losses.back() != constant.losses.back());

  int64_t polls = 0;
  TrainControl stop;
  stop.stopRequested = [&polls] { return ++polls > 13; };
  const TrainSummary first = train(cosine(path), {}, stop);
  REQUIRE(first.steps == 13);
  TrainControl resume;
  resume.resumeFrom = path;
  const TrainSummary rest = train(cosine(path), {}, resume);
  REQUIRE(rest.steps == 7);
  std::vector<double> losses(first.losses);
  losses.insert(losses.end(), rest.losses.begin(), rest.losses.end());
  CHECK(worstLossDifference(losses, full.losses) <= 1e-6);
}

TEST_CASE("train() writes checkpoints, stops when asked, and resumes where it stopped") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "run.safetensors").string();
  const TrainSummary full = train(syntheticRun(""));
  REQUIRE(full.steps == 20);
  CHECK(full.checkpoint.empty());

  SUBCASE("every K steps and at the end") {
    RunConfig config = syntheticRun(path);
    config.output.checkpointEvery = 6;
    std::vector<int64_t> written;
    const TrainSummary summary = train(config, [&](const TrainProgress&) {
      if (fs::exists(path)) written.push_back(readCheckpoint(path).step);
    });
    // The file appears at step 6; onStep runs before the step's checkpoint.
    CHECK(written.size() == 20 - 6);
    CHECK(std::count(written.begin(), written.end(), 6) == 6);
    CHECK(std::count(written.begin(), written.end(), 12) == 6);
    CHECK(std::count(written.begin(), written.end(), 18) == 2);
    CHECK(summary.checkpoint == path);
    CHECK(summary.checkpointStep == 20);
    CHECK(readCheckpoint(path).step == 20);
    CHECK(readCheckpoint(path).extraMetadata.at("globalBatch") == "16");
  }

  SUBCASE("interrupted, then resumed with another replication factor") {
    int64_t polls = 0;
    TrainControl stop;
    stop.stopRequested = [&polls] { return ++polls > 13; };
    const TrainSummary first = train(syntheticRun(path), {}, stop);
    CHECK(first.interrupted);
    CHECK(first.steps == 13);
    CHECK(first.testAccuracy == 0.0);
    CHECK(first.checkpointStep == 13);
    CHECK(readCheckpoint(path).step == 13);

    std::vector<std::string> warnings;
    TrainControl resume;
    resume.resumeFrom = path;
    resume.onWarning = [&warnings](const std::string& w) { warnings.push_back(w); };
    const TrainSummary rest = train(syntheticRun(path, 4), {}, resume);
    CHECK(!rest.interrupted);
    CHECK(rest.firstStep == 13);
    CHECK(rest.steps == 7);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("/sessionOptions/replicatedGraphCount 2 -> 4") != std::string::npos);
    std::vector<double> losses(first.losses);
    losses.insert(losses.end(), rest.losses.begin(), rest.losses.end());
    CHECK(worstLossDifference(losses, full.losses) <= 1e-6);
    CHECK(std::abs(rest.testAccuracy - full.testAccuracy) <= 1e-9);
  }

  SUBCASE("a resumed run with other data settings says so") {
    train(syntheticRun(path));
    RunConfig other = syntheticRun("");
    other.data.seed = 5;
    other.data.batchSize = 4;
    other.data.epochs = 3;
    std::vector<std::string> warnings;
    TrainControl resume;
    resume.resumeFrom = path;
    resume.onWarning = [&warnings](const std::string& w) { warnings.push_back(w); };
    const TrainSummary summary = train(other, {}, resume);
    CHECK(summary.firstStep == 20);
    CHECK(summary.steps == 20 * 3 - 20);
    REQUIRE(warnings.size() == 2);
    CHECK(warnings[0].find("global batch of 16 samples and this run has 8") != std::string::npos);
    CHECK(warnings[1].find("(/data/seed 0 -> 5)") != std::string::npos);
  }
}

TEST_CASE("checkpointEvery needs a checkpoint path") {
  RunConfig config = syntheticRun("");
  config.output.checkpointEvery = 5;
  const auto error = test::catchError<ConfigError>([&] { validate(config); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::InvalidOutput);
  CHECK(error->subject() == "/output/checkpointEvery");
  config.output.checkpointEvery = -1;
  config.output.checkpoint = "x.safetensors";
  const auto negative = test::catchError<ConfigError>([&] { validate(config); });
  REQUIRE(negative);
  CHECK(negative->code() == ErrorCode::OutOfRange);
  CHECK(negative->subject() == "/output/checkpointEvery");
}

// ---------------------------------------------------------------------------
// Hostile files and outputs
// ---------------------------------------------------------------------------

namespace {

// A safetensors file of `path` whose header claims one F32 tensor of `bytes`
// bytes, made that long as a sparse file (no disk, no memory).
void writeSparseCheckpoint(const std::string& path, uint64_t bytes) {
  const std::string header =
      fmt::format(R"({{"W0":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{}]}}}})", bytes / 4, bytes);
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i)
    prefix[static_cast<std::size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  {
    std::ofstream out(path, std::ios::binary);
    out << prefix << header;
  }
  fs::resize_file(path, 8 + header.size() + bytes);
}

}  // namespace

TEST_CASE("a checkpoint larger than its bound is refused before it is read") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "huge.safetensors").string();
  writeSparseCheckpoint(path, uint64_t{8} << 30);
  const auto start = std::chrono::steady_clock::now();
  const auto error = test::catchError<IoError>([&] { readCheckpoint(path); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::UnsupportedCheckpoint);
  CHECK(error->subject() == path);
  CHECK(error->detail().find(fmt::format("more than the limit of checkpoint files read without a session ({} "
                                         "bytes)",
                                         kDefaultMaxCheckpointBytes)) != std::string::npos);
  // Resuming bounds the file by the session's variables: far less than the default.
  TrainingSession session = makeSession(Setup{1, false, 1}, sgdMomentum());
  const std::string small = (dir.path() / "small.safetensors").string();
  writeSparseCheckpoint(small, uint64_t{1} << 30);
  const auto resumed = test::catchError<IoError>([&] { loadCheckpoint(session, small); });
  REQUIRE(resumed);
  CHECK(resumed->code() == ErrorCode::UnsupportedCheckpoint);
  CHECK(resumed->detail().find("a checkpoint of this session's variables can have") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
}

TEST_CASE("a header length beyond the file is refused from the first 8 bytes") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "claims.safetensors").string();
  std::string bytes(8, '\0');
  bytes[4] = 1;  // 2^32 header bytes
  {
    std::ofstream out(path, std::ios::binary);
    out << bytes << "{}";
  }
  const auto error = test::catchError<IoError>([&] { readCheckpoint(path); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::CorruptCheckpoint);
  CHECK(error->detail().find("the header claims 4294967296 bytes but the file has 2 bytes") !=
        std::string::npos);
}

TEST_CASE("special files are refused as checkpoints without waiting or reading") {
  const test::TempDir dir;
  const std::string fifo = (dir.path() / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  struct Case {
    std::string path;
    std::string what;
  };
  for (const Case& c : {Case{fifo, "a FIFO (named pipe)"}, Case{"/dev/zero", "a character device"},
                        Case{"/dev/urandom", "a character device"}, Case{dir.path().string(), "a folder"}}) {
    CAPTURE(c.path);
    const auto start = std::chrono::steady_clock::now();
    const auto error = test::catchError<IoError>([&] { readCheckpoint(c.path); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::FileUnreadable);
    CHECK(error->subject() == c.path);
    CHECK(error->detail() == fmt::format("cannot read the file: it is {}, not a regular file", c.what));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
  }
}

TEST_CASE("a checkpoint holding NaN or infinity is refused on load unless allowed") {
  TrainingSession session = makeSession(Setup{1, false, 1}, sgdMomentum());
  Checkpoint checkpoint = makeCheckpoint(session);
  REQUIRE(!checkpoint.tensors.empty());
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    Checkpoint broken = checkpoint;
    broken.tensors.back().value.data.at(1) = bad;
    const auto error =
        test::catchError<IoError>([&] { restoreCheckpoint(session, broken, "run.safetensors"); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::NonFiniteCheckpoint);
    CHECK(error->subject() == "run.safetensors");
    CHECK(error->detail().starts_with(
        fmt::format("tensor \"{}\" holds {} at element 1", broken.tensors.back().name, bad)));
    CHECK_NOTHROW(restoreCheckpoint(session, broken, "run.safetensors", /*allowNonFinite=*/true));
  }
  CHECK_NOTHROW(restoreCheckpoint(session, checkpoint, "run.safetensors"));
}

TEST_CASE("writes never replace a special file, follow symbolic links and refuse NUL") {
  const test::TempDir dir;
  const std::string fifo = (dir.path() / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::vector<uint8_t> bytes = {1, 2, 3};
  const auto isFifo = [&] { return fs::status(fifo).type() == fs::file_type::fifo; };

  const auto direct = test::catchError<IoError>([&] { detail::writeFileAtomically(fifo, bytes); });
  REQUIRE(direct);
  CHECK(direct->code() == ErrorCode::FileUnwritable);
  CHECK(direct->detail() ==
        "it is a FIFO (named pipe), not a regular file, and is never replaced; write to a regular file");
  CHECK(isFifo());

  const fs::path toFifo = dir.path() / "to-fifo";
  fs::create_symlink(fifo, toFifo);
  const auto linked = test::catchError<IoError>([&] { detail::writeFileAtomically(toFifo.string(), bytes); });
  REQUIRE(linked);
  CHECK(linked->code() == ErrorCode::FileUnwritable);
  CHECK(fs::is_symlink(toFifo));
  CHECK(isFifo());

  // A link to a regular file (or to none yet) stays a link; the file it names is written.
  const fs::path target = dir.path() / "target.bin";
  const fs::path link = dir.path() / "link.bin";
  fs::create_symlink("target.bin", link);
  detail::writeFileAtomically(link.string(), bytes);
  CHECK(fs::is_symlink(link));
  CHECK(fs::file_size(target) == 3);
  detail::writeFileAtomically(link.string(), std::vector<uint8_t>{4, 5});
  CHECK(fs::is_symlink(link));
  CHECK(fs::file_size(target) == 2);

  const std::string withNul = (dir.path() / "a").string() + std::string(1, '\0') + "b";
  const auto nul = test::catchError<IoError>([&] { detail::writeFileAtomically(withNul, bytes); });
  REQUIRE(nul);
  CHECK(nul->code() == ErrorCode::FileUnwritable);
  CHECK(!fs::exists(dir.path() / "a"));
}

TEST_CASE("the temporary file of a write is unique to the process") {
  // Writers of one path in several processes at once all succeed.
  const test::TempDir dir;
  const std::string path = (dir.path() / "summary.json").string();
  std::vector<pid_t> children;
  for (int i = 0; i < 8; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int status = 0;
      try {
        detail::setUnnamedTemporaryFiles(false);
        for (int n = 0; n < 20; ++n) detail::writeFileAtomically(path, std::vector<uint8_t>(4096, 'x'));
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(fs::file_size(path) == 4096);
}
