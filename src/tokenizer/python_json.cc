#include "tokenizer/python_json.h"
#include "base/json_escape.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace dinfer::tokenizer {
namespace {

namespace json = boost::json;

void AppendDouble(double d, std::string* out) {
  // Shortest round-trip digits and the decimal exponent, from the scientific form "d.ddde±XX".
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(end - buf));
  const bool negative = sci.front() == '-';
  if (negative) sci.remove_prefix(1);
  const size_t e_at = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_at)) {
    if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(sci.substr(e_at + 1)).c_str());
  if (negative) *out += '-';
  if (exponent >= -5 && exponent < 16) {
    if (exponent >= 0) {
      const size_t int_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_digits) {
        *out += digits;
        out->append(int_digits - digits.size(), '0');
        *out += ".0";
      } else {
        out->append(digits, 0, int_digits);
        *out += '.';
        out->append(digits, int_digits);
      }
    } else {
      *out += "0.";
      out->append(static_cast<size_t>(-exponent - 1), '0');
      *out += digits;
    }
    return;
  }
  *out += digits[0];
  if (digits.size() > 1) {
    *out += '.';
    out->append(digits, 1);
  }
  *out += fmt::format("e{}{}", exponent < 0 ? '-' : '+', std::abs(exponent));
}

}  // namespace

void AppendPythonJson(const json::value& value, std::string* out) {
  switch (value.kind()) {
    case json::kind::null:
      *out += "null";
      break;
    case json::kind::bool_:
      *out += value.get_bool() ? "true" : "false";
      break;
    case json::kind::int64:
      *out += fmt::format("{}", value.get_int64());
      break;
    case json::kind::uint64:
      *out += fmt::format("{}", value.get_uint64());
      break;
    case json::kind::double_:
      AppendDouble(value.get_double(), out);
      break;
    case json::kind::string:
      AppendJsonQuoted(value.get_string(), out);
      break;
    case json::kind::array: {
      *out += '[';
      bool first = true;
      for (const json::value& v : value.get_array()) {
        if (!first) *out += ", ";
        AppendPythonJson(v, out);
        first = false;
      }
      *out += ']';
      break;
    }
    case json::kind::object: {
      *out += '{';
      bool first = true;
      for (const auto& kv : value.get_object()) {
        if (!first) *out += ", ";
        AppendJsonQuoted(kv.key(), out);
        *out += ": ";
        AppendPythonJson(kv.value(), out);
        first = false;
      }
      *out += '}';
      break;
    }
  }
}

std::string PythonJson(const json::value& value) {
  std::string out;
  AppendPythonJson(value, &out);
  return out;
}

}  // namespace dinfer::tokenizer
