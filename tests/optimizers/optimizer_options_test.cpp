#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "optimizer_options_json.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/optimizers/optimizer_options.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

template <class T>
void checkRoundTrip(const T& value) {
  const json j = value;
  CHECK(j.get<T>() == value);
  CHECK(json(j.get<T>()).dump() == j.dump());
}

TEST_CASE("optimizer options survive a round trip") {
  checkRoundTrip(SgdOptions{});
  checkRoundTrip(SgdOptions{
      .learningRate = 0.05, .momentum = 0.9, .dampening = 0, .weightDecay = 1e-4, .nesterov = true});
  checkRoundTrip(
      SgdOptions{.learningRate = 0.1, .momentum = 0.5, .dampening = 1, .weightDecay = 0, .nesterov = false});
  checkRoundTrip(AdamOptions{});
  checkRoundTrip(AdamOptions{.learningRate = 3e-4,
                             .beta1 = 0.8,
                             .beta2 = 0.99,
                             .eps = 1e-6,
                             .weightDecay = 0.01,
                             .biasCorrection = false,
                             .decoupledWeightDecay = true});
  for (const auto& [type, name] : EnumNames<OptimizerType>::kNames) {
    CHECK(json(type) == std::string(name));
    CHECK(json(std::string(name)).get<OptimizerType>() == type);
  }
}

TEST_CASE("the dump of optimizer options names every field") {
  CHECK(json(SgdOptions{}) == json{{"learningRate", 0.01},
                                   {"momentum", 0.0},
                                   {"dampening", 0.0},
                                   {"weightDecay", 0.0},
                                   {"nesterov", false},
                                   {"lossScaling", 1.0},
                                   {"accumType", "float32"},
                                   {"accl1Type", "float32"},
                                   {"masterWeights", true}});
  CHECK(json(AdamOptions{}) == json{{"learningRate", 0.001},
                                    {"beta1", 0.9},
                                    {"beta2", 0.999},
                                    {"eps", 1e-8},
                                    {"weightDecay", 0.0},
                                    {"biasCorrection", true},
                                    {"decoupledWeightDecay", false},
                                    {"lossScaling", 1.0},
                                    {"accumType", "float32"},
                                    {"accl1Type", "float32"},
                                    {"accl2Type", "float32"},
                                    {"masterWeights", true}});
  // Integers are numbers too.
  CHECK(json::parse(R"({"learningRate": 1})").get<SgdOptions>().learningRate == 1.0);
}

struct RangeCase {
  const char* name;
  std::string json;
  ErrorCode code;
  std::string subject;
  std::string fragment;
};

template <class T>
void checkRejected(const std::vector<RangeCase>& cases) {
  for (const RangeCase& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<ConfigError>([&] { (void)json::parse(c.json).get<T>(); });
    REQUIRE(error.has_value());
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("SGD options outside their ranges are rejected") {
  checkRejected<SgdOptions>({
      {"zero learning rate", R"({"learningRate": 0})", ErrorCode::OutOfRange, "/learningRate",
       "learningRate is 0; it must be > 0"},
      {"negative learning rate", R"({"learningRate": -0.1})", ErrorCode::OutOfRange, "/learningRate", "> 0"},
      {"momentum of 1", R"({"momentum": 1})", ErrorCode::OutOfRange, "/momentum", "it must be in [0, 1)"},
      {"negative momentum", R"({"momentum": -0.5})", ErrorCode::OutOfRange, "/momentum", "in [0, 1)"},
      {"dampening above 1", R"({"dampening": 1.5})", ErrorCode::OutOfRange, "/dampening", "in [0, 1]"},
      {"negative weight decay", R"({"weightDecay": -1e-4})", ErrorCode::OutOfRange, "/weightDecay", ">= 0"},
      {"string learning rate", R"({"learningRate": "0.1"})", ErrorCode::WrongType, "/learningRate",
       "write 0.1 without quotes"},
      {"unknown key", R"({"momentun": 0.9})", ErrorCode::UnknownKey, "/momentun",
       "did you mean \"momentum\""},
      {"nesterov without momentum", R"({"nesterov": true})", ErrorCode::InvalidOptimizer, "/nesterov",
       "nesterov needs momentum > 0 and dampening 0, found momentum 0 and dampening 0"},
      {"nesterov with dampening", R"({"nesterov": true, "momentum": 0.9, "dampening": 0.1})",
       ErrorCode::InvalidOptimizer, "/nesterov", "found momentum 0.9 and dampening 0.1"},
  });
  CHECK_NOTHROW((void)json::parse(R"({"nesterov": true, "momentum": 0.9})").get<SgdOptions>());
  CHECK_NOTHROW((void)json::parse(R"({"dampening": 1, "momentum": 0})").get<SgdOptions>());
}

TEST_CASE("Adam options outside their ranges are rejected") {
  checkRejected<AdamOptions>({
      {"zero learning rate", R"({"learningRate": 0})", ErrorCode::OutOfRange, "/learningRate", "> 0"},
      {"beta1 of 1", R"({"beta1": 1})", ErrorCode::OutOfRange, "/beta1", "beta1 is 1; it must be in [0, 1)"},
      {"negative beta2", R"({"beta2": -0.5})", ErrorCode::OutOfRange, "/beta2", "in [0, 1)"},
      {"zero eps", R"({"eps": 0})", ErrorCode::OutOfRange, "/eps", "eps is 0; it must be > 0"},
      {"negative weight decay", R"({"weightDecay": -1})", ErrorCode::OutOfRange, "/weightDecay", ">= 0"},
      {"number for a boolean", R"({"biasCorrection": 0})", ErrorCode::WrongType, "/biasCorrection",
       "expected a boolean"},
      {"unknown key", R"({"beta3": 0.9})", ErrorCode::UnknownKey, "/beta3", "did you mean \"beta1\""},
  });
  CHECK_NOTHROW((void)json::parse(R"({"beta1": 0, "beta2": 0, "weightDecay": 0})").get<AdamOptions>());
}

TEST_CASE("checking C++ options gives the reader's code, path and message") {
  struct Case {
    const char* name;
    std::function<void(SgdOptions&)> change;
    std::string json;
  };
  const std::vector<Case> cases = {
      {"learning rate", [](SgdOptions& o) { o.learningRate = 0; }, R"({"learningRate": 0})"},
      {"momentum", [](SgdOptions& o) { o.momentum = 1; }, R"({"momentum": 1})"},
      {"nesterov", [](SgdOptions& o) { o.nesterov = true; }, R"({"nesterov": true})"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    SgdOptions options;
    c.change(options);
    const auto checked = test::catchError<ConfigError>([&] { jsonio::checkRules(options, "/optimizer"); });
    const auto read = test::catchError<ConfigError>(
        [&] { (void)jsonio::readValue<SgdOptions>(json::parse(c.json), "/optimizer", jsonio::SourceMap{}); });
    REQUIRE(checked.has_value());
    REQUIRE(read.has_value());
    CHECK(checked->code() == read->code());
    CHECK(checked->subject() == read->subject());
    CHECK(checked->subject().starts_with("/optimizer/"));
    CHECK(checked->detail() == read->detail());
  }
  CHECK_NOTHROW(jsonio::checkRules(SgdOptions{}, "/optimizer"));
  CHECK_NOTHROW(jsonio::checkRules(AdamOptions{}, "/optimizer"));
  AdamOptions adam;
  adam.eps = -1;
  TESSERA_CHECK_ERROR(jsonio::checkRules(adam, "/optimizer"), ConfigError, ErrorCode::OutOfRange);
}

TEST_CASE("the optimizer schemas carry the ranges and defaults of the tables") {
  const json sgd = jsonio::schemaOf<SgdOptions>();
  CHECK(sgd["additionalProperties"] == false);
  CHECK(sgd["properties"].size() == json(SgdOptions{}).size());
  CHECK(sgd["properties"]["learningRate"]["exclusiveMinimum"] == 0.0);
  CHECK(sgd["properties"]["learningRate"]["default"] == 0.01);
  CHECK(sgd["properties"]["momentum"]["minimum"] == 0.0);
  CHECK(sgd["properties"]["momentum"]["exclusiveMaximum"] == 1.0);
  CHECK(sgd["properties"]["dampening"]["maximum"] == 1.0);
  const json adam = jsonio::schemaOf<AdamOptions>();
  CHECK(adam["properties"].size() == json(AdamOptions{}).size());
  CHECK(adam["properties"]["eps"]["exclusiveMinimum"] == 0.0);
  CHECK(adam["properties"]["biasCorrection"]["type"] == "boolean");
  for (const auto& property : adam["properties"].items()) {
    CAPTURE(property.key());
    CHECK_FALSE(property.value()["description"].get<std::string>().empty());
  }
}

}  // namespace
}  // namespace tessera
