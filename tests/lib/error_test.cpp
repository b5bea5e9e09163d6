#include "tessera/lib/error.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "test_support.hpp"

using namespace tessera;

TEST_CASE("error ids are tessera.KIND.NNN with the kind from the hundreds digit") {
  CHECK(errorId(ErrorCode::InvalidEnumValue) == "tessera.config.102");
  CHECK(errorId(ErrorCode::ShapeMismatch) == "tessera.graph.201");
  CHECK(errorId(ErrorCode::NoGradient) == "tessera.autodiff.301");
  CHECK(errorId(ErrorCode::OutOfMemory) == "tessera.device.401");
  CHECK(errorId(ErrorCode::InstanceMismatch) == "tessera.dist.502");
  CHECK(errorId(ErrorCode::CorruptCheckpoint) == "tessera.io.603");
  CHECK(errorId(ErrorCode::Internal) == "tessera.internal.901");
}

TEST_CASE("the message starts with the id and the subject") {
  const ConfigError e(ErrorCode::UnknownKey, "/sessionOptions/foo", "unknown key \"foo\"");
  CHECK(std::string(e.what()) == "[tessera.config.104] /sessionOptions/foo: unknown key \"foo\"");
  CHECK(e.code() == ErrorCode::UnknownKey);
  CHECK(e.kind() == ErrorKind::Config);
  CHECK(e.subject() == "/sessionOptions/foo");
  CHECK(e.detail() == "unknown key \"foo\"");

  const GraphError noSubject(ErrorCode::ShapeMismatch, "", "shapes differ");
  CHECK(std::string(noSubject.what()) == "[tessera.graph.201] shapes differ");
}

TEST_CASE("every code has a unique number and name") {
  std::set<int> numbers;
  std::set<std::string_view> names;
  for (ErrorCode code : allErrorCodes()) {
    CHECK(numbers.insert(static_cast<int>(code)).second);
    CHECK(names.insert(errorCodeName(code)).second);
    CHECK(errorCodeName(code) != "Unknown");
  }
  CHECK(numbers.size() >= 50);
}

TEST_CASE("docs/errors.md documents every id with an example message") {
  std::ifstream in(test::sourcePath("docs/errors.md"));
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  for (ErrorCode code : allErrorCodes()) {
    INFO(errorId(code));
    const std::string heading = "`" + errorId(code) + "`";
    const auto at = text.str().find(heading);
    CHECK(at != std::string::npos);
    // The example message of the entry repeats the id in brackets.
    CHECK(text.str().find("[" + errorId(code) + "]", at) != std::string::npos);
  }
}

TEST_CASE("messages and subjects quote at most a bounded prefix of an input value") {
  CHECK(boundedText("short") == "short");
  CHECK(boundedText(std::string(kMaxQuotedBytes, 'a')) == std::string(kMaxQuotedBytes, 'a'));
  const std::string huge(10'000'000, 'k');
  CHECK(boundedText(huge) == std::string(kMaxQuotedBytes, 'k') + "... (10000000 bytes)");
  // A UTF-8 sequence is never cut: "é" is 2 bytes, so 3 bytes end inside the second one.
  CHECK(boundedText("\xc3\xa9\xc3\xa9z", 3) == "\xc3\xa9... (5 bytes)");
  const ConfigError error(ErrorCode::UnknownKey, "/" + huge, "unknown key");
  CHECK(error.subject() == "/" + std::string(kMaxSubjectBytes - 1, 'k') + "... (10000001 bytes)");
  CHECK(std::string(error.what()).size() < 2 * kMaxSubjectBytes);
}
