// Peer benchmark: the GPT-style training step of tests/data/onnx/generate.py
// (GptBlock: vocabulary 32, width 16, sequence 8, 2 heads; token and
// position embeddings, one pre-LayerNorm decoder block with causal
// self-attention written out with matmuls and a -inf mask, a GELU MLP of 4x,
// a final LayerNorm, a linear head, the next-token cross-entropy) in
// libtorch on the CPU, with plain SGD, on a fixed batch of token sequences.
//
//   torch_gpt BATCH STEPS THREADS  -> prints "... samples_per_s=N"
// (a sample is one sequence of 8 tokens).
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "peer_timing.hpp"

namespace F = torch::nn::functional;

constexpr int64_t kVocab = 32, kDim = 16, kSequence = 8, kHeads = 2;

struct GptBlock : torch::nn::Module {
  torch::nn::Embedding tokens{nullptr}, positions{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr}, lnf{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::Tensor causal, index;

  GptBlock() {
    const int64_t d = kDim;
    tokens = register_module("tokens", torch::nn::Embedding(kVocab, d));
    positions = register_module("positions", torch::nn::Embedding(kSequence, d));
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
    fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    head = register_module("head", torch::nn::Linear(d, kVocab));
    dropout = register_module("dropout", torch::nn::Dropout(0.0));
    causal = register_buffer(
        "causal", torch::tril(torch::ones({kSequence, kSequence})).view({1, 1, kSequence, kSequence}));
    index = register_buffer("index", torch::arange(kSequence));
  }

  torch::Tensor forward(const torch::Tensor& in, const torch::Tensor& targets) {
    const int64_t n = in.size(0), t = in.size(1), d = kDim, h = kHeads;
    auto x = tokens->forward(in) + positions->forward(index.slice(0, 0, t));
    auto parts = qkv->forward(ln1->forward(x)).split(d, 2);
    auto q = parts[0].view({n, t, h, d / h}).transpose(1, 2);
    auto k = parts[1].view({n, t, h, d / h}).transpose(1, 2);
    auto v = parts[2].view({n, t, h, d / h}).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d / h)));
    using torch::indexing::Slice;
    auto mask = causal.index({Slice(), Slice(), Slice(0, t), Slice(0, t)}) == 0;
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
    auto attention = dropout->forward(torch::softmax(scores, -1));
    auto y = torch::matmul(attention, v).transpose(1, 2).reshape({n, t, d});
    x = x + proj->forward(y);
    x = x + fc2->forward(F::gelu(fc1->forward(ln2->forward(x))));
    auto logits = head->forward(lnf->forward(x));
    return F::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
  }
};

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 64;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 100;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  if (batch < 1 || steps < 1 || threads < 1) {
    std::fprintf(stderr, "usage: torch_gpt BATCH STEPS THREADS\n");
    return 2;
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  auto net = std::make_shared<GptBlock>();
  net->train();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
  const auto sequence = torch::randint(0, kVocab, {batch, kSequence + 1}, torch::kLong);
  const auto in = sequence.slice(1, 0, kSequence).contiguous();
  const auto targets = sequence.slice(1, 1, kSequence + 1).contiguous();
  const auto step = [&] {
    sgd.zero_grad();
    auto loss = net->forward(in, targets);
    loss.backward();
    sgd.step();
    return loss;
  };
  timeSteps("gpt", batch, threads, steps, step);
}
