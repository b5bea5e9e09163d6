// Communicators between threads acting as instances: the collectives, what
// happens when an instance does not take part, and the agreement check that
// names the first difference between instances.
#include "tessera/popdist/communicator.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "support/instances.hpp"
#include "test_support.hpp"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

using test::errorOf;

// Runs body(rank, communicator) on `instances` threads and returns what each
// threw (nullptr when it returned).
std::vector<std::exception_ptr> onInstances(int64_t instances,
                                            const std::function<void(int64_t, Communicator&)>& body,
                                            std::chrono::milliseconds timeout = 10s) {
  return test::onInstances(
      instances, [&](int64_t rank, std::shared_ptr<Communicator> c) { body(rank, *c); }, timeout);
}

}  // namespace

TEST_CASE("in-process communicators gather, reduce and broadcast in rank order") {
  for (const int64_t instances : {1, 2, 3, 4}) {
    CAPTURE(instances);
    std::vector<std::vector<float>> gathered(static_cast<size_t>(instances));
    std::vector<std::vector<float>> sums(static_cast<size_t>(instances));
    std::vector<std::vector<float>> broadcasts(static_cast<size_t>(instances));
    std::vector<std::vector<std::string>> texts(static_cast<size_t>(instances));
    const auto errors = onInstances(instances, [&](int64_t rank, Communicator& c) {
      CHECK(c.size() == instances);
      CHECK(c.rank() == rank);
      const std::vector<float> mine{static_cast<float>(rank), 10.0f + static_cast<float>(rank)};
      auto& all = gathered[static_cast<size_t>(rank)];
      all.assign(static_cast<size_t>(2 * instances), -1.0f);
      c.allGather(mine, all);
      // In place: this instance's block of the output is its input.
      std::vector<float> inPlace(static_cast<size_t>(2 * instances), 0.0f);
      inPlace[static_cast<size_t>(2 * rank)] = mine[0];
      inPlace[static_cast<size_t>(2 * rank + 1)] = mine[1];
      c.allGather(std::span<const float>(inPlace).subspan(static_cast<size_t>(2 * rank), 2), inPlace);
      CHECK(inPlace == all);
      auto& sum = sums[static_cast<size_t>(rank)];
      sum = {1.0f, static_cast<float>(rank)};
      c.allReduceSum(sum);
      auto& value = broadcasts[static_cast<size_t>(rank)];
      value = {static_cast<float>(rank), static_cast<float>(rank)};
      c.broadcast(value, instances - 1);
      c.barrier();
      texts[static_cast<size_t>(rank)] = c.allGatherBytes(std::string(static_cast<size_t>(rank), 'x'));
    });
    for (int64_t i = 0; i < instances; ++i) {
      CHECK(errors[static_cast<size_t>(i)] == nullptr);
      std::vector<float> expected;
      for (int64_t q = 0; q < instances; ++q) {
        expected.push_back(static_cast<float>(q));
        expected.push_back(10.0f + static_cast<float>(q));
      }
      CHECK(gathered[static_cast<size_t>(i)] == expected);
      CHECK(sums[static_cast<size_t>(i)] ==
            std::vector<float>{static_cast<float>(instances),
                               static_cast<float>(instances * (instances - 1) / 2)});
      CHECK(broadcasts[static_cast<size_t>(i)] ==
            std::vector<float>{static_cast<float>(instances - 1), static_cast<float>(instances - 1)});
      REQUIRE(texts[static_cast<size_t>(i)].size() == static_cast<size_t>(instances));
      for (int64_t q = 0; q < instances; ++q)
        CHECK(texts[static_cast<size_t>(i)][static_cast<size_t>(q)].size() == static_cast<size_t>(q));
    }
  }
}

TEST_CASE("an instance that does not take part is named by the others after the timeout") {
  const auto start = std::chrono::steady_clock::now();
  const auto errors = onInstances(
      3,
      [](int64_t rank, Communicator& c) {
        if (rank == 2) return;  // leaves before the exchange
        std::vector<float> all(3);
        c.allGather(std::vector<float>{1.0f}, all);
      },
      200ms);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(errors[2] == nullptr);
  for (const int64_t rank : {0, 1}) {
    const DistError error = errorOf<DistError>(errors[static_cast<size_t>(rank)]);
    INFO(error.what());
    CHECK(error.code() == ErrorCode::InstanceLost);
    CHECK(error.subject() == "instance 2");
    CHECK(error.detail().find("did not take part") != std::string::npos);
    CHECK(error.detail().find("allGather #0") != std::string::npos);
  }
}

TEST_CASE("after a lost instance every later exchange fails at once") {
  const auto errors = onInstances(
      2,
      [](int64_t rank, Communicator& c) {
        if (rank == 1) return;
        CHECK(test::catchError<DistError>([&] { c.barrier(); }).has_value());
        const auto start = std::chrono::steady_clock::now();
        const auto again = test::catchError<DistError>([&] { c.barrier(); });
        REQUIRE(again.has_value());
        CHECK(again->code() == ErrorCode::InstanceLost);
        CHECK(again->subject() == "instance 1");
        CHECK(std::chrono::steady_clock::now() - start < 100ms);
      },
      100ms);
  CHECK(errors[0] == nullptr);
}

TEST_CASE("instances that pass different sizes fail alike") {
  const auto errors = onInstances(2, [](int64_t rank, Communicator& c) {
    std::vector<float> values(static_cast<size_t>(rank + 1), 1.0f);
    c.allReduceSum(values);
  });
  for (const auto& e : errors) {
    const DistError error = errorOf<DistError>(e);
    INFO(error.what());
    CHECK(error.code() == ErrorCode::InstanceMismatch);
    CHECK(error.subject() == "instance 1");
  }
  const auto wrongRoom = onInstances(1, [](int64_t, Communicator& c) {
    std::vector<float> all(3);
    c.allGather(std::vector<float>{1.0f}, all);
  });
  CHECK(errorOf<DistError>(wrongRoom[0]).code() == ErrorCode::InstanceMismatch);
  CHECK(test::catchError<ConfigError>([] { makeInProcessCommunicators(0); })->code() ==
        ErrorCode::OutOfRange);
}

TEST_CASE("checkInstancesAgree passes equal settings and names the first difference on every instance") {
  using nlohmann::json;
  SUBCASE("equal") {
    const auto errors = onInstances(3, [](int64_t, Communicator& c) {
      dist::checkInstancesAgree(c, json{{"a", 1}, {"b", {1, 2}}}, "settings");
    });
    for (const auto& e : errors) CHECK(e == nullptr);
  }
  struct Row {
    std::string name;
    std::function<json(int64_t)> settings;
    std::string subject;
    std::string fragment;
  };
  const std::vector<Row> rows = {
      {"a leaf",
       [](int64_t rank) {
         return json{{"a", {{"x", 1}, {"y", rank == 2 ? 5 : 4}}}, {"z", rank}};
       },
       "/a/y", "4 on instance 0, 5 on instance 2 (instance(s) 1, 2 differ from instance 0)"},
      {"a missing key",
       [](int64_t rank) {
         return rank == 1 ? json{{"a", 1}} : json{{"a", 1}, {"b", 2}};
       },
       "/b", "2 on instance 0, (absent) on instance 1"},
      {"list indices in numeric order",
       [](int64_t rank) {
         json list = json::array();
         for (int i = 0; i < 12; ++i) list.push_back(i);
         if (rank == 1) list[10] = -1;
         if (rank == 2) list[2] = -1;
         return json{{"list", list}};
       },
       "/list/2", "2 on instance 0, -1 on instance 2"},
      {"a longer list",
       [](int64_t rank) {
         return json{{"l", rank == 1 ? json{1, 2, 3} : json{1, 2}}};
       },
       "/l/2", "(absent) on instance 0, 3 on instance 1"},
      {"an object for a value",
       [](int64_t rank) {
         return rank == 0 ? json{{"o", 1}} : json{{"o", {{"k", 1}}}};
       },
       "/o", "1 on instance 0, an object (with 1 entries) on instance 1"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const auto errors = onInstances(3, [&](int64_t rank, Communicator& c) {
      dist::checkInstancesAgree(c, row.settings(rank), "settings");
    });
    for (const auto& e : errors) {
      const DistError error = errorOf<DistError>(e);
      INFO(error.what());
      CHECK(error.code() == ErrorCode::InstanceMismatch);
      CHECK(error.subject() == row.subject);
      CHECK(error.detail().find("the instances' settings differ here") != std::string::npos);
      CHECK(error.detail().find(row.fragment) != std::string::npos);
    }
  }
}
