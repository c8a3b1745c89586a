#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <boost/json.hpp>

#include "base/json_escape.h"
#include "tokenizer/unicode.h"

namespace dinfer::tokenizer::jinja {

const Value* DictData::Find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.str() == key) return &v;
  }
  return nullptr;
}

void DictData::Set(Text key, Value value) {
  for (auto& [k, v] : entries) {
    if (k.str() == key.str()) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string_view name) {
  Value v;
  v.name_ = name;
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::String(Text t) {
  Value v;
  v.kind_ = Kind::kString;
  v.p_ = std::make_shared<const Text>(std::move(t));
  return v;
}

Value Value::List(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.p_ = std::make_shared<const ListData>(ListData{std::move(items), tuple, false});
  return v;
}

Value Value::Generator(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.p_ = std::make_shared<const ListData>(ListData{std::move(items), false, true});
  return v;
}

Value Value::Dict(DictData d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.p_ = std::make_shared<const DictData>(std::move(d));
  return v;
}

Value Value::Namespace(DictData d) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.p_ = std::make_shared<DictData>(std::move(d));
  return v;
}

Value Value::Callable(std::string name, std::function<Value(const Args&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.p_ = std::make_shared<const CallableData>(CallableData{std::move(name), std::move(fn)});
  return v;
}

Value Value::FromJson(const boost::json::value& j) {
  switch (j.kind()) {
    case boost::json::kind::null:
      return None();
    case boost::json::kind::bool_:
      return Bool(j.get_bool());
    case boost::json::kind::int64:
      return Int(j.get_int64());
    case boost::json::kind::uint64:
      if (j.get_uint64() <= static_cast<uint64_t>(INT64_MAX)) {
        return Int(static_cast<int64_t>(j.get_uint64()));
      }
      return Float(static_cast<double>(j.get_uint64()));
    case boost::json::kind::double_:
      return Float(j.get_double());
    case boost::json::kind::string:
      return String(std::string(j.get_string()), /*trusted=*/false);
    case boost::json::kind::array: {
      std::vector<Value> items;
      items.reserve(j.get_array().size());
      for (const auto& item : j.get_array()) items.push_back(FromJson(item));
      return List(std::move(items));
    }
    case boost::json::kind::object: {
      DictData d;
      d.entries.reserve(j.get_object().size());
      for (const auto& [key, item] : j.get_object()) {
        d.entries.emplace_back(Text(std::string(key), false), FromJson(item));
      }
      return Dict(std::move(d));
    }
  }
  return None();
}

double Value::float_value() const {
  switch (kind_) {
    case Kind::kFloat:
      return f_;
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return static_cast<double>(i_);
  }
}

std::string_view TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.list().generator ? "generator" : v.list().tuple ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.bool_value();
    case Value::Kind::kInt:
      return v.int_value() != 0;
    case Value::Kind::kFloat:
      return v.float_value() != 0.0;
    case Value::Kind::kString:
      return !v.text().empty();
    case Value::Kind::kList:
      return v.list().generator || !v.list().items.empty();
    case Value::Kind::kDict:
      return !v.dict().entries.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.float_value() == b.float_value();
    }
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.text().str() == b.text().str();
    case Value::Kind::kList: {
      const ListData &x = a.list(), &y = b.list();
      if (x.generator || y.generator) return a.identity() == b.identity();
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!Equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const DictData &x = a.dict(), &y = b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x.entries) {
        const Value* other = y.Find(key.str());
        if (other == nullptr || !Equal(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

bool Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.float_value() < b.float_value();
    }
    return a.int_value() < b.int_value();
  }
  if (a.is_string() && b.is_string()) return a.text().str() < b.text().str();
  if (a.is_list() && b.is_list() && a.list().tuple == b.list().tuple && !a.is_generator() &&
      !b.is_generator()) {
    const auto &x = a.list().items, &y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  Fail("'<' not supported between instances of '{}' and '{}'", TypeName(a), TypeName(b));
}

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, laid out as Python's repr does: positional for exponents in
  // [-4, 16), scientific with at least two exponent digits otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
             digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

namespace {

// Python's str.isprintable, for the characters repr() escapes.
bool PyPrintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF)) return false;
  return true;
}

void ReprString(std::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  *out += quote;
  for (size_t pos = 0; pos < s.size();) {
    size_t len = 0;
    const char32_t c = CodePointAt(s, pos, &len);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      *out += '\\';
      *out += static_cast<char>(c);
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (!PyPrintable(c)) {
      if (c < 0x100) {
        *out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
      } else {
        *out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
      }
    } else {
      out->append(s, pos, len);
    }
    pos += len;
  }
  *out += quote;
}

void ReprInto(const Value& v, std::string* out, bool* trusted) {
  switch (v.kind()) {
    case Value::Kind::kString:
      *trusted = *trusted && v.text().AllTrusted();
      ReprString(v.text().str(), out);
      return;
    case Value::Kind::kList: {
      const ListData& l = v.list();
      if (l.generator) {
        *out += "<generator object>";
        *trusted = false;
        return;
      }
      *out += l.tuple ? '(' : '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i > 0) *out += ", ";
        ReprInto(l.items[i], out, trusted);
      }
      if (l.tuple && l.items.size() == 1) *out += ',';
      *out += l.tuple ? ')' : ']';
      return;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      const DictData& d = v.kind() == Value::Kind::kDict ? v.dict() : v.ns();
      if (v.kind() == Value::Kind::kNamespace) *out += "<Namespace ";
      *out += '{';
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i > 0) *out += ", ";
        *trusted = *trusted && d.entries[i].first.AllTrusted();
        ReprString(d.entries[i].first.str(), out);
        *out += ": ";
        ReprInto(d.entries[i].second, out, trusted);
      }
      *out += '}';
      if (v.kind() == Value::Kind::kNamespace) *out += '>';
      return;
    }
    case Value::Kind::kUndefined:
      *out += "Undefined";
      return;
    default:
      *out += ToText(v).str();
  }
}

struct JsonWriter {
  const JsonOptions& options;
  std::string item_sep, key_sep;
  std::string out;
  bool trusted = true;

  void Newline(int level) {
    if (options.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(options.indent * level), ' ');
  }

  void Write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.bool_value() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.int_value());
        return;
      case Value::Kind::kFloat: {
        const double f = v.float_value();
        if (std::isnan(f)) {
          out += "NaN";
        } else if (std::isinf(f)) {
          out += f < 0 ? "-Infinity" : "Infinity";
        } else {
          out += FormatFloat(f);
        }
        return;
      }
      case Value::Kind::kString:
        trusted = trusted && v.text().AllTrusted();
        AppendJsonQuoted(v.text().str(), &out);
        return;
      case Value::Kind::kList: {
        if (v.is_generator()) Fail("Object of type generator is not JSON serializable");
        const auto& items = v.list().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          Newline(level + 1);
          Write(items[i], level + 1);
        }
        Newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        std::vector<const std::pair<Text, Value>*> entries;
        for (const auto& e : v.dict().entries) entries.push_back(&e);
        if (entries.empty()) {
          out += "{}";
          return;
        }
        if (options.sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](auto* a, auto* b) { return a->first.str() < b->first.str(); });
        }
        out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_sep;
          Newline(level + 1);
          trusted = trusted && entries[i]->first.AllTrusted();
          AppendJsonQuoted(entries[i]->first.str(), &out);
          out += key_sep;
          Write(entries[i]->second, level + 1);
        }
        Newline(level);
        out += '}';
        return;
      }
      default:
        Fail("Object of type {} is not JSON serializable", TypeName(v));
    }
  }
};

}  // namespace

Text ToText(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Text();
    case Value::Kind::kNone:
      return Text("None", false);
    case Value::Kind::kBool:
      return Text(v.bool_value() ? "True" : "False", false);
    case Value::Kind::kInt:
      return Text(std::to_string(v.int_value()), false);
    case Value::Kind::kFloat:
      return Text(FormatFloat(v.float_value()), false);
    case Value::Kind::kString:
      return v.text();
    case Value::Kind::kCallable:
      return Text("<function " + v.callable().name + ">", false);
    default:
      return Repr(v);
  }
}

Text Repr(const Value& v) {
  std::string out;
  bool trusted = true;
  ReprInto(v, &out, &trusted);
  if (!v.is_string() && !v.is_list() && !v.is_dict() && v.kind() != Value::Kind::kNamespace) {
    trusted = false;
  }
  return Text(std::move(out), trusted);
}

Text ToJson(const Value& v, const JsonOptions& options) {
  JsonWriter w{options, options.item_separator, options.key_separator, {}, true};
  if (w.item_sep.empty()) w.item_sep = options.indent < 0 ? ", " : ",";
  if (w.key_sep.empty()) w.key_sep = ": ";
  w.Write(v, 0);
  if (!v.is_string() && !v.is_list() && !v.is_dict()) w.trusted = false;
  return Text(std::move(w.out), w.trusted);
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().entries.size());
      for (const auto& e : v.dict().entries) keys.push_back(Value::String(e.first));
      return keys;
    }
    case Value::Kind::kString: {
      const Text& t = v.text();
      const std::vector<size_t> offsets = CodePointOffsets(t.str());
      std::vector<Value> chars;
      chars.reserve(offsets.size() - 1);
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(Value::String(t.Slice(offsets[i], offsets[i + 1])));
      }
      return chars;
    }
    default:
      Fail("'{}' object is not iterable", TypeName(v));
  }
}

}  // namespace dinfer::tokenizer::jinja
