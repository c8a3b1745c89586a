// Attribute and item access, slicing, `in`, the Python str/dict/list methods templates call, and
// the global functions. (Filters and tests are in filters.cc.)
#include <algorithm>

#include "tokenizer/jinja/builtins.h"

namespace dinfer::tokenizer::jinja {
namespace {

const Value kNone = Value::None();
const Value kUndefined = Value();

int64_t IntArg(const Value& v, std::string_view what) {
  if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
    Fail("{} must be an integer, not '{}'", what, TypeName(v));
  }
  return v.int_value();
}

const Text& StrArg(const Value& v, std::string_view what) {
  if (!v.is_string()) Fail("{} must be str, not {}", what, TypeName(v));
  return v.text();
}

// Code point index of a byte offset.
int64_t CodePointIndex(std::string_view s, size_t byte) {
  return static_cast<int64_t>(CodePointCount(s.substr(0, byte)));
}

Value StringMethod(const Value& self, std::string_view name);
Value DictMethod(const Value& self, std::string_view name);
Value ListMethod(const Value& self, std::string_view name);

// Python's str.format: {}, {0}, {name}, {{ and }}; conversions and format specs are refused.
Text Format(const Text& fmt_text, const Args& args) {
  const std::string& f = fmt_text.str();
  Text out;
  size_t next_auto = 0, literal_begin = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '{' && f[i] != '}') continue;
    out.Append(fmt_text.Slice(literal_begin, i));
    if (i + 1 < f.size() && f[i + 1] == f[i]) {
      out.Append(fmt_text.Slice(i, i + 1));
      literal_begin = ++i + 1;
      continue;
    }
    if (f[i] == '}') Fail("Single '}}' encountered in format string");
    const size_t close = f.find('}', i);
    if (close == std::string::npos) Fail("Single '{{' encountered in format string");
    const std::string field = f.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) {
      Fail("format specs and conversions in str.format are not supported");
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      const size_t index = field.empty() ? next_auto++ : std::stoul(field);
      if (index >= args.positional.size()) Fail("Replacement index {} out of range", index);
      v = &args.positional[index];
    } else {
      for (const auto& [k, value] : args.named) {
        if (k == field) v = &value;
      }
      if (v == nullptr) Fail("KeyError: '{}'", field);
    }
    out.Append(ToText(*v));
    literal_begin = close + 1;
    i = close;
  }
  out.Append(fmt_text.Slice(literal_begin, f.size()));
  return out;
}

bool Cased(char32_t c) { return ToUpper(c) != c || ToLower(c) != c; }

char32_t TitleMap(char32_t c, char32_t previous) {
  return (previous != 0 && Cased(previous)) ? ToLower(c) : ToUpper(c);
}

Text Justify(const Text& s, int64_t width, const Value& fill, int mode) {
  const std::string fill_char = fill.is_string() ? fill.text().str() : " ";
  const int64_t len = static_cast<int64_t>(CodePointCount(s.str()));
  if (width <= len) return s;
  const int64_t pad = width - len;
  int64_t left = 0;
  if (mode == 0) left = pad / 2 + (pad & width & 1);  // center, as CPython rounds it
  if (mode == 2) left = pad;                          // rjust
  auto repeat = [&](int64_t n) {
    std::string r;
    for (int64_t i = 0; i < n; ++i) r += fill_char;
    return r;
  };
  Text out(repeat(left), s.AllTrusted());
  out.Append(s);
  out.Append(repeat(pad - left), s.AllTrusted());
  return out;
}

Value StringMethod(const Value& self, std::string_view name) {
  // Methods hold the string Value (shared), not a copy of its text.
  auto method = [&](auto fn) {
    return Value::Callable(std::string(name),
                           [self, fn](const Args& args) -> Value { return fn(self.text(), args); });
  };
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method([starts](const Text& s, const Args& args) {
      const Value& prefix = Arg(args, 0, "", kUndefined);
      std::vector<Value> options = prefix.is_list() ? prefix.list().items : std::vector{prefix};
      for (const Value& o : options) {
        const std::string& p = StrArg(o, starts ? "startswith arg" : "endswith arg").str();
        const std::string& str = s.str();
        const bool hit = p.size() <= str.size() &&
                         (starts ? str.compare(0, p.size(), p) == 0
                                 : str.compare(str.size() - p.size(), p.size(), p) == 0);
        if (hit) return Value::Bool(true);
      }
      return Value::Bool(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method([left, right](const Text& s, const Args& args) {
      const Value& chars = Arg(args, 0, "chars", kNone);
      size_t begin = 0, end = 0;
      StripRange(s.str(), chars.is_none() ? std::string_view() : StrArg(chars, "chars").str(), left,
                 right, &begin, &end);
      if (!chars.is_none() && chars.text().empty()) begin = 0, end = s.size();
      return Value::String(s.Slice(begin, end));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return method([from_right](const Text& s, const Args& args) {
      const Value& sep = Arg(args, 0, "sep", kNone);
      const int64_t maxsplit = IntArg(Arg(args, 1, "maxsplit", Value::Int(-1)), "maxsplit");
      const Text* sep_text = sep.is_none() ? nullptr : &StrArg(sep, "sep");
      return Value::List(Split(s, sep_text, maxsplit, from_right));
    });
  }
  if (name == "splitlines") {
    return method([](const Text& s, const Args& args) {
      const bool keepends = Truthy(Arg(args, 0, "keepends", Value::Bool(false)));
      std::vector<Value> lines;
      const std::string& str = s.str();
      size_t begin = 0;
      for (size_t pos = 0; pos < str.size();) {
        size_t len = 0;
        const char32_t c = CodePointAt(str, pos, &len);
        const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C ||
                              (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!is_break) {
          pos += len;
          continue;
        }
        size_t end = pos + len;
        if (c == '\r' && end < str.size() && str[end] == '\n') ++end;
        lines.push_back(Value::String(s.Slice(begin, keepends ? end : pos)));
        begin = pos = end;
      }
      if (begin < str.size()) lines.push_back(Value::String(s.Slice(begin, str.size())));
      return Value::List(std::move(lines));
    });
  }
  if (name == "replace") {
    return method([](const Text& s, const Args& args) {
      const Text& old = StrArg(Arg(args, 0, "old", kUndefined), "replace arg 1");
      const Text& repl = StrArg(Arg(args, 1, "new", kUndefined), "replace arg 2");
      return Value::String(
          Replace(s, old, repl, IntArg(Arg(args, 2, "count", Value::Int(-1)), "count")));
    });
  }
  if (name == "upper" || name == "lower" || name == "casefold" || name == "swapcase" ||
      name == "title" || name == "capitalize") {
    char32_t (*map)(char32_t, char32_t) = nullptr;
    if (name == "upper") map = [](char32_t c, char32_t) { return ToUpper(c); };
    if (name == "lower" || name == "casefold")
      map = [](char32_t c, char32_t) { return ToLower(c); };
    if (name == "swapcase") {
      map = [](char32_t c, char32_t) { return ToUpper(c) != c ? ToUpper(c) : ToLower(c); };
    }
    if (name == "title") map = TitleMap;
    if (name == "capitalize") {
      return method([](const Text& s, const Args&) {
        const std::vector<size_t> offsets = CodePointOffsets(s.str());
        if (offsets.size() < 2) return Value::String(s);
        Text out =
            s.Slice(0, offsets[1]).MapCodePoints([](char32_t c, char32_t) { return ToUpper(c); });
        out.Append(s.Slice(offsets[1], s.size()).MapCodePoints([](char32_t c, char32_t) {
          return ToLower(c);
        }));
        return Value::String(std::move(out));
      });
    }
    return method(
        [map](const Text& s, const Args&) { return Value::String(s.MapCodePoints(map)); });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string kind(name);
    return method([kind](const Text& s, const Args& args) {
      const std::string& sub = StrArg(Arg(args, 0, "sub", kUndefined), kind + " arg").str();
      const std::string& str = s.str();
      if (kind == "count") {
        if (sub.empty()) return Value::Int(CodePointIndex(str, str.size()) + 1);
        int64_t n = 0;
        for (size_t p = str.find(sub); p != std::string::npos; p = str.find(sub, p + sub.size())) {
          ++n;
        }
        return Value::Int(n);
      }
      const size_t pos = kind[0] == 'r' ? str.rfind(sub) : str.find(sub);
      if (pos == std::string::npos) {
        if (kind.find("index") != std::string::npos) Fail("substring not found");
        return Value::Int(-1);
      }
      return Value::Int(CodePointIndex(str, pos));
    });
  }
  if (name == "join") {
    return method([](const Text& s, const Args& args) {
      Text out;
      const std::vector<Value> items = Iterate(Arg(args, 0, "iterable", kUndefined));
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) {
          Fail("sequence item {}: expected str instance, {} found", i, TypeName(items[i]));
        }
        if (i > 0) out.Append(s);
        out.Append(items[i].text());
      }
      return Value::String(std::move(out));
    });
  }
  if (name == "format") {
    return method([](const Text& s, const Args& args) { return Value::String(Format(s, args)); });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "isupper" || name == "islower") {
    const std::string kind(name);
    return method([kind](const Text& s, const Args&) {
      const std::string& str = s.str();
      if (str.empty()) return Value::Bool(false);
      bool any_cased = false, ok = true;
      for (size_t pos = 0; pos < str.size() && ok;) {
        size_t len = 0;
        const char32_t c = CodePointAt(str, pos, &len);
        pos += len;
        if (kind == "isdigit") ok = IsDigit(c);
        if (kind == "isalpha") ok = IsAlpha(c);
        if (kind == "isalnum") ok = IsAlpha(c) || IsDigit(c);
        if (kind == "isspace") ok = IsPySpace(c);
        if (kind == "isupper" && Cased(c)) ok = ToUpper(c) == c, any_cased = true;
        if (kind == "islower" && Cased(c)) ok = ToLower(c) == c, any_cased = true;
      }
      if (kind == "isupper" || kind == "islower") ok = ok && any_cased;
      return Value::Bool(ok);
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    const int mode = name == "center" ? 0 : name == "ljust" ? 1 : 2;
    const bool zfill = name == "zfill";
    return method([mode, zfill](const Text& s, const Args& args) {
      const int64_t width = IntArg(Arg(args, 0, "width", kUndefined), "width");
      return Value::String(Justify(
          s, width, zfill ? Value::String("0", s.AllTrusted()) : Arg(args, 1, "", kNone), mode));
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool from_right = name == "rpartition";
    return method([from_right](const Text& s, const Args& args) {
      const std::string& sep = StrArg(Arg(args, 0, "sep", kUndefined), "sep").str();
      if (sep.empty()) Fail("empty separator");
      const size_t pos = from_right ? s.str().rfind(sep) : s.str().find(sep);
      if (pos == std::string::npos) {
        Value empty = Value::String(Text());
        return from_right ? Value::List({empty, empty, Value::String(s)}, true)
                          : Value::List({Value::String(s), empty, empty}, true);
      }
      return Value::List(
          {Value::String(s.Slice(0, pos)), Value::String(s.Slice(pos, pos + sep.size())),
           Value::String(s.Slice(pos + sep.size(), s.size()))},
          true);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method([prefix](const Text& s, const Args& args) {
      const std::string& a = StrArg(Arg(args, 0, "", kUndefined), "arg").str();
      const std::string& str = s.str();
      if (a.size() > str.size()) return Value::String(s);
      if (prefix && str.compare(0, a.size(), a) == 0) {
        return Value::String(s.Slice(a.size(), str.size()));
      }
      if (!prefix && str.compare(str.size() - a.size(), a.size(), a) == 0) {
        return Value::String(s.Slice(0, str.size() - a.size()));
      }
      return Value::String(s);
    });
  }
  return Value();
}

Value DictMethod(const Value& self, std::string_view name) {
  if (name == "items" || name == "keys" || name == "values") {
    const int kind = name == "items" ? 0 : name == "keys" ? 1 : 2;
    return Value::Callable(std::string(name), [self, kind](const Args&) {
      std::vector<Value> out;
      for (const auto& [k, v] : self.dict().entries) {
        if (kind == 0) out.push_back(Value::List({Value::String(k), v}, true));
        if (kind == 1) out.push_back(Value::String(k));
        if (kind == 2) out.push_back(v);
      }
      return Value::List(std::move(out));
    });
  }
  if (name == "get") {
    return Value::Callable("get", [self](const Args& args) {
      const Value& key = Arg(args, 0, "key", kUndefined);
      if (key.is_string()) {
        if (const Value* v = self.dict().Find(key.text().str())) return *v;
      }
      return Arg(args, 1, "default", kNone);
    });
  }
  return Value();
}

Value ListMethod(const Value& self, std::string_view name) {
  if (name == "index" || name == "count") {
    const bool index = name == "index";
    return Value::Callable(std::string(name), [self, index](const Args& args) {
      const Value& x = Arg(args, 0, "value", kUndefined);
      int64_t n = 0;
      const auto& items = self.list().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!Equal(items[i], x)) continue;
        if (index) return Value::Int(static_cast<int64_t>(i));
        ++n;
      }
      if (index) Fail("{} is not in list", Repr(x).str());
      return Value::Int(n);
    });
  }
  return Value();
}

// Python's index normalisation for slices.
void SliceIndices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v,
                  int64_t* start, int64_t* stop, int64_t* step) {
  *step = step_v.is_none() ? 1 : IntArg(step_v, "slice step");
  if (*step == 0) Fail("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback, int64_t low, int64_t high) {
    if (v.is_none()) return fallback;
    int64_t i = IntArg(v, "slice indices");
    if (i < 0) i += n;
    return std::clamp(i, low, high);
  };
  if (*step > 0) {
    *start = bound(start_v, 0, 0, n);
    *stop = bound(stop_v, n, 0, n);
  } else {
    *start = bound(start_v, n - 1, -1, n - 1);
    *stop = bound(stop_v, -1, -1, n - 1);
  }
}

}  // namespace

const Value& Arg(const Args& args, size_t index, std::string_view name, const Value& fallback) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [k, v] : args.named) {
    if (!name.empty() && k == name) return v;
  }
  return fallback;
}

Text Replace(const Text& s, const Text& old, const Text& replacement, int64_t count) {
  const std::string& str = s.str();
  const std::string& o = old.str();
  Text out;
  if (o.empty()) {  // Python inserts the replacement around every code point
    const std::vector<size_t> offsets = CodePointOffsets(str);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out.Append(replacement);
      out.Append(s.Slice(offsets[i], offsets[i + 1]));
    }
    if (count < 0 || static_cast<int64_t>(offsets.size()) - 1 < count) out.Append(replacement);
    return out;
  }
  size_t begin = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = str.find(o, begin);
    if (hit == std::string::npos) break;
    out.Append(s.Slice(begin, hit));
    out.Append(replacement);
    begin = hit + o.size();
  }
  out.Append(s.Slice(begin, str.size()));
  return out;
}

std::vector<Value> Split(const Text& s, const Text* sep, int64_t maxsplit, bool from_right) {
  const std::string& str = s.str();
  std::vector<Value> parts;
  if (sep != nullptr) {
    const std::string& p = sep->str();
    if (p.empty()) Fail("empty separator");
    if (!from_right) {
      size_t begin = 0;
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        const size_t hit = str.find(p, begin);
        if (hit == std::string::npos) break;
        parts.push_back(Value::String(s.Slice(begin, hit)));
        begin = hit + p.size();
      }
      parts.push_back(Value::String(s.Slice(begin, str.size())));
      return parts;
    }
    size_t end = str.size();
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      if (end < p.size()) break;
      const size_t hit = str.rfind(p, end - p.size());
      if (hit == std::string::npos) break;
      parts.push_back(Value::String(s.Slice(hit + p.size(), end)));
      end = hit;
    }
    parts.push_back(Value::String(s.Slice(0, end)));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Runs of whitespace separate; what is left after maxsplit splits is kept as it is.
  const std::vector<size_t> offsets = CodePointOffsets(str);
  const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
  auto space = [&](int64_t i) {
    size_t len = 0;
    return IsPySpace(CodePointAt(str, offsets[static_cast<size_t>(i)], &len));
  };
  auto slice = [&](int64_t a, int64_t b) {
    return Value::String(s.Slice(offsets[static_cast<size_t>(a)], offsets[static_cast<size_t>(b)]));
  };
  if (!from_right) {
    int64_t i = 0;
    for (int64_t splits = 0;; ++splits) {
      while (i < n && space(i)) ++i;
      if (i == n) break;
      if (maxsplit >= 0 && splits == maxsplit) {
        parts.push_back(slice(i, n));
        break;
      }
      int64_t j = i;
      while (j < n && !space(j)) ++j;
      parts.push_back(slice(i, j));
      i = j;
    }
    return parts;
  }
  int64_t j = n;
  for (int64_t splits = 0;; ++splits) {
    while (j > 0 && space(j - 1)) --j;
    if (j == 0) break;
    if (maxsplit >= 0 && splits == maxsplit) {
      parts.push_back(slice(0, j));
      break;
    }
    int64_t i = j;
    while (i > 0 && !space(i - 1)) --i;
    parts.push_back(slice(i, j));
    j = i;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

Value GetAttr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      if (Value m = DictMethod(obj, name); !m.is_undefined()) return m;
      static constexpr std::string_view kMutating[] = {"pop",   "popitem", "setdefault", "update",
                                                       "clear", "copy",    "fromkeys"};
      for (std::string_view m : kMutating) {
        if (name == m) return Value();
      }
      if (const Value* v = obj.dict().Find(name)) return *v;
      return Value();
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.ns().Find(name)) return *v;
      return Value();
    case Value::Kind::kString:
      return StringMethod(obj, name);
    case Value::Kind::kList:
      return obj.is_generator() ? Value() : ListMethod(obj, name);
    default:
      return Value();
  }
}

Value GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.dict().Find(key.text().str())) return *v;
        return DictMethod(obj, key.text().str());
      }
      return Value();
    case Value::Kind::kNamespace:
      return key.is_string() ? GetAttr(obj, key.text().str()) : Value();
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (obj.is_generator()) return Value();
      if (key.is_string()) return GetAttr(obj, key.text().str());
      if (key.kind() != Value::Kind::kInt && key.kind() != Value::Kind::kBool) return Value();
      if (obj.is_list()) {
        const auto& items = obj.list().items;
        int64_t i = key.int_value();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value();
        return items[static_cast<size_t>(i)];
      }
      const std::vector<size_t> offsets = CodePointOffsets(obj.text().str());
      int64_t i = key.int_value();
      const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return Value::String(
          obj.text().Slice(offsets[static_cast<size_t>(i)], offsets[static_cast<size_t>(i) + 1]));
    }
    default:
      return Value();
  }
}

Value Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  // Jinja slices with Python's own subscript (not its forgiving getitem): other objects fail.
  if (obj.is_dict()) Fail("unhashable type: 'slice'");
  if ((!obj.is_list() && !obj.is_string()) || obj.is_generator()) {
    Fail("'{}' object is not subscriptable", TypeName(obj));
  }
  const std::vector<size_t> offsets =
      obj.is_string() ? CodePointOffsets(obj.text().str()) : std::vector<size_t>();
  const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list().items.size())
                                  : static_cast<int64_t>(offsets.size()) - 1;
  int64_t start = 0, stop = 0, step = 1;
  SliceIndices(n, start_v, stop_v, step_v, &start, &stop, &step);
  if (obj.is_string() && step == 1) {
    if (start >= stop) return Value::String(Text());
    return Value::String(
        obj.text().Slice(offsets[static_cast<size_t>(start)], offsets[static_cast<size_t>(stop)]));
  }
  std::vector<Value> items;
  Text text;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    const size_t k = static_cast<size_t>(i);
    if (obj.is_list()) {
      items.push_back(obj.list().items[k]);
    } else {
      text.Append(obj.text().Slice(offsets[k], offsets[k + 1]));
    }
  }
  if (obj.is_string()) return Value::String(std::move(text));
  return Value::List(std::move(items), obj.list().tuple);
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        Fail("'in <string>' requires string as left operand, not {}", TypeName(item));
      }
      return container.text().str().find(item.text().str()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.list().items.begin(), container.list().items.end(),
                         [&](const Value& v) { return Equal(v, item); });
    case Value::Kind::kDict:
      if (item.is_list() || item.is_dict()) Fail("unhashable type: '{}'", TypeName(item));
      return item.is_string() && container.dict().Find(item.text().str()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      Fail("argument of type '{}' is not iterable", TypeName(container));
  }
}

Value GlobalFunction(std::string_view name) {
  if (name == "range") {
    return Value::Callable("range", [](const Args& args) {
      const size_t n = args.positional.size();
      if (n == 0 || n > 3) Fail("range expected 1 to 3 arguments, got {}", n);
      int64_t start = 0, stop = 0, step = 1;
      if (n == 1) {
        stop = IntArg(args.positional[0], "range argument");
      } else {
        start = IntArg(args.positional[0], "range argument");
        stop = IntArg(args.positional[1], "range argument");
        if (n == 3) step = IntArg(args.positional[2], "range argument");
      }
      if (step == 0) Fail("range() arg 3 must not be zero");
      std::vector<Value> items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        // The sandbox's limit.
        if (items.size() >= 100000)
          Fail("Range too big. The sandbox blocks ranges larger than 100000");
        items.push_back(Value::Int(i));
      }
      return Value::List(std::move(items));
    });
  }
  if (name == "dict" || name == "namespace") {
    const bool ns = name == "namespace";
    return Value::Callable(std::string(name), [ns](const Args& args) {
      DictData d;
      for (const Value& p : args.positional) {
        if (!p.is_dict()) Fail("{} expects keyword arguments or a dict", ns ? "namespace" : "dict");
        for (const auto& e : p.dict().entries) d.Set(e.first, e.second);
      }
      for (const auto& [k, v] : args.named) d.Set(Text(k, true), v);
      return ns ? Value::Namespace(std::move(d)) : Value::Dict(std::move(d));
    });
  }
  return Value();
}

}  // namespace dinfer::tokenizer::jinja
