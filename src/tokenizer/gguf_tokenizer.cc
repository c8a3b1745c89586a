// Loading a Tokenizer from a GGUF file's tokenizer.* metadata. tokenizer.ggml.pre names the
// pre-tokenizer; each name maps to what the model's HF tokenizer.json does, so the two agree.

#include <array>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace dinfer::tokenizer {
namespace {

// GGUF token types (llama.cpp's llama_token_type).
constexpr int32_t kUnknownType = 2;
constexpr int32_t kControlType = 3;
constexpr int32_t kUserDefinedType = 4;

constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek V3 splits three times: digit groups, runs of CJK ideographs and kana, then the rest.
constexpr std::array<std::string_view, 3> kDeepseekV3Patterns = {
    R"(\p{N}{1,3})",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};

bool OneOf(std::string_view name, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) {
    if (name == n) return true;
  }
  return false;
}

// Fills the pre-tokenizer (and the NFC normalizer / ignore_merges where the HF tokenizer has them).
Status MapPreTokenizer(std::string_view pre, TokenizerDefinition* def) {
  auto split_then_bytes = [def](std::string_view pattern) {
    def->pre_tokenizer.push_back(PreTokenizerStep::SplitRegex(std::string(pattern)));
    def->pre_tokenizer.push_back(PreTokenizerStep::ByteLevel(false, false));
  };
  if (OneOf(pre, {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"})) {
    def->pre_tokenizer.push_back(PreTokenizerStep::ByteLevel(false, true));
  } else if (OneOf(pre, {"smollm", "starcoder", "refact"})) {
    def->pre_tokenizer.push_back(PreTokenizerStep::Digits(true));
    def->pre_tokenizer.push_back(PreTokenizerStep::ByteLevel(false, true));
  } else if (OneOf(pre, {"llama3", "llama-v3", "llama-bpe"})) {
    split_then_bytes(kLlama3Pattern);
    def->bpe.ignore_merges = true;
  } else if (OneOf(pre, {"dbrx", "smaug-bpe", "falcon3"})) {
    split_then_bytes(kLlama3Pattern);
  } else if (OneOf(pre, {"qwen2", "deepseek-r1-qwen"})) {
    split_then_bytes(kQwen2Pattern);
    def->nfc = true;
  } else if (OneOf(pre, {"tekken", "mistral"})) {
    split_then_bytes(kTekkenPattern);
  } else if (OneOf(pre, {"deepseek-v3"})) {
    for (std::string_view p : kDeepseekV3Patterns) {
      def->pre_tokenizer.push_back(PreTokenizerStep::SplitRegex(std::string(p)));
    }
    def->pre_tokenizer.push_back(PreTokenizerStep::ByteLevel(false, false));
  } else {
    return Unimplemented("GGUF tokenizer.ggml.pre '{}' is not supported", pre);
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufTokenizerSpec& spec) {
  if (spec.model == "llama") {
    return Unimplemented("GGUF tokenizer.ggml.model 'llama' (SentencePiece) is not supported yet");
  }
  if (spec.model != "gpt2") {
    return Unimplemented("GGUF tokenizer.ggml.model '{}' is not supported (only 'gpt2')",
                         spec.model);
  }
  if (!spec.token_types.empty() && spec.token_types.size() != spec.tokens.size()) {
    return DataLoss("GGUF tokenizer: {} token types for {} tokens", spec.token_types.size(),
                    spec.tokens.size());
  }
  TokenizerDefinition def;
  DINFER_RETURN_IF_ERROR(MapPreTokenizer(spec.pre, &def));
  def.vocab.reserve(spec.tokens.size());
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    def.vocab.emplace_back(spec.tokens[i], id);
    const int32_t type = spec.token_types.empty() ? 1 : spec.token_types[i];
    if (type == kControlType || type == kUnknownType || type == kUserDefinedType) {
      AddedToken t;
      t.id = id;
      t.content = spec.tokens[i];
      t.special = type != kUserDefinedType;
      def.added_tokens.push_back(std::move(t));
    }
    // llama.cpp stores user-defined tokens as plain text, not in the byte-level alphabet.
    if (type == kUserDefinedType) def.raw_text_ids.push_back(id);
  }
  def.merges.reserve(spec.merges.size());
  for (const std::string& merge : spec.merges) {
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) return DataLoss("GGUF tokenizer: bad merge '{}'", merge);
    def.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }
  def.bpe.skip_invalid_merges = true;
  if (spec.unk_id && *spec.unk_id >= 0 && static_cast<size_t>(*spec.unk_id) < spec.tokens.size()) {
    def.bpe.unk_token = spec.tokens[static_cast<size_t>(*spec.unk_id)];
  }
  def.bos_id = spec.bos_id;
  if (spec.eos_id) def.eos_ids.push_back(*spec.eos_id);
  if (spec.eot_id) def.eos_ids.push_back(*spec.eot_id);
  def.add_bos = spec.add_bos;
  def.chat_template = spec.chat_template;
  def.tool_use_chat_template = spec.tool_use_chat_template;
  auto tokenizer = Build(std::move(def));
  if (!tokenizer.ok()) return tokenizer.status().WithContext("GGUF tokenizer: ");
  return tokenizer;
}

}  // namespace dinfer::tokenizer
