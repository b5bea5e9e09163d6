// What every fuzz target checks: the code under test may reject its input
// only with a tessera error of a kind that matches the error's class, and
// with a message of the documented form. Anything else — another exception,
// an InternalError, a crash, a sanitizer report, a leak, a huge allocation
// (libFuzzer's -malloc_limit_mb) — is a finding.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera::fuzz {

[[noreturn]] inline void fail(std::string_view what, const Error& error) {
  std::fprintf(stderr, "fuzz finding: %.*s: %s\n", static_cast<int>(what.size()), what.data(), error.what());
  std::abort();
}

// Whether the error has the class of its code's kind (ConfigError for 1xx, ...).
inline bool hasClassOfKind(const Error& error) {
  switch (error.kind()) {
    case ErrorKind::Config: return dynamic_cast<const ConfigError*>(&error) != nullptr;
    case ErrorKind::Graph: return dynamic_cast<const GraphError*>(&error) != nullptr;
    case ErrorKind::Autodiff: return dynamic_cast<const AutodiffError*>(&error) != nullptr;
    case ErrorKind::Device: return dynamic_cast<const DeviceError*>(&error) != nullptr;
    case ErrorKind::Dist: return dynamic_cast<const DistError*>(&error) != nullptr;
    case ErrorKind::Io: return dynamic_cast<const IoError*>(&error) != nullptr;
    case ErrorKind::Onnx: return dynamic_cast<const OnnxError*>(&error) != nullptr;
    case ErrorKind::Internal: return dynamic_cast<const InternalError*>(&error) != nullptr;
  }
  return false;
}

// The checks on an error the input provoked.
inline void checkError(const Error& error) {
  if (error.kind() == ErrorKind::Internal) fail("an internal error (a defect, not bad input)", error);
  if (!hasClassOfKind(error)) fail("an error whose class does not match the kind of its code", error);
  const std::string prefix = "[" + error.id() + "] ";
  if (std::string_view(error.what()).substr(0, prefix.size()) != prefix)
    fail("a message without its id", error);
  if (error.detail().empty()) fail("an error without a message", error);
}

// Runs fn; a tessera error is an expected outcome once it passes the checks
// above, and whatever else escapes reaches libFuzzer, which reports it.
template <class Fn>
void expectOnlyTesseraErrors(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    checkError(error);
  }
}

// A config that loaded must read back from its canonical dump unchanged.
inline void checkRoundTrip(const RunConfig& config) {
  const std::string dump = nlohmann::json(config).dump();
  try {
    if (parseRunConfig(dump, "dump.json").config == config) return;
  } catch (const Error& error) {
    fail("the canonical dump of a loaded config does not read back", error);
  }
  std::fprintf(stderr, "fuzz finding: the canonical dump reads back as another config: %s\n", dump.c_str());
  std::abort();
}

}  // namespace tessera::fuzz
