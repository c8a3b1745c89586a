// The official JSON-Schema-Test-Suite (Debian package json-schema-test-suite): for every schema
// the grammar supports, each valid instance is accepted and each invalid one rejected, byte by
// byte and token by token (the instance's tokenization by the default model's tokenizer, each
// token checked against the mask). Unsupported schemas must be refused with Unimplemented.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "structured/json_schema.h"
#include "structured/json_schema_internal.h"
#include "test_util.h"

namespace dinfer::structured {
namespace {

namespace json = boost::json;
namespace fs = std::filesystem;

std::string SuiteDir() {
  if (const char* dir = std::getenv("DINFER_JSON_SCHEMA_TEST_SUITE"); dir && *dir) return dir;
  return "/usr/share/json-schema-test-suite/tests";
}

// Groups outside what a grammar can decide from the text alone: arbitrary-precision numbers
// (bignum), and draft 4's view that 1.0 is not an integer, which compact serialization erases.
// contentEncoding / contentMediaType only annotate (the suite's optional tests assert them).
bool Skipped(const std::string& file) {
  return file.find("bignum") != std::string::npos ||
         file.find("zeroTerminatedFloats") != std::string::npos ||
         file.find("refRemote") != std::string::npos ||
         file.find("optional/content") != std::string::npos;
}

// Formats the grammar does not enforce are annotations: their optional tests do not apply.
bool UnknownFormat(const json::value& schema) {
  const json::value* f = schema.is_object() ? schema.as_object().if_contains("format") : nullptr;
  return f && f->is_string() && !json_internal::FormatRegex(f->as_string());
}

const json::value* ResolvePointer(const json::value& root, std::string_view ref) {
  if (!ref.starts_with("#")) return nullptr;
  const json::value* cur = &root;
  std::string_view rest = ref.substr(1);
  while (!rest.empty() && cur) {
    rest.remove_prefix(1);
    const size_t slash = rest.find('/');
    std::string token(rest.substr(0, slash));
    rest = slash == std::string_view::npos ? "" : rest.substr(slash);
    for (size_t p; (p = token.find("~1")) != std::string::npos;) token.replace(p, 2, "/");
    for (size_t p; (p = token.find("~0")) != std::string::npos;) token.replace(p, 2, "~");
    if (cur->is_object()) {
      cur = cur->as_object().if_contains(token);
    } else if (cur->is_array()) {
      const size_t i = std::stoul(token);
      cur = i < cur->as_array().size() ? &cur->as_array()[i] : nullptr;
    } else {
      cur = nullptr;
    }
  }
  return cur;
}

// The schemas that describe a value: the schema itself, its $ref target and its allOf / anyOf /
// oneOf branches, in order.
void Describing(const json::value& s, const json::value& root, int depth,
                std::vector<const json::object*>* out) {
  if (!s.is_object() || depth > 8) return;
  const json::object& o = s.as_object();
  out->push_back(&o);
  if (const json::value* r = o.if_contains("$ref"); r && r->is_string()) {
    if (const json::value* t = ResolvePointer(root, r->as_string()))
      Describing(*t, root, depth + 1, out);
  }
  for (const char* k : {"allOf", "anyOf", "oneOf"}) {
    if (const json::value* l = o.if_contains(k); l && l->is_array()) {
      for (const auto& x : l->as_array()) Describing(x, root, depth + 1, out);
    }
  }
}

// Object keys in the order the grammar generates them: the schema's properties first.
json::value Canonical(const json::value& v, const json::value& schema, const json::value& root) {
  std::vector<const json::object*> schemas;
  Describing(schema, root, 0, &schemas);
  if (v.is_object()) {
    // const / enum objects are written as listed.
    for (const json::object* s : schemas) {
      std::vector<const json::value*> literals;
      if (const json::value* c = s->if_contains("const")) literals.push_back(c);
      if (const json::value* e = s->if_contains("enum"); e && e->is_array()) {
        for (const auto& x : e->as_array()) literals.push_back(&x);
      }
      for (const json::value* lit : literals) {
        if (!lit->is_object() || lit->as_object().size() != v.as_object().size()) continue;
        json::object out;
        for (const auto& kv : lit->as_object()) {
          if (const json::value* x = v.as_object().if_contains(kv.key())) out[kv.key()] = *x;
        }
        if (out.size() == v.as_object().size()) return out;
      }
    }
    std::vector<std::string> order;
    std::map<std::string, const json::value*> sub;
    for (const json::object* s : schemas) {
      if (const json::value* p = s->if_contains("properties"); p && p->is_object()) {
        for (const auto& kv : p->as_object()) {
          if (!sub.contains(kv.key())) order.emplace_back(kv.key());
          sub.emplace(kv.key(), &kv.value());
        }
      }
      if (const json::value* r = s->if_contains("required"); r && r->is_array()) {
        for (const auto& x : r->as_array()) {
          if (x.is_string() && !sub.contains(std::string(x.as_string()))) {
            order.emplace_back(x.as_string());
            sub.emplace(std::string(x.as_string()), nullptr);
          }
        }
      }
    }
    json::object out;
    const json::value any = true;
    for (const std::string& k : order) {
      if (const json::value* x = v.as_object().if_contains(k)) {
        out[k] = Canonical(*x, sub[k] ? *sub[k] : any, root);
      }
    }
    for (const auto& kv : v.as_object()) {
      if (!out.contains(kv.key())) out[kv.key()] = kv.value();
    }
    return out;
  }
  if (v.is_array()) {
    json::array out;
    const auto& a = v.as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      const json::value* item = nullptr;
      for (const json::object* s : schemas) {
        const json::value* items = s->if_contains("items");
        if (items && items->is_array() && i < items->as_array().size()) {
          item = &items->as_array()[i];
        } else if (items && items->is_object()) {
          item = items;
        }
        if (item) break;
      }
      out.push_back(item ? Canonical(a[i], *item, root) : a[i]);
    }
    return out;
  }
  return v;
}

bool TokenLevelMatch(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  Matcher m(g);
  std::vector<uint32_t> mask(BitmaskWords(m.vocab_size()));
  for (int32_t id : testutil::DefaultTokenizer()->Encode(text, false)) {
    m.FillNextTokenBitmask(mask.data());
    const bool allowed = TestBit(mask.data(), id);
    const bool accepted = m.AcceptToken(id);
    EXPECT_EQ(allowed, accepted) << "mask and AcceptToken disagree on token " << id << " in "
                                 << text;
    if (!accepted) return false;
  }
  return m.IsCompleted();
}

struct Totals {
  int groups = 0, supported = 0, tests = 0, checked = 0;
};

TEST(JsonSchemaTestSuite, ValidAcceptedInvalidRejected) {
  if (!fs::exists(SuiteDir())) GTEST_SKIP() << "json-schema-test-suite not installed";
  const bool tokens = testutil::DefaultCompiler() != nullptr;
  std::map<std::string, Totals> by_draft;
  std::map<std::string, int> reasons;
  std::vector<std::string> failures;
  for (const char* draft : {"draft4", "draft6", "draft7"}) {
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(fs::path(SuiteDir()) / draft)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    Totals& t = by_draft[draft];
    for (const fs::path& file : files) {
      const std::string rel = fs::relative(file, SuiteDir()).string();
      if (Skipped(rel)) continue;
      std::ifstream in(file);
      std::stringstream ss;
      ss << in.rdbuf();
      const json::value groups = json::parse(ss.str());
      for (const auto& group : groups.as_array()) {
        const json::value& schema = group.at("schema");
        const std::string where = rel + ": " + std::string(group.at("description").as_string());
        if (rel.find("optional/") != std::string::npos && UnknownFormat(schema)) continue;
        ++t.groups;
        t.tests += static_cast<int>(group.at("tests").as_array().size());
        JsonSchemaOptions options;
        options.default_draft = std::stoi(std::string(draft).substr(5));
        auto grammar = JsonSchemaToGrammar(schema, options);
        StatusOr<std::shared_ptr<const CompiledGrammar>> bytes = Status(StatusCode::kInternal, "");
        if (grammar.ok()) bytes = testutil::ByteCompiler().Compile(*grammar);
        const Status status = grammar.ok() ? bytes.status() : grammar.status();
        if (status.code() == StatusCode::kUnimplemented) {
          // The reason without where it is ("... at '/properties/x' ...").
          ++reasons[std::regex_replace(status.message(), std::regex(" ?at '[^']*'"), "")];
          continue;
        }
        const bool empty =
            !status.ok() && status.message().find("matches no text") != std::string::npos;
        if (!status.ok() && !empty) {
          failures.push_back(where + ": " + status.ToString());
          continue;
        }
        ++t.supported;
        std::shared_ptr<const CompiledGrammar> token_grammar;
        if (tokens && !empty) {
          auto c = testutil::DefaultCompiler()->Compile(*grammar);
          ASSERT_TRUE(c.ok()) << where << ": " << c.status().ToString();
          token_grammar = *c;
        }
        for (const auto& test : group.at("tests").as_array()) {
          const bool valid = test.at("valid").as_bool();
          const std::string text =
              json_internal::SerializeCompact(Canonical(test.at("data"), schema, schema));
          const std::string name =
              where + " / " + std::string(test.at("description").as_string()) + " " + text;
          ++t.checked;
          const bool byte_match = !empty && testutil::FullMatch(*bytes, text);
          if (byte_match != valid) {
            failures.push_back(name + (valid ? ": valid, rejected" : ": invalid, accepted"));
            continue;
          }
          if (token_grammar && TokenLevelMatch(token_grammar, text) != valid) {
            failures.push_back(name + ": token level differs from byte level");
          }
        }
      }
    }
  }
  for (const auto& [draft, t] : by_draft) {
    std::printf("[coverage] %s: %d of %d schema groups supported, %d of %d tests checked\n",
                draft.c_str(), t.supported, t.groups, t.checked, t.tests);
  }
  for (const auto& [reason, n] : reasons) std::printf("[unsupported] %3d  %s\n", n, reason.c_str());
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace dinfer::structured
