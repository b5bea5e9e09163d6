// tessera onnx-test DIR...: runs ONNX backend tests (a folder with model.onnx
// and test_data_set_N/{input,output}_K.pb) forward on the simulated device
// and compares every output with the stored one.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/sessions/session.hpp"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

constexpr double kRelativeTolerance = 1e-3;
constexpr double kAbsoluteTolerance = 1e-5;
// float16 outputs: 2^-9 relative (two to four units in the last place of a
// half, which holds 11 significant bits) plus 2^-14 absolute (float16's
// smallest normal; below it halves are subnormal, spaced 2^-24 apart).
constexpr double kHalfRelativeTolerance = 1.0 / 512;
constexpr double kHalfAbsoluteTolerance = 1.0 / 16384;

struct OnnxTestArgs {
  std::vector<std::string> paths;
};

enum class Outcome { Pass, Fail, Unsupported };

struct Result {
  Outcome outcome = Outcome::Pass;
  std::string detail;
};

// Every folder holding a model.onnx under `root` (root itself included), sorted.
std::vector<fs::path> testFolders(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw IoError(ErrorCode::FileUnreadable, root.string(), "not a folder of ONNX tests");
  std::vector<fs::path> folders;
  if (fs::exists(root / "model.onnx")) folders.push_back(root);
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory() && fs::exists(it->path() / "model.onnx")) folders.push_back(it->path());
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

// FILE_0.pb, FILE_1.pb, ... in index order.
std::vector<fs::path> numberedFiles(const fs::path& folder, std::string_view prefix) {
  std::vector<fs::path> files;
  for (int k = 0;; ++k) {
    fs::path file = folder / fmt::format("{}_{}.pb", prefix, k);
    if (!fs::exists(file)) break;
    files.push_back(std::move(file));
  }
  return files;
}

bool isSymbolic(const std::string& dim) {
  return dim != "?" && !dim.empty() &&
         !std::all_of(dim.begin(), dim.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The worst difference of an output, or a description of what does not match.
std::optional<std::string> compare(const std::string& name, const OnnxTensor& expected,
                                   const HostTensor& actual) {
  // float64 outputs come as doubles; every other type as floats.
  const std::vector<double> got =
      actual.doubles.empty() ? std::vector<double>(actual.data.begin(), actual.data.end()) : actual.doubles;
  if (numElements(expected.shape) != static_cast<int64_t>(got.size()) ||
      (actual.shape != expected.shape && numElements(actual.shape) != numElements(expected.shape)))
    return fmt::format("output {} has shape {}; expected {}", name, shapeStr(actual.shape),
                       shapeStr(expected.shape));
  const bool exact = expected.dtype != "float" && expected.dtype != "double" && expected.dtype != "float16" &&
                     expected.dtype != "bfloat16";
  const bool half = expected.dtype == "float16";
  const double relative = half ? kHalfRelativeTolerance : kRelativeTolerance;
  const double absolute = half ? kHalfAbsoluteTolerance : kAbsoluteTolerance;
  double worst = 0;
  std::size_t worstAt = 0;
  bool bad = false;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double want = expected.values[k];
    if (std::isnan(want) && std::isnan(got[k])) continue;
    if (std::isinf(want) && got[k] == want) continue;
    const double diff = std::fabs(got[k] - want);
    const double allowed = exact ? 0.0 : absolute + relative * std::fabs(want);
    if (!(diff <= allowed)) bad = true;
    if (!(diff <= worst)) {
      worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff;
      worstAt = k;
    }
  }
  if (!bad) return std::nullopt;
  return fmt::format(
      "worst difference {:.6g} in output {} at element {} (got {:.8g}, expected {:.8g}; allowed {})", worst,
      name, worstAt, got[worstAt], expected.values[worstAt],
      exact ? "exact" : fmt::format("{} + {} x |expected|", absolute, relative));
}

// One data set of a test; the model imported with double tensors as
// float64, or as float32 (`doubleAsFloat`).
std::optional<std::string> runDataSet(const fs::path& model, const OnnxSignature& signature,
                                      const fs::path& set, bool doubleAsFloat) {
  const std::vector<fs::path> inputFiles = numberedFiles(set, "input");
  const std::vector<fs::path> outputFiles = numberedFiles(set, "output");
  if (inputFiles.size() != signature.inputs.size())
    return fmt::format("{} holds {} inputs; the model declares {}", set.filename().string(),
                       inputFiles.size(), signature.inputs.size());
  for (const OnnxValueInfo& input : signature.inputs) {
    if (input.dtype == "sequence" || input.dtype == "optional" || input.dtype == "map" ||
        input.dtype == "sparse_tensor")
      throw OnnxError(ErrorCode::OnnxUnsupportedFeature, model.string(),
                      fmt::format("input {} is a {}; only tensors are supported", input.name, input.dtype));
  }
  std::vector<OnnxTensor> inputs;
  OnnxImportOptions options;
  options.doubleAsFloat = doubleAsFloat;
  for (std::size_t k = 0; k < inputFiles.size(); ++k) {
    inputs.push_back(readOnnxTensor(inputFiles[k]));
    const bool integer = signature.inputs[k].dtype == "int64" || signature.inputs[k].dtype == "int32";
    if (!integer && numElements(inputs.back().shape) == 0)
      throw OnnxError(
          ErrorCode::OnnxUnsupportedFeature, inputFiles[k].string(),
          fmt::format("shape {}: tensors of zero elements are not supported", shapeStr(inputs.back().shape)));
    // ONNX's node tests pass shapes, axes and indices as inputs; they are
    // fixed at import, as an exported model has them.
    if (integer) {
      inputs.back().name = signature.inputs[k].name;
      options.constantInputs[signature.inputs[k].name] = inputs.back();
    }
    const auto& dims = signature.inputs[k].dims;
    if (dims.size() != inputs.back().shape.size()) continue;
    for (std::size_t axis = 0; axis < dims.size(); ++axis)
      if (isSymbolic(dims[axis])) options.dimensions[dims[axis]] = inputs.back().shape[axis];
  }
  OnnxModel imported = importOnnx(model, options);
  if (imported.outputs.size() != outputFiles.size())
    return fmt::format("{} holds {} outputs; the model declares {}", set.filename().string(),
                       outputFiles.size(), imported.outputs.size());

  std::vector<std::vector<float>> floats(inputs.size());
  std::vector<std::vector<int32_t>> ints(inputs.size());
  std::vector<std::vector<double>> doubles(inputs.size());
  std::vector<StepInput> feeds;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const std::string& name = signature.inputs[k].name;
    if (options.constantInputs.count(name)) continue;
    const DType dtype = imported.graph.tensor(imported.graph.find(name)).dtype;
    if (dtype == DType::Float64) {
      doubles[k] = inputs[k].values;
      feeds.emplace_back(name, std::span<const double>(doubles[k]));
    } else if (dtype == DType::Int32) {
      for (double v : inputs[k].values) {
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          throw OnnxError(ErrorCode::OnnxUnsupportedFeature, inputFiles[k].string(),
                          fmt::format("input value {} does not fit in int32", v));
        ints[k].push_back(static_cast<int32_t>(v));
      }
      feeds.emplace_back(name, std::span<const int32_t>(ints[k]));
    } else {
      for (double v : inputs[k].values) {
        if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max())
          throw OnnxError(
              ErrorCode::OnnxUnsupportedFeature, inputFiles[k].string(),
              fmt::format("input value {} ({}) is beyond float32's range, and the input is float32", v,
                          inputs[k].dtype));
      }
      floats[k].assign(inputs[k].values.begin(), inputs[k].values.end());
      feeds.emplace_back(name, std::span<const float>(floats[k]));
    }
  }
  const std::vector<std::string> outputs = imported.outputs;
  InferenceSession session(std::move(imported.graph), outputs, SessionOptions{}, makeSimDevice());
  session.run(feeds);
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (auto mismatch = compare(outputs[k], readOnnxTensor(outputFiles[k]), session.output(outputs[k])))
      return mismatch;
  }
  return std::nullopt;
}

// Every data set of a test, or the first that does not match, or what
// refused the model (`refused`: an exception, not a mismatch).
Result runSets(const fs::path& model, const std::vector<fs::path>& sets, bool doubleAsFloat, bool& refused) {
  refused = true;
  try {
    const OnnxSignature signature = readOnnxSignature(model);
    for (const fs::path& set : sets) {
      if (auto mismatch = runDataSet(model, signature, set, doubleAsFloat)) {
        refused = false;
        return {Outcome::Fail, fmt::format("{}: {}", set.filename().string(), *mismatch)};
      }
    }
  } catch (const OnnxError& e) {
    // What the importer refuses by design is unsupported; a model it should
    // read but cannot is a failure.
    const bool unsupported =
        e.code() == ErrorCode::OnnxUnsupportedOpset || e.code() == ErrorCode::OnnxUnsupportedOp ||
        e.code() == ErrorCode::OnnxUnsupportedFeature || e.code() == ErrorCode::OnnxTooLarge ||
        e.code() == ErrorCode::OnnxUnsupportedRecurrence ||
        e.code() == ErrorCode::OnnxUnsupportedScatterReduction;
    return {unsupported ? Outcome::Unsupported : Outcome::Fail, e.what()};
  } catch (const Error& e) {
    return {Outcome::Fail, e.what()};
  }
  refused = false;
  return {};
}

// Double tensors are imported as float64 and computed in double. A model
// that this refuses (an op with no float64 form on the device, say) runs
// again with its doubles as float32, compared at the same tolerance.
Result runTest(const fs::path& folder) {
  const fs::path model = folder / "model.onnx";
  std::vector<fs::path> sets;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.is_directory() && entry.path().filename().string().starts_with("test_data_set_"))
      sets.push_back(entry.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Outcome::Fail, "no test_data_set_* folder"};
  bool refused = false;
  const Result native = runSets(model, sets, false, refused);
  if (!refused) return native;
  Result asFloat = runSets(model, sets, true, refused);
  if (asFloat.outcome != Outcome::Pass && asFloat.detail != native.detail)
    asFloat.detail = fmt::format("{} (with doubles as float32: {})", native.detail, asFloat.detail);
  return asFloat;
}

}  // namespace

Action attachOnnxTest(CLI::App& command) {
  auto args = std::make_shared<OnnxTestArgs>();
  command
      .add_option("DIR", args->paths, "Folders of ONNX backend tests (searched recursively for model.onnx)")
      ->required();
  return [args] {
    if (!onnxSupported())
      throw OnnxError(ErrorCode::OnnxUnavailable, "",
                      "this build of tessera has no ONNX support; "
                      "install libonnx-dev and libprotobuf-dev and configure with -Donnx=enabled");
    int passed = 0, failed = 0, unsupported = 0;
    for (const std::string& path : args->paths) {
      const fs::path root(path);
      for (const fs::path& folder : testFolders(root)) {
        const std::string name =
            folder == root ? folder.filename().string() : fs::relative(folder, root).generic_string();
        const Result result = runTest(folder);
        switch (result.outcome) {
          case Outcome::Pass:
            ++passed;
            fmt::print("PASS {}\n", name);
            break;
          case Outcome::Fail:
            ++failed;
            fmt::print("FAIL {}: {}\n", name, result.detail);
            break;
          case Outcome::Unsupported:
            ++unsupported;
            fmt::print("UNSUPPORTED {}: {}\n", name, result.detail);
            break;
        }
        std::fflush(stdout);
      }
    }
    fmt::print("onnx tests: {} passed, {} failed, {} unsupported\n", passed, failed, unsupported);
    return failed == 0 ? kExitOk : kExitInvalidInput;
  };
}

}  // namespace tessera::cli
