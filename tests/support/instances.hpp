// Several in-process instances of a run, one thread each, for tests of the
// multi-instance paths without MPI.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "tessera/popdist/communicator.hpp"

namespace tessera::test {

// Runs body(instance, communicator) for each of `instances` instances on
// its own thread, with in-process communicators that give up after
// `timeout`; returns what each threw (nullptr when it returned).
inline std::vector<std::exception_ptr> onInstances(
    int64_t instances, const std::function<void(int64_t, std::shared_ptr<Communicator>)>& body,
    std::chrono::milliseconds timeout) {
  const auto communicators = makeInProcessCommunicators(instances, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(instances));
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < instances; ++i) {
    threads.emplace_back([&, i] {
      try {
        body(i, communicators[static_cast<size_t>(i)]);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// The error of type E an instance threw; fails the test when it threw
// nothing.
template <class E>
E errorOf(const std::exception_ptr& error) {
  REQUIRE(error != nullptr);
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    return e;
  }
}

}  // namespace tessera::test
