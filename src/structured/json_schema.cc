#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <span>

#include "structured/json_schema_internal.h"
#include "structured/regex.h"

namespace dinfer::structured {
namespace json_internal {
namespace {

bool HasValidation(const json::object& s) {
  return std::any_of(s.begin(), s.end(), [](const auto& kv) { return !IsAnnotation(kv.key()); });
}

Draft DraftOf(const json::value& root, int32_t fallback) {
  const json::value* s = root.is_object() ? root.as_object().if_contains("$schema") : nullptr;
  if (!s || !s->is_string()) {
    switch (fallback) {
      case 4:
        return Draft::k4;
      case 6:
        return Draft::k6;
      case 7:
        return Draft::k7;
      case 2019:
        return Draft::k2019;
      default:
        return Draft::k2020;
    }
  }
  const std::string_view u = s->as_string();
  if (u.find("draft-04") != std::string_view::npos) return Draft::k4;
  if (u.find("draft-06") != std::string_view::npos) return Draft::k6;
  if (u.find("draft-07") != std::string_view::npos) return Draft::k7;
  if (u.find("2019-09") != std::string_view::npos) return Draft::k2019;
  return Draft::k2020;
}

bool AllDisjoint(std::span<json::object> alts, const Flattener& flatten) {
  for (size_t i = 0; i < alts.size(); ++i) {
    for (size_t j = i + 1; j < alts.size(); ++j) {
      if (!Disjoint(alts[i], alts[j], flatten)) return false;
    }
  }
  return true;
}

std::vector<std::string> Required(const json::object& s) {
  std::vector<std::string> out;
  if (const json::value* r = s.if_contains("required"); r && r->is_array()) {
    for (const auto& x : r->as_array()) {
      if (x.is_string()) out.emplace_back(x.as_string());
    }
  }
  return out;
}

// oneOf over objects told apart by the properties they require (as with {"required": ["ssn"]}
// and {"required": ["ein"]}): when every alternative requires something another does not, each
// is generated as an object without the properties that only the others require, so that no
// output matches two alternatives. A restriction of what is generated, never an acceptance of
// what is invalid.
bool ExcludeOthersRequired(std::span<json::object> alts) {
  std::vector<std::vector<std::string>> req;
  for (const json::object& a : alts) req.push_back(Required(a));
  auto missing_from = [&](size_t i, size_t j) {  // required by j, not by i
    std::vector<std::string> out;
    for (const std::string& q : req[j]) {
      if (std::find(req[i].begin(), req[i].end(), q) == req[i].end()) out.push_back(q);
    }
    return out;
  };
  for (size_t i = 0; i < alts.size(); ++i) {
    auto types = DeclaredTypes(alts[i]);
    if (!types.ok() || !(*types & kObject)) return false;
    for (size_t j = 0; j < alts.size(); ++j) {
      if (i != j && missing_from(i, j).empty()) return false;
    }
  }
  for (size_t i = 0; i < alts.size(); ++i) {
    json::object& a = alts[i];
    a["type"] = "object";
    json::object props;
    if (const json::value* p = a.if_contains("properties"); p && p->is_object())
      props = p->as_object();
    for (size_t j = 0; j < alts.size(); ++j) {
      if (i == j) continue;
      for (const std::string& q : missing_from(i, j)) props[q] = false;
    }
    a["properties"] = std::move(props);
  }
  return true;
}

}  // namespace

Status Converter::Error(const Ctx& ctx, std::string_view what) const {
  return InvalidArgument("JSON Schema at '{}': {}", Where(ctx), what);
}

Status Converter::Unsupported(const Ctx& ctx, std::string_view keyword) const {
  return Unimplemented("JSON Schema: {} at '{}' is not supported", keyword, Where(ctx));
}

StatusOr<ExprId> Converter::MemoRule(const std::string& key, const std::string& name,
                                     const std::function<StatusOr<ExprId>(RuleId)>& make) {
  if (auto it = memo_.find(key); it != memo_.end()) return g_.Ref(it->second);
  const RuleId r = g_.AddRule(name.empty() ? "/" : name);
  memo_.emplace(key, r);
  DINFER_ASSIGN_OR_RETURN(ExprId body, make(r));
  g_.SetBody(r, body);
  return g_.Ref(r);
}

Status Converter::Run(const json::value& root) {
  draft_ = DraftOf(root, opt_.default_draft);
  std::string base = "urn:dinfer:schema";
  if (root.is_object()) base = index_.BaseOf(root.as_object(), base);
  index_.Build(root, draft_, base);
  Ctx ctx{base, "", 0};
  DINFER_ASSIGN_OR_RETURN(ExprId e, Value(root, ctx));
  g_.set_root(g_.DefineRule("root", e));
  return OkStatus();
}

ExprId Converter::Ws() {
  if (opt_.max_whitespace == 0) return g_.Empty();
  if (ws_ < 0) {
    // One looping state whose bytes are counted: the bound costs no states, and the rule's masks
    // are shared by every grammar of the tokenizer whatever the bound.
    const ExprId space = g_.Bytes({{' ', ' '}, {'\t', '\n'}, {'\r', '\r'}}, ByteMark::kChar);
    ws_ = g_.DefineRule("ws", g_.Star(space));
    g_.SetCounted(
        ws_, 0, opt_.max_whitespace < 0 ? kUnbounded : static_cast<uint32_t>(opt_.max_whitespace));
  }
  return g_.Ref(ws_);
}

ExprId Converter::Sep(char c) { return g_.Seq({Ws(), g_.Byte(static_cast<uint8_t>(c)), Ws()}); }

ExprId Converter::FreeString() {
  if (free_string_ < 0) {
    free_string_ = g_.DefineRule(
        "string",
        g_.Seq({g_.Byte('"'),
                g_.Star(g_.Chars({{0, kMaxCodepoint}}, CharEncoding::kJsonStringAnyEscape)),
                g_.Byte('"', ByteMark::kClose)}));
    g_.SetCounted(free_string_, 0, kUnbounded);
  }
  return g_.Ref(free_string_);
}

ExprId Converter::AnyValue() {
  if (any_value_ < 0) {
    any_value_ = g_.AddRule("json_value");
    any_object_ = g_.AddRule("json_object");
    any_array_ = g_.AddRule("json_array");
    const ExprId value = g_.Ref(any_value_);
    g_.SetBody(any_value_,
               g_.Alt({g_.Ref(any_object_), g_.Ref(any_array_), FreeString(), NumberExpr({}, &g_),
                       g_.Literal("true"), g_.Literal("false"), g_.Literal("null")}));
    const ExprId member = g_.Seq({FreeString(), Sep(':'), value});
    g_.SetBody(any_object_,
               g_.Seq({g_.Byte('{'), Ws(),
                       g_.Optional(g_.Seq({member, g_.Star(g_.Seq({Sep(','), member})), Ws()})),
                       g_.Byte('}')}));
    g_.SetBody(any_array_,
               g_.Seq({g_.Byte('['), Ws(),
                       g_.Optional(g_.Seq({value, g_.Star(g_.Seq({Sep(','), value})), Ws()})),
                       g_.Byte(']')}));
  }
  return g_.Ref(any_value_);
}

RuleId Converter::AnyObjectRule() {
  AnyValue();
  return any_object_;
}

StatusOr<ExprId> Converter::Value(const json::value& schema, const Ctx& ctx) {
  if (ctx.depth > 200) return Error(ctx, "schema nesting is too deep");
  if (schema.is_bool()) return schema.get_bool() ? AnyValue() : g_.Nothing();
  if (!schema.is_object()) return Error(ctx, "a schema must be an object or a boolean");
  const json::object& o = schema.as_object();
  Ctx inner = ctx;
  inner.base = index_.BaseOf(o, ctx.base);
  inner.depth = ctx.depth + 1;
  if (!HasValidation(o)) return AnyValue();
  if (const json::value* ref = o.if_contains("$ref")) {
    if (!ref->is_string()) return Error(ctx, "'$ref' must be a string");
    const bool bare = draft_ <= Draft::k7 || std::all_of(o.begin(), o.end(), [](const auto& kv) {
                        return kv.key() == "$ref" || IsAnnotation(kv.key());
                      });
    if (bare) return RefValue(ref->as_string(), inner);
  }
  DINFER_ASSIGN_OR_RETURN(json::object flat, Flatten(o, inner, 0));
  return FlatValue(flat, inner);
}

StatusOr<ExprId> Converter::RefValue(std::string_view ref, const Ctx& ctx) {
  auto target = index_.Resolve(ref, ctx.base);
  if (!target.ok())
    return target.status().WithContext(fmt::format("JSON Schema at '{}'", Where(ctx)));
  const auto [schema, base] = *target;
  Ctx t{base, ctx.path, ctx.depth};
  const std::string key = fmt::format("ref:{}", static_cast<const void*>(schema));
  return MemoRule(key, std::string(ref), [&](RuleId) { return Value(*schema, t); });
}

StatusOr<json::object> Converter::Flatten(const json::object& schema, const Ctx& ctx, int depth) {
  if (depth > 32) return Unsupported(ctx, "a cycle of $ref / allOf without a value in between");
  json::object r = schema;
  {
    // Draft 4's boolean exclusiveMinimum / exclusiveMaximum modify minimum / maximum (later
    // drafts use numbers, so a boolean can only mean this).
    for (const auto& [ex, plain] :
         {std::pair{"exclusiveMinimum", "minimum"}, std::pair{"exclusiveMaximum", "maximum"}}) {
      const json::value* e = r.if_contains(ex);
      if (!e || !e->is_bool()) continue;
      if (e->get_bool() && r.contains(plain)) {
        r[ex] = r[plain];
        r.erase(plain);
      } else {
        r.erase(ex);
      }
    }
  }
  auto flat_of = [&](const json::value& v, const Ctx& c) -> StatusOr<json::object> {
    if (v.is_bool()) return v.get_bool() ? json::object{} : json::object{{"enum", json::array{}}};
    if (!v.is_object()) return Error(c, "a schema must be an object or a boolean");
    Ctx inner = c;
    inner.base = index_.BaseOf(v.as_object(), c.base);
    return Flatten(v.as_object(), inner, depth + 1);
  };
  if (const json::value* ref = r.if_contains("$ref"); ref && ref->is_string()) {
    auto target = index_.Resolve(ref->as_string(), ctx.base);
    if (!target.ok())
      return target.status().WithContext(fmt::format("JSON Schema at '{}'", Where(ctx)));
    r.erase("$ref");
    DINFER_ASSIGN_OR_RETURN(json::object t,
                            flat_of(*target->first, Ctx{target->second, ctx.path, ctx.depth}));
    if (draft_ <= Draft::k7) {
      r = std::move(t);
    } else {
      DINFER_ASSIGN_OR_RETURN(r, MergeSchemas(t, r));
    }
  }
  if (const json::value* all = r.if_contains("allOf")) {
    if (!all->is_array()) return Error(ctx, "'allOf' must be an array");
    const json::array list = all->as_array();
    r.erase("allOf");
    for (size_t i = 0; i < list.size(); ++i) {
      Ctx c = ctx;
      c.path += fmt::format("/allOf/{}", i);
      DINFER_ASSIGN_OR_RETURN(json::object sub, flat_of(list[i], c));
      auto merged = MergeSchemas(r, sub);
      if (!merged.ok())
        return merged.status().WithContext(fmt::format("JSON Schema at '{}'", Where(c)));
      r = std::move(*merged);
      // A merged part may bring its own allOf / $ref.
      if (r.contains("allOf") || r.contains("$ref")) {
        DINFER_ASSIGN_OR_RETURN(r, Flatten(r, ctx, depth + 1));
      }
    }
  }
  return r;
}

StatusOr<ExprId> Converter::FlatValue(const json::object& s, const Ctx& ctx) {
  if (s.contains("anyOf") || s.contains("oneOf")) return Alternatives(s, ctx);
  return Typed(s, ctx);
}

StatusOr<ExprId> Converter::Alternatives(const json::object& s, const Ctx& ctx) {
  const std::string key = "alt:" + ctx.base + "|" + KeyOf(s);
  return MemoRule(key, ctx.path, [&](RuleId) -> StatusOr<ExprId> {
    json::object base = s;
    base.erase("anyOf");
    base.erase("oneOf");
    std::vector<json::object> alts = {base};
    for (const char* kw : {"anyOf", "oneOf"}) {
      const json::value* list = s.if_contains(kw);
      if (!list) continue;
      if (!list->is_array() || list->as_array().empty()) {
        return Error(ctx, fmt::format("'{}' must be a non-empty array", kw));
      }
      const json::array& items = list->as_array();
      const Flattener flatten = [&](const json::value& v) -> std::optional<json::object> {
        if (v.is_bool()) {
          return v.get_bool() ? json::object{} : json::object{{"enum", json::array{}}};
        }
        if (!v.is_object()) return std::nullopt;
        auto f = Flatten(v.as_object(), ctx, 0);
        return f.ok() ? std::optional<json::object>(std::move(*f)) : std::nullopt;
      };
      std::vector<json::object> next;
      for (const json::object& a : alts) {
        const size_t first = next.size();
        for (size_t i = 0; i < items.size(); ++i) {
          Ctx c = ctx;
          c.path += fmt::format("/{}/{}", kw, i);
          if (items[i].is_bool()) {
            if (items[i].get_bool()) next.push_back(a);
            continue;
          }
          if (!items[i].is_object()) return Error(c, "a schema must be an object or a boolean");
          c.base = index_.BaseOf(items[i].as_object(), ctx.base);
          DINFER_ASSIGN_OR_RETURN(json::object sub, Flatten(items[i].as_object(), c, 0));
          auto merged = MergeSchemas(a, sub);
          if (!merged.ok())
            return merged.status().WithContext(fmt::format("JSON Schema at '{}'", Where(c)));
          next.push_back(std::move(*merged));
        }
        if (std::string_view(kw) == "oneOf") {
          std::span<json::object> group(next.data() + first, next.size() - first);
          if (!AllDisjoint(group, flatten) && !ExcludeOthersRequired(group)) {
            return Unsupported(ctx, "oneOf whose alternatives may match the same value");
          }
        }
      }
      if (next.size() > 256) return Unsupported(ctx, "anyOf / oneOf with over 256 combinations");
      alts = std::move(next);
    }
    std::vector<ExprId> exprs;
    for (const json::object& a : alts) {
      DINFER_ASSIGN_OR_RETURN(ExprId e, FlatValue(a, ctx));
      exprs.push_back(e);
    }
    return g_.Alt(std::move(exprs));
  });
}

StatusOr<ExprId> Converter::Typed(const json::object& s, const Ctx& ctx) {
  auto declared = DeclaredTypes(s);
  if (!declared.ok()) return Error(ctx, declared.status().message());
  const uint32_t types = *declared;
  for (const char* kw : {"not", "if", "$dynamicRef", "$recursiveRef"}) {
    if (s.contains(kw)) return Unsupported(ctx, fmt::format("keyword '{}'", kw));
  }
  for (const char* kw : {"dependencies", "dependentRequired", "dependentSchemas"}) {
    const json::value* v = s.if_contains(kw);
    if (v && !(v->is_object() && v->as_object().empty()) && (types & kObject)) {
      return Unsupported(ctx, fmt::format("keyword '{}'", kw));
    }
  }
  for (const char* kw : {"unevaluatedProperties", "unevaluatedItems"}) {
    const json::value* v = s.if_contains(kw);
    const bool trivial =
        !v || (v->is_bool() && v->get_bool()) || (v->is_object() && v->as_object().empty());
    if (!trivial) return Unsupported(ctx, fmt::format("keyword '{}'", kw));
  }
  if (s.contains("enum") || s.contains("const")) return Literals(s, types, ctx);
  std::vector<ExprId> alts;
  if (types & kNull) alts.push_back(g_.Literal("null"));
  if (types & kBoolean) alts.push_back(g_.Alt({g_.Literal("true"), g_.Literal("false")}));
  if (types & (kInteger | kNumber)) {
    DINFER_ASSIGN_OR_RETURN(ExprId e, Number(s, (types & kNumber) == 0, ctx));
    alts.push_back(e);
  }
  if (types & kString) {
    DINFER_ASSIGN_OR_RETURN(ExprId e, String(s, ctx));
    alts.push_back(e);
  }
  if (types & kArray) {
    DINFER_ASSIGN_OR_RETURN(ExprId e, Array(s, ctx));
    alts.push_back(e);
  }
  if (types & kObject) {
    DINFER_ASSIGN_OR_RETURN(ExprId e, Object(s, ctx));
    alts.push_back(e);
  }
  return g_.Alt(std::move(alts));
}

StatusOr<ExprId> Converter::Literals(const json::object& s, uint32_t types, const Ctx& ctx) {
  json::array values;
  const json::value* e = s.if_contains("enum");
  if (e && !e->is_array()) return Error(ctx, "'enum' must be an array");
  if (const json::value* c = s.if_contains("const")) {
    const std::string text = SerializeCompact(*c);
    bool in_enum = !e;
    if (e) {
      for (const auto& v : e->as_array()) in_enum |= SerializeCompact(v) == text;
    }
    if (in_enum) values.push_back(*c);
  } else {
    values = e->as_array();
  }
  std::set<std::string> seen;
  std::vector<ExprId> alts;
  for (const auto& v : values) {
    if (!(TypeOfValue(v) & types)) continue;
    DINFER_ASSIGN_OR_RETURN(bool ok, LiteralAllowed(v, s, ctx));
    if (!ok) continue;
    const std::string text = SerializeCompact(v);
    if (seen.insert(text).second) alts.push_back(g_.Literal(text));
  }
  return g_.Alt(std::move(alts));
}

StatusOr<bool> Converter::LiteralAllowed(const json::value& v, const json::object& s,
                                         const Ctx& ctx) {
  if (v.is_string()) {
    const std::string_view text = v.as_string();
    const size_t n = CodepointCount(text);
    DINFER_ASSIGN_OR_RETURN(uint32_t min, CountKeyword(s, "minLength", 0));
    DINFER_ASSIGN_OR_RETURN(uint32_t max, CountKeyword(s, "maxLength", kUnbounded));
    if (n < min || n > max) return false;
    if (const json::value* p = s.if_contains("pattern"); p && p->is_string()) {
      auto m = PatternMatches(p->as_string(), text, true);
      if (!m.ok()) return m.status().WithContext(fmt::format("JSON Schema at '{}'", Where(ctx)));
      return *m;
    }
    if (const json::value* f = s.if_contains("format"); f && f->is_string()) {
      if (auto re = FormatRegex(f->as_string())) return PatternMatches(*re, text, false);
    }
    return true;
  }
  if (v.is_number()) {
    auto d = ToDecimal(v);
    if (!d) return false;
    auto check = [&](const char* key, bool lower, bool exclusive) {
      auto b = s.if_contains(key) ? ToDecimal(s.at(key)) : std::nullopt;
      if (!b) return true;
      const int c = Decimal::Compare(*d, *b);
      return lower ? (exclusive ? c > 0 : c >= 0) : (exclusive ? c < 0 : c <= 0);
    };
    if (!check("minimum", true, false) || !check("exclusiveMinimum", true, true) ||
        !check("maximum", false, false) || !check("exclusiveMaximum", false, true)) {
      return false;
    }
    if (const json::value* m = s.if_contains("multipleOf")) {
      auto md = ToDecimal(*m);
      const bool power =
          md &&
          ((md->int_digits == "1" && md->frac_digits.empty()) ||
           (md->int_digits == "0" && !md->frac_digits.empty() && md->frac_digits.back() == '1' &&
            md->frac_digits.find_first_not_of('0') == md->frac_digits.size() - 1));
      if (!power) return Unsupported(ctx, "multipleOf other than a power of ten");
      const size_t digits = md->int_digits == "1" ? 0 : md->frac_digits.size();
      if (d->frac_digits.size() > digits) return false;
    }
    return true;
  }
  if (v.is_array() || v.is_object()) {
    static const char* kContainer[] = {"properties",        "required",      "additionalProperties",
                                       "patternProperties", "propertyNames", "minProperties",
                                       "maxProperties",     "items",         "prefixItems",
                                       "additionalItems",   "minItems",      "maxItems",
                                       "uniqueItems",       "contains"};
    for (const char* k : kContainer) {
      if (s.contains(k)) {
        return Unsupported(ctx, fmt::format("enum / const of objects or arrays with '{}'", k));
      }
    }
  }
  return true;
}

StatusOr<ExprId> Converter::Number(const json::object& s, bool integer, const Ctx& ctx) {
  NumberBounds b;
  auto bound = [&](const char* key) -> StatusOr<std::optional<Decimal>> {
    const json::value* v = s.if_contains(key);
    if (!v) return std::optional<Decimal>();
    auto d = ToDecimal(*v);
    if (!d) return Error(ctx, fmt::format("'{}' must be a number", key));
    return std::optional<Decimal>(*d);
  };
  DINFER_ASSIGN_OR_RETURN(b.min, bound("minimum"));
  DINFER_ASSIGN_OR_RETURN(b.max, bound("maximum"));
  DINFER_ASSIGN_OR_RETURN(auto xmin, bound("exclusiveMinimum"));
  DINFER_ASSIGN_OR_RETURN(auto xmax, bound("exclusiveMaximum"));
  if (xmin && (!b.min || Decimal::Compare(*xmin, *b.min) >= 0)) {
    b.min = xmin;
    b.min_exclusive = true;
  }
  if (xmax && (!b.max || Decimal::Compare(*xmax, *b.max) <= 0)) {
    b.max = xmax;
    b.max_exclusive = true;
  }
  if (const json::value* m = s.if_contains("multipleOf")) {
    auto md = ToDecimal(*m);
    if (!md || md->negative || md->IsZero()) return Error(ctx, "'multipleOf' must be positive");
    const bool one = md->int_digits == "1" && md->frac_digits.empty();
    const bool tenth = md->int_digits == "0" && md->frac_digits.back() == '1' &&
                       md->frac_digits.find_first_not_of('0') == md->frac_digits.size() - 1;
    if (one || tenth) {
      b.max_fraction_digits = one ? 0 : static_cast<uint32_t>(md->frac_digits.size());
    } else {
      return Unsupported(ctx, fmt::format("multipleOf {}", md->ToString()));
    }
  }
  return integer ? IntegerExpr(b, &g_) : NumberExpr(b, &g_);
}

StatusOr<ExprId> Converter::String(const json::object& s, const Ctx& ctx) {
  auto min = CountKeyword(s, "minLength", 0);
  auto max = CountKeyword(s, "maxLength", kUnbounded);
  if (!min.ok()) return Error(ctx, min.status().message());
  if (!max.ok()) return Error(ctx, max.status().message());
  std::string pattern, format;
  if (const json::value* p = s.if_contains("pattern")) {
    if (!p->is_string()) return Error(ctx, "'pattern' must be a string");
    pattern = p->as_string();
  } else if (const json::value* f = s.if_contains("format"); f && f->is_string()) {
    if (FormatRegex(f->as_string())) format = f->as_string();
  }
  if (*min > *max) return g_.Nothing();
  if (pattern.empty() && format.empty() && *min == 0 && *max == kUnbounded) return FreeString();
  const std::string key = fmt::format("str:{}\x1f{}\x1f{}\x1f{}", pattern, format, *min, *max);
  return MemoRule(key, ctx.path + "/string", [&](RuleId r) -> StatusOr<ExprId> {
    uint32_t lo = *min, hi = *max;
    ExprId body;
    if (!pattern.empty()) {
      if (auto cr = AsClassRepeat(pattern, true)) {
        lo = std::max(lo, cr->min);
        hi = std::min(hi, cr->max);
        body = g_.Star(g_.Chars(cr->codepoints, CharEncoding::kJsonString));
      } else {
        auto e = RegexToExpr(pattern, {.search = true, .encoding = CharEncoding::kJsonString}, &g_);
        if (!e.ok()) return e.status().WithContext(fmt::format("JSON Schema at '{}'", Where(ctx)));
        body = *e;
      }
    } else if (!format.empty()) {
      auto e = RegexToExpr(*FormatRegex(format), {.encoding = CharEncoding::kJsonString}, &g_);
      if (!e.ok()) return e.status();
      body = *e;
    } else {
      body = g_.Star(g_.Chars({{0, kMaxCodepoint}}, CharEncoding::kJsonStringAnyEscape));
    }
    g_.SetCounted(r, lo, hi);
    return g_.Seq({g_.Byte('"'), body, g_.Byte('"', ByteMark::kClose)});
  });
}

}  // namespace json_internal

StatusOr<Grammar> JsonSchemaToGrammar(const boost::json::value& schema,
                                      const JsonSchemaOptions& options) {
  Grammar g;
  json_internal::Converter c(options, &g);
  DINFER_RETURN_IF_ERROR(c.Run(schema));
  return g;
}

StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema_json,
                                      const JsonSchemaOptions& options) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(schema_json, ec);
  if (ec) return InvalidArgument("the JSON schema is not valid JSON: {}", ec.message());
  return JsonSchemaToGrammar(v, options);
}

Grammar JsonObjectGrammar(const JsonSchemaOptions& options) {
  Grammar g;
  json_internal::Converter c(options, &g);
  g.set_root(c.AnyObjectRule());
  return g;
}

}  // namespace dinfer::structured
