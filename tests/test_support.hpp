// Helpers shared by the test suites.
#pragma once

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <doctest/doctest.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera::test {

// Session options of `replicas` replicas (replication on when more than
// one), the gradients reduced by `reduction` over replicas and micro-batches.
inline SessionOptions replicated(int64_t replicas, ReductionType reduction = ReductionType::Sum) {
  SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  options.accumulationAndReplicationReductionType = reduction;
  return options;
}

// A path inside the source tree (tests run from the build folder).
inline std::string sourcePath(const std::string& relative) {
  const char* root = std::getenv("TESSERA_SOURCE_ROOT");
  return (root ? std::string(root) : std::string(".")) + "/" + relative;
}

// The whole file at `path`; empty when it cannot be read.
inline std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs fn and returns the error of type E it threw, or nullopt when it threw
// nothing. Any other exception propagates and fails the test.
template <class E, class Fn>
std::optional<E> catchError(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const E& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace tessera::test

// Runs `expr`, expects a tessera error of type `Type` with code `code`, and
// leaves it in `caught` for more checks on the subject and message.
#define TESSERA_CHECK_ERROR(expr, Type, expectedCode)                                  \
  do {                                                                                \
    bool tesseraThrew = false;                                                        \
    try {                                                                             \
      (void)(expr);                                                                   \
    } catch (const Type& tesseraError) {                                              \
      tesseraThrew = true;                                                            \
      INFO(tesseraError.what());                                                      \
      CHECK(tesseraError.code() == (expectedCode));                                   \
    }                                                                                 \
    CHECK_MESSAGE(tesseraThrew, "expected " #Type " from " #expr);                    \
  } while (false)
