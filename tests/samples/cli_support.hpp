// Helpers of the CLI tests (tests/samples/*cli_test.cpp): they run the built
// `tessera` program (path in TESSERA_CLI) and read its output.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "test_support.hpp"

namespace tessera::test {

// The JSON a command printed; the command must have exited with 0.
inline nlohmann::json parseJson(const ProcessResult& result) {
  INFO("stdout: ", result.out);
  INFO("stderr: ", result.err);
  REQUIRE(result.exitCode == 0);
  return nlohmann::json::parse(result.out);
}

// "tessera ARG..." for failure messages.
inline std::string commandLine(const std::vector<std::string>& args) {
  std::string line = "tessera";
  for (const std::string& arg : args) line += " " + arg;
  return line;
}

inline bool startsWith(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

}  // namespace tessera::test
