// Arrays and objects of the JSON Schema translation.
#include <algorithm>
#include <map>
#include <set>

#include "structured/json_schema_internal.h"

namespace dinfer::structured::json_internal {
namespace {

bool IsFalse(const json::value& v) { return v.is_bool() && !v.get_bool(); }
bool IsTrivial(const json::value& v) {
  return (v.is_bool() && v.get_bool()) || (v.is_object() && v.as_object().empty());
}

// Code points of a UTF-8 string.
std::vector<uint32_t> Codepoints(std::string_view s) {
  std::vector<uint32_t> out;
  while (!s.empty()) {
    const int32_t cp = DecodeUtf8(&s);
    if (cp < 0) break;
    out.push_back(static_cast<uint32_t>(cp));
  }
  return out;
}

}  // namespace

StatusOr<ExprId> Converter::Array(const json::object& s, const Ctx& ctx) {
  const std::string key = "arr:" + ctx.base + "|" + KeyOf(s);
  return MemoRule(key, ctx.path + "/array", [&](RuleId) -> StatusOr<ExprId> {
    std::vector<const json::value*> prefix;
    const json::value* rest = nullptr;
    const json::value* items = s.if_contains("items");
    if (items && items->is_array()) {
      for (const auto& x : items->as_array()) prefix.push_back(&x);
      rest = s.if_contains("additionalItems");
    } else {
      if (const json::value* p = s.if_contains("prefixItems"); p && p->is_array()) {
        for (const auto& x : p->as_array()) prefix.push_back(&x);
      }
      rest = items;
    }
    auto min = CountKeyword(s, "minItems", 0);
    auto max = CountKeyword(s, "maxItems", kUnbounded);
    if (!min.ok()) return Error(ctx, min.status().message());
    if (!max.ok()) return Error(ctx, max.status().message());
    uint32_t lo = *min, hi = *max;
    for (size_t i = 0; i < prefix.size(); ++i) {
      if (IsFalse(*prefix[i])) hi = std::min(hi, static_cast<uint32_t>(i));
    }
    if (rest && IsFalse(*rest)) hi = std::min(hi, static_cast<uint32_t>(prefix.size()));
    if (lo > hi) return g_.Nothing();
    if (const json::value* u = s.if_contains("uniqueItems");
        u && u->is_bool() && u->get_bool() && hi > 1) {
      return Unsupported(ctx, "keyword 'uniqueItems'");
    }
    if (s.contains("contains")) return Unsupported(ctx, "keyword 'contains'");
    const uint32_t k = static_cast<uint32_t>(std::min<size_t>(prefix.size(), hi));
    std::vector<ExprId> elems;
    for (uint32_t i = 0; i < k; ++i) {
      Ctx c = ctx;
      c.path += fmt::format("/items/{}", i);
      DINFER_ASSIGN_OR_RETURN(ExprId e, Value(*prefix[i], c));
      elems.push_back(e);
    }
    ExprId rest_expr = g_.Nothing();
    if (hi > k) {
      Ctx c = ctx;
      c.path += "/items";
      if (rest) {
        DINFER_ASSIGN_OR_RETURN(rest_expr, Value(*rest, c));
      } else {
        rest_expr = AnyValue();
      }
    }
    auto elem = [&](uint32_t i) { return i < k ? elems[i] : rest_expr; };
    const ExprId sep = Sep(',');
    // tail(i): what may follow once i >= 1 elements were written.
    const uint32_t top = std::max({k, lo, 1u});
    ExprId tail;
    if (top > hi) {
      tail = g_.Nothing();
    } else {
      tail = g_.Repeat(g_.Seq({sep, rest_expr}), 0, hi == kUnbounded ? kUnbounded : hi - top);
    }
    for (uint32_t i = top; i-- > 1;) {
      tail = g_.Alt({i >= lo ? g_.Empty() : g_.Nothing(),
                     i < hi ? g_.Seq({sep, elem(i), tail}) : g_.Nothing()});
    }
    const ExprId close = g_.Byte(']');
    return g_.Seq({g_.Byte('['), Ws(),
                   g_.Alt({lo == 0 ? close : g_.Nothing(),
                           hi >= 1 ? g_.Seq({elem(0), tail, Ws(), close}) : g_.Nothing()})});
  });
}

StatusOr<ExprId> Converter::KeyExcept(const std::vector<std::string>& names) {
  std::string key = "keys:";
  for (const auto& n : names) key += KeyLiteral(n);
  return MemoRule(key, "key", [&](RuleId) -> StatusOr<ExprId> {
    // A trie of the excluded names, by code point: a key leaves it as soon as it differs.
    struct Node {
      std::map<uint32_t, int> next;
      bool end = false;
    };
    std::vector<Node> trie(1);
    for (const auto& n : names) {
      int cur = 0;
      for (uint32_t cp : Codepoints(n)) {
        auto it = trie[cur].next.find(cp);
        if (it == trie[cur].next.end()) {
          trie.emplace_back();
          it = trie[cur].next.emplace(cp, static_cast<int>(trie.size() - 1)).first;
        }
        cur = it->second;
      }
      trie[cur].end = true;
    }
    const ExprId close = g_.Byte('"');
    const ExprId any = g_.Star(g_.Chars({{0, kMaxCodepoint}}, CharEncoding::kJsonString));
    std::vector<ExprId> built(trie.size(), -1);
    // Children have larger indices than their parents: build from the last node up.
    for (size_t i = trie.size(); i-- > 0;) {
      const Node& node = trie[i];
      std::vector<ExprId> alts;
      if (!node.end) alts.push_back(close);
      Ranges taken;
      for (const auto& [cp, child] : node.next) {
        alts.push_back(g_.Seq({g_.Chars({{cp, cp}}, CharEncoding::kJsonString), built[child]}));
        taken.emplace_back(cp, cp);
      }
      alts.push_back(
          g_.Seq({g_.Chars(ComplementCodepoints(taken), CharEncoding::kJsonString), any, close}));
      built[i] = g_.Alt(std::move(alts));
    }
    return g_.Seq({g_.Byte('"'), built[0]});
  });
}

StatusOr<ExprId> Converter::Object(const json::object& s, const Ctx& ctx) {
  const std::string key = "obj:" + ctx.base + "|" + KeyOf(s);
  return MemoRule(key, ctx.path + "/object", [&](RuleId) -> StatusOr<ExprId> {
    struct Prop {
      std::string name;
      json::value schema;
      bool required = false;
    };
    std::vector<Prop> props;
    std::map<std::string, size_t> index;
    if (const json::value* p = s.if_contains("properties")) {
      if (!p->is_object()) return Error(ctx, "'properties' must be an object");
      for (const auto& kv : p->as_object()) {
        index[std::string(kv.key())] = props.size();
        props.push_back({std::string(kv.key()), kv.value(), false});
      }
    }
    const json::value* ap = s.if_contains("additionalProperties");
    const json::value* pp = s.if_contains("patternProperties");
    if (pp && !pp->is_object()) return Error(ctx, "'patternProperties' must be an object");
    const bool has_patterns = pp && !pp->as_object().empty();
    if (const json::value* req = s.if_contains("required")) {
      if (!req->is_array()) return Error(ctx, "'required' must be an array");
      for (const auto& r : req->as_array()) {
        if (!r.is_string()) return Error(ctx, "'required' must list strings");
        const std::string name(r.as_string());
        auto it = index.find(name);
        if (it == index.end()) {
          // Required but not listed: constrained like any other extra property.
          index[name] = props.size();
          props.push_back({name, ap ? *ap : json::value(true), true});
        } else {
          props[it->second].required = true;
        }
      }
    }
    // Pattern properties also constrain the listed properties whose names they match.
    if (has_patterns) {
      for (Prop& p : props) {
        for (const auto& kv : pp->as_object()) {
          auto m = PatternMatches(kv.key(), p.name, true);
          if (!m.ok())
            return m.status().WithContext(fmt::format("JSON Schema at '{}'", Where(ctx)));
          if (*m) p.schema = json::object{{"allOf", json::array{p.schema, kv.value()}}};
        }
      }
    }
    const json::value* pn = s.if_contains("propertyNames");
    if (pn && !IsTrivial(*pn)) {
      if (!pn->is_object() && !IsFalse(*pn)) return Error(ctx, "bad 'propertyNames'");
      for (Prop& p : props) {
        DINFER_ASSIGN_OR_RETURN(
            bool ok, pn->is_object() ? LiteralAllowed(json::value(p.name), pn->as_object(), ctx)
                                     : StatusOr<bool>(false));
        if (!ok) p.schema = false;
      }
    }
    const bool extra = has_patterns || !(ap && IsFalse(*ap));
    if (pn && !IsTrivial(*pn) && extra) {
      return Unsupported(ctx, "propertyNames on objects that allow other properties");
    }
    auto min_p = CountKeyword(s, "minProperties", 0);
    auto max_p = CountKeyword(s, "maxProperties", kUnbounded);
    if (!min_p.ok()) return Error(ctx, min_p.status().message());
    if (!max_p.ok()) return Error(ctx, max_p.status().message());

    // Values of the properties (a property whose schema is false cannot appear).
    std::vector<ExprId> pairs(props.size());
    std::vector<std::string> names;
    for (size_t i = 0; i < props.size(); ++i) {
      names.push_back(props[i].name);
      Ctx c = ctx;
      c.path += "/properties/" + props[i].name;
      DINFER_ASSIGN_OR_RETURN(ExprId v, Value(props[i].schema, c));
      pairs[i] = g_.Seq({g_.Literal(KeyLiteral(props[i].name)), Sep(':'), v});
    }
    // Other properties, after the listed ones. Pattern properties that cannot change what other
    // keys may hold (one schema for every key: a pattern matching any key, or the same schema as
    // additionalProperties) are plain additional properties.
    const json::value* extra_schema = ap;
    bool patterns_apart = has_patterns;
    if (has_patterns) {
      auto text = [](const json::value* v) {
        const std::string t = v ? SerializeCompact(*v) : "true";
        return t == "{}" ? std::string("true") : t;
      };
      std::set<std::string> schemas;
      bool universal = false;
      for (const auto& kv : pp->as_object()) {
        schemas.insert(text(&kv.value()));
        auto m = PatternMatches(kv.key(), "", true);
        universal |= m.ok() && *m;
      }
      if (schemas.size() == 1 && (universal || *schemas.begin() == text(ap))) {
        extra_schema = &pp->as_object().begin()->value();
        patterns_apart = false;
      }
    }
    ExprId other = g_.Nothing();
    if (patterns_apart) {
      if (ap && !IsFalse(*ap)) {
        return Unsupported(ctx, "patternProperties together with additionalProperties");
      }
      if (!ap) return Unsupported(ctx, "patternProperties without additionalProperties: false");
      const auto& patterns = pp->as_object();
      std::set<std::string> schemas;
      for (const auto& kv : patterns) schemas.insert(SerializeCompact(kv.value()));
      if (schemas.size() > 1) {
        return Unsupported(ctx, "several patternProperties with different schemas");
      }
      std::vector<ExprId> alts;
      for (const auto& kv : patterns) {
        for (const std::string& n : names) {
          auto m = PatternMatches(kv.key(), n, true);
          if (m.ok() && *m) {
            return Unsupported(ctx, "patternProperties matching a listed property");
          }
        }
        Ctx c = ctx;
        c.path += "/patternProperties/" + std::string(kv.key());
        json::object key_schema{{"type", "string"}, {"pattern", kv.key()}};
        DINFER_ASSIGN_OR_RETURN(ExprId k, String(key_schema, c));
        DINFER_ASSIGN_OR_RETURN(ExprId v, Value(kv.value(), c));
        alts.push_back(g_.Seq({k, Sep(':'), v}));
      }
      other = g_.Alt(std::move(alts));
    } else if (extra && !(extra_schema && IsFalse(*extra_schema))) {
      Ctx c = ctx;
      c.path += "/additionalProperties";
      DINFER_ASSIGN_OR_RETURN(ExprId k, KeyExcept(names));
      ExprId v;
      if (extra_schema) {
        DINFER_ASSIGN_OR_RETURN(v, Value(*extra_schema, c));
      } else {
        v = AnyValue();
      }
      other = g_.Seq({k, Sep(':'), v});
    }
    const bool has_other = !g_.IsNothing(other);

    // members(i, c): the listed properties from i on, c of them (capped) written so far.
    const uint32_t lo = *min_p, hi = *max_p;
    const uint32_t cap = std::max<uint32_t>(1, hi == kUnbounded ? lo : hi);
    if (static_cast<uint64_t>(props.size() + 1) * (cap + 1) > 200000) {
      return Unsupported(ctx, "minProperties / maxProperties this large");
    }
    const ExprId sep = Sep(',');
    std::vector<std::vector<ExprId>> memo(props.size() + 1, std::vector<ExprId>(cap + 1, -1));
    for (uint32_t c = 0; c <= cap; ++c) {
      // After the listed properties: other properties, keeping the count within bounds.
      const uint32_t need = lo > c ? lo - c : 0;
      const uint32_t room = hi == kUnbounded ? kUnbounded : hi - std::min(hi, c);
      ExprId e;
      if (!has_other) {
        e = need == 0 ? g_.Empty() : g_.Nothing();
      } else if (c > 0) {
        e = g_.Repeat(g_.Seq({sep, other}), need, room);
      } else {
        const ExprId more =
            room == 0 ? g_.Nothing()
                      : g_.Seq({other, g_.Repeat(g_.Seq({sep, other}), need > 0 ? need - 1 : 0,
                                                 room == kUnbounded ? kUnbounded : room - 1)});
        e = g_.Alt({need == 0 ? g_.Empty() : g_.Nothing(), more});
      }
      memo[props.size()][c] = e;
    }
    for (size_t i = props.size(); i-- > 0;) {
      for (uint32_t c = 0; c <= cap; ++c) {
        const ExprId skip = props[i].required ? g_.Nothing() : memo[i + 1][c];
        ExprId take = g_.Nothing();
        if (hi == kUnbounded || c < hi) {
          const uint32_t next = std::min(c + 1, cap);
          take = g_.Seq({c > 0 ? sep : g_.Empty(), pairs[i], memo[i + 1][next]});
        }
        memo[i][c] = g_.Alt({take, skip});
      }
    }
    return g_.Seq({g_.Byte('{'), Ws(), memo[0][0], Ws(), g_.Byte('}')});
  });
}

}  // namespace dinfer::structured::json_internal
