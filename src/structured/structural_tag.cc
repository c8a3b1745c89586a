#include "structured/structural_tag.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace dinfer::structured {

namespace json = boost::json;

StatusOr<StructuralTag> ParseStructuralTag(std::string_view json_text) {
  boost::system::error_code ec;
  json::value v = json::parse(json_text, ec);
  if (ec || !v.is_object()) {
    return InvalidArgument(
        "a structural tag must be a JSON object with 'structures' and "
        "'triggers'");
  }
  const json::object& o = v.get_object();
  const json::value* structures = o.if_contains("structures");
  const json::value* triggers = o.if_contains("triggers");
  if (structures == nullptr || !structures->is_array() || structures->get_array().empty()) {
    return InvalidArgument("a structural tag needs a non-empty 'structures' array");
  }
  if (triggers == nullptr || !triggers->is_array() || triggers->get_array().empty()) {
    return InvalidArgument("a structural tag needs a non-empty 'triggers' array");
  }
  StructuralTag tag;
  for (const json::value& t : triggers->get_array()) {
    if (!t.is_string() || t.get_string().empty()) {
      return InvalidArgument("structural tag triggers must be non-empty strings");
    }
    tag.triggers.emplace_back(t.get_string());
  }
  for (size_t i = 0; i < structures->get_array().size(); ++i) {
    const json::value& s = structures->get_array()[i];
    const json::object* so = s.if_object();
    const json::value* begin = so ? so->if_contains("begin") : nullptr;
    const json::value* end = so ? so->if_contains("end") : nullptr;
    const json::value* schema = so ? so->if_contains("schema") : nullptr;
    if (begin == nullptr || !begin->is_string() || end == nullptr || !end->is_string() ||
        schema == nullptr || !(schema->is_object() || schema->is_bool())) {
      return InvalidArgument(
          "structural tag structure {} needs string 'begin' and 'end' and a 'schema' object", i);
    }
    tag.structures.push_back({std::string(begin->get_string()), json::serialize(*schema),
                              std::string(end->get_string())});
  }
  return tag;
}

std::string StructuralTagJson(const StructuralTag& tag) {
  json::array structures, triggers;
  for (const TaggedStructure& s : tag.structures) {
    structures.push_back(
        json::object{{"begin", s.begin}, {"schema", json::parse(s.schema)}, {"end", s.end}});
  }
  for (const std::string& t : tag.triggers) triggers.emplace_back(t);
  return json::serialize(json::object{{"type", "structural_tag"},
                                      {"structures", std::move(structures)},
                                      {"triggers", std::move(triggers)}});
}

std::shared_ptr<const ByteDfa> AvoidingDfa(const std::vector<std::string>& strings) {
  // States are the distinct prefixes of the strings (the longest suffix of the text read that
  // may still grow into one of them); a byte that completes a string has no edge.
  std::vector<std::string> prefixes = {""};
  for (const std::string& s : strings) {
    for (size_t n = 1; n < s.size(); ++n) prefixes.push_back(s.substr(0, n));
  }
  std::sort(prefixes.begin(), prefixes.end());
  prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
  std::map<std::string, int32_t, std::less<>> index;
  for (size_t i = 0; i < prefixes.size(); ++i) index[prefixes[i]] = static_cast<int32_t>(i);
  auto dfa = std::make_shared<ByteDfa>();
  dfa->states.resize(prefixes.size());
  // The empty prefix is state 0: sorted first.
  for (size_t i = 0; i < prefixes.size(); ++i) {
    ByteDfa::State& state = dfa->states[i];
    state.final = true;
    for (int b = 0; b < 256; ++b) {
      const std::string text = prefixes[i] + static_cast<char>(b);
      const bool completes = std::any_of(strings.begin(), strings.end(), [&](const std::string& s) {
        return text.size() >= s.size() && text.compare(text.size() - s.size(), s.size(), s) == 0;
      });
      if (completes) continue;
      int32_t to = 0;
      for (size_t start = 0; start < text.size(); ++start) {
        auto it = index.find(std::string_view(text).substr(start));
        if (it != index.end()) {
          to = it->second;
          break;
        }
      }
      if (!state.edges.empty() && state.edges.back().to == to && state.edges.back().hi + 1 == b) {
        state.edges.back().hi = static_cast<uint8_t>(b);
      } else {
        state.edges.push_back({static_cast<uint8_t>(b), static_cast<uint8_t>(b), to});
      }
    }
  }
  return dfa;
}

StatusOr<Grammar> StructuralTagToGrammar(const StructuralTag& tag,
                                         const JsonSchemaOptions& options) {
  if (tag.structures.empty() || tag.triggers.empty()) {
    return InvalidArgument("a structural tag needs structures and triggers");
  }
  Grammar g;
  std::vector<ExprId> tagged;
  for (size_t i = 0; i < tag.structures.size(); ++i) {
    const TaggedStructure& s = tag.structures[i];
    const bool triggered =
        std::any_of(tag.triggers.begin(), tag.triggers.end(),
                    [&](const std::string& t) { return s.begin.starts_with(t); });
    if (!triggered) {
      return InvalidArgument("structural tag structure {}: its begin '{}' starts with no trigger",
                             i, s.begin);
    }
    auto value = JsonSchemaToGrammar(std::string_view(s.schema), options);
    if (!value.ok()) return value.status().WithContext(fmt::format("structure {}", i));
    const RuleId root = g.Import(*value, fmt::format("s{}.", i));
    tagged.push_back(g.Seq({g.Literal(s.begin), g.Ref(root), g.Literal(s.end)}));
  }
  const RuleId free = g.DefineRule("free", g.Dfa(AvoidingDfa(tag.triggers)));
  const RuleId structure = g.DefineRule("structure", g.Alt(std::move(tagged)));
  g.set_root(
      g.DefineRule("root", g.Seq({g.Ref(free), g.Star(g.Seq({g.Ref(structure), g.Ref(free)}))})));
  return g;
}

}  // namespace dinfer::structured
