// The safetensors container format, without tessera's meaning:
//
//   8 bytes   N, the header length, little-endian unsigned
//   N bytes   a JSON object: {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
//             ..., "__metadata__": {"KEY": "VALUE", ...}}
//   the rest  the data section; each tensor's little-endian, row-major bytes are [BEGIN, END) of it
//
// The tensors' byte ranges must tile the data section exactly: no gaps, no
// overlaps, nothing after the last one. parse() checks all of it so that the
// caller only sees well-formed files; it never reads outside `bytes` and never
// allocates more than a small multiple of the header's size.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::safetensors {

// Headers above this are refused rather than parsed (the JSON reader's limit).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{64} << 20;
// The reserved header key of the string-to-string metadata map.
inline constexpr std::string_view kMetadataKey = "__metadata__";

// Bytes per element of a dtype the format defines ("F32" -> 4); nullopt for
// any other name.
std::optional<uint64_t> dtypeSize(std::string_view dtype);

struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // byte range within the data section
  uint64_t end = 0;
};

struct FileView {
  // In data order (by begin offset).
  std::vector<TensorView> tensors;
  // nullopt when the header has no "__metadata__".
  std::optional<std::map<std::string, std::string>> metadata;
  // The data section, a view into the parsed bytes.
  std::span<const uint8_t> data;
};

// Checks the structure of `bytes` and returns its tensors and metadata.
// Throws IoError(CorruptCheckpoint) with subject `source` naming the first
// defect: a length field past the end or over kMaxHeaderBytes, a header that
// is not a JSON object (duplicate keys included), an entry without exactly
// dtype, shape and data_offsets, an unknown dtype, a shape whose size
// overflows, offsets out of order, out of range, overlapping, leaving gaps or
// not matching shape x dtype size, or metadata values that are not strings.
FileView parse(std::span<const uint8_t> bytes, std::string_view source);

// The same checks of a file's first 8 + N bytes (the length field and the
// header) alone, for a file whose data section has `dataBytes` bytes: the
// returned view's `data` is empty. Reads no tensor data.
FileView parseHeader(std::span<const uint8_t> header, uint64_t dataBytes, std::string_view source);

struct TensorBytes {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> bytes;
};

// The file holding `tensors` (data in the order given) and `metadata`. The
// header is padded with spaces so that the data starts 8-byte aligned, as
// the reference implementation does. Throws IoError(FileUnwritable) with the
// tensor as subject when a name or string is not valid UTF-8 or a tensor's
// byte count does not match its shape and dtype.
std::vector<uint8_t> encode(std::span<const TensorBytes> tensors,
                            const std::map<std::string, std::string>& metadata);

}  // namespace tessera::safetensors
