#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_spec_json.hpp"
#include "json_reader.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/json.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

TEST_CASE("DeviceSpec survives a round trip") {
  const DeviceSpec defaults{};
  CHECK(json(defaults).get<DeviceSpec>() == defaults);
  const DeviceSpec small{.tilesPerIpu = 64,
                         .bytesPerTile = 1024,
                         .streamingMemoryBytes = 0,
                         .linkBandwidthBytesPerSecond = 1.5e9,
                         .interInstanceBandwidthBytesPerSecond = 1e8,
                         .streamingBandwidthBytesPerSecond = 3e9,
                         .computeFlopsPerSecond = 1e12,
                         .transferLatencySeconds = 0,
                         .hostBandwidthBytesPerSecond = 1e9,
                         .hostLatencySeconds = 1e-5,
                         .numThreads = 3};
  CHECK(json(small).get<DeviceSpec>() == small);
  CHECK(json(json(small).get<DeviceSpec>()).dump() == json(small).dump());
}

TEST_CASE("the DeviceSpec dump has the header's keys and defaults") {
  const json j = DeviceSpec{};
  CHECK(j == json{{"tilesPerIpu", 1472},
                  {"bytesPerTile", 624 * 1024},
                  {"streamingMemoryBytes", int64_t{32} << 30},
                  {"linkBandwidthBytesPerSecond", 64e9},
                  {"interInstanceBandwidthBytesPerSecond", 12.5e9},
                  {"streamingBandwidthBytesPerSecond", 20e9},
                  {"computeFlopsPerSecond", 62.5e12},
                  {"transferLatencySeconds", 2e-6},
                  {"ipusPerReplica", 1},
                  {"interIpuBandwidthBytesPerSecond", 64e9},
                  {"interIpuLatencySeconds", 1e-6},
                  {"hostBandwidthBytesPerSecond", 6.25e9},
                  {"hostLatencySeconds", 5e-6},
                  {"numThreads", 0}});
  CHECK(j["tilesPerIpu"].is_number_integer());
  CHECK(j["linkBandwidthBytesPerSecond"].is_number_float());
}

TEST_CASE("DeviceSpec values outside their ranges are rejected at their JSON pointer") {
  struct Case {
    const char* name;
    std::string json;
    ErrorCode code;
    std::string subject;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"no tiles", R"({"tilesPerIpu": 0})", ErrorCode::OutOfRange, "/tilesPerIpu",
       "tilesPerIpu is 0; it must be >= 1"},
      {"no bytes per tile", R"({"bytesPerTile": 0})", ErrorCode::OutOfRange, "/bytesPerTile", ">= 1"},
      {"negative streaming memory", R"({"streamingMemoryBytes": -1})", ErrorCode::OutOfRange,
       "/streamingMemoryBytes", ">= 0"},
      {"zero link bandwidth", R"({"linkBandwidthBytesPerSecond": 0})", ErrorCode::OutOfRange,
       "/linkBandwidthBytesPerSecond", "> 0"},
      {"negative gateway bandwidth", R"({"interInstanceBandwidthBytesPerSecond": -1})", ErrorCode::OutOfRange,
       "/interInstanceBandwidthBytesPerSecond", "> 0"},
      {"zero streaming bandwidth", R"({"streamingBandwidthBytesPerSecond": 0.0})", ErrorCode::OutOfRange,
       "/streamingBandwidthBytesPerSecond", "> 0"},
      {"zero compute rate", R"({"computeFlopsPerSecond": 0})", ErrorCode::OutOfRange,
       "/computeFlopsPerSecond", "> 0"},
      {"negative latency", R"({"transferLatencySeconds": -1e-9})", ErrorCode::OutOfRange,
       "/transferLatencySeconds", ">= 0"},
      {"zero host bandwidth", R"({"hostBandwidthBytesPerSecond": 0})", ErrorCode::OutOfRange,
       "/hostBandwidthBytesPerSecond", "> 0"},
      {"negative host latency", R"({"hostLatencySeconds": -1e-6})", ErrorCode::OutOfRange,
       "/hostLatencySeconds", ">= 0"},
      {"negative thread count", R"({"numThreads": -1})", ErrorCode::OutOfRange, "/numThreads",
       "numThreads is -1; it must be in [0, 1024]"},
      {"too many threads", R"({"numThreads": 1025})", ErrorCode::OutOfRange, "/numThreads",
       "numThreads is 1025; it must be in [0, 1024]"},
      {"no IPU per replica", R"({"ipusPerReplica": 0})", ErrorCode::OutOfRange, "/ipusPerReplica",
       "ipusPerReplica is 0; it must be in [1, 64]"},
      {"zero IPU-Link bandwidth", R"({"interIpuBandwidthBytesPerSecond": 0})", ErrorCode::OutOfRange,
       "/interIpuBandwidthBytesPerSecond", "> 0"},
      {"float tile count", R"({"tilesPerIpu": 1472.5})", ErrorCode::WrongType, "/tilesPerIpu",
       "expected an integer"},
      {"string bandwidth", R"({"linkBandwidthBytesPerSecond": "fast"})", ErrorCode::WrongType,
       "/linkBandwidthBytesPerSecond", "expected a number, got string \"fast\""},
      {"unknown key", R"({"tilesPerIPU": 4})", ErrorCode::UnknownKey, "/tilesPerIPU",
       "did you mean \"tilesPerIpu\""},
      {"memory that does not fit in 64 bits", R"({"tilesPerIpu": 4294967296, "bytesPerTile": 4294967296})",
       ErrorCode::InvalidDeviceSpec, "/bytesPerTile", "4294967296 tiles of 4294967296 bytes"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<ConfigError>([&] { (void)json::parse(c.json).get<DeviceSpec>(); });
    REQUIRE(error.has_value());
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("checking a C++ DeviceSpec gives the reader's errors") {
  struct Case {
    const char* name;
    std::function<void(DeviceSpec&)> change;
    std::string json;
  };
  const std::vector<Case> cases = {
      {"tiles", [](DeviceSpec& d) { d.tilesPerIpu = 0; }, R"({"tilesPerIpu": 0})"},
      {"latency", [](DeviceSpec& d) { d.transferLatencySeconds = -1; }, R"({"transferLatencySeconds": -1})"},
      {"overflow",
       [](DeviceSpec& d) {
         d.tilesPerIpu = int64_t{1} << 40;
         d.bytesPerTile = int64_t{1} << 40;
       },
       R"({"tilesPerIpu": 1099511627776, "bytesPerTile": 1099511627776})"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    DeviceSpec device;
    c.change(device);
    const auto checked = test::catchError<ConfigError>([&] { jsonio::checkRules(device, "/device"); });
    const auto read = test::catchError<ConfigError>(
        [&] { (void)jsonio::readValue<DeviceSpec>(json::parse(c.json), "/device", jsonio::SourceMap{}); });
    REQUIRE(checked.has_value());
    REQUIRE(read.has_value());
    CHECK(checked->code() == read->code());
    CHECK(checked->subject() == read->subject());
    CHECK(checked->detail() == read->detail());
  }
  CHECK_NOTHROW(jsonio::checkRules(DeviceSpec{}, "/device"));
}

TEST_CASE("the DeviceSpec schema has every field with its range") {
  const json schema = jsonio::schemaOf<DeviceSpec>();
  CHECK(schema["additionalProperties"] == false);
  CHECK(schema["properties"].size() == json(DeviceSpec{}).size());
  CHECK(schema["properties"]["tilesPerIpu"] ==
        json{{"type", "integer"},
             {"minimum", 1},
             {"default", 1472},
             {"description", schema["properties"]["tilesPerIpu"]["description"]}});
  CHECK(schema["properties"]["computeFlopsPerSecond"]["exclusiveMinimum"] == 0.0);
  CHECK(schema["properties"]["transferLatencySeconds"]["minimum"] == 0.0);
  CHECK(schema["properties"]["numThreads"]["minimum"] == 0);
  CHECK(schema["properties"]["numThreads"]["maximum"] == 1024);
}

TEST_CASE("tileMemory splits the SRAM between compute and IO tiles") {
  const DeviceSpec device{};
  const TileMemory none = tileMemory(device, 0);
  CHECK(none.computeTileBytes == int64_t{1472} * 624 * 1024);
  CHECK(none.ioTileBytes == 0);
  const TileMemory some = tileMemory(device, 128);
  CHECK(some.computeTileBytes == int64_t{1344} * 624 * 1024);
  CHECK(some.ioTileBytes == int64_t{128} * 624 * 1024);
  CHECK(some.computeTileBytes + some.ioTileBytes == none.computeTileBytes);
  TESSERA_CHECK_ERROR(tileMemory(device, 1472), ConfigError, ErrorCode::IOTilesExceedTiles);
  TESSERA_CHECK_ERROR(tileMemory(device, -2), ConfigError, ErrorCode::IOTilesExceedTiles);
  DeviceSpec huge;
  huge.tilesPerIpu = int64_t{1} << 40;
  huge.bytesPerTile = int64_t{1} << 40;
  TESSERA_CHECK_ERROR(tileMemory(huge, 0), ConfigError, ErrorCode::InvalidDeviceSpec);
}

}  // namespace
}  // namespace tessera
