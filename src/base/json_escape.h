// JSON string escaping as JSON serializers write it (Python's json.dumps with ensure_ascii=False,
// HF's tojson, Boost.JSON): '"', '\\' and control characters escaped, everything else (UTF-8
// included) as it is. Plain functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace dinfer {

// Appends `text` escaped for the inside of a JSON string (no quotes).
void AppendJsonEscaped(std::string_view text, std::string* out);
// Appends `text` as a quoted JSON string.
inline void AppendJsonQuoted(std::string_view text, std::string* out) {
  out->push_back('"');
  AppendJsonEscaped(text, out);
  out->push_back('"');
}

}  // namespace dinfer
