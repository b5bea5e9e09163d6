#include "safetensors.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"

namespace tessera::safetensors {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<std::string_view, uint64_t>, 15> kDtypes = {{
    {"BOOL", 1},
    {"U8", 1},
    {"I8", 1},
    {"F8_E5M2", 1},
    {"F8_E4M3", 1},
    {"I16", 2},
    {"U16", 2},
    {"F16", 2},
    {"BF16", 2},
    {"I32", 4},
    {"U32", 4},
    {"F32", 4},
    {"F64", 8},
    {"I64", 8},
    {"U64", 8},
}};

// The header's own description of a value, for messages.
std::string describe(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr std::size_t kShown = 40;
  if (text.size() > kShown) text = text.substr(0, kShown) + "...";
  return text;
}

class Parser {
 public:
  Parser(std::span<const uint8_t> bytes, std::string_view source) : bytes_(bytes), source_(source) {}
  // Only the length field and the header: the data section has `dataBytes`
  // bytes, which are not given.
  Parser(std::span<const uint8_t> bytes, uint64_t dataBytes, std::string_view source)
      : bytes_(bytes), source_(source), dataBytes_(dataBytes) {}

  FileView parse() {
    if (bytes_.size() < 8) {
      fail("the file has {} byte(s); a safetensors file starts with an 8-byte header length", bytes_.size());
    }
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | bytes_[static_cast<std::size_t>(i)];
    const uint64_t available = dataBytes_ ? bytes_.size() - 8 + *dataBytes_ : bytes_.size() - 8;
    if (length > kMaxHeaderBytes) {
      fail(
          "the header length field says {} bytes, over the limit of {} (64 MiB); the file is not a "
          "safetensors file or is damaged",
          length, kMaxHeaderBytes);
    }
    if (length > available) {
      fail("the header length field says {} bytes but only {} follow it; the file is truncated", length,
           available);
    }
    const auto text =
        std::string_view(reinterpret_cast<const char*>(bytes_.data() + 8), static_cast<std::size_t>(length));
    json header;
    try {
      header = parseJsonDocument(text, "header");
    } catch (const ConfigError& e) {
      fail("the header is not valid JSON ({}: {})", e.subject(), e.detail());
    }
    if (!header.is_object()) fail("the header is {}, not a JSON object", describe(header));

    if (dataBytes_ && bytes_.size() != 8 + length) {
      fail("the header length field says {} bytes but {} were read", length, bytes_.size() - 8);
    }
    FileView file;
    file.data = bytes_.subspan(static_cast<std::size_t>(8 + length));
    const uint64_t dataBytes = dataBytes_ ? *dataBytes_ : file.data.size();
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        file.metadata = readMetadata(value);
      } else {
        file.tensors.push_back(readTensor(key, value, dataBytes));
      }
    }
    checkTiling(file);
    return file;
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    throw IoError(ErrorCode::CorruptCheckpoint, std::string(source_),
                  fmt::format(format, std::forward<Args>(args)...));
  }

  std::map<std::string, std::string> readMetadata(const json& value) const {
    if (!value.is_object()) fail("\"{}\" is {}, not an object of strings", kMetadataKey, describe(value));
    std::map<std::string, std::string> metadata;
    for (const auto& [key, entry] : value.items()) {
      if (!entry.is_string()) {
        fail("metadata \"{}\" is {}; metadata values must be strings", key, describe(entry));
      }
      metadata.emplace(key, entry.get<std::string>());
    }
    return metadata;
  }

  uint64_t readUnsigned(const json& value, const std::string& name, std::string_view field) const {
    if (!value.is_number_unsigned()) {
      fail("tensor \"{}\": {} holds {}; expected non-negative integers", name, field, describe(value));
    }
    return value.get<uint64_t>();
  }

  TensorView readTensor(const std::string& name, const json& value, uint64_t dataBytes) const {
    if (name.empty()) fail("a tensor has an empty name");
    if (!value.is_object()) fail("tensor \"{}\" is {}, not an object", name, describe(value));
    for (const auto& [key, entry] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        fail("tensor \"{}\" has an unknown key \"{}\"; the keys are dtype, shape and data_offsets", name,
             key);
      }
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) fail("tensor \"{}\" has no \"{}\"", name, key);
    }
    TensorView tensor;
    tensor.name = name;
    const json& dtype = value["dtype"];
    if (!dtype.is_string()) fail("tensor \"{}\": dtype is {}, not a string", name, describe(dtype));
    tensor.dtype = dtype.get<std::string>();
    const auto size = dtypeSize(tensor.dtype);
    if (!size) fail("tensor \"{}\": \"{}\" is not a safetensors dtype", name, tensor.dtype);

    const json& shape = value["shape"];
    if (!shape.is_array()) fail("tensor \"{}\": shape is {}, not an array", name, describe(shape));
    // The product of the non-zero dimensions must fit too, so that no reader
    // of the shape overflows whatever order it multiplies in.
    uint64_t nonZero = *size;
    bool overflow = false;
    bool empty = false;
    for (const json& dim : shape) {
      tensor.shape.push_back(readUnsigned(dim, name, "shape"));
      if (tensor.shape.back() == 0) {
        empty = true;
      } else {
        overflow = overflow || __builtin_mul_overflow(nonZero, tensor.shape.back(), &nonZero);
      }
    }
    if (overflow)
      fail("tensor \"{}\": shape {} x {} bytes overflows a 64-bit size", name, tensor.shape, *size);
    const uint64_t expected = empty ? 0 : nonZero;

    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      fail("tensor \"{}\": data_offsets is {}; expected [BEGIN, END]", name, describe(offsets));
    }
    tensor.begin = readUnsigned(offsets[0], name, "data_offsets");
    tensor.end = readUnsigned(offsets[1], name, "data_offsets");
    if (tensor.begin > tensor.end) {
      fail("tensor \"{}\": data_offsets {}..{} end before they begin", name, tensor.begin, tensor.end);
    }
    if (tensor.end > dataBytes) {
      fail("tensor \"{}\" claims bytes {}..{} but the data section has {} bytes", name, tensor.begin,
           tensor.end, dataBytes);
    }
    if (tensor.end - tensor.begin != expected) {
      fail("tensor \"{}\" has shape {} of {} = {} bytes but its data_offsets {}..{} span {} bytes", name,
           tensor.shape, tensor.dtype, expected, tensor.begin, tensor.end, tensor.end - tensor.begin);
    }
    return tensor;
  }

  void checkTiling(FileView& file) const {
    std::sort(file.tensors.begin(), file.tensors.end(), [](const TensorView& a, const TensorView& b) {
      return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
    });
    uint64_t covered = 0;
    const TensorView* previous = nullptr;
    for (const TensorView& tensor : file.tensors) {
      if (tensor.begin < covered) {
        fail("tensor \"{}\" (bytes {}..{}) overlaps tensor \"{}\" (bytes {}..{})", tensor.name, tensor.begin,
             tensor.end, previous->name, previous->begin, previous->end);
      }
      if (tensor.begin > covered) {
        fail("bytes {}..{} of the data section belong to no tensor (the next, \"{}\", starts at {})", covered,
             tensor.begin, tensor.name, tensor.begin);
      }
      covered = tensor.end;
      previous = &tensor;
    }
    const uint64_t dataBytes = dataBytes_ ? *dataBytes_ : file.data.size();
    if (covered != dataBytes) {
      fail("bytes {}..{} at the end of the data section belong to no tensor", covered, dataBytes);
    }
  }

  std::span<const uint8_t> bytes_;
  std::string_view source_;
  std::optional<uint64_t> dataBytes_;
};

}  // namespace

std::optional<uint64_t> dtypeSize(std::string_view dtype) {
  for (const auto& [name, size] : kDtypes)
    if (name == dtype) return size;
  return std::nullopt;
}

FileView parse(std::span<const uint8_t> bytes, std::string_view source) {
  return Parser(bytes, source).parse();
}

FileView parseHeader(std::span<const uint8_t> header, uint64_t dataBytes, std::string_view source) {
  return Parser(header, dataBytes, source).parse();
}

std::vector<uint8_t> encode(std::span<const TensorBytes> tensors,
                            const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorBytes& tensor : tensors) {
    const auto size = dtypeSize(tensor.dtype);
    if (!size) {
      throw IoError(ErrorCode::FileUnwritable, tensor.name,
                    fmt::format("\"{}\" is not a safetensors dtype", tensor.dtype));
    }
    uint64_t expected = *size;
    for (uint64_t dim : tensor.shape) expected *= dim;
    if (expected != tensor.bytes.size()) {
      throw IoError(ErrorCode::FileUnwritable, tensor.name,
                    fmt::format("shape {} of {} needs {} bytes but {} were given", tensor.shape, tensor.dtype,
                                expected, tensor.bytes.size()));
    }
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw IoError(ErrorCode::FileUnwritable, "",
                  fmt::format("a tensor name or metadata string is not valid UTF-8 ({})", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const TensorBytes& tensor : tensors) out.insert(out.end(), tensor.bytes.begin(), tensor.bytes.end());
  return out;
}

}  // namespace tessera::safetensors
