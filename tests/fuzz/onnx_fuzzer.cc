// The ONNX importer on arbitrary bytes (serialized ModelProtos). The symbolic
// dimensions of the corpus models are bound so that imports get past the
// inputs into the node mapping and the import-time evaluator.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.hpp"
#include "tessera/onnx/onnx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  tessera::fuzz::expectOnlyTesseraErrors([&] {
    tessera::OnnxImportOptions options;
    options.dimensions = {{"batch", 2}, {"sequence", 3}};
    const tessera::OnnxModel model =
        tessera::importOnnx(std::as_bytes(std::span<const uint8_t>(data, size)), options, "fuzz");
    (void)model;
  });
  return 0;
}
