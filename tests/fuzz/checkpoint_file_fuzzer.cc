// The checkpoint file readers on arbitrary bytes written to a file: the
// bounded reader (readCheckpoint, which checks the header length against the
// file before it reads) and the header reader of `tessera checkpoint
// inspect` (readCheckpointHeader, which reads nothing past the header). They
// must agree: both accept the file, with the same metadata and the same
// tensors (name, dtype, shape, category, layout version), or both refuse it
// with the same error code. Run with -rss_limit_mb=300: a file of a few
// kilobytes must never make either reader hold much more than itself.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/app/checkpoint.hpp"

namespace {

// One file per process, rewritten for every input.
const std::string& inputPath() {
  static const std::string path = [] {
    const char* folder = std::getenv("TMPDIR");
    return std::string(folder != nullptr && *folder != '\0' ? folder : "/tmp") + "/tessera-checkpoint-fuzz-" +
           std::to_string(::getpid()) + ".safetensors";
  }();
  return path;
}

struct Outcome {
  std::optional<tessera::Checkpoint> checkpoint;
  tessera::ErrorCode code = tessera::ErrorCode::Internal;
};

template <class Read>
Outcome attempt(Read&& read) {
  Outcome outcome;
  try {
    outcome.checkpoint = read();
  } catch (const tessera::Error& error) {
    tessera::fuzz::checkError(error);
    outcome.code = error.code();
  }
  return outcome;
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string& path = inputPath();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) finding("cannot create the input file");
  if (size > 0 && std::fwrite(data, 1, size, file) != size) finding("cannot write the input file");
  std::fclose(file);

  const Outcome whole = attempt([&] { return tessera::readCheckpoint(path); });
  const Outcome header = attempt([&] { return tessera::readCheckpointHeader(path); });
  std::remove(path.c_str());
  if (whole.checkpoint.has_value() != header.checkpoint.has_value()) {
    finding(whole.checkpoint ? "the header reader refused a file the whole reader accepted"
                             : "the header reader accepted a file the whole reader refused");
  }
  if (!whole.checkpoint) {
    if (whole.code != header.code) finding("the readers refused the file with different error codes");
    return 0;
  }
  const tessera::Checkpoint& a = *whole.checkpoint;
  const tessera::Checkpoint& b = *header.checkpoint;
  if (a.formatVersion != b.formatVersion || a.tesseraVersion != b.tesseraVersion || a.step != b.step ||
      a.optimizerStep != b.optimizerStep || !(a.optimizer == b.optimizer) ||
      a.sessionOptions != b.sessionOptions || a.sessionOptionsHash != b.sessionOptionsHash ||
      a.extraMetadata != b.extraMetadata || a.tensors.size() != b.tensors.size()) {
    finding("the readers disagree on the metadata");
  }
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const tessera::CheckpointTensor& x = a.tensors[i];
    const tessera::CheckpointTensor& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.category != y.category ||
        x.shardLayoutVersion != y.shardLayoutVersion || x.value.shape != y.value.shape) {
      finding("the readers disagree on a tensor");
    }
    if (!y.value.data.empty()) finding("the header reader returned tensor data");
  }
  return 0;
}
