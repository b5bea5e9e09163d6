// The device's host threads: every result is the same bits at any thread
// count, and the thread count comes from the spec, TESSERA_NUM_THREADS or
// the CPU affinity.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "device_checks.hpp"
#include "gemm.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "vector_math.hpp"
#include "worker_pool.hpp"

using namespace tessera;

namespace {

// Large enough that the products and the optimizer's chains are split
// (a first layer four blocks of the sum deep, cut by its sum on 2 threads
// and by columns on 3 and 4; rows that leave edge tiles; the weight
// gradients by rows), small enough to train a few steps quickly.
constexpr int64_t kFeatures = 800;
constexpr int64_t kGlobalBatch = 48;
constexpr int64_t kSteps = 3;

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
  std::vector<uint8_t> checkpoint;
  int threads = 0;
};

Trained train(int64_t replicas, int threads, bool rts) {
  ModelConfig model;
  model.layers = {kFeatures, 160, 40, 4};
  MlpGraph mlp = buildMlp(model, kGlobalBatch / replicas, replicas, 5);
  SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  if (rts) {
    for (TensorCategory category : {TensorCategory::Weight, TensorCategory::OptimizerState})
      options.locationSettings(category).location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  }
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.05;
  sgd.sgd.momentum = 0.9;
  DeviceSpec spec;
  spec.numThreads = threads;
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgd), options, makeSimDevice(spec));

  std::vector<float> x(static_cast<size_t>(kGlobalBatch * kFeatures));
  std::vector<int32_t> y(static_cast<size_t>(kGlobalBatch));
  uint64_t state = 7;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  Trained out;
  for (int64_t s = 0; s < kSteps; ++s) {
    for (float& v : x) v = static_cast<float>(next() % 2000) / 1000.0f - 1.0f;
    for (int32_t& v : y) v = static_cast<int32_t>(next() % 4);
    session.run(
        {StepInput("input", std::span<const float>(x)), StepInput("labels", std::span<const int32_t>(y))});
    out.losses.push_back(session.meanLoss());
  }
  for (auto& [name, tensor] : session.readWeights()) out.weights.emplace(name, tensor.data);
  out.checkpoint = encodeCheckpoint(makeCheckpoint(session));
  return out;
}

}  // namespace

TEST_CASE("losses, weights and checkpoint bytes are the same bits at 1, 2, 3 and 4 threads") {
  struct Case {
    int64_t replicas;
    bool rts;
  };
  // The first layer's forward product at R = 1 is cut by its sum on 2
  // threads (with the packed kernels): its halves added after two threads
  // computed them must be the bits of one thread computing both.
  const sim::GemmIsa isa = sim::bestGemmIsa();
  const sim::GemmShape first{kGlobalBatch, 160, kFeatures, false, false};
  if (isa != sim::GemmIsa::Portable)
    CHECK(sim::splitsBySum(sim::planGemm(isa, first.m, first.n, first.k), first, 2));
  for (const Case c : {Case{1, false}, Case{2, false}, Case{3, false}, Case{4, false}, Case{2, true}}) {
    CAPTURE(c.replicas);
    CAPTURE(c.rts);
    const Trained one = train(c.replicas, 1, c.rts);
    REQUIRE(one.losses.size() == kSteps);
    // The run trains: a loss that did not move would compare equal trivially.
    CHECK(one.losses.front() != one.losses.back());
    for (int threads : {2, 3, 4}) {
      CAPTURE(threads);
      const Trained other = train(c.replicas, threads, c.rts);
      CHECK(other.losses == one.losses);  // exact: doubles of float sums
      REQUIRE(other.weights.size() == one.weights.size());
      for (const auto& weight : one.weights) {
        CAPTURE(weight.first);
        CHECK(other.weights.at(weight.first) == weight.second);
      }
      CHECK(other.checkpoint == one.checkpoint);
    }
  }
}

namespace {

// `graph` loaded on a device of `threads` threads, Vectorized.
test::DeviceRun loadOnThreads(const Graph& graph, int threads) {
  DeviceSpec spec;
  spec.numThreads = threads;
  return test::loadOnDevice(graph, ExecutionMode::Vectorized, spec);
}

// Softmax, log-softmax, cross entropy (summed and mean) and its gradient
// over `replicas` x rows x cols: every output of a run at `threads`.
struct RowOutputs {
  std::vector<std::vector<float>> values;
  std::vector<float> logits;
  std::vector<float> labels;
};

RowOutputs runRowOps(int64_t replicas, int64_t rows, int64_t cols, int threads) {
  Graph g(replicas);
  const Tensor logits = ops::input(g, "logits", {rows, cols});
  const Tensor labels = ops::input(g, "labels", {rows}, DType::Int32);
  const Tensor sum = ops::softmaxCrossEntropy(logits, labels, ReductionType::Sum);
  const Tensor mean = ops::softmaxCrossEntropy(logits, labels, ReductionType::Mean);
  OpAttributes meanAttributes;
  meanAttributes.reduction = ReductionType::Mean;
  const Tensor factor = ops::mul(mean, ops::scalar(g, 3.0));
  const OpNode& gradOp = g.op(g.addOp(OpKind::SoftmaxCrossEntropyGrad, {factor.id(), logits.id(), labels.id()},
                                      std::move(meanAttributes)));
  const Tensor grad{&g, gradOp.outputs[0]};
  const std::vector<Tensor> outputs = {ops::softmax(logits), ops::logSoftmax(logits), sum, mean, grad};

  RowOutputs out;
  // Logits over a wide range, so that every row's exponentials and sums
  // are far from round numbers.
  out.logits = test::pseudoRandom(static_cast<std::size_t>(replicas * rows * cols), 31, -20.0f, 20.0f);
  out.labels = test::pseudoRandom(static_cast<std::size_t>(replicas * rows), 32, 0.0f, static_cast<float>(cols));
  for (float& v : out.labels) v = std::floor(v);
  test::DeviceRun device = loadOnThreads(g, threads);
  test::runDevice(*device.executable, {{logits.id(), out.logits}, {labels.id(), out.labels}});
  for (const Tensor& t : outputs) {
    std::vector<float> values(static_cast<std::size_t>(replicas * numElements(t.shape())));
    device.executable->read(t.id(), values);
    out.values.push_back(std::move(values));
  }
  return out;
}

}  // namespace

TEST_CASE("row-wise steps: the same bits at 1 to 4 threads, the loss summed in row order") {
  // Many rows and few: a split of the rows over threads must keep both checks.
  for (const int64_t rows : {int64_t{200}, int64_t{5}}) {
    const int64_t replicas = 3;
    const int64_t cols = 13;
    CAPTURE(rows);
    const RowOutputs one = runRowOps(replicas, rows, cols, 1);
    // The loss is each row's log-sum-exp minus its label's logit, added in
    // row order in double (the device's exponential and sum, vector_math.hpp): a split that added blocks of
    // rows in another order, or dropped or repeated a row, gives other bits here.
    for (int64_t r = 0; r < replicas; ++r) {
      double loss = 0.0;
      for (int64_t i = 0; i < rows; ++i) {
        const float* x = one.logits.data() + (r * rows + i) * cols;
        const float max = *std::max_element(x, x + cols);
        std::vector<double> e(static_cast<std::size_t>(cols));
        for (int64_t j = 0; j < cols; ++j)
          e[static_cast<std::size_t>(j)] = sim::exponential(static_cast<double>(x[j] - max));
        sim::LaneSum sum;
        sum.add(e.data(), cols);
        const double exps = sum.total();
        const auto label = static_cast<int64_t>(one.labels[static_cast<std::size_t>(r * rows + i)]);
        loss += static_cast<double>(max) + std::log(exps) - static_cast<double>(x[label]);
      }
      const int64_t replica = r;
      CAPTURE(replica);
      CHECK(one.values[2][static_cast<std::size_t>(r)] == static_cast<float>(loss));
      CHECK(one.values[3][static_cast<std::size_t>(r)] ==
            static_cast<float>(loss * static_cast<double>(1.0f / static_cast<float>(rows))));
    }
    for (int threads : {2, 3, 4}) {
      CAPTURE(threads);
      const RowOutputs other = runRowOps(replicas, rows, cols, threads);
      REQUIRE(other.values.size() == one.values.size());
      for (std::size_t i = 0; i < one.values.size(); ++i) {
        CAPTURE(i);
        CHECK(other.values[i] == one.values[i]);
      }
    }
  }
}

// Row-wise steps of the softmax family split their rows over the threads
// once there are a few hundred elements a part, so they never go side by
// side (where each step has one thread) unless their rows are too few to
// split: a cross entropy and a softmax of 12,000 elements each run one after
// the other, each over every thread; two of one row of 9,000 side by side.
TEST_CASE("softmax and cross entropy split their rows rather than run side by side") {
  for (const int64_t rows : {int64_t{600}, int64_t{1}}) {
    CAPTURE(rows);
    const int64_t cols = rows == 600 ? 20 : 9'000;
    Graph g(1);
    const Tensor a = ops::input(g, "a", {rows, cols});
    const Tensor b = ops::input(g, "b", {rows, cols});
    const Tensor labels = ops::input(g, "labels", {rows}, DType::Int32);
    const Tensor loss = ops::softmaxCrossEntropy(a, labels, ReductionType::Mean);
    const Tensor p = ops::softmax(b);
    const auto feeds = test::makeFeeds(g, cols, 8);
    std::vector<std::vector<float>> single;
    for (const int threads : {1, 2, 3}) {
      CAPTURE(threads);
      test::DeviceRun device = loadOnThreads(g, threads);
      const bool split = rows == 600 || threads == 1;
      CHECK(device.sim->stats().besideGroups == (split ? 0 : 1));
      test::runDevice(*device.executable, feeds);
      const std::vector<std::vector<float>> values = {test::deviceValue(*device.executable, g, loss.id(), 0),
                                                      test::deviceValue(*device.executable, g, p.id(), 0)};
      if (threads == 1) {
        single = values;
        continue;
      }
      CHECK(values == single);
    }
  }
}

TEST_CASE("the worker pool runs every part once, each on a thread below its count") {
  for (int threads : {1, 2, 3, 5}) {
    CAPTURE(threads);
    sim::WorkerPool pool(threads);
    CHECK(pool.threads() == threads);
    for (int parts : {0, 1, 2, 7, 64}) {
      CAPTURE(parts);
      std::vector<int> runs(static_cast<size_t>(parts), 0);
      std::vector<int> thread(static_cast<size_t>(parts), -1);
      for (int job = 0; job < 3; ++job) {
        pool.run(parts, [&](int part, int t) {
          ++runs[static_cast<size_t>(part)];
          thread[static_cast<size_t>(part)] = t;
        });
      }
      for (int p = 0; p < parts; ++p) {
        CHECK(runs[static_cast<size_t>(p)] == 3);
        CHECK(thread[static_cast<size_t>(p)] >= 0);
        CHECK(thread[static_cast<size_t>(p)] < threads);
      }
    }
  }
}

TEST_CASE("the worker pool runs every part once whether its workers were kept polling or had gone to sleep") {
  for (int threads : {2, 3, 4}) {
    CAPTURE(threads);
    sim::WorkerPool pool(threads);
    for (int round = 0; round < 4; ++round) {
      CAPTURE(round);
      // Rounds 1 and 3 start after the workers have given up polling (20 us)
      // and gone to sleep; rounds 2 and 3 keep them polling between jobs.
      if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::vector<std::atomic<int>> runs(16);
      std::atomic<int> outOfRange{0};
      for (int job = 0; job < 50; ++job) {
        if (round >= 2) pool.stayAwake();
        pool.run(16, [&](int part, int t) {
          if (t < 0 || t >= threads) outOfRange.fetch_add(1);
          runs[static_cast<size_t>(part)].fetch_add(1);
        });
      }
      CHECK(outOfRange.load() == 0);
      for (const std::atomic<int>& r : runs) CHECK(r.load() == 50);
    }
  }
}

TEST_CASE("idle work runs on the workers between jobs, never on the caller, and stops when removed") {
  const std::thread::id caller = std::this_thread::get_id();
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    sim::WorkerPool pool(threads);
    constexpr int kPieces = 200;
    std::atomic<int> pieces{0};
    std::atomic<int> onCaller{0};
    std::atomic<int> duringPart{0};
    static thread_local bool inPart = false;
    pool.setIdleWork([&] {
      if (std::this_thread::get_id() == caller) onCaller.fetch_add(1);
      if (inPart) duringPart.fetch_add(1);
      // Taken one at a time: two workers that both saw kPieces - 1 left
      // must not both take it.
      int taken = pieces.load();
      do {
        if (taken >= kPieces) return false;
      } while (!pieces.compare_exchange_weak(taken, taken + 1));
      return true;
    });
    // Jobs with the workers kept polling: the pieces run in the gaps, up to 2 s.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (pieces.load() < kPieces && std::chrono::steady_clock::now() < deadline) {
      pool.stayAwake();
      pool.run(threads, [&](int, int) {
        inPart = true;
        for (int i = 0; i < 1000; ++i) asm volatile("");
        inPart = false;
      });
    }
    CHECK(onCaller.load() == 0);
    CHECK(duringPart.load() == 0);
    // One thread has no worker to do it: the work is the caller's to finish.
    CHECK(pieces.load() == (threads == 1 ? 0 : kPieces));
    // Removed: returns with no piece running, and none runs after.
    std::atomic<int> late{0};
    pool.setIdleWork([&] {
      late.fetch_add(1);
      return true;
    });
    pool.setIdleWork({});
    const int seen = late.load();
    for (int job = 0; job < 200; ++job) {
      pool.stayAwake();
      pool.run(threads, [](int, int) {});
    }
    CHECK(late.load() == seen);
  }
}

TEST_CASE("a job of as many parts as threads runs part p on thread p") {
  for (int threads : {2, 3, 4}) {
    CAPTURE(threads);
    sim::WorkerPool pool(threads);
    for (int job = 0; job < 20; ++job) {
      CAPTURE(job);
      if (job % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // workers asleep
      // Every part waits until all have started, so each thread runs one
      // part and none can take a second before the others have taken theirs.
      std::atomic<int> started{0};
      std::atomic<int> timedOut{0};
      std::vector<int> thread(static_cast<size_t>(threads), -1);
      pool.run(threads, [&](int part, int t) {
        thread[static_cast<size_t>(part)] = t;
        started.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (started.load() < threads) {
          if (std::chrono::steady_clock::now() > deadline) {
            timedOut.fetch_add(1);
            break;
          }
          std::this_thread::yield();
        }
      });
      CHECK(timedOut.load() == 0);
      for (int p = 0; p < threads; ++p) CHECK(thread[static_cast<size_t>(p)] == p);
    }
  }
}

TEST_CASE("a job started inside a part runs all its parts on that part's thread") {
  sim::WorkerPool pool(3);
  CHECK(pool.currentThread() == 0);
  // Outer parts on threads 0-2 (each waits for the others, so every thread
  // has one); each starts an inner job of 4 parts, which must run there,
  // in order, on the thread that started it.
  std::atomic<int> started{0};
  std::vector<int> outerThread(3, -1);
  std::vector<int> seenCurrent(3, -1);
  std::vector<std::vector<std::pair<int, int>>> inner(3);
  pool.run(3, [&](int part, int thread) {
    const auto at = static_cast<std::size_t>(part);
    outerThread[at] = thread;
    seenCurrent[at] = pool.currentThread();
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    pool.run(4, [&](int innerPart, int innerThread) { inner[at].emplace_back(innerPart, innerThread); });
  });
  std::set<int> threads;
  for (std::size_t p = 0; p < 3; ++p) {
    CAPTURE(p);
    CHECK(seenCurrent[p] == outerThread[p]);
    threads.insert(outerThread[p]);
    const std::vector<std::pair<int, int>> expected = {
        {0, outerThread[p]}, {1, outerThread[p]}, {2, outerThread[p]}, {3, outerThread[p]}};
    CHECK(inner[p] == expected);
  }
  CHECK(threads.size() == 3);
  // Back outside the job, the caller is thread 0 again, and jobs split.
  CHECK(pool.currentThread() == 0);
  std::atomic<int> parts{0};
  pool.run(3, [&](int, int) { parts.fetch_add(1); });
  CHECK(parts.load() == 3);
}

TEST_CASE("the thread count: the spec, else TESSERA_NUM_THREADS, else the CPU affinity") {
  const char* saved = std::getenv("TESSERA_NUM_THREADS");
  const std::string restore = saved == nullptr ? "" : saved;
  ::unsetenv("TESSERA_NUM_THREADS");
  DeviceSpec spec;
  CHECK(sim::deviceThreads(spec) == sim::affinityCpus());
  CHECK(sim::affinityCpus() >= 1);
  ::setenv("TESSERA_NUM_THREADS", "3", 1);
  CHECK(sim::deviceThreads(spec) == 3);
  CHECK(makeSimDevice(spec)->hostThreads() == 3);
  {
    // A device reads the variable once: its programs run on the threads it
    // reports, whatever the variable says when they are loaded.
    const std::unique_ptr<Device> device = makeSimDevice(spec);
    ::setenv("TESSERA_NUM_THREADS", "1", 1);
    Graph g(1);
    ops::relu(ops::input(g, "x", {4}));
    Program program{g};
    const std::unique_ptr<Executable> loaded = device->load(std::move(program));
    const auto* executable = dynamic_cast<const sim::SimExecutable*>(loaded.get());
    REQUIRE(executable != nullptr);
    CHECK(executable->threads() == 3);
    CHECK(device->hostThreads() == 3);
  }
  spec.numThreads = 5;
  CHECK(sim::deviceThreads(spec) == 5);
  CHECK(makeSimDevice(spec)->hostThreads() == 5);
  spec.numThreads = 0;
  for (const char* bad : {"0", "-2", "two", "3x", "1025", " 2"}) {
    CAPTURE(bad);
    ::setenv("TESSERA_NUM_THREADS", bad, 1);
    try {
      sim::deviceThreads(spec);
      FAIL("no error");
    } catch (const ConfigError& e) {
      CHECK(e.code() == ErrorCode::InvalidDeviceSpec);
      CHECK(e.subject() == "TESSERA_NUM_THREADS");
      CHECK(std::string(e.what()).find(std::string("TESSERA_NUM_THREADS is '") + bad + "'") !=
            std::string::npos);
    }
  }
  if (saved == nullptr) {
    ::unsetenv("TESSERA_NUM_THREADS");
  } else {
    ::setenv("TESSERA_NUM_THREADS", restore.c_str(), 1);
  }
}

// Adjacent steps that share no written memory and each run on one thread
// go to the threads side by side (Step::beside); a step that reads what one
// of them writes, or writes what one reads, waits for them. The values are
// the same bits at any thread count and those of the reference.
TEST_CASE("independent steps run side by side, dependent ones after: the same bits at 1 to 3 threads") {
  // One replica: each sum is then of a single value, which no thread count
  // splits (a sum per replica is split by replicas from 2 x 4,096 terms).
  Graph g(1);
  const Tensor x1 = ops::input(g, "x1", {1, 10'000});
  const Tensor x2 = ops::input(g, "x2", {1, 12'000});
  const Tensor v = ops::variable(g, "v", test::pseudoRandom(10'000, 5), {1, 10'000});
  // Two softmaxes of one row each (a row is never split), then three sums,
  // the first two of the softmaxes' outputs, the last of v, which the
  // in-place update after it rewrites. (Elementwise steps this large split
  // their loops instead.)
  const Tensor y1 = ops::softmax(x1);
  const Tensor y2 = ops::softmax(x2);
  const Tensor s1 = ops::reduceSum(y1);
  const Tensor s2 = ops::reduceSum(y2);
  const Tensor sv = ops::reduceSum(v);
  ops::scaledAddInplace(v, y1, 1.0, -0.5);
  const std::vector<Tensor> outputs = {y1, y2, s1, s2, sv, v};
  const auto feeds = test::makeFeeds(g, 1, 21);

  std::vector<std::vector<float>> single;
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    test::DeviceRun device = loadOnThreads(g, threads);
    const sim::PlanStats& stats = device.sim->stats();
    // 2 threads: {softmax, softmax}, {sum of y1, sum of y2}, then the sum of v
    // alone (the group is full) and the update apart from it. 3 threads:
    // the three sums together.
    CHECK(stats.besideGroups == (threads == 1 ? 0 : 2));
    CHECK(stats.besideSteps == (threads == 1 ? 0 : threads == 2 ? 4 : 5));
    test::runDevice(*device.executable, feeds);
    test::ReferenceEvaluator oracle(g);
    test::feedOracle(oracle, g, feeds);
    oracle.run();
    // (float32 sums of 10,000 terms of both signs against double ones.)
    CHECK(test::compareAll(*device.executable, g, oracle, 2e-3) >= 6);
    std::vector<std::vector<float>> values;
    for (const Tensor& t : outputs) values.push_back(test::deviceValue(*device.executable, g, t.id(), 0));
    if (threads == 1) {
      single = values;
      continue;
    }
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      CAPTURE(i);
      CHECK(values[i] == single[i]);
    }
  }
}

// The strided steps that split their loops over the threads (copies,
// transposes, pads, broadcasts, Where, the elementwise ops' broadcast
// loops, unary ops outside chains) and the reductions over rows: large enough to split, with shapes
// whose outer dimension does not divide evenly. The same bits at 1 to 4
// threads as at one, and the reference's values.
TEST_CASE("split strided steps and reductions: the same bits at 1 to 4 threads") {
  for (const int64_t replicas : {int64_t{1}, int64_t{2}}) {
    CAPTURE(replicas);
    Graph g(replicas);
    const Tensor x = ops::input(g, "x", {67, 3, 8, 16});
    const Tensor mask = ops::input(g, "mask", {8, 16});
    const Tensor t = ops::transpose(x, {0, 2, 1, 3});
    const Tensor k = ops::transpose(x, {0, 1, 3, 2});
    const Tensor part = ops::slice(x, {0, 1, 0, 0}, {67, 3, 8, 16});
    OpAttributes pad;
    pad.shape = {67, 3, 8, 16};
    pad.starts = {0, 1, 0, 0};
    pad.ends = {67, 3, 8, 16};
    const Tensor padded{&g, g.op(g.addOp(OpKind::SlicePad, {part.id()}, std::move(pad))).outputs[0]};
    const Tensor rows = ops::reshape(x, {67 * 3 * 8, 16});
    const Tensor mean = ops::reduceMean(rows, {1}, true);
    const Tensor centred = ops::sub(rows, mean);
    const Tensor spread = ops::add(ops::mul(mean, mean), ops::scalar(g, 1.0));
    const Tensor scaled = ops::div(centred, ops::broadcastTo(spread, {67 * 3 * 8, 16}));
    const Tensor columnSums = ops::reduceSum(rows, {0});
    const Tensor masked = ops::where(mask, ops::scalar(g, -1.0e9), x);
    const Tensor joined = ops::concat({x, padded}, 1);
    // Unary ops, each over a count of elements of its own (so that no chain
    // joins them): a vector form, a bulk row (Tanh) and one element at a
    // time.
    const Tensor rectified = ops::relu(x);
    const Tensor bent = ops::tanh(joined);
    const Tensor magnitude = ops::abs(ops::slice(x, {0, 1, 0, 0}, {67, 3, 8, 16}));
    const std::vector<Tensor> outputs = {t,          k,      padded, mean,      centred, scaled,
                                         columnSums, masked, joined, rectified, bent,    magnitude};
    auto feeds = test::makeFeeds(g, 1, 41);
    for (float& v : feeds[mask.id()]) v = v > 0.0f ? 1.0f : 0.0f;

    std::vector<std::vector<float>> single;
    for (const int threads : {1, 2, 3, 4}) {
      CAPTURE(threads);
      // Only the outputs are read back, as in a session.
      DeviceSpec spec;
      spec.numThreads = threads;
      std::vector<TensorId> reads;
      for (const Tensor& out : outputs) reads.push_back(out.id());
      test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized, spec, reads);
      test::runDevice(*device.executable, feeds);
      std::vector<std::vector<float>> values;
      for (const Tensor& out : outputs) {
        for (int64_t r = 0; r < replicas; ++r) {
          values.push_back(test::deviceValue(*device.executable, g, out.id(), r));
        }
      }
      if (threads == 1) {
        test::ReferenceEvaluator oracle(g);
        test::feedOracle(oracle, g, feeds);
        oracle.run();
        // (float32 sums of 1,608 terms against double ones.)
        CHECK(test::compareAll(*device.executable, g, oracle, 2e-4) >= static_cast<int64_t>(outputs.size()));
        single = values;
        continue;
      }
      for (std::size_t i = 0; i < values.size(); ++i) {
        CAPTURE(i);
        CHECK(values[i] == single[i]);
      }
    }
  }
}

namespace {

// Runs `g` at 1, 2, 3 and 4 threads on the same feeds (from `seed`) and
// checks that every one of `outputs` has the bits of the 1-thread run.
void sameBitsAtOneToFourThreads(const Graph& g, const std::vector<TensorId>& outputs, uint64_t seed) {
  const auto feeds = test::makeFeeds(g, 1, seed);
  std::vector<std::vector<float>> single;
  for (const int threads : {1, 2, 3, 4}) {
    CAPTURE(threads);
    DeviceSpec spec;
    spec.numThreads = threads;
    test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized, spec, outputs);
    test::runDevice(*device.executable, feeds);
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const std::vector<float> value = test::deviceValue(*device.executable, g, outputs[i], 0);
      if (threads == 1) {
        single.push_back(value);
      } else {
        CHECK(value == single[i]);
      }
    }
  }
}

}  // namespace

TEST_CASE("depthwise convolutions and convolutions by chunks of samples: the same bits at 1 to 4 threads") {
  // A depthwise 3 x 3 (one channel per group: direct kernels) and a 3 x 3
  // and a 1 x 1 over 4 x 4 positions (products over chunks of samples),
  // forward and both gradients.
  Graph g(1);
  const Tensor x = ops::input(g, "x", {6, 24, 8, 8});
  const Tensor wd = ops::variable(g, "wd", test::pseudoRandom(24 * 9, 51), {24, 1, 3, 3});
  const ops::ConvParams pd{.strides = {2, 2}, .pads = {1, 1, 1, 1}, .group = 24};
  const Tensor d = ops::conv(x, wd, pd);
  const Tensor w3 = ops::variable(g, "w3", test::pseudoRandom(32 * 24 * 9, 52), {32, 24, 3, 3});
  const Tensor c3 = ops::conv(d, w3, {.pads = {1, 1, 1, 1}});
  const Tensor w1 = ops::variable(g, "w1", test::pseudoRandom(40 * 32, 53), {40, 32, 1, 1});
  const Tensor c1 = ops::conv(c3, w1);
  const Tensor loss = ops::reduceSum(ops::mul(c1, c1));
  std::vector<TensorId> outputs{c1.id()};
  for (const Tensor& grad : autodiff(g, loss, {x, wd, w3, w1})) outputs.push_back(grad.id());
  sameBitsAtOneToFourThreads(g, outputs, 54);
}

TEST_CASE("batch normalisation split by channels: the same bits at 1 to 4 threads, forward and back") {
  // 6 channels of 16 x 16 x 16 values: up to 3 parts of 2 channels.
  Graph g(1);
  const Tensor x = ops::input(g, "x", {16, 6, 16, 16});
  const Tensor dy = ops::input(g, "dy", {16, 6, 16, 16});
  const Tensor scale = ops::variable(g, "scale", test::pseudoRandom(6, 61, 0.5f, 1.5f), {6});
  const Tensor bias = ops::variable(g, "bias", test::pseudoRandom(6, 62), {6});
  const ops::BatchNormOutputs bn = ops::batchNormTraining(x, scale, bias);
  const Tensor loss = ops::reduceSum(ops::mul(bn.y, dy));
  std::vector<TensorId> outputs{bn.y.id(), bn.mean.id(), bn.variance.id()};
  for (const Tensor& grad : autodiff(g, loss, {x, scale, bias})) outputs.push_back(grad.id());
  sameBitsAtOneToFourThreads(g, outputs, 63);
}

TEST_CASE("a convolution's weight gradient sums its chunks in two halves: the same bits at 1 to 4 threads") {
  // 7 samples of 50 column rows (2 groups of 2 channels, 5 x 5 taps) over
  // 26 x 26 positions: a chunk of one sample, so halves of 4 and 3 chunks;
  // 3 output channels per group (dy first) and 20 (columns first).
  for (const int64_t outChannels : {int64_t{6}, int64_t{40}}) {
    CAPTURE(outChannels);
    Graph g(1);
    const Tensor x = ops::input(g, "x", {7, 4, 30, 30});
    const Tensor w =
        ops::variable(g, "w", test::pseudoRandom(outChannels * 2 * 25, 43), {outChannels, 2, 5, 5});
    const Tensor y = ops::conv(x, w, {.group = 2});
    const Tensor dy = ops::input(g, "dy", y.shape());
    OpAttributes weight;
    weight.strides = {1, 1};
    weight.pads = {0, 0, 0, 0};
    weight.dilations = {1, 1};
    weight.group = 2;
    weight.shape = {outChannels, 2, 5, 5};
    const Tensor dw{&g,
                    g.op(g.addOp(OpKind::ConvGradWeight, {dy.id(), x.id()}, std::move(weight))).outputs[0]};
    const auto feeds = test::makeFeeds(g, 1, 47);
    std::vector<float> single;
    for (const int threads : {1, 2, 3, 4}) {
      CAPTURE(threads);
      DeviceSpec spec;
      spec.numThreads = threads;
      test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized, spec, std::vector{dw.id()});
      test::runDevice(*device.executable, feeds);
      const std::vector<float> value = test::deviceValue(*device.executable, g, dw.id(), 0);
      if (threads == 1) {
        test::ReferenceEvaluator oracle(g);
        test::feedOracle(oracle, g, feeds);
        oracle.run();
        // (float32 sums of 4,732 terms against double ones.)
        test::compareTensor(*device.executable, g, oracle, dw.id(), 2e-4);
        single = value;
        continue;
      }
      CHECK(value == single);
    }
  }
}
