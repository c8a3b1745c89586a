// Arrays and objects of the JSON Schema translation.
#include <algorithm>
#include <map>
#include <set>

#include "structured/automaton.h"
#include "structured/json_schema_internal.h"
#include "structured/regex.h"

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
          // Required but not listed: constrained by the patterns it matches (merged below), else
          // by additionalProperties.
          bool patterned = false;
          if (has_patterns) {
            for (const auto& kv : pp->as_object()) {
              auto m = PatternMatches(kv.key(), name, true);
              patterned |= m.ok() && *m;
            }
          }
          index[name] = props.size();
          props.push_back({name, ap && !patterned ? *ap : json::value(true), true});
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
      // Keys matching a pattern take its schema; keys matching none take additionalProperties.
      // Patterns with different schemas must not share a key (it would need both schemas).
      const auto& patterns = pp->as_object();
      std::vector<std::string> all;
      for (const auto& kv : patterns) all.emplace_back(kv.key());
      size_t i = 0;
      for (auto x = patterns.begin(); x != patterns.end(); ++x, ++i) {
        size_t j = i + 1;
        for (auto y = std::next(x); y != patterns.end(); ++y, ++j) {
          if (SerializeCompact(x->value()) == SerializeCompact(y->value())) continue;
          DINFER_ASSIGN_OR_RETURN(ExprId both, KeyLanguage({all[i], all[j]}, {}, {}, ctx));
          if (!g_.IsNothing(both)) {
            return Unsupported(ctx, "patternProperties whose patterns share keys but not schemas");
          }
        }
      }
      std::vector<ExprId> alts;
      for (const auto& kv : patterns) {
        Ctx c = ctx;
        c.path += "/patternProperties/" + std::string(kv.key());
        DINFER_ASSIGN_OR_RETURN(ExprId k, KeyLanguage({std::string(kv.key())}, {}, names, c));
        DINFER_ASSIGN_OR_RETURN(ExprId v, Value(kv.value(), c));
        alts.push_back(g_.Seq({k, Sep(':'), v}));
      }
      if (!(ap && IsFalse(*ap))) {
        Ctx c = ctx;
        c.path += "/additionalProperties";
        DINFER_ASSIGN_OR_RETURN(ExprId k, KeyLanguage({}, all, names, c));
        ExprId v;
        if (ap) {
          DINFER_ASSIGN_OR_RETURN(v, Value(*ap, c));
        } else {
          v = AnyValue();
        }
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

StatusOr<ExprId> Converter::KeyLanguage(const std::vector<std::string>& all_of,
                                        const std::vector<std::string>& none_of,
                                        const std::vector<std::string>& names, const Ctx& ctx) {
  std::string key = "keylang:";
  for (const auto* list : {&all_of, &none_of, &names}) {
    for (const auto& x : *list) key += KeyLiteral(x);
    key += '|';
  }
  if (auto it = key_languages_.find(key); it != key_languages_.end()) return it->second;
  // Each part is a one-rule automaton over JSON string literals in the canonical spelling; the
  // key language is their product: in the string automaton, in every all_of automaton, and out
  // of the exclusion automaton.
  auto automaton = [&](auto&& body) -> StatusOr<std::optional<Automaton>> {
    Grammar kg;
    DINFER_ASSIGN_OR_RETURN(ExprId b, body(&kg));
    kg.set_root(kg.DefineRule("key", kg.Seq({kg.Byte('"'), b, kg.Byte('"')})));
    auto a = Automaton::Build(kg);
    if (!a.ok()) {
      if (a.status().code() == StatusCode::kInvalidArgument) return std::optional<Automaton>();
      return a.status();
    }
    return std::optional<Automaton>(std::move(*a));
  };
  auto pattern = [&](const std::string& p) {
    return [&](Grammar* kg) -> StatusOr<ExprId> {
      auto e = RegexToExpr(p, {.search = true, .encoding = CharEncoding::kJsonString}, kg);
      if (!e.ok()) return e.status().WithContext(fmt::format("JSON Schema at '{}'", Where(ctx)));
      return *e;
    };
  };
  std::vector<Automaton> parts;  // parts[0]: any string; then the all_of patterns
  DINFER_ASSIGN_OR_RETURN(
      auto any, automaton([](Grammar* kg) -> StatusOr<ExprId> {
        return kg->Star(kg->Chars({{0, kMaxCodepoint}}, CharEncoding::kJsonString));
      }));
  parts.push_back(std::move(*any));
  for (const std::string& p : all_of) {
    DINFER_ASSIGN_OR_RETURN(auto a, automaton(pattern(p)));
    if (!a) return key_languages_[key] = g_.Nothing();
    parts.push_back(std::move(*a));
  }
  std::optional<Automaton> excluded;
  if (!none_of.empty() || !names.empty()) {
    DINFER_ASSIGN_OR_RETURN(excluded, automaton([&](Grammar* kg) -> StatusOr<ExprId> {
                              std::vector<ExprId> alts;
                              for (const std::string& p : none_of) {
                                DINFER_ASSIGN_OR_RETURN(ExprId e, pattern(p)(kg));
                                alts.push_back(e);
                              }
                              for (const std::string& n : names) {
                                std::vector<ExprId> chars;
                                for (uint32_t cp : Codepoints(n))
                                  chars.push_back(kg->Chars({{cp, cp}}, CharEncoding::kJsonString));
                                alts.push_back(kg->Seq(std::move(chars)));
                              }
                              return kg->Alt(std::move(alts));
                            }));
  }
  // Product states: one state per part (-1: the exclusion automaton has failed, which is fine).
  const size_t width = parts.size() + 1;
  std::vector<int32_t> start;
  for (const Automaton& a : parts) start.push_back(a.rule(a.root()).start);
  start.push_back(excluded ? excluded->rule(excluded->root()).start : -1);
  std::map<std::vector<int32_t>, int32_t> ids = {{start, 0}};
  std::vector<std::vector<int32_t>> tuples = {start};
  auto dfa = std::make_shared<ByteDfa>();
  constexpr size_t kMaxStates = 20000;
  for (size_t i = 0; i < tuples.size(); ++i) {
    if (tuples.size() > kMaxStates) {
      return Unsupported(ctx, "patternProperties keys this complex");
    }
    const std::vector<int32_t> cur = tuples[i];
    ByteDfa::State st;
    bool final = true;
    for (size_t k = 0; k < parts.size(); ++k) final &= parts[k].state(cur[k]).final;
    if (cur[width - 1] >= 0 && excluded->state(cur[width - 1]).final) final = false;
    st.final = final;
    std::vector<int32_t> next(width);
    for (int b = 0; b < 256; ++b) {
      bool alive = true;
      for (size_t k = 0; k < parts.size() && alive; ++k) {
        const int32_t w = parts[k].Next(cur[k], static_cast<uint8_t>(b));
        alive = w >= 0;
        next[k] = w & kTargetMask;
      }
      if (!alive) continue;
      const int32_t x = cur[width - 1];
      const int32_t wx = x >= 0 ? excluded->Next(x, static_cast<uint8_t>(b)) : -1;
      next[width - 1] = wx >= 0 ? (wx & kTargetMask) : -1;
      auto [it, inserted] = ids.emplace(next, static_cast<int32_t>(tuples.size()));
      if (inserted) tuples.push_back(next);
      if (!st.edges.empty() && st.edges.back().hi + 1 == b && st.edges.back().to == it->second) {
        st.edges.back().hi = static_cast<uint8_t>(b);
      } else {
        st.edges.push_back({static_cast<uint8_t>(b), static_cast<uint8_t>(b), it->second});
      }
    }
    dfa->states.push_back(std::move(st));
  }
  // States that cannot reach an accepting one are dropped.
  const size_t n = dfa->states.size();
  std::vector<std::vector<int32_t>> back(n);
  for (size_t s = 0; s < n; ++s) {
    for (const auto& e : dfa->states[s].edges) back[e.to].push_back(static_cast<int32_t>(s));
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s) {
    if (dfa->states[s].final) {
      live[s] = 1;
      stack.push_back(static_cast<int32_t>(s));
    }
  }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : back[s]) {
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
    }
  }
  if (!live[0]) return key_languages_[key] = g_.Nothing();
  for (auto& st : dfa->states) std::erase_if(st.edges, [&](const auto& e) { return !live[e.to]; });
  // A rule of its own, which calls nothing: its masks are computed (and shared) at compile time.
  return key_languages_[key] = g_.Ref(g_.DefineRule("key", g_.Dfa(std::move(dfa))));
}

}  // namespace dinfer::structured::json_internal
