// The bad-input corpus (tests/data/bad): every file is fed to the reader of
// its folder and must be rejected with the tessera error that
// tests/data/bad/expected.json gives for it. The same files are the replay
// corpus of the fuzz targets (tests/fuzz).
//
// expected.json maps each file (relative to tests/data/bad) to
//   {"id": "tessera.KIND.NNN", "subject": "...", ...}
// where "$FILE" in the subject stands for the path the reader was given. The
// folder names the reader:
//   config/   loadRunConfig(file), then validate()
//   set/      each line one --set override of the default run config's dump,
//             then validate()
//   dataset/  "reader": "images" | "labels" | "split" (the IDX readers;
//             "split" pairs the file, as labels, with the "images" file)
//   checkpoint/ readCheckpoint(file)
//   onnx/     importOnnx(file) with the symbolic dimension "batch" bound to 2
//             (in a build without ONNX every file gives tessera.onnx.701)
//   tensors/  readTensorSplit(file) for the inputs of the MLP export of
//             tests/data/onnx: x float32 [2, 2, 3] and labels int32 [2]
// A new kind of input is a folder and a row of kReaders.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/app/run_config.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kBadFolder = "tests/data/bad";

std::string readText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines of a --set file: one override each; a final newline ends the
// last line rather than starting an empty one.
std::vector<std::string> overrideLines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

void readConfig(const std::string& path, const json&) { validate(loadRunConfig(path).config); }

void applyOverrides(const std::string& path, const json&) {
  static const std::string base = json(RunConfig{}).dump();
  validate(parseRunConfig(base, "default.json", overrideLines(readText(path))).config);
}

void readDataset(const std::string& path, const json& entry) {
  const std::string reader = entry.at("reader").get<std::string>();
  if (reader == "images") {
    (void)readIdxImages(path);
  } else if (reader == "labels") {
    (void)readIdxLabels(path);
  } else if (reader == "split") {
    const fs::path images = fs::path(path).parent_path() / entry.at("images").get<std::string>();
    (void)readIdxSplit(images.string(), path);
  } else {
    FAIL("unknown dataset reader \"", reader, "\" for ", path);
  }
}

// The reader of each folder of tests/data/bad.
const std::map<std::string, std::function<void(const std::string&, const json&)>> kReaders = {
    {"config", readConfig},
    {"set", applyOverrides},
    {"dataset", readDataset},
    {"checkpoint", [](const std::string& path, const json&) { readCheckpoint(path); }},
    {"onnx",
     [](const std::string& path, const json&) {
       OnnxImportOptions options;
       options.dimensions = {{"batch", 2}};
       (void)importOnnx(path, options);
     }},
    {"tensors",
     [](const std::string& path, const json&) {
       const std::vector<DataInput> inputs = {{"x", DType::Float32, {2, 2, 3}},
                                              {"labels", DType::Int32, {2}}};
       (void)readTensorSplit(path, inputs);
     }},
};

struct Outcome {
  std::string id;
  std::string subject;
  std::string what;
};

// The tessera error `fn` threw; an empty id when it threw nothing. Any other
// exception fails the test.
template <class Fn>
Outcome outcomeOf(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return {error.id(), error.subject(), error.what()};
  }
  return {};
}

std::string expandFile(std::string subject, const std::string& path) {
  for (std::size_t at = subject.find("$FILE"); at != std::string::npos; at = subject.find("$FILE", at)) {
    subject.replace(at, 5, path);
    at += path.size();
  }
  return subject;
}

std::set<std::string> corpusFiles(const fs::path& root) {
  std::set<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const std::string relative = fs::relative(entry.path(), root).generic_string();
    if (relative != "expected.json") files.insert(relative);
  }
  return files;
}

TEST_CASE("every file of the bad-input corpus is rejected with its expected error") {
  const fs::path root = test::sourcePath(kBadFolder);
  const json expected = json::parse(readText(root / "expected.json"));
  REQUIRE(expected.is_object());
  const std::set<std::string> files = corpusFiles(root);

  for (const std::string& file : files) {
    CAPTURE(file);
    CHECK_MESSAGE(expected.contains(file), "a file of the corpus without an entry in expected.json");
  }
  std::map<std::string, int> perFolder;
  // Named variables, not structured bindings: clang before 16 cannot capture those in a lambda
  // (CAPTURE makes one).
  for (const auto& item : expected.items()) {
    const std::string file = item.key();
    const json& entry = item.value();
    CAPTURE(file);
    if (!files.contains(file)) {
      FAIL_CHECK("an entry of expected.json without a file");
      continue;
    }
    const std::string folder = file.substr(0, file.find('/'));
    const auto reader = kReaders.find(folder);
    if (reader == kReaders.end()) {
      FAIL_CHECK("no reader for folder \"", folder, "\"");
      continue;
    }
    ++perFolder[folder];
    const std::string path = (root / file).string();
    const Outcome outcome = outcomeOf([&] { reader->second(path, entry); });
    INFO(outcome.what);
    if (folder == "onnx" && !onnxSupported()) {
      CHECK(outcome.id == errorId(ErrorCode::OnnxUnavailable));
      continue;
    }
    CHECK(outcome.id == entry.at("id").get<std::string>());
    if (entry.contains("subject"))
      CHECK(outcome.subject == expandFile(entry["subject"].get<std::string>(), path));
  }
  // The corpus covers each reader broadly; a folder emptied by mistake fails here.
  CHECK(perFolder["config"] >= 80);
  CHECK(perFolder["set"] >= 20);
  CHECK(perFolder["dataset"] >= 30);
  CHECK(perFolder["checkpoint"] >= 25);
  CHECK(perFolder["onnx"] >= 15);
  CHECK(perFolder["tensors"] >= 10);
}

TEST_CASE("the corpus names every error id it expects correctly") {
  const json expected = json::parse(readText(fs::path(test::sourcePath(kBadFolder)) / "expected.json"));
  std::set<std::string> ids;
  for (const ErrorCode code : allErrorCodes()) ids.insert(errorId(code));
  for (const auto& item : expected.items()) {
    const std::string file = item.key();
    CAPTURE(file);
    CHECK(ids.contains(item.value().at("id").get<std::string>()));
  }
}

// Inputs too large to commit, written at test time.
TEST_CASE("generated huge inputs are rejected by their limits") {
  const test::TempDir dir;
  struct Row {
    std::string name;
    std::function<std::string()> make;
    ErrorCode code;
    std::string subject;  // "$FILE": the file
  };
  const std::vector<Row> rows = {
      {"a document one byte over 64 MiB", [] { return "{}" + std::string(std::size_t{64} << 20, ' ') + " "; },
       ErrorCode::DocumentLimit, "$FILE"},
      {"a 32 MiB unknown key",
       [] { return R"({"data": {")" + std::string(std::size_t{32} << 20, 'k') + R"(": 1}})"; },
       // The subject quotes a bounded prefix of the key.
       ErrorCode::UnknownKey,
       "/data/" + std::string(kMaxSubjectBytes - 6, 'k') + fmt::format("... ({} bytes)", (32 << 20) + 6)},
      {"a million layers: more values than a document may hold",
       [] {
         std::string layers = "784";
         for (int i = 0; i < 1'000'000; ++i) layers += ", 784";
         return R"({"model": {"layers": [)" + layers + ", 10]}}";
       },
       ErrorCode::DocumentLimit, "$FILE"},
      {"100,000 layers: more than /limits/maxLayers",
       [] {
         std::string layers = "784";
         for (int i = 0; i < 100'000; ++i) layers += ", 4";
         return R"({"model": {"layers": [)" + layers + ", 10]}}";
       },
       ErrorCode::ShapeTooLarge, "/model/layers"},
      {"250,000 tensor location overrides",
       [] {
         std::string overrides;
         for (int i = 0; i < 250'000; ++i) overrides += fmt::format("{}\"W{}\": {{}}", i == 0 ? "" : ", ", i);
         return R"({"sessionOptions": {"tensorLocationSettingsOverride": {)" + overrides + "}}}";
       },
       ErrorCode::DocumentLimit, "$FILE"},
      {"ten thousand nested arrays inside a valid prefix",
       [] { return R"({"model": {"layers": )" + std::string(10000, '[') + std::string(10000, ']') + "}}"; },
       ErrorCode::DocumentLimit, "$FILE"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const std::string path = dir.write("generated.json", row.make());
    const auto error = test::catchError<ConfigError>([&] { validate(loadRunConfig(path).config); });
    REQUIRE(error.has_value());
    CHECK(error->code() == row.code);
    CHECK(error->subject() == expandFile(row.subject, path));
  }
}

}  // namespace
}  // namespace tessera
