// Peer benchmark: the LeNet training step of tests/data/onnx/generate.py
// (conv 1->6 5x5 pad 2, ReLU, max pool 2; conv 6->16 5x5, ReLU, max pool 2;
// linear 400-120-84-10 with ReLUs; softmax cross-entropy, mean) in libtorch
// on the CPU, with plain SGD, on a fixed batch of 28x28 images.
//
//   torch_lenet BATCH STEPS THREADS  -> prints "... samples_per_s=N"
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "peer_timing.hpp"

struct LeNet : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  LeNet() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)));
    fc1 = register_module("fc1", torch::nn::Linear(400, 120));
    fc2 = register_module("fc2", torch::nn::Linear(120, 84));
    fc3 = register_module("fc3", torch::nn::Linear(84, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::flatten(x, 1);
    x = torch::relu(fc1->forward(x));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
};

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 64;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 100;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  if (batch < 1 || steps < 1 || threads < 1) {
    std::fprintf(stderr, "usage: torch_lenet BATCH STEPS THREADS\n");
    return 2;
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  auto net = std::make_shared<LeNet>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
  const auto x = torch::rand({batch, 1, 28, 28});
  const auto y = torch::randint(0, 10, {batch}, torch::kLong);
  const auto step = [&] {
    sgd.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    sgd.step();
    return loss;
  };
  timeSteps("lenet", batch, threads, steps, step);
}
