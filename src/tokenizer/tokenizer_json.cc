// Loading a Tokenizer from HF tokenizer.json / tokenizer_config.json / generation_config.json.

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <unordered_map>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace dinfer::tokenizer {
namespace {

namespace json = boost::json;

// The file names errors mention; FromTokenizerJsonFile passes full paths.
struct Sources {
  std::string tokenizer = "tokenizer.json";
  std::string config = "tokenizer_config.json";
  std::string generation = "generation_config.json";
};

StatusOr<json::value> Parse(std::string_view text, std::string_view file) {
  boost::system::error_code ec;
  json::value value = json::parse(text, ec);
  if (ec) return DataLoss("{}: invalid JSON: {}", file, ec.message());
  if (!value.is_object()) return DataLoss("{}: expected a JSON object at the top", file);
  return value;
}

const json::value* Field(const json::object& obj, std::string_view key) {
  const json::value* v = obj.if_contains(key);
  return v && !v->is_null() ? v : nullptr;
}

StatusOr<bool> GetBool(const json::object& obj, std::string_view key, bool fallback,
                       std::string_view where) {
  const json::value* v = Field(obj, key);
  if (!v) return fallback;
  if (!v->is_bool()) return DataLoss("{}: '{}' must be true or false", where, key);
  return v->get_bool();
}

StatusOr<std::string> GetString(const json::object& obj, std::string_view key,
                                std::string_view where) {
  const json::value* v = Field(obj, key);
  if (!v) return std::string();
  if (!v->is_string()) return DataLoss("{}: '{}' must be a string", where, key);
  return std::string(v->get_string());
}

StatusOr<int32_t> ToId(const json::value& v, std::string_view where) {
  if (v.is_int64() && v.get_int64() >= 0 && v.get_int64() <= INT32_MAX) {
    return static_cast<int32_t>(v.get_int64());
  }
  if (v.is_uint64() && v.get_uint64() <= INT32_MAX) return static_cast<int32_t>(v.get_uint64());
  return DataLoss("{}: expected a token id, got {}", where, json::serialize(v));
}

std::string_view TypeOf(const json::value& v) {
  if (!v.is_object()) return {};
  const json::value* t = v.get_object().if_contains("type");
  return t && t->is_string() ? std::string_view(t->get_string()) : std::string_view();
}

Status ParseModel(const json::object& root, const std::string& file, TokenizerDefinition* def) {
  const json::value* model_value = Field(root, "model");
  if (!model_value || !model_value->is_object()) return DataLoss("{}: no 'model' object", file);
  const json::object& model = model_value->get_object();
  const std::string_view type = TypeOf(*model_value);
  if (!type.empty() && type != "BPE") {
    return Unimplemented("{}: model type '{}' is not supported (only BPE)", file, type);
  }
  const json::value* vocab = Field(model, "vocab");
  const json::value* merges = Field(model, "merges");
  if (!vocab || !vocab->is_object()) return DataLoss("{}: model.vocab must be an object", file);
  def->vocab.reserve(vocab->get_object().size());
  for (const auto& entry : vocab->get_object()) {
    DINFER_ASSIGN_OR_RETURN(int32_t id, ToId(entry.value(), file + ": model.vocab"));
    def->vocab.emplace_back(std::string(entry.key()), id);
  }
  if (merges && !merges->is_array()) return DataLoss("{}: model.merges must be an array", file);
  if (merges) {
    def->merges.reserve(merges->get_array().size());
    for (const json::value& m : merges->get_array()) {
      if (m.is_string()) {
        const std::string_view s = m.get_string();
        const size_t space = s.find(' ', 1);
        if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos) {
          return DataLoss("{}: merge '{}' is not two tokens separated by a space", file, s);
        }
        def->merges.emplace_back(std::string(s.substr(0, space)), std::string(s.substr(space + 1)));
      } else if (m.is_array() && m.get_array().size() == 2 && m.get_array()[0].is_string() &&
                 m.get_array()[1].is_string()) {
        def->merges.emplace_back(std::string(m.get_array()[0].get_string()),
                                 std::string(m.get_array()[1].get_string()));
      } else {
        return DataLoss("{}: merge {} is neither \"a b\" nor [a, b]", file, json::serialize(m));
      }
    }
  }
  const std::string where = file + ": model";
  DINFER_ASSIGN_OR_RETURN(def->bpe.ignore_merges, GetBool(model, "ignore_merges", false, where));
  DINFER_ASSIGN_OR_RETURN(def->bpe.byte_fallback, GetBool(model, "byte_fallback", false, where));
  DINFER_ASSIGN_OR_RETURN(def->bpe.fuse_unk, GetBool(model, "fuse_unk", false, where));
  DINFER_ASSIGN_OR_RETURN(std::string unk, GetString(model, "unk_token", where));
  if (!unk.empty()) def->bpe.unk_token = unk;
  for (std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    DINFER_ASSIGN_OR_RETURN(std::string affix, GetString(model, key, where));
    if (!affix.empty()) return Unimplemented("{}: BPE '{}' is not supported", file, key);
  }
  if (const json::value* dropout = Field(model, "dropout")) {
    if (!dropout->is_number() || dropout->to_number<double>() != 0.0) {
      return Unimplemented("{}: BPE dropout is not supported", file);
    }
  }
  return OkStatus();
}

Status ParseAddedTokens(const json::object& root, const std::string& file,
                        TokenizerDefinition* def) {
  const json::value* added = Field(root, "added_tokens");
  if (!added) return OkStatus();
  if (!added->is_array()) return DataLoss("{}: 'added_tokens' must be an array", file);
  for (const json::value& v : added->get_array()) {
    if (!v.is_object()) {
      return DataLoss("{}: added token {} is not an object", file, json::serialize(v));
    }
    const json::object& obj = v.get_object();
    const std::string where = file + ": added token";
    AddedToken t;
    const json::value* id = Field(obj, "id");
    if (!id) return DataLoss("{}: added token {} has no id", file, json::serialize(v));
    DINFER_ASSIGN_OR_RETURN(t.id, ToId(*id, where));
    DINFER_ASSIGN_OR_RETURN(t.content, GetString(obj, "content", where));
    DINFER_ASSIGN_OR_RETURN(t.special, GetBool(obj, "special", false, where));
    DINFER_ASSIGN_OR_RETURN(t.lstrip, GetBool(obj, "lstrip", false, where));
    DINFER_ASSIGN_OR_RETURN(t.rstrip, GetBool(obj, "rstrip", false, where));
    DINFER_ASSIGN_OR_RETURN(t.single_word, GetBool(obj, "single_word", false, where));
    DINFER_ASSIGN_OR_RETURN(t.normalized, GetBool(obj, "normalized", !t.special, where));
    def->added_tokens.push_back(std::move(t));
  }
  // HF does not trust the ids written here: a token already in the vocabulary takes the
  // vocabulary's id, any other the next id after the vocabulary and the added tokens so far.
  std::unordered_map<std::string_view, int32_t> vocab;
  vocab.reserve(def->vocab.size());
  for (const auto& [token, id] : def->vocab) vocab.emplace(token, id);
  std::unordered_map<std::string_view, int32_t> assigned;
  int32_t next_id = static_cast<int32_t>(def->vocab.size());
  for (AddedToken& t : def->added_tokens) {
    if (auto it = assigned.find(t.content); it != assigned.end()) {
      t.id = it->second;
    } else if (auto v = vocab.find(t.content); v != vocab.end()) {
      t.id = v->second;
    } else {
      t.id = next_id;
    }
    assigned.emplace(t.content, t.id);
    next_id = std::max(next_id, t.id + 1);
  }
  return OkStatus();
}

Status ParseNormalizer(const json::value& v, const std::string& file, TokenizerDefinition* def) {
  const std::string_view type = TypeOf(v);
  if (type == "NFC") {
    def->nfc = true;
    return OkStatus();
  }
  if (type == "Sequence") {
    const json::value* list = Field(v.get_object(), "normalizers");
    if (list && list->is_array()) {
      for (const json::value& n : list->get_array()) {
        DINFER_RETURN_IF_ERROR(ParseNormalizer(n, file, def));
      }
      return OkStatus();
    }
  }
  return Unimplemented("{}: normalizer '{}' is not supported (only NFC)", file,
                       type.empty() ? json::serialize(v) : std::string(type));
}

StatusOr<SplitBehavior> ParseBehavior(std::string_view name, const std::string& file) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return DataLoss("{}: unknown Split behavior '{}'", file, name);
}

Status ParsePreTokenizer(const json::value& v, const std::string& file, TokenizerDefinition* def) {
  const std::string_view type = TypeOf(v);
  const std::string where = fmt::format("{}: pre_tokenizer {}", file, type);
  if (type == "Sequence") {
    const json::value* list = Field(v.get_object(), "pretokenizers");
    if (!list || !list->is_array()) return DataLoss("{} has no 'pretokenizers' array", where);
    for (const json::value& p : list->get_array()) {
      DINFER_RETURN_IF_ERROR(ParsePreTokenizer(p, file, def));
    }
    return OkStatus();
  }
  const json::object* obj = v.is_object() ? &v.get_object() : nullptr;
  if (type == "ByteLevel") {
    DINFER_ASSIGN_OR_RETURN(bool prefix, GetBool(*obj, "add_prefix_space", true, where));
    DINFER_ASSIGN_OR_RETURN(bool regex, GetBool(*obj, "use_regex", true, where));
    def->pre_tokenizer.push_back(PreTokenizerStep::ByteLevel(prefix, regex));
    return OkStatus();
  }
  if (type == "Digits") {
    DINFER_ASSIGN_OR_RETURN(bool individual, GetBool(*obj, "individual_digits", false, where));
    def->pre_tokenizer.push_back(PreTokenizerStep::Digits(individual));
    return OkStatus();
  }
  if (type == "Split") {
    PreTokenizerStep step;
    const json::value* pattern = Field(*obj, "pattern");
    if (!pattern || !pattern->is_object()) return DataLoss("{} has no 'pattern' object", where);
    if (const json::value* r = Field(pattern->get_object(), "Regex"); r && r->is_string()) {
      step.pattern = std::string(r->get_string());
    } else if (const json::value* s = Field(pattern->get_object(), "String"); s && s->is_string()) {
      step.pattern = std::string(s->get_string());
      step.pattern_is_regex = false;
    } else {
      return DataLoss("{}: pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    }
    DINFER_ASSIGN_OR_RETURN(std::string behavior, GetString(*obj, "behavior", where));
    DINFER_ASSIGN_OR_RETURN(step.behavior, ParseBehavior(behavior, file));
    DINFER_ASSIGN_OR_RETURN(step.invert, GetBool(*obj, "invert", false, where));
    def->pre_tokenizer.push_back(std::move(step));
    return OkStatus();
  }
  return Unimplemented(
      "{}: pre_tokenizer '{}' is not supported (ByteLevel, Split, Digits, Sequence)", file,
      type.empty() ? json::serialize(v) : std::string(type));
}

Status CheckDecoder(const json::value& v, const std::string& file) {
  const std::string_view type = TypeOf(v);
  if (type == "ByteLevel") return OkStatus();
  if (type == "Sequence") {
    const json::value* list = Field(v.get_object(), "decoders");
    if (list && list->is_array()) {
      for (const json::value& d : list->get_array()) {
        DINFER_RETURN_IF_ERROR(CheckDecoder(d, file));
      }
      return OkStatus();
    }
  }
  return Unimplemented("{}: decoder '{}' is not supported (only ByteLevel)", file,
                       type.empty() ? json::serialize(v) : std::string(type));
}

// The special token a TemplateProcessing post-processor puts first, if any (Llama 3's BOS).
std::string LeadingTemplateToken(const json::value& v) {
  const std::string_view type = TypeOf(v);
  if (type == "Sequence") {
    const json::value* list = Field(v.get_object(), "processors");
    if (list && list->is_array()) {
      for (const json::value& p : list->get_array()) {
        std::string token = LeadingTemplateToken(p);
        if (!token.empty()) return token;
      }
    }
    return {};
  }
  if (type != "TemplateProcessing") return {};
  const json::value* single = Field(v.get_object(), "single");
  if (!single || !single->is_array() || single->get_array().empty()) return {};
  const json::value& first = single->get_array()[0];
  if (!first.is_object()) return {};
  const json::value* special = Field(first.get_object(), "SpecialToken");
  if (!special || !special->is_object()) return {};
  const json::value* id = Field(special->get_object(), "id");
  return id && id->is_string() ? std::string(id->get_string()) : std::string();
}

// bos_token / eos_token: "<s>", {"content": "<s>", ...} or null.
std::string TokenName(const json::object& config, std::string_view key) {
  const json::value* v = Field(config, key);
  if (!v) return {};
  if (v->is_string()) return std::string(v->get_string());
  if (v->is_object()) {
    const json::value* content = Field(v->get_object(), "content");
    if (content && content->is_string()) return std::string(content->get_string());
  }
  return {};
}

std::optional<int32_t> FindToken(const TokenizerDefinition& def, std::string_view content) {
  if (content.empty()) return std::nullopt;
  for (const AddedToken& t : def.added_tokens) {
    if (t.content == content) return t.id;
  }
  for (const auto& [token, id] : def.vocab) {
    if (token == content) return id;
  }
  return std::nullopt;
}

Status ParseConfig(std::string_view text, const std::string& file, TokenizerDefinition* def,
                   bool* has_add_bos) {
  DINFER_ASSIGN_OR_RETURN(json::value value, Parse(text, file));
  const json::object& config = value.get_object();
  if (const json::value* add_bos = Field(config, "add_bos_token")) {
    if (!add_bos->is_bool()) return DataLoss("{}: 'add_bos_token' must be true or false", file);
    def->add_bos = add_bos->get_bool();
    *has_add_bos = true;
  }
  if (std::optional<int32_t> bos = FindToken(*def, TokenName(config, "bos_token"))) {
    def->bos_id = bos;
  }
  if (std::optional<int32_t> eos = FindToken(*def, TokenName(config, "eos_token"))) {
    def->eos_ids.push_back(*eos);
  }
  if (const json::value* tmpl = Field(config, "chat_template")) {
    if (tmpl->is_string()) {
      def->chat_template = std::string(tmpl->get_string());
    } else if (tmpl->is_array()) {
      // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]: the default one (else
      // the first), and the tool_use one.
      bool have_default = false;
      for (const json::value& entry : tmpl->get_array()) {
        if (!entry.is_object()) continue;
        const json::value* name = Field(entry.get_object(), "name");
        const json::value* body = Field(entry.get_object(), "template");
        if (!body || !body->is_string()) continue;
        const std::string_view n = name && name->is_string() ? name->get_string() : "";
        if (n == "tool_use") def->tool_use_chat_template = body->get_string();
        if (n == "default" || (!have_default && def->chat_template.empty())) {
          def->chat_template = body->get_string();
          have_default = n == "default";
        }
      }
    } else {
      return DataLoss("{}: 'chat_template' must be a string or a list of templates", file);
    }
  }
  return OkStatus();
}

Status ParseGenerationConfig(std::string_view text, const std::string& file,
                             TokenizerDefinition* def) {
  DINFER_ASSIGN_OR_RETURN(json::value value, Parse(text, file));
  const json::value* eos = Field(value.get_object(), "eos_token_id");
  if (!eos) return OkStatus();
  if (eos->is_array()) {
    for (const json::value& id : eos->get_array()) {
      DINFER_ASSIGN_OR_RETURN(int32_t v, ToId(id, file + ": eos_token_id"));
      def->eos_ids.push_back(v);
    }
    return OkStatus();
  }
  DINFER_ASSIGN_OR_RETURN(int32_t v, ToId(*eos, file + ": eos_token_id"));
  def->eos_ids.push_back(v);
  return OkStatus();
}

// Template files beside tokenizer.json (empty when absent).
struct TemplateFiles {
  std::string default_template;  // chat_template.jinja
  std::string tool_use;          // additional_chat_templates/tool_use.jinja
};

StatusOr<std::unique_ptr<Tokenizer>> Load(std::string_view tokenizer_json,
                                          std::string_view config_json,
                                          std::string_view generation_json,
                                          TemplateFiles template_files, const Sources& files) {
  TokenizerDefinition def;
  {
    DINFER_ASSIGN_OR_RETURN(json::value value, Parse(tokenizer_json, files.tokenizer));
    const json::object& root = value.get_object();
    const std::string& file = files.tokenizer;
    DINFER_RETURN_IF_ERROR(ParseModel(root, file, &def));
    DINFER_RETURN_IF_ERROR(ParseAddedTokens(root, file, &def));
    if (const json::value* n = Field(root, "normalizer")) {
      DINFER_RETURN_IF_ERROR(ParseNormalizer(*n, file, &def));
    }
    if (const json::value* p = Field(root, "pre_tokenizer")) {
      DINFER_RETURN_IF_ERROR(ParsePreTokenizer(*p, file, &def));
    }
    // A missing decoder is taken as ByteLevel: the only one supported.
    if (const json::value* d = Field(root, "decoder")) {
      DINFER_RETURN_IF_ERROR(CheckDecoder(*d, file));
    }
    bool has_add_bos = false;
    if (!config_json.empty()) {
      DINFER_RETURN_IF_ERROR(ParseConfig(config_json, files.config, &def, &has_add_bos));
    }
    // Without add_bos_token, a post-processor that puts a special token first adds BOS (Llama 3).
    if (const json::value* post = Field(root, "post_processor"); post && !has_add_bos) {
      if (std::optional<int32_t> lead = FindToken(def, LeadingTemplateToken(*post))) {
        def.add_bos = true;
        if (!def.bos_id) def.bos_id = lead;
      }
    }
  }
  if (!generation_json.empty()) {
    DINFER_RETURN_IF_ERROR(ParseGenerationConfig(generation_json, files.generation, &def));
  }
  // Template files take priority over the config's entries, as in transformers.
  if (!template_files.default_template.empty()) {
    def.chat_template = std::move(template_files.default_template);
  }
  if (!template_files.tool_use.empty()) {
    def.tool_use_chat_template = std::move(template_files.tool_use);
  }
  auto tokenizer = Tokenizer::Build(std::move(def));
  if (!tokenizer.ok()) return tokenizer.status().WithContext(files.tokenizer + ": ");
  return tokenizer;
}

// The file's text if it exists, "" if it does not.
StatusOr<std::string> ReadOptional(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::string();
  return ReadFileToString(path.string());
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(
    std::string_view json_text, std::string_view tokenizer_config_json) {
  return Load(json_text, tokenizer_config_json, {}, {}, Sources());
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJsonFile(
    const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path(dir_or_file);
  if (fs::is_directory(path, ec)) path /= "tokenizer.json";
  const fs::path dir = path.parent_path();
  Sources files{path.string(), (dir / "tokenizer_config.json").string(),
                (dir / "generation_config.json").string()};
  DINFER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(files.tokenizer));
  DINFER_ASSIGN_OR_RETURN(std::string config, ReadOptional(files.config));
  DINFER_ASSIGN_OR_RETURN(std::string generation, ReadOptional(files.generation));
  TemplateFiles templates;
  DINFER_ASSIGN_OR_RETURN(templates.default_template, ReadOptional(dir / "chat_template.jinja"));
  DINFER_ASSIGN_OR_RETURN(templates.tool_use,
                          ReadOptional(dir / "additional_chat_templates" / "tool_use.jinja"));
  return Load(text, config, generation, std::move(templates), files);
}

}  // namespace dinfer::tokenizer
