#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/shard_layout.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every leaf of a JSON value (scalars, arrays, empty objects), as pointers.
void jsonLeaves(const json& value, const std::string& path, std::vector<std::string>& out) {
  if (!value.is_object() || value.empty()) {
    out.push_back(path);
    return;
  }
  for (const auto& [key, member] : value.items()) jsonLeaves(member, jsonio::childPath(path, key), out);
}

SessionOptions nonDefaultOptions() {
  SessionOptions o;
  o.enableReplicatedGraphs = true;
  o.replicatedGraphCount = 4;
  o.enableDistributedReplicatedGraphs = true;
  o.globalReplicationFactor = 8;
  o.globalReplicaOffset = 4;
  o.enableGradientAccumulation = true;
  o.accumulationFactor = 3;
  o.accumulationAndReplicationReductionType = ReductionType::Mean;
  o.meanAccumulationAndReplicationReductionStrategy = MeanReductionStrategy::Running;
  o.numIOTiles = 128;
  o.activationTensorLocationSettings.minElementsForOffChip = 7;
  o.weightTensorLocationSettings = TensorLocationSettings(
      TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO, ReplicatedTensorSharding::On,
                     CommGroup(CommGroupType::Consecutive, 4)),
      0, 4);
  o.optimizerStateTensorLocationSettings.location.shardingDomain = CommGroup(CommGroupType::Orthogonal, 2);
  o.accumulatorTensorLocationSettings.location.storage = TensorStorage::OffChip;
  o.tensorLocationSettingsOverride["W1"] = TensorLocation(TensorStorage::OffChip);
  o.tensorLocationSettingsOverride["a/b~c"] =
      TensorLocation(TensorStorage::OnChip, ReplicatedTensorSharding::On);
  return o;
}

// --- parseJsonDocument ----------------------------------------------------------

TEST_CASE("parseJsonDocument reads a valid document") {
  const json document =
      parseJsonDocument(R"({"a": [1, -2, 3.5, "x", true, null], "b": {"c": {}}})", "t.json");
  CHECK(document["a"][0] == 1);
  CHECK(document["a"][1] == -2);
  CHECK(document["a"][2] == 3.5);
  CHECK(document["a"][3] == "x");
  CHECK(document["a"][4] == true);
  CHECK(document["a"][5].is_null());
  CHECK(document["b"]["c"].is_object());
  CHECK(parseJsonDocument("  42 ", "t.json") == 42);
}

TEST_CASE("parseJsonDocument rejects malformed text with the source, line and column") {
  struct Case {
    const char* name;
    std::string text;
    std::string subject;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"empty text", "", "t.json:1:1", "unexpected end of input"},
      {"unclosed object", "{\"a\": 1", "t.json:1:8", "unexpected end of input"},
      {"bad literal on line 2", "{\n  \"a\": x\n}", "t.json:2:8", "invalid literal"},
      {"trailing garbage", "{} x", "t.json:1:4", "expected end of input"},
      {"second document", "{}{}", "t.json:1:3", "expected end of input"},
      {"trailing comma", "[1, 2,]", "t.json:1:7", "unexpected ']'"},
      {"comment", "{} // no", "t.json:1:4", ""},
      {"single quotes", "{'a': 1}", "t.json:1:2", "invalid literal"},
      {"invalid UTF-8", "{\"a\": \"\xff\"}", "t.json:1:8", "UTF-8"},
      {"number overflow", "[1e999]", "t.json:1:6", "number overflow"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<ConfigError>([&] { parseJsonDocument(c.text, "t.json"); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::JsonSyntax);
    CHECK(error->subject() == c.subject);
    CHECK(std::string(error->what()).find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("line and column of a syntax error agree with nlohmann's own count") {
  for (const std::string text : {"{\n\n  \"a\": [1,\n 2 x]}", "[\r\n1,\r\n}", "{\"a\":\n\n\n"}) {
    CAPTURE(text);
    std::string expected;
    try {
      [[maybe_unused]] const json parsed = json::parse(text);
    } catch (const json::parse_error& e) {
      const std::string what = e.what();
      const std::size_t at = what.find("at line ");
      const std::size_t colon = what.find(':', at);
      expected = what.substr(at + 8, colon - at - 8);  // "L, column C"
    }
    const auto error = test::catchError<ConfigError>([&] { parseJsonDocument(text, "s"); });
    REQUIRE(error.has_value());
    const std::string subject = error->subject();  // "s:L:C"
    const std::size_t second = subject.rfind(':');
    CHECK(subject.substr(2, second - 2) + ", column " + subject.substr(second + 1) == expected);
  }
}

TEST_CASE("parseJsonDocument rejects duplicate keys at their JSON pointer") {
  struct Case {
    std::string text;
    std::string subject;
  };
  const std::vector<Case> cases = {
      {R"({"a": 1, "a": 2})", "/a"},
      {R"({"a": 1, "b": {"c": 1, "d": 2, "c": 3}})", "/b/c"},
      {R"({"l": [{"x": 1}, {"x": 1, "x": 2}]})", "/l/1/x"},
      {R"({"a/b": {"~": 1, "~": 1}})", "/a~1b/~0"},
      {R"({"": 1, "": 2})", "/"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const auto error = test::catchError<ConfigError>([&] { parseJsonDocument(c.text, "d.json"); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::DuplicateKey);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find("(in d.json)") != std::string::npos);
  }
  // The same key in different objects is fine.
  CHECK_NOTHROW(parseJsonDocument(R"({"a": {"a": 1}, "b": {"a": 2}})", "d.json"));
}

TEST_CASE("parseJsonDocument limits nesting depth and size") {
  const auto nested = [](std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  CHECK_NOTHROW(parseJsonDocument(nested(jsonio::kMaxDepth), "n.json"));
  const auto tooDeep =
      test::catchError<ConfigError>([&] { parseJsonDocument(nested(jsonio::kMaxDepth + 1), "n.json"); });
  REQUIRE(tooDeep.has_value());
  CHECK(tooDeep->code() == ErrorCode::DocumentLimit);
  CHECK(tooDeep->subject() == "n.json");
  CHECK(tooDeep->detail().find("deeper than 64") != std::string::npos);
  // Objects count as well as arrays.
  std::string objects;
  for (std::size_t i = 0; i <= jsonio::kMaxDepth; ++i) objects += "{\"k\":";
  objects += "1" + std::string(jsonio::kMaxDepth + 1, '}');
  TESSERA_CHECK_ERROR(parseJsonDocument(objects, "n.json"), ConfigError, ErrorCode::DocumentLimit);

  const std::string huge(jsonio::kMaxDocumentBytes + 1, ' ');
  const auto tooLarge = test::catchError<ConfigError>([&] { parseJsonDocument(huge, "big.json"); });
  REQUIRE(tooLarge.has_value());
  CHECK(tooLarge->code() == ErrorCode::DocumentLimit);
  CHECK(tooLarge->subject() == "big.json");
}

// --- Round trips ----------------------------------------------------------------

template <NamedEnum E>
void checkEnumRoundTrip() {
  CAPTURE(EnumNames<E>::kTypeName);
  for (const auto& [value, name] : EnumNames<E>::kNames) {
    const json j = value;
    CHECK(j == std::string(name));
    CHECK(j.get<E>() == value);
  }
  TESSERA_CHECK_ERROR(json("no such name").get<E>(), ConfigError, ErrorCode::InvalidEnumValue);
  TESSERA_CHECK_ERROR(json(0).get<E>(), ConfigError, ErrorCode::WrongType);
}

TEST_CASE("enums are written and read as the names of their tables") {
  checkEnumRoundTrip<TensorStorage>();
  checkEnumRoundTrip<TileSet>();
  checkEnumRoundTrip<ReplicatedTensorSharding>();
  checkEnumRoundTrip<CommGroupType>();
  checkEnumRoundTrip<TensorCategory>();
  checkEnumRoundTrip<ReductionType>();
  checkEnumRoundTrip<MeanReductionStrategy>();
}

template <class T>
void checkRoundTrip(const T& value) {
  const json j = value;
  CHECK(j.get<T>() == value);
  // The dump is canonical: writing what was read gives the same text.
  CHECK(json(j.get<T>()).dump() == j.dump());
}

TEST_CASE("option structs survive a round trip, with defaults and with other values") {
  checkRoundTrip(CommGroup{});
  checkRoundTrip(CommGroup(CommGroupType::Orthogonal, 4));
  checkRoundTrip(TensorLocation{});
  checkRoundTrip(TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO,
                                ReplicatedTensorSharding::On, CommGroup(CommGroupType::Consecutive, 2)));
  checkRoundTrip(TensorLocationSettings{});
  checkRoundTrip(TensorLocationSettings(TensorStorage::OffChip, 0, 16));
  checkRoundTrip(SessionOptions{});
  checkRoundTrip(nonDefaultOptions());
  CHECK(nonDefaultOptions() != SessionOptions{});
}

TEST_CASE("the dump of SessionOptions{} equals the golden file") {
  const std::string path = test::sourcePath("samples/configs/session_options.default.json");
  const std::string text = readText(path);
  CHECK(parseJsonDocument(text, path) == json(SessionOptions{}));
  // The file is the dump itself, so it never drifts in form either.
  CHECK(text == json(SessionOptions{}).dump(2) + "\n");
  CHECK(parseJsonDocument(text, path).get<SessionOptions>() == SessionOptions{});
}

TEST_CASE("the dump has every field with the C++ names, keys sorted") {
  const json j = nonDefaultOptions();
  CHECK(j["replicatedGraphCount"] == 4);
  CHECK(j["weightTensorLocationSettings"]["location"]["storage"] == "OffChip");
  CHECK(j["weightTensorLocationSettings"]["location"]["shardingDomain"] ==
        json{{"type", "Consecutive"}, {"replicaGroupSize", 4}});
  CHECK(j["tensorLocationSettingsOverride"]["a/b~c"]["replicatedTensorSharding"] == "On");
  CHECK(j.dump().find("\"accumulationAndReplicationReductionType\"") <
        j.dump().find("\"accumulationFactor\""));
  for (const auto& [category, name] : EnumNames<TensorCategory>::kNames) {
    CHECK(j.contains(std::string(SessionOptions::locationSettingsKey(category))));
  }
}

TEST_CASE("missing keys keep the C++ defaults") {
  const auto o = json::parse(R"({"replicatedGraphCount": 2, "enableReplicatedGraphs": true,
      "weightTensorLocationSettings": {"location": {"storage": "OffChip"}}})")
                     .get<SessionOptions>();
  SessionOptions expected;
  expected.replicatedGraphCount = 2;
  expected.enableReplicatedGraphs = true;
  expected.weightTensorLocationSettings.location.storage = TensorStorage::OffChip;
  CHECK(o == expected);
  CHECK(json::object().get<SessionOptions>() == SessionOptions{});
}

TEST_CASE("ReplicaGrouping has its own serializer") {
  const ReplicaGrouping grouping(8, 4, 2);
  const json j = grouping;
  CHECK(j == json{{"numReplicas", 8}, {"stride", 4}, {"groupSize", 2}});
  CHECK(j.get<ReplicaGrouping>() == grouping);
  CHECK(json{{"numReplicas", 4}}.get<ReplicaGrouping>() == ReplicaGrouping(4));
  CHECK(json{{"numReplicas", 4}, {"groupSize", 2}}.get<ReplicaGrouping>() == ReplicaGrouping(4, 1, 2));

  struct Case {
    json value;
    ErrorCode code;
    std::string subject;
  };
  const std::vector<Case> cases = {
      {json::object(), ErrorCode::InvalidReplicaGrouping, "/numReplicas"},
      {{{"numReplicas", 0}}, ErrorCode::InvalidReplicaGrouping, "/numReplicas"},
      {{{"numReplicas", 4}, {"stride", 0}}, ErrorCode::InvalidReplicaGrouping, "/stride"},
      {{{"numReplicas", 4}, {"strides", 2}}, ErrorCode::UnknownKey, "/strides"},
      {{{"numReplicas", "4"}}, ErrorCode::WrongType, "/numReplicas"},
      {json::array(), ErrorCode::WrongType, ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.value.dump());
    const auto error = test::catchError<ConfigError>([&] { (void)c.value.get<ReplicaGrouping>(); });
    REQUIRE(error.has_value());
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
  }
  // The constructor's own checks apply.
  TESSERA_CHECK_ERROR((json{{"numReplicas", 6}, {"stride", 4}}.get<ReplicaGrouping>()), ConfigError,
                      ErrorCode::ReplicaGroupingNotDivisible);
}

TEST_CASE("ShardLayout is written with its real elements per shard") {
  const json j = ShardLayout(30, 4);
  CHECK(j == json{{"elements", 30},
                  {"shards", 4},
                  {"shardElements", 8},
                  {"padding", 2},
                  {"realElements", {7, 8, 7, 8}},
                  {"version", ShardLayout::kVersion}});
}

// --- Strict reading -------------------------------------------------------------

struct BadInput {
  const char* name;
  std::string json;
  ErrorCode code;
  std::string subject;
  std::string fragment;  // a part of the message
};

void checkBadInputs(const std::vector<BadInput>& cases, const std::function<void(const json&)>& read) {
  for (const BadInput& c : cases) {
    INFO(std::string(c.name));
    const json document = parseJsonDocument(c.json, "bad.json");
    const auto error = test::catchError<ConfigError>([&] { read(document); });
    REQUIRE_MESSAGE(error.has_value(), "no error for ", c.json);
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("reading SessionOptions rejects every kind of bad input at its JSON pointer") {
  const std::vector<BadInput> cases = {
      {"unknown key with a suggestion", R"({"replicatedGraphCont": 2})", ErrorCode::UnknownKey,
       "/replicatedGraphCont", "(did you mean \"replicatedGraphCount\"?)"},
      {"unknown key lists the allowed keys", R"({"replicatedGraphCont": 2})", ErrorCode::UnknownKey,
       "/replicatedGraphCont", "allowed keys: accumulationAndReplicationReductionType, accumulationFactor"},
      {"unknown key, case only", R"({"numIoTiles": 32})", ErrorCode::UnknownKey, "/numIoTiles",
       "did you mean \"numIOTiles\""},
      {"unknown key without a close one", R"({"zzz": 1})", ErrorCode::UnknownKey, "/zzz",
       "unknown key \"zzz\"; "},
      {"nested unknown key", R"({"weightTensorLocationSettings": {"location": {"storag": "OnChip"}}})",
       ErrorCode::UnknownKey, "/weightTensorLocationSettings/location/storag", "did you mean \"storage\""},
      {"unknown key in an override entry", R"({"tensorLocationSettingsOverride": {"w": {"rts": "On"}}})",
       ErrorCode::UnknownKey, "/tensorLocationSettingsOverride/w/rts", "allowed keys"},
      {"string for an integer", R"({"replicatedGraphCount": "4"})", ErrorCode::WrongType,
       "/replicatedGraphCount", "expected an integer, got string \"4\"; write 4 without quotes"},
      {"float for an integer", R"({"replicatedGraphCount": 1.5})", ErrorCode::WrongType,
       "/replicatedGraphCount", "expected an integer, got number 1.5"},
      {"exponent with a fraction for an integer", R"({"numIOTiles": 1.5e0})", ErrorCode::WrongType, "/numIOTiles",
       "expected an integer, got number 1.5"},
      {"integer for a boolean", R"({"enableReplicatedGraphs": 1})", ErrorCode::WrongType,
       "/enableReplicatedGraphs", "expected a boolean, got integer 1"},
      {"string for a boolean", R"({"enableReplicatedGraphs": "true"})", ErrorCode::WrongType,
       "/enableReplicatedGraphs", "write true without quotes"},
      {"null for an integer", R"({"accumulationFactor": null})", ErrorCode::WrongType, "/accumulationFactor",
       "got null"},
      {"array for an object", R"({"weightTensorLocationSettings": []})", ErrorCode::WrongType,
       "/weightTensorLocationSettings", "expected an object, got an array"},
      {"string for an object", R"({"tensorLocationSettingsOverride": {"w": "OffChip"}})",
       ErrorCode::WrongType, "/tensorLocationSettingsOverride/w", "expected an object"},
      {"number for an enum", R"({"accumulationAndReplicationReductionType": 1})", ErrorCode::WrongType,
       "/accumulationAndReplicationReductionType", "expected one of \"Sum\", \"Mean\""},
      {"invalid enum with a suggestion",
       R"({"weightTensorLocationSettings": {"location": {"storage": "onchip"}}})",
       ErrorCode::InvalidEnumValue, "/weightTensorLocationSettings/location/storage",
       "invalid value \"onchip\"; expected one of \"OnChip\", \"OffChip\" (did you mean \"OnChip\"?)"},
      {"invalid enum without a suggestion", R"({"accumulationAndReplicationReductionType": "Product"})",
       ErrorCode::InvalidEnumValue, "/accumulationAndReplicationReductionType",
       "expected one of \"Sum\", \"Mean\""},
      {"integer beyond int64", R"({"replicatedGraphCount": 9223372036854775808})", ErrorCode::OutOfRange,
       "/replicatedGraphCount", "does not fit in a 64-bit integer"},
      {"integer beyond uint64", R"({"replicatedGraphCount": 99999999999999999999})", ErrorCode::OutOfRange,
       "/replicatedGraphCount", "does not fit in a 64-bit integer"},
      {"integer below int64", R"({"numIOTiles": -9223372036854775809})", ErrorCode::OutOfRange, "/numIOTiles",
       "does not fit"},
      {"count below its minimum", R"({"replicatedGraphCount": 0})", ErrorCode::OutOfRange,
       "/replicatedGraphCount", "replicatedGraphCount is 0; it must be >= 1"},
      {"negative IO tiles", R"({"numIOTiles": -2})", ErrorCode::OutOfRange, "/numIOTiles", "it must be >= 0"},
      {"negative threshold", R"({"optimizerStateTensorLocationSettings": {"minElementsForOffChip": -1}})",
       ErrorCode::NegativeThreshold, "/optimizerStateTensorLocationSettings/minElementsForOffChip",
       "minElementsForOffChip is -1; it must be >= 0"},
      {"negative group size",
       R"({"weightTensorLocationSettings": {"location": {"shardingDomain": {"replicaGroupSize": -2}}}})",
       ErrorCode::InvalidCommGroup, "/weightTensorLocationSettings/location/shardingDomain/replicaGroupSize",
       "it must be >= 0"},
      {"escaped tensor name in a path",
       R"({"tensorLocationSettingsOverride": {"a/b~c": {"storage": "OffChp"}}})", ErrorCode::InvalidEnumValue,
       "/tensorLocationSettingsOverride/a~1b~0c/storage", "did you mean \"OffChip\""},
      {"root that is not an object", R"([1, 2])", ErrorCode::WrongType, "",
       "expected an object, got an array"},
  };
  checkBadInputs(cases, [](const json& j) { (void)j.get<SessionOptions>(); });
}

TEST_CASE("the extreme int64 values are read") {
  const json j = parseJsonDocument(R"({"globalReplicaOffset": -9223372036854775808,
      "globalReplicationFactor": 9223372036854775807})",
                                   "x");
  const auto o = j.get<SessionOptions>();
  CHECK(o.globalReplicaOffset == std::numeric_limits<int64_t>::min());
  CHECK(o.globalReplicationFactor == std::numeric_limits<int64_t>::max());
}

TEST_CASE("an integer field reads what the schema's \"integer\" accepts: 64.0 and 1e3, not 1.5") {
  // JSON Schema counts a number with a zero fraction as an integer; the
  // reader agrees, so that a config the schema accepts also loads.
  const json schema = jsonio::schemaOf<SessionOptions>();
  CHECK(schema["properties"]["numIOTiles"]["type"] == "integer");
  const auto o = parseJsonDocument(R"({"numIOTiles": 64.0, "replicatedGraphCount": 4e0,
      "accumulationFactor": 1e3})",
                                   "x")
                     .get<SessionOptions>();
  CHECK(o.numIOTiles == 64);
  CHECK(o.replicatedGraphCount == 4);
  CHECK(o.accumulationFactor == 1000);
  CHECK(json(o)["numIOTiles"].is_number_integer());
  CHECK_THROWS_AS(parseJsonDocument(R"({"numIOTiles": 64.5})", "x").get<SessionOptions>(), ConfigError);
  // Beyond 64 bits stays out of range.
  try {
    (void)parseJsonDocument(R"({"numIOTiles": 1e19})", "x").get<SessionOptions>();
    FAIL("1e19 was read");
  } catch (const ConfigError& e) {
    CHECK(e.code() == ErrorCode::OutOfRange);
  }
}

TEST_CASE("messages name the source, and the --set override that wrote a value") {
  jsonio::SourceMap sources("run.json");
  sources.addOverride("/sessionOptions/numIOTiles", "/sessionOptions/numIOTiles=x");
  CHECK(sources.sourceOf("/sessionOptions/replicatedGraphCount") == "run.json");
  CHECK(sources.sourceOf("/sessionOptions/numIOTiles") == "--set /sessionOptions/numIOTiles=x");
  CHECK(sources.sourceOf("/sessionOptions/numIOTilesX") == "run.json");
  CHECK(sources.origin("/a") == " (in run.json)");
  CHECK(jsonio::SourceMap().origin("/a").empty());

  const json document = parseJsonDocument(R"({"numIOTiles": "x"})", "run.json");
  const auto error = test::catchError<ConfigError>(
      [&] { (void)jsonio::readValue<SessionOptions>(document, "/sessionOptions", sources); });
  REQUIRE(error.has_value());
  CHECK(error->subject() == "/sessionOptions/numIOTiles");
  CHECK(error->detail().find("(in --set /sessionOptions/numIOTiles=x)") != std::string::npos);
}

// --- Mechanism --------------------------------------------------------------------

TEST_CASE("closestMatch suggests only likely typos") {
  const std::vector<std::string_view> candidates = {"replicatedGraphCount", "numIOTiles", "OnChip", "OffChip",
                                                    "eps"};
  struct Case {
    std::string_view word;
    std::optional<std::string_view> expected;
  };
  const std::vector<Case> cases = {
      {"replicatedGraphCont", "replicatedGraphCount"},
      {"replicatedgraphcount", "replicatedGraphCount"},
      {"numIoTiles", "numIOTiles"},
      {"onchip", "OnChip"},
      {"OFFCHIP", "OffChip"},
      {"offchp", "OffChip"},
      {"ep", "eps"},
      {"x", std::nullopt},
      {"io", std::nullopt},
      {"somethingElse", std::nullopt},
  };
  for (const Case& c : cases) {
    CAPTURE(c.word);
    CHECK(jsonio::closestMatch(c.word, candidates) == c.expected);
  }
}

TEST_CASE("closestMatch finds the PascalCase name of an older spelling") {
  const std::vector<std::string_view> kinds = {"FashionMnist", "Mnist", "Synthetic", "Tensors"};
  CHECK(jsonio::closestMatch("fashion-mnist", kinds) == "FashionMnist");
  CHECK(jsonio::closestMatch("fashion_mnist", kinds) == "FashionMnist");
  CHECK(jsonio::closestMatch("mnist", kinds) == "Mnist");
  const std::vector<std::string_view> optimizers = {"SGD", "Adam", "AdamW"};
  CHECK(jsonio::closestMatch("adamw", optimizers) == "AdamW");
  CHECK(jsonio::closestMatch("adam", optimizers) == "Adam");
  CHECK(jsonio::closestMatch("-", optimizers) == std::nullopt);
}

TEST_CASE("JSON pointers are escaped, split and compared by segment") {
  CHECK(jsonio::childPath("/a", "b/c~d") == "/a/b~1c~0d");
  CHECK(jsonio::childPath("", std::size_t{3}) == "/3");
  CHECK(jsonio::splitPointer("/a~1b/~0/") == std::vector<std::string>{"a/b", "~", ""});
  CHECK(jsonio::splitPointer("/") == std::vector<std::string>{""});
  CHECK_FALSE(jsonio::splitPointer("a/b").has_value());
  CHECK_FALSE(jsonio::splitPointer("").has_value());
  CHECK_FALSE(jsonio::splitPointer("/a~2").has_value());
  CHECK_FALSE(jsonio::splitPointer("/a~").has_value());
  CHECK(jsonio::isPathWithin("/a/b", "/a"));
  CHECK(jsonio::isPathWithin("/a", "/a"));
  CHECK_FALSE(jsonio::isPathWithin("/ab", "/a"));
  CHECK_FALSE(jsonio::isPathWithin("/a", "/a/b"));
}

TEST_CASE("the leaf lister names exactly the leaves of the dump") {
  for (const SessionOptions& options : {SessionOptions{}, nonDefaultOptions()}) {
    std::vector<std::string> fromDump;
    jsonLeaves(json(options), "/sessionOptions", fromDump);
    std::vector<std::string> listed = jsonio::leafPaths(options, "/sessionOptions");
    std::sort(listed.begin(), listed.end());
    std::sort(fromDump.begin(), fromDump.end());
    CHECK(listed == fromDump);
  }
}

TEST_CASE("the schema of SessionOptions describes every field of the dump") {
  const json schema = jsonio::schemaOf<SessionOptions>();
  // Walks the dump and the schema together.
  std::function<void(const json&, const json&, const std::string&)> walk =
      [&](const json& value, const json& node, const std::string& path) {
        CAPTURE(path);
        if (value.is_object() && node.contains("properties")) {
          CHECK(node["additionalProperties"] == false);
          CHECK(node["properties"].size() == value.size());
          for (const auto& [key, member] : value.items()) {
            REQUIRE(node["properties"].contains(key));
            CHECK(node["properties"][key].contains("description"));
            walk(member, node["properties"][key], path + "/" + key);
          }
          return;
        }
        if (node.contains("default")) CHECK(node["default"] == value);
      };
  walk(json(SessionOptions{}), schema, "");
  const json& count = schema["properties"]["replicatedGraphCount"];
  CHECK(count["type"] == "integer");
  CHECK(count["minimum"] == 1);
  CHECK(count["default"] == 1);
  const json& storage =
      schema["properties"]["weightTensorLocationSettings"]["properties"]["location"]["properties"]["storage"];
  CHECK(storage["enum"] == json{"OnChip", "OffChip"});
  const json& overrides = schema["properties"]["tensorLocationSettingsOverride"];
  CHECK(overrides["type"] == "object");
  CHECK(overrides["additionalProperties"]["properties"].contains("shardingDomain"));
}

TEST_CASE("the checker applies the ranges of the tables to C++ values, with the reader's code and path") {
  struct Case {
    const char* name;
    std::function<void(SessionOptions&)> change;
    std::string json;
  };
  const std::vector<Case> cases = {
      {"count", [](SessionOptions& o) { o.replicatedGraphCount = 0; }, R"({"replicatedGraphCount": 0})"},
      {"threshold", [](SessionOptions& o) { o.accumulatorTensorLocationSettings.minElementsForOffChip = -5; },
       R"({"accumulatorTensorLocationSettings": {"minElementsForOffChip": -5}})"},
      {"override group size",
       [](SessionOptions& o) { o.tensorLocationSettingsOverride["w"].shardingDomain.replicaGroupSize = -1; },
       R"({"tensorLocationSettingsOverride": {"w": {"shardingDomain": {"replicaGroupSize": -1}}}})"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    SessionOptions options;
    c.change(options);
    const auto checked =
        test::catchError<ConfigError>([&] { jsonio::checkRules(options, "/sessionOptions"); });
    const auto read = test::catchError<ConfigError>([&] {
      (void)jsonio::readValue<SessionOptions>(json::parse(c.json), "/sessionOptions", jsonio::SourceMap{});
    });
    REQUIRE(checked.has_value());
    REQUIRE(read.has_value());
    CHECK(checked->code() == read->code());
    CHECK(checked->subject() == read->subject());
    CHECK(checked->detail() == read->detail());
  }
  SessionOptions badEnum;
  badEnum.weightTensorLocationSettings.location.storage = static_cast<TensorStorage>(7);
  const auto error = test::catchError<ConfigError>([&] { jsonio::checkRules(badEnum, ""); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::InvalidEnumValue);
  CHECK(error->subject() == "/weightTensorLocationSettings/location/storage");
  CHECK_NOTHROW(jsonio::checkRules(nonDefaultOptions(), ""));
}

TEST_CASE("range messages state the bound in the form of the table") {
  struct Case {
    jsonio::FieldSpec spec;
    double value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{.min = 1}, 0, "x is 0; it must be >= 1"},
      {{.exclusiveMin = 0}, -0.5, "x is -0.5; it must be > 0"},
      {{.max = 1}, 2, "x is 2; it must be <= 1"},
      {{.exclusiveMax = 1}, 1, "x is 1; it must be < 1"},
      {{.min = 0, .exclusiveMax = 1}, 1, "x is 1; it must be in [0, 1)"},
      {{.min = 0, .max = 1}, 1.5, "x is 1.5; it must be in [0, 1]"},
      {{.exclusiveMin = 0, .max = 2}, 0, "x is 0; it must be in (0, 2]"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expected);
    const auto error =
        test::catchError<ConfigError>([&] { jsonio::checkRange(c.value, c.spec, "/x", "x", ""); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::OutOfRange);
    CHECK(error->detail() == c.expected);
  }
  CHECK_NOTHROW(jsonio::checkRange(0.0, {.min = 0, .exclusiveMax = 1}, "/x", "x", ""));
  CHECK_NOTHROW(jsonio::checkRange(int64_t{5}, {}, "/x", "x", ""));
}

TEST_CASE("invalidUtf8Offset accepts what the JSON parser accepts and finds the first bad byte") {
  struct Case {
    std::string name;
    std::string text;
    std::optional<std::size_t> offset;
  };
  const std::vector<Case> cases = {
      {"ASCII", "replicatedGraphCount=4", std::nullopt},
      {"empty", "", std::nullopt},
      {"two bytes", "r\xc3\xa9sum\xc3\xa9", std::nullopt},
      {"three bytes", "\xe2\x82\xac", std::nullopt},
      {"four bytes, the largest code point", "\xf4\x8f\xbf\xbf", std::nullopt},
      {"stray continuation byte", "ab\x80", 2},
      {"truncated sequence", "x\xe2\x82", 1},
      {"overlong two bytes", "\xc0\xaf", 0},
      {"overlong three bytes", "\xe0\x80\xaf", 0},
      {"overlong four bytes", "\xf0\x80\x80\xaf", 0},
      {"surrogate", "\xed\xa0\x80", 0},
      {"above U+10FFFF", "\xf4\x90\x80\x80", 0},
      {"never in UTF-8", "ok\xff", 2},
      {"Latin-1", "caf\xe9", 3},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    CHECK(jsonio::invalidUtf8Offset(c.text) == c.offset);
    // The parser agrees: a string holding the text is valid JSON exactly when the text is UTF-8.
    const bool parsed = !test::catchError<ConfigError>([&] { parseJsonDocument("\"" + c.text + "\"", ""); });
    CHECK(parsed == !c.offset.has_value());
  }
}

}  // namespace
}  // namespace tessera
