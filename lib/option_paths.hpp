// JSON paths of SessionOptions fields, shared by validate() and the location
// resolver so that an error, a location reason and the config file name the
// same field.
#pragma once

#include <string>
#include <string_view>

#include "tessera/lib/session_options.hpp"

namespace tessera::detail {

// Appends `token` as one JSON pointer segment (RFC 6901: "~" -> "~0",
// "/" -> "~1"); tensor names may contain both.
inline void appendPointerToken(std::string& out, std::string_view token) {
  for (const char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
}

// "/sessionOptions/tensorLocationSettingsOverride/<escaped name>"
inline std::string overridePath(std::string_view tensorName) {
  constexpr std::string_view kMiddle = "/tensorLocationSettingsOverride/";
  std::string path;
  path.reserve(kSessionOptionsPath.size() + kMiddle.size() + tensorName.size() + 8);
  path += kSessionOptionsPath;
  path += kMiddle;
  appendPointerToken(path, tensorName);
  return path;
}

// "/sessionOptions/<category key>/location"
inline std::string categoryLocationPath(TensorCategory category) {
  const std::string_view key = SessionOptions::locationSettingsKey(category);
  constexpr std::string_view kLocation = "/location";
  std::string path;
  path.reserve(kSessionOptionsPath.size() + 1 + key.size() + kLocation.size() + 32);
  path += kSessionOptionsPath;
  path += '/';
  path += key;
  path += kLocation;
  return path;
}

}  // namespace tessera::detail
