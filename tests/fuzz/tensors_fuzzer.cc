// The tensors dataset reader on arbitrary bytes, for the inputs of the MLP
// export of tests/data/onnx (x float32 [2, 2, 3], labels int32 [2]). A file it
// accepts must hold a tensor per input with the same number of samples, each
// with the values of a whole number of samples.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "fuzz_support.hpp"
#include "tessera/app/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::vector<tessera::DataInput> inputs = {{"x", tessera::DType::Float32, {2, 2, 3}},
                                                  {"labels", tessera::DType::Int32, {2}}};
  tessera::fuzz::expectOnlyTesseraErrors([&] {
    const tessera::TensorSplit split =
        tessera::parseTensorSplit(std::span<const unsigned char>(data, size), "fuzz", inputs);
    bool consistent = split.tensors.size() == inputs.size();
    for (const tessera::DataTensor& tensor : split.tensors) {
      const auto values = static_cast<int64_t>(tensor.floats.size() + tensor.ints.size());
      consistent = consistent && !tensor.shape.empty() && tensor.shape[0] == split.count &&
                   values == split.count * tensor.sampleElements();
    }
    if (!consistent) {
      std::fprintf(stderr, "fuzz finding: an accepted tensors file does not hold what its header says\n");
      std::abort();
    }
  });
  return 0;
}
