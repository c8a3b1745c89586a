#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "base/json_escape.h"
#include "structured/automaton.h"
#include "structured/json_schema_internal.h"
#include "structured/pda.h"
#include "structured/regex.h"

namespace dinfer::structured::json_internal {
namespace {

bool HasScheme(std::string_view uri) {
  const size_t colon = uri.find(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  if (!std::isalpha(static_cast<unsigned char>(uri[0]))) return false;
  for (size_t i = 1; i < colon; ++i) {
    const char c = uri[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

std::string StripFragment(std::string_view uri) {
  return std::string(uri.substr(0, uri.find('#')));
}

std::string Join(const std::string& base, std::string_view ref) {
  if (ref.empty()) return base;
  if (HasScheme(ref)) return std::string(ref);
  if (ref[0] == '/') {
    const size_t scheme = base.find("://");
    const size_t path =
        scheme == std::string::npos ? std::string::npos : base.find('/', scheme + 3);
    return (path == std::string::npos ? base : base.substr(0, path)) + std::string(ref);
  }
  const size_t slash = base.rfind('/');
  std::string dir = slash == std::string::npos ? "" : base.substr(0, slash + 1);
  while (ref.starts_with("./")) ref.remove_prefix(2);
  while (ref.starts_with("../") && dir.size() > 1) {
    ref.remove_prefix(3);
    const size_t prev = dir.rfind('/', dir.size() - 2);
    if (prev == std::string::npos) break;
    dir.resize(prev + 1);
  }
  return dir + std::string(ref);
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

constexpr std::string_view kSubschemaMaps[] = {"properties",  "patternProperties", "$defs",
                                               "definitions", "dependentSchemas",  "dependencies"};
constexpr std::string_view kSubschemaLists[] = {"allOf", "anyOf", "oneOf", "prefixItems", "items"};
constexpr std::string_view kSubschemas[] = {"additionalProperties",
                                            "additionalItems",
                                            "items",
                                            "not",
                                            "if",
                                            "then",
                                            "else",
                                            "contains",
                                            "propertyNames",
                                            "unevaluatedItems",
                                            "unevaluatedProperties"};

}  // namespace

void SchemaIndex::Build(const json::value& root, Draft draft, const std::string& root_base) {
  draft_ = draft;
  by_uri_[root_base] = &root;
  Walk(root, root_base);
}

std::string SchemaIndex::BaseOf(const json::object& schema, const std::string& outer) const {
  const json::value* id = schema.if_contains("$id");
  if (!id && draft_ == Draft::k4) id = schema.if_contains("id");
  if (!id || !id->is_string()) return outer;
  const std::string_view s = id->as_string();
  if (s.starts_with("#")) return outer;
  return StripFragment(Join(StripFragment(outer), s));
}

void SchemaIndex::Walk(const json::value& v, const std::string& outer) {
  if (!v.is_object()) return;
  const json::object& o = v.as_object();
  const std::string base = BaseOf(o, outer);
  if (base != outer) by_uri_.emplace(base, &v);
  const json::value* id = o.if_contains("$id");
  if (!id && draft_ == Draft::k4) id = o.if_contains("id");
  if (id && id->is_string() && id->as_string().starts_with("#")) {
    by_uri_.emplace(base + std::string(id->as_string()), &v);
  }
  if (const json::value* a = o.if_contains("$anchor"); a && a->is_string()) {
    by_uri_.emplace(base + "#" + std::string(a->as_string()), &v);
  }
  for (std::string_view k : kSubschemaMaps) {
    if (const json::value* m = o.if_contains(k); m && m->is_object()) {
      for (const auto& kv : m->as_object()) Walk(kv.value(), base);
    }
  }
  for (std::string_view k : kSubschemaLists) {
    if (const json::value* l = o.if_contains(k); l && l->is_array()) {
      for (const auto& item : l->as_array()) Walk(item, base);
    }
  }
  for (std::string_view k : kSubschemas) {
    if (const json::value* s = o.if_contains(k)) Walk(*s, base);
  }
}

StatusOr<std::pair<const json::value*, std::string>> SchemaIndex::Resolve(
    std::string_view ref, const std::string& base) const {
  const size_t hash = ref.find('#');
  const std::string_view uri_part = ref.substr(0, hash);
  const std::string fragment =
      hash == std::string_view::npos ? "" : PercentDecode(ref.substr(hash + 1));
  const std::string target =
      uri_part.empty() ? StripFragment(base) : Join(StripFragment(base), uri_part);
  auto it = by_uri_.find(target);
  if (it == by_uri_.end()) {
    return Unimplemented(
        "$ref '{}' points outside the schema document (remote references are not supported)", ref);
  }
  if (fragment.empty()) return std::make_pair(it->second, target);
  if (fragment[0] != '/') {
    auto anchor = by_uri_.find(target + "#" + fragment);
    if (anchor == by_uri_.end()) return InvalidArgument("$ref '{}': no anchor '{}'", ref, fragment);
    return std::make_pair(anchor->second, target);
  }
  const json::value* cur = it->second;
  std::string cur_base = target;
  size_t pos = 1;
  while (pos <= fragment.size()) {
    size_t next = fragment.find('/', pos);
    if (next == std::string::npos) next = fragment.size();
    std::string token;
    for (size_t i = pos; i < next; ++i) {
      if (fragment[i] == '~' && i + 1 < next &&
          (fragment[i + 1] == '0' || fragment[i + 1] == '1')) {
        token.push_back(fragment[i + 1] == '0' ? '~' : '/');
        ++i;
      } else {
        token.push_back(fragment[i]);
      }
    }
    if (cur->is_object()) {
      cur_base = BaseOf(cur->as_object(), cur_base);
      cur = cur->as_object().if_contains(token);
    } else if (cur->is_array()) {
      size_t index = 0;
      auto [p, ec] = std::from_chars(token.data(), token.data() + token.size(), index);
      cur = ec == std::errc() && p == token.data() + token.size() && index < cur->as_array().size()
                ? &cur->as_array()[index]
                : nullptr;
    } else {
      cur = nullptr;
    }
    if (!cur) return InvalidArgument("$ref '{}' does not resolve", ref);
    pos = next + 1;
  }
  return std::make_pair(cur, cur_base);
}

std::string KeyLiteral(std::string_view name) {
  std::string out;
  AppendJsonQuoted(name, &out);
  return out;
}

namespace {

void AppendNumber(double d, std::string* out) {
  char buf[64];
  if (d == 0) {
    *out += "0";
    return;
  }
  const double a = std::fabs(d);
  std::to_chars_result r;
  if (a >= 1e-7 && a < 1e21) {
    r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::fixed);
  } else {
    r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  }
  out->append(buf, r.ptr);
}

void Serialize(const json::value& v, std::string* out) {
  switch (v.kind()) {
    case json::kind::null:
      *out += "null";
      return;
    case json::kind::bool_:
      *out += v.get_bool() ? "true" : "false";
      return;
    case json::kind::int64:
      *out += std::to_string(v.get_int64());
      return;
    case json::kind::uint64:
      *out += std::to_string(v.get_uint64());
      return;
    case json::kind::double_:
      AppendNumber(v.get_double(), out);
      return;
    case json::kind::string:
      AppendJsonQuoted(v.get_string(), out);
      return;
    case json::kind::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& x : v.get_array()) {
        if (!first) out->push_back(',');
        first = false;
        Serialize(x, out);
      }
      out->push_back(']');
      return;
    }
    case json::kind::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& kv : v.get_object()) {
        if (!first) out->push_back(',');
        first = false;
        AppendJsonQuoted(kv.key(), out);
        out->push_back(':');
        Serialize(kv.value(), out);
      }
      out->push_back('}');
      return;
    }
  }
}

}  // namespace

std::string SerializeCompact(const json::value& v) {
  std::string out;
  Serialize(v, &out);
  return out;
}

std::optional<Decimal> ToDecimal(const json::value& v) {
  if (!v.is_number()) return std::nullopt;
  std::string text;
  if (v.is_double()) {
    if (!std::isfinite(v.get_double())) return std::nullopt;
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), v.get_double());
    text.assign(buf, r.ptr);
  } else {
    text = SerializeCompact(v);
  }
  return Decimal::Parse(text);
}

size_t CodepointCount(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

std::optional<std::string_view> FormatRegex(std::string_view format) {
  // Days per month, February 29 only in leap years.
  static const std::string kDate =
      R"((\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30))"
      R"(|02-(0[1-9]|1\d|2[0-8]))|(\d\d(0[48]|[2468][048]|[13579][26])|([02468][048])"
      R"(|[13579][26])00)-02-29))";
  static const std::string kTime =
      R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))";
  static const std::string kDateTime = kDate + "[Tt]" + kTime;
  static const std::string kDuration =
      R"(P(\d+W|(\d+Y(\d+M)?(\d+D)?|\d+M(\d+D)?|\d+D)(T(\d+H(\d+M)?(\d+S)?|\d+M(\d+S)?|\d+S))?)"
      R"(|T(\d+H(\d+M)?(\d+S)?|\d+M(\d+S)?|\d+S)))";
  static const std::string kAtom = R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)";
  static const std::string kLabel = R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
  // Email domains keep their labels unbounded: bounded runs would cost one state per character.
  static const std::string kLooseLabel = R"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)";
  static const std::string kEmail =
      kAtom + R"((\.)" + kAtom + R"()*@()" + kLooseLabel + R"(\.)+)" + kLooseLabel;
  static const std::string kHostname = kLabel + R"((\.)" + kLabel + ")*";
  static const std::string kOctet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  static const std::string kIpv4 = kOctet + R"((\.)" + kOctet + "){3}";
  static const std::string kIpv6 = [] {
    const std::string h = "[0-9A-Fa-f]{1,4}";
    const std::string ls32 = "(" + h + ":" + h + "|" + kIpv4 + ")";
    auto head = [&](int n) {  // up to n groups "h:" then h, possibly nothing
      return n < 0 ? std::string() : "((" + h + ":){0," + std::to_string(n) + "}" + h + ")?";
    };
    std::vector<std::string> alts = {
        "(" + h + ":){6}" + ls32,
        "::(" + h + ":){5}" + ls32,
        head(0) + "::(" + h + ":){4}" + ls32,
        head(1) + "::(" + h + ":){3}" + ls32,
        head(2) + "::(" + h + ":){2}" + ls32,
        head(3) + "::" + h + ":" + ls32,
        head(4) + "::" + ls32,
        head(5) + "::" + h,
        head(6) + "::",
    };
    std::string out;
    for (const auto& a : alts) out += (out.empty() ? "" : "|") + ("(" + a + ")");
    return out;
  }();
  static const std::string kJsonPointer = R"((/([^~/]|~[01])*)*)";
  static const std::string kUuid =
      "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  static const std::string kUriChars = R"(([A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-Fa-f]{2}))";
  static const std::string kUri = "[A-Za-z][A-Za-z0-9+.-]*:" + kUriChars + "*";
  static const std::string kUriReference = kUriChars + "*";
  static const std::pair<std::string_view, const std::string*> kFormats[] = {
      {"date", &kDate},
      {"time", &kTime},
      {"date-time", &kDateTime},
      {"duration", &kDuration},
      {"email", &kEmail},
      {"hostname", &kHostname},
      {"ipv4", &kIpv4},
      {"ipv6", &kIpv6},
      {"uuid", &kUuid},
      {"uri", &kUri},
      {"uri-reference", &kUriReference},
      {"json-pointer", &kJsonPointer}};
  for (const auto& [name, regex] : kFormats) {
    if (name == format) return *regex;
  }
  return std::nullopt;
}

StatusOr<bool> PatternMatches(std::string_view pattern, std::string_view text, bool search) {
  Grammar g;
  DINFER_ASSIGN_OR_RETURN(ExprId e, RegexToExpr(pattern, {.search = search}, &g));
  g.set_root(g.DefineRule("pattern", e));
  auto a = Automaton::Build(g);
  if (!a.ok()) return false;  // matches nothing
  Pda pda(*a);
  FramePool pool;
  Config cur, next;
  pda.Start(&pool, &cur);
  for (char c : text) {
    pda.Step(cur, static_cast<uint8_t>(c), &pool, &next);
    if (next.Dead()) return false;
    std::swap(cur, next);
  }
  return cur.complete;
}

uint32_t TypeOfValue(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null:
      return kNull;
    case json::kind::bool_:
      return kBoolean;
    case json::kind::object:
      return kObject;
    case json::kind::array:
      return kArray;
    case json::kind::string:
      return kString;
    case json::kind::int64:
    case json::kind::uint64:
      return kInteger;
    case json::kind::double_: {
      const double d = v.get_double();
      return std::isfinite(d) && d == std::floor(d) ? kInteger : kNumber;
    }
  }
  return 0;
}

StatusOr<uint32_t> DeclaredTypes(const json::object& schema) {
  const json::value* t = schema.if_contains("type");
  if (!t) return kAllTypes;
  auto one = [](std::string_view name) -> uint32_t {
    if (name == "null") return kNull;
    if (name == "boolean") return kBoolean;
    if (name == "object") return kObject;
    if (name == "array") return kArray;
    if (name == "string") return kString;
    if (name == "integer") return kInteger;
    if (name == "number") return kInteger | kNumber;
    return 0;
  };
  if (t->is_string()) {
    const uint32_t bits = one(t->as_string());
    if (!bits) return InvalidArgument("unknown type '{}'", std::string_view(t->as_string()));
    return bits;
  }
  if (!t->is_array()) return InvalidArgument("'type' must be a string or an array");
  uint32_t bits = 0;
  for (const auto& x : t->as_array()) {
    if (!x.is_string() || !one(x.as_string())) return InvalidArgument("bad entry in 'type'");
    bits |= one(x.as_string());
  }
  return bits;
}

bool IsAnnotation(std::string_view k) {
  static const std::set<std::string_view> kValidation = {"type",
                                                         "enum",
                                                         "const",
                                                         "properties",
                                                         "required",
                                                         "additionalProperties",
                                                         "patternProperties",
                                                         "propertyNames",
                                                         "minProperties",
                                                         "maxProperties",
                                                         "items",
                                                         "prefixItems",
                                                         "additionalItems",
                                                         "minItems",
                                                         "maxItems",
                                                         "uniqueItems",
                                                         "contains",
                                                         "minContains",
                                                         "maxContains",
                                                         "minLength",
                                                         "maxLength",
                                                         "pattern",
                                                         "format",
                                                         "minimum",
                                                         "maximum",
                                                         "exclusiveMinimum",
                                                         "exclusiveMaximum",
                                                         "multipleOf",
                                                         "allOf",
                                                         "anyOf",
                                                         "oneOf",
                                                         "not",
                                                         "if",
                                                         "then",
                                                         "else",
                                                         "$ref",
                                                         "dependencies",
                                                         "dependentRequired",
                                                         "dependentSchemas",
                                                         "unevaluatedItems",
                                                         "unevaluatedProperties",
                                                         "$dynamicRef",
                                                         "$recursiveRef"};
  return !kValidation.contains(k);
}

std::string KeyOf(const json::object& s) {
  json::object v;
  for (const auto& kv : s) {
    if (!IsAnnotation(kv.key())) v[kv.key()] = kv.value();
  }
  return SerializeCompact(v);
}

StatusOr<uint32_t> CountKeyword(const json::object& s, std::string_view key, uint32_t fallback) {
  const json::value* v = s.if_contains(key);
  if (!v) return fallback;
  auto d = ToDecimal(*v);
  if (!d || d->negative || !d->IsInteger()) {
    return InvalidArgument("'{}' must be a non-negative integer", key);
  }
  if (d->int_digits.size() > 9) return kUnbounded - 1;
  return static_cast<uint32_t>(std::stoul(d->int_digits));
}

}  // namespace dinfer::structured::json_internal
