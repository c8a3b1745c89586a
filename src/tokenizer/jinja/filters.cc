// Jinja's builtin filters and tests (with HF's tojson), as Jinja2 3.1 defines them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/unicode.h"

namespace dinfer::tokenizer::jinja {
namespace {

using FilterFn = Value (*)(const Value& input, const Args& args);
using TestFn = bool (*)(const Value& input, const Args& args);

const Value kNone = Value::None();
const Value kUndefined = Value();
const Value kFalse = Value::Bool(false);

// The positional arguments after the first `skip` (select's and map's pass-through arguments).
Args Rest(const Args& args, size_t skip) {
  Args rest;
  for (size_t i = skip; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  rest.named = args.named;
  return rest;
}

std::string NameArg(const Value& v, std::string_view what) {
  if (!v.is_string()) Fail("{} must be a string, not '{}'", what, TypeName(v));
  return v.text().str();
}

// Jinja's make_attrgetter: "a.b.0" looks up items (then attributes) part by part.
Value AttrPath(const Value& item, std::string_view path) {
  Value v = item;
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('.', begin);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(begin, end - begin);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (v.is_undefined()) Fail("'{}' is undefined", part);
    v = numeric ? GetItem(v, Value::Int(std::stoll(std::string(part))))
                : GetItem(v, Value::String(std::string(part), true));
    begin = end + 1;
  }
  return v;
}

// Sort keys of the case-insensitive filters: strings compare lower-cased.
Value FoldCase(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::String(v.text().MapCodePoints([](char32_t c, char32_t) { return ToLower(c); }));
}

Value Length(const Value& v, const Args&) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(CodePointCount(v.text().str())));
    case Value::Kind::kList:
      if (v.is_generator()) Fail("object of type 'generator' has no len()");
      return Value::Int(static_cast<int64_t>(v.list().items.size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.dict().entries.size()));
    default:
      Fail("object of type '{}' has no len()", TypeName(v));
  }
}

Value Default(const Value& v, const Args& args) {
  const bool boolean = Truthy(Arg(args, 1, "boolean", kFalse));
  if (v.is_undefined() || (boolean && !Truthy(v))) {
    return Arg(args, 0, "default_value", Value::String(Text()));
  }
  return v;
}

Value ToList(const Value& v, const Args&) { return Value::List(Iterate(v)); }

Value First(const Value& v, const Args&) {
  std::vector<Value> items = Iterate(v);
  return items.empty() ? Value() : items.front();
}

Value Last(const Value& v, const Args&) {
  if (v.is_generator()) Fail("'generator' object is not reversible");
  std::vector<Value> items = Iterate(v);
  return items.empty() ? Value() : items.back();
}

Value Join(const Value& v, const Args& args) {
  const Value sep = Arg(args, 0, "d", Value::String(Text()));
  const Value& attribute = Arg(args, 1, "attribute", kNone);
  const Text sep_text = ToText(sep);
  Text out;
  const std::vector<Value> items = Iterate(v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.Append(sep_text);
    out.Append(ToText(attribute.is_none() ? items[i]
                                          : AttrPath(items[i], NameArg(attribute, "attribute"))));
  }
  return Value::String(std::move(out));
}

Value Upper(const Value& v, const Args&) {
  return Value::String(ToText(v).MapCodePoints([](char32_t c, char32_t) { return ToUpper(c); }));
}

Value Lower(const Value& v, const Args&) {
  return Value::String(ToText(v).MapCodePoints([](char32_t c, char32_t) { return ToLower(c); }));
}

Value Capitalize(const Value& v, const Args& args) {
  return GetAttr(Value::String(ToText(v)), "capitalize").callable().fn(args);
}

// Jinja's title: words begin after '-', whitespace, or an opening bracket.
Value Title(const Value& v, const Args&) {
  return Value::String(ToText(v).MapCodePoints([](char32_t c, char32_t previous) {
    const bool word_start = previous == 0 || previous == '-' || previous == '(' ||
                            previous == '{' || previous == '[' || previous == '<' ||
                            IsPySpace(previous);
    return word_start ? ToUpper(c) : ToLower(c);
  }));
}

Value Trim(const Value& v, const Args& args) {
  const Value& chars = Arg(args, 0, "chars", kNone);
  Args strip_args;
  strip_args.positional.push_back(chars);
  return GetAttr(Value::String(ToText(v)), "strip").callable().fn(strip_args);
}

Value ReplaceFilter(const Value& v, const Args& args) {
  const Value& count = Arg(args, 2, "count", kNone);
  return Value::String(Replace(ToText(v), ToText(Arg(args, 0, "old", kUndefined)),
                               ToText(Arg(args, 1, "new", kUndefined)),
                               count.is_none() ? -1 : count.int_value()));
}

Value String(const Value& v, const Args&) { return Value::String(ToText(v)); }

bool ParseInt(std::string s, int64_t* out) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  size_t begin = 0, end = 0;
  StripRange(s, {}, true, true, &begin, &end);
  s = s.substr(begin, end - begin);
  if (s.empty()) return false;
  char* stop = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &stop, 10);
  if (errno != 0 || *stop != '\0') return false;
  *out = v;
  return true;
}

bool ParseFloat(std::string s, double* out) {
  size_t begin = 0, end = 0;
  StripRange(s, {}, true, true, &begin, &end);
  s = s.substr(begin, end - begin);
  if (s.empty()) return false;
  char* stop = nullptr;
  const double v = std::strtod(s.c_str(), &stop);
  if (*stop != '\0') return false;
  *out = v;
  return true;
}

Value Int(const Value& v, const Args& args) {
  if (v.is_undefined()) Fail("'{}' is undefined", v.undefined_name());  // int(Undefined) raises
  const Value fallback = Arg(args, 0, "default", Value::Int(0));
  if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) {
    return Value::Int(v.int_value());
  }
  if (v.kind() == Value::Kind::kFloat) {
    if (!std::isfinite(v.float_value())) return fallback;
    return Value::Int(static_cast<int64_t>(std::trunc(v.float_value())));
  }
  if (v.is_string()) {
    int64_t i = 0;
    double f = 0.0;
    if (ParseInt(v.text().str(), &i)) return Value::Int(i);
    if (ParseFloat(v.text().str(), &f) && std::isfinite(f)) {
      return Value::Int(static_cast<int64_t>(std::trunc(f)));
    }
  }
  return fallback;
}

Value Float(const Value& v, const Args& args) {
  if (v.is_undefined()) Fail("'{}' is undefined", v.undefined_name());  // float(Undefined) raises
  if (v.is_number()) return Value::Float(v.float_value());
  double f = 0.0;
  if (v.is_string() && ParseFloat(v.text().str(), &f)) return Value::Float(f);
  return Arg(args, 0, "default", Value::Float(0.0));
}

Value Abs(const Value& v, const Args&) {
  if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.float_value()));
  if (v.is_number()) return Value::Int(std::llabs(v.int_value()));
  Fail("bad operand type for abs(): '{}'", TypeName(v));
}

Value Round(const Value& v, const Args& args) {
  const int64_t precision = Arg(args, 0, "precision", Value::Int(0)).int_value();
  const std::string method =
      NameArg(Arg(args, 1, "method", Value::String("common", true)), "method");
  if (!v.is_number()) Fail("type {} doesn't define __round__ method", TypeName(v));
  if (method == "common" && v.kind() != Value::Kind::kFloat) return Value::Int(v.int_value());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.float_value() * scale;
  double r = 0.0;
  if (method == "common") {
    r = std::nearbyint(x);  // round half to even, like Python's round()
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    Fail("method must be common, ceil or floor");
  }
  return Value::Float(r / scale);
}

Value Items(const Value& v, const Args&) {
  if (v.is_undefined()) return Value::Generator({});
  if (!v.is_dict()) Fail("Can only get item pairs from a mapping.");
  return Value::Generator(GetAttr(v, "items").callable().fn(Args()).list().items);
}

std::vector<Value> SortedBy(std::vector<Value> items, bool reverse,
                            const std::function<Value(const Value&)>& key) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& item : items) keyed.emplace_back(key(item), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? Less(b.first, a.first) : Less(a.first, b.first);
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value DictSort(const Value& v, const Args& args) {
  if (!v.is_dict()) Fail("You can only sort by either a mapping or a dict.");
  const bool case_sensitive = Truthy(Arg(args, 0, "case_sensitive", kFalse));
  const std::string by = NameArg(Arg(args, 1, "by", Value::String("key", true)), "by");
  const bool reverse = Truthy(Arg(args, 2, "reverse", kFalse));
  if (by != "key" && by != "value") Fail("You can only sort by either \"key\" or \"value\"");
  const size_t pos = by == "key" ? 0 : 1;
  return Value::List(SortedBy(Items(v, {}).list().items, reverse, [&](const Value& pair) {
    return FoldCase(pair.list().items[pos], case_sensitive);
  }));
}

Value Sort(const Value& v, const Args& args) {
  const bool reverse = Truthy(Arg(args, 0, "reverse", kFalse));
  const bool case_sensitive = Truthy(Arg(args, 1, "case_sensitive", kFalse));
  const Value& attribute = Arg(args, 2, "attribute", kNone);
  return Value::List(SortedBy(Iterate(v), reverse, [&](const Value& item) {
    return FoldCase(attribute.is_none() ? item : AttrPath(item, NameArg(attribute, "attribute")),
                    case_sensitive);
  }));
}

Value Unique(const Value& v, const Args& args) {
  const bool case_sensitive = Truthy(Arg(args, 0, "case_sensitive", kFalse));
  const Value& attribute = Arg(args, 1, "attribute", kNone);
  std::vector<Value> seen, out;
  for (const Value& item : Iterate(v)) {
    Value key =
        FoldCase(attribute.is_none() ? item : AttrPath(item, NameArg(attribute, "attribute")),
                 case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::List(std::move(out));
}

Value MinMax(const Value& v, const Args& args, bool max) {
  const bool case_sensitive = Truthy(Arg(args, 0, "case_sensitive", kFalse));
  const Value& attribute = Arg(args, 1, "attribute", kNone);
  std::vector<Value> items = Iterate(v);
  if (items.empty()) return Value();
  auto key = [&](const Value& item) {
    return FoldCase(attribute.is_none() ? item : AttrPath(item, NameArg(attribute, "attribute")),
                    case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    if (max ? Less(key(items[best]), key(items[i])) : Less(key(items[i]), key(items[best]))) {
      best = i;
    }
  }
  return items[best];
}

Value Min(const Value& v, const Args& args) { return MinMax(v, args, false); }
Value Max(const Value& v, const Args& args) { return MinMax(v, args, true); }

Value Sum(const Value& v, const Args& args) {
  const Value& attribute = Arg(args, 0, "attribute", kNone);
  Value total = Arg(args, 1, "start", Value::Int(0));
  for (const Value& item : Iterate(v)) {
    const Value x = attribute.is_none() ? item : AttrPath(item, NameArg(attribute, "attribute"));
    if (!x.is_number() || !total.is_number()) {
      Fail("unsupported operand type(s) for +: '{}' and '{}'", TypeName(total), TypeName(x));
    }
    if (x.kind() == Value::Kind::kFloat || total.kind() == Value::Kind::kFloat) {
      total = Value::Float(total.float_value() + x.float_value());
    } else {
      total = Value::Int(total.int_value() + x.int_value());
    }
  }
  return total;
}

Value Reverse(const Value& v, const Args&) {
  if (v.is_string()) return Slice(v, kNone, kNone, Value::Int(-1));
  std::vector<Value> items = Iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::List(std::move(items));
}

// select / reject / selectattr / rejectattr.
Value SelectImpl(const Value& v, const Args& args, bool select, bool by_attribute) {
  const size_t test_at = by_attribute ? 1 : 0;
  const std::string attribute =
      by_attribute ? NameArg(Arg(args, 0, "", kUndefined), "attribute") : std::string();
  const bool has_test = args.positional.size() > test_at;
  const std::string test = has_test ? NameArg(args.positional[test_at], "test name") : "";
  const Args test_args = Rest(args, test_at + 1);
  std::vector<Value> out;
  if (!Truthy(v)) return Value::Generator({});  // Jinja iterates only a true value
  for (const Value& item : Iterate(v)) {
    const Value x = by_attribute ? AttrPath(item, attribute) : item;
    const bool hit = has_test ? CallTest(test, x, test_args) : Truthy(x);
    if (hit == select) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

Value Select(const Value& v, const Args& a) { return SelectImpl(v, a, true, false); }
Value Reject(const Value& v, const Args& a) { return SelectImpl(v, a, false, false); }
Value SelectAttr(const Value& v, const Args& a) { return SelectImpl(v, a, true, true); }
Value RejectAttr(const Value& v, const Args& a) { return SelectImpl(v, a, false, true); }

Value Map(const Value& v, const Args& args) {
  std::vector<Value> out;
  if (!Truthy(v)) return Value::Generator({});  // Jinja iterates only a true value
  const Value& attribute = Arg(args, 99, "attribute", kUndefined);
  if (!attribute.is_undefined()) {
    const Value& fallback = Arg(args, 99, "default", kUndefined);
    const std::string path = NameArg(attribute, "attribute");
    for (const Value& item : Iterate(v)) {
      Value x = AttrPath(item, path);
      out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
    }
    return Value::Generator(std::move(out));
  }
  if (args.positional.empty()) Fail("map requires a filter argument");
  const std::string filter = NameArg(args.positional[0], "filter name");
  const Args filter_args = Rest(args, 1);
  for (const Value& item : Iterate(v)) out.push_back(CallFilter(filter, item, filter_args));
  return Value::Generator(std::move(out));
}

// HF's tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value ToJsonFilter(const Value& v, const Args& args) {
  const bool ensure_ascii = Truthy(Arg(args, 0, "ensure_ascii", kFalse));
  const Value& indent = Arg(args, 1, "indent", kNone);
  const Value& separators = Arg(args, 2, "separators", kNone);
  JsonOptions options;
  options.sort_keys = Truthy(Arg(args, 3, "sort_keys", kFalse));
  if (!indent.is_none()) {
    if (indent.kind() != Value::Kind::kInt) Fail("tojson: indent must be an integer");
    options.indent = static_cast<int>(std::max<int64_t>(0, indent.int_value()));
  }
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.list().items.size() != 2) {
      Fail("tojson: separators must be a pair of strings");
    }
    options.item_separator = NameArg(separators.list().items[0], "separator");
    options.key_separator = NameArg(separators.list().items[1], "separator");
  }
  Text json = ToJson(v, options);
  if (!ensure_ascii) return Value::String(std::move(json));
  std::string ascii;
  const std::string& s = json.str();
  for (size_t pos = 0; pos < s.size();) {
    size_t len = 0;
    const char32_t c = CodePointAt(s, pos, &len);
    if (c < 0x80) {
      ascii += static_cast<char>(c);
    } else if (c < 0x10000) {
      ascii += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      const uint32_t u = static_cast<uint32_t>(c) - 0x10000;
      ascii += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
    }
    pos += len;
  }
  return Value::String(std::move(ascii), json.AllTrusted());
}

Value Indent(const Value& v, const Args& args) {
  const Value width = Arg(args, 0, "width", Value::Int(4));
  const bool first = Truthy(Arg(args, 1, "first", kFalse));
  const bool blank = Truthy(Arg(args, 2, "blank", kFalse));
  // " " * width, which is empty for a negative width.
  const Text indention =
      width.is_string()
          ? width.text()
          : Text(std::string(static_cast<size_t>(std::max<int64_t>(0, width.int_value())), ' '),
                 true);
  // Jinja appends a newline with +=, which only strings survive.
  if (!v.is_string()) {
    if (v.is_undefined()) Fail("'{}' is undefined", v.undefined_name());
    Fail("unsupported operand type(s) for +=: '{}' and 'str'", TypeName(v));
  }
  Text s = v.text();
  s.Append("\n", true);  // so that splitlines keeps a trailing empty line
  const std::vector<Value> lines =
      GetAttr(Value::String(s), "splitlines").callable().fn(Args()).list().items;
  Text out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Text& line = lines[i].text();
    if (i > 0) {
      out.Append("\n", true);
      if (blank || !line.empty()) out.Append(indention);
    }
    out.Append(line);
  }
  if (first) {
    Text with_first = indention;
    with_first.Append(out);
    return Value::String(std::move(with_first));
  }
  return Value::String(std::move(out));
}

Value WordCount(const Value& v, const Args&) {
  const std::string s = ToText(v).str();
  int64_t words = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s.size();) {
    size_t len = 0;
    const char32_t c = CodePointAt(s, pos, &len);
    const bool word = IsAlpha(c) || IsDigit(c) || c == '_' ||
                      (c >= 0x80 && !IsPySpace(c) && !(c >= 0x2000 && c <= 0x206F));
    if (word && !in_word) ++words;
    in_word = word;
    pos += len;
  }
  return Value::Int(words);
}

Value Escape(const Value& v, const Args&) {
  Text s = ToText(v);
  const std::pair<const char*, const char*> kEntities[] = {
      {"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&#34;"}, {"'", "&#39;"}};
  for (const auto& [from, to] : kEntities) {
    s = Replace(s, Text(from, true), Text(to, s.AllTrusted()), -1);
  }
  return Value::String(std::move(s));
}

Value Safe(const Value& v, const Args&) { return v; }

Value Center(const Value& v, const Args& args) {
  Args a;
  a.positional.push_back(Arg(args, 0, "width", Value::Int(80)));
  return GetAttr(Value::String(ToText(v)), "center").callable().fn(a);
}

}  // namespace

Text PercentFormat(const Text& f, const std::vector<Value>& args, bool mapping_arg) {
  const std::string& s = f.str();
  Text out;
  size_t next = 0, literal = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') continue;
    out.Append(f.Slice(literal, i));
    if (i + 1 >= s.size()) Fail("incomplete format");
    const char conv = s[++i];
    literal = i + 1;
    if (conv == '%') {
      out.Append("%", f.AllTrusted());
      continue;
    }
    if (next >= args.size()) Fail("not enough arguments for format string");
    const Value& a = args[next++];
    if (conv == 's') {
      out.Append(ToText(a));
    } else if (conv == 'r') {
      out.Append(Repr(a));
    } else if (conv == 'd' || conv == 'i') {
      if (!a.is_number()) Fail("%d format: a real number is required, not {}", TypeName(a));
      out.Append(std::to_string(a.kind() == Value::Kind::kFloat
                                    ? static_cast<int64_t>(std::trunc(a.float_value()))
                                    : a.int_value()),
                 false);
    } else if (conv == 'f') {
      if (!a.is_number()) Fail("must be real number, not {}", TypeName(a));
      out.Append(fmt::format("{:.6f}", a.float_value()), false);
    } else {
      Fail("unsupported format character '{}'", conv);
    }
  }
  out.Append(f.Slice(literal, s.size()));
  if (next < args.size() && !mapping_arg) {
    Fail("not all arguments converted during string formatting");
  }
  return out;
}

namespace {

// Jinja's format filter: soft_str(value) % args.
Value FormatFilter(const Value& v, const Args& args) {
  return Value::String(PercentFormat(ToText(v), args.positional, /*mapping_arg=*/false));
}

Value Attr(const Value& v, const Args& args) {
  return GetAttr(v, NameArg(Arg(args, 0, "name", kUndefined), "attribute name"));
}

Value Batch(const Value& v, const Args& args) {
  const int64_t size = Arg(args, 0, "linecount", kUndefined).int_value();
  if (size <= 0) Fail("batch size must be positive");
  const Value& fill = Arg(args, 1, "fill_with", kNone);
  std::vector<Value> out, current;
  for (const Value& item : Iterate(v)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) {
      out.push_back(Value::List(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (!fill.is_none()) {
      while (static_cast<int64_t>(current.size()) < size) current.push_back(fill);
    }
    out.push_back(Value::List(std::move(current)));
  }
  return Value::List(std::move(out));
}

const std::unordered_map<std::string_view, FilterFn>& Filters() {
  static const std::unordered_map<std::string_view, FilterFn> kFilters = {
      {"abs", Abs},
      {"attr", Attr},
      {"batch", Batch},
      {"capitalize", Capitalize},
      {"center", Center},
      {"count", Length},
      {"d", Default},
      {"default", Default},
      {"dictsort", DictSort},
      {"e", Escape},
      {"escape", Escape},
      {"first", First},
      {"float", Float},
      {"forceescape", Escape},
      {"format", FormatFilter},
      {"indent", Indent},
      {"int", Int},
      {"items", Items},
      {"join", Join},
      {"last", Last},
      {"length", Length},
      {"list", ToList},
      {"lower", Lower},
      {"map", Map},
      {"max", Max},
      {"min", Min},
      {"reject", Reject},
      {"rejectattr", RejectAttr},
      {"replace", ReplaceFilter},
      {"reverse", Reverse},
      {"round", Round},
      {"safe", Safe},
      {"select", Select},
      {"selectattr", SelectAttr},
      {"sort", Sort},
      {"string", String},
      {"sum", Sum},
      {"title", Title},
      {"tojson", ToJsonFilter},
      {"trim", Trim},
      {"unique", Unique},
      {"upper", Upper},
      {"wordcount", WordCount},
  };
  return kFilters;
}

// ---- tests ----

const Value& TestArg(const Args& args) {
  if (args.positional.empty()) Fail("test requires an argument");
  return args.positional[0];
}

bool IsDefined(const Value& v, const Args&) { return !v.is_undefined(); }
bool IsUndefined(const Value& v, const Args&) { return v.is_undefined(); }
bool IsNone(const Value& v, const Args&) { return v.is_none(); }
bool IsBoolean(const Value& v, const Args&) { return v.kind() == Value::Kind::kBool; }
bool IsTrue(const Value& v, const Args&) {
  return v.kind() == Value::Kind::kBool && v.bool_value();
}
bool IsFalse(const Value& v, const Args&) {
  return v.kind() == Value::Kind::kBool && !v.bool_value();
}
bool IsInteger(const Value& v, const Args&) { return v.kind() == Value::Kind::kInt; }
bool IsFloat(const Value& v, const Args&) { return v.kind() == Value::Kind::kFloat; }
bool IsNumber(const Value& v, const Args&) { return v.is_number(); }
bool IsString(const Value& v, const Args&) { return v.is_string(); }
bool IsMapping(const Value& v, const Args&) { return v.is_dict(); }
bool IsIterable(const Value& v, const Args&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool IsSequence(const Value& v, const Args& a) { return IsIterable(v, a) && !v.is_generator(); }
// Jinja's Undefined defines __call__ (to fail when called), so it passes callable().
bool IsCallable(const Value& v, const Args&) {
  return v.kind() == Value::Kind::kCallable || v.is_undefined();
}
bool IsSameAs(const Value& v, const Args& args) {
  const Value& other = TestArg(args);
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      return Equal(v, other);
    default:
      return v.identity() == other.identity();
  }
}
bool IsEscaped(const Value&, const Args&) { return false; }
bool IsIn(const Value& v, const Args& args) { return Contains(TestArg(args), v); }
bool IsEq(const Value& v, const Args& args) { return Equal(v, TestArg(args)); }
bool IsNe(const Value& v, const Args& args) { return !Equal(v, TestArg(args)); }
bool IsLt(const Value& v, const Args& args) { return Less(v, TestArg(args)); }
bool IsLe(const Value& v, const Args& args) { return !Less(TestArg(args), v); }
bool IsGt(const Value& v, const Args& args) { return Less(TestArg(args), v); }
bool IsGe(const Value& v, const Args& args) { return !Less(v, TestArg(args)); }
// Python's value % divisor (what even, odd and divisibleby compute), as a double.
double PyMod(const Value& v, const Value& divisor) {
  if (v.is_undefined()) Fail("'{}' is undefined", v.undefined_name());
  if (v.is_string()) Fail("not all arguments converted during string formatting");
  if (!v.is_number() || !divisor.is_number()) {
    Fail("unsupported operand type(s) for %: '{}' and '{}'", TypeName(v), TypeName(divisor));
  }
  const double d = divisor.float_value();
  if (d == 0.0) Fail("integer division or modulo by zero");
  double m = std::fmod(v.float_value(), d);
  if (m != 0.0 && ((m < 0) != (d < 0))) m += d;
  return m;
}
bool IsEven(const Value& v, const Args&) { return PyMod(v, Value::Int(2)) == 0.0; }
bool IsOdd(const Value& v, const Args&) { return PyMod(v, Value::Int(2)) == 1.0; }
bool IsDivisibleBy(const Value& v, const Args& args) { return PyMod(v, TestArg(args)) == 0.0; }
bool IsLower(const Value& v, const Args&) {
  return Truthy(GetAttr(Value::String(ToText(v)), "islower").callable().fn(Args()));
}
bool IsUpper(const Value& v, const Args&) {
  return Truthy(GetAttr(Value::String(ToText(v)), "isupper").callable().fn(Args()));
}
bool IsFilter(const Value& v, const Args&) { return v.is_string() && HasFilter(v.text().str()); }
bool IsTest(const Value& v, const Args&) { return v.is_string() && HasTest(v.text().str()); }

const std::unordered_map<std::string_view, TestFn>& Tests() {
  static const std::unordered_map<std::string_view, TestFn> kTests = {
      {"defined", IsDefined},
      {"undefined", IsUndefined},
      {"none", IsNone},
      {"boolean", IsBoolean},
      {"true", IsTrue},
      {"false", IsFalse},
      {"integer", IsInteger},
      {"float", IsFloat},
      {"number", IsNumber},
      {"string", IsString},
      {"mapping", IsMapping},
      {"iterable", IsIterable},
      {"sequence", IsSequence},
      {"callable", IsCallable},
      {"sameas", IsSameAs},
      {"escaped", IsEscaped},
      {"in", IsIn},
      {"eq", IsEq},
      {"equalto", IsEq},
      {"==", IsEq},
      {"ne", IsNe},
      {"!=", IsNe},
      {"lt", IsLt},
      {"lessthan", IsLt},
      {"<", IsLt},
      {"le", IsLe},
      {"<=", IsLe},
      {"gt", IsGt},
      {"greaterthan", IsGt},
      {">", IsGt},
      {"ge", IsGe},
      {">=", IsGe},
      {"even", IsEven},
      {"odd", IsOdd},
      {"divisibleby", IsDivisibleBy},
      {"lower", IsLower},
      {"upper", IsUpper},
      {"filter", IsFilter},
      {"test", IsTest},
  };
  return kTests;
}

}  // namespace

bool HasFilter(std::string_view name) { return Filters().count(name) > 0; }
bool HasTest(std::string_view name) { return Tests().count(name) > 0; }

Value CallFilter(std::string_view name, const Value& input, const Args& args) {
  const auto it = Filters().find(name);
  if (it == Filters().end()) Fail("No filter named '{}'.", name);
  return it->second(input, args);
}

bool CallTest(std::string_view name, const Value& input, const Args& args) {
  const auto it = Tests().find(name);
  if (it == Tests().end()) Fail("No test named '{}'.", name);
  return it->second(input, args);
}

}  // namespace dinfer::tokenizer::jinja
