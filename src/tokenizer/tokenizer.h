// Tokenizer: text <-> token ids for byte-level BPE models, loaded from HF tokenizer.json (plus
// tokenizer_config.json) or from a GGUF file's tokenizer.* metadata, agreeing token for token with
// HF `tokenizers`. IncrementalDetokenizer turns a stream of ids into UTF-8-safe text deltas.
// A Tokenizer is immutable after loading (its BPE word cache is internally locked): Encode and
// Decode are safe from any thread. An IncrementalDetokenizer belongs to one stream (one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "dinfer/prompt.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace dinfer {
class ThreadPool;
}

namespace dinfer::tokenizer {

// What a GGUF file's tokenizer.* metadata holds; the model loader fills it.
struct GgufTokenizerSpec {
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE); "llama" is not supported yet
  std::string pre;    // tokenizer.ggml.pre: selects the pre-tokenizer ("smollm", "llama-bpe", ...)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
                                     // 6 byte; empty: all normal
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("a b")
  std::optional<int32_t> bos_id, eos_id, eot_id, unk_id, pad_id;
  bool add_bos = false;                // tokenizer.ggml.add_bos_token
  std::string chat_template;           // tokenizer.chat_template
  std::string tool_use_chat_template;  // tokenizer.chat_template.tool_use
};

// Everything a Tokenizer is built from, whatever the file format; the loaders fill it.
struct TokenizerDefinition {
  std::vector<std::pair<std::string, int32_t>> vocab;  // tokens as the model spells them
  std::vector<std::pair<std::string, std::string>> merges;
  BpeOptions bpe;
  std::vector<AddedToken> added_tokens;
  bool nfc = false;  // NFC normalizer
  std::vector<PreTokenizerStep> pre_tokenizer;
  // Tokens whose text is literal rather than byte-level spelled (GGUF user-defined tokens).
  std::vector<int32_t> raw_text_ids;
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  bool add_bos = false;
  std::string chat_template;
  // HF's named "tool_use" template (apply_chat_template takes it when tools are given).
  std::string tool_use_chat_template;
};

class Tokenizer {
 public:
  // `tokenizer_config_json` may be empty (then no bos/eos/chat template).
  static StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(
      std::string_view json_text, std::string_view tokenizer_config_json);
  // A directory holding tokenizer.json, or the tokenizer.json file itself; tokenizer_config.json,
  // generation_config.json (more eos ids), chat_template.jinja and
  // additional_chat_templates/tool_use.jinja beside it are read if present (the template files
  // win over tokenizer_config.json's chat_template, as in transformers).
  static StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJsonFile(const std::string& dir_or_file);
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufTokenizerSpec& spec);
  // What both loaders end with; also for tests and tokenizers assembled in code.
  static StatusOr<std::unique_ptr<Tokenizer>> Build(TokenizerDefinition definition);

  // parse_special: text matching a special token's content becomes that token; otherwise it is
  // plain text (non-special added tokens always match). No BOS is added: see add_bos().
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;
  // A rendered prompt: added tokens (special or not) are recognised only inside trusted segments
  // (text the chat template itself wrote); untrusted text (messages, tool arguments) and the
  // trusted text between added tokens are encoded without the added vocabulary, as DeepSeek's
  // reference prompt encoding does, so no request text can become a control token. The plain
  // text between added tokens is encoded as one run, so the ids equal Encode(concatenation)
  // whenever untrusted text holds no added token's text.
  // With a pool, large prompts are encoded in parallel with the same result: the runs between
  // added tokens are pre-tokenized concurrently (a very long one by PreTokenizer::SplitParallel),
  // and the pieces of long runs are cut into chunks whose BPE runs concurrently. Calls sharing a
  // pool take turns (ThreadPool runs one loop at a time).
  std::vector<int32_t> EncodeSegments(std::span<const PromptSegment> segments,
                                      ThreadPool* pool = nullptr) const;
  // Unknown ids are skipped; ill-formed UTF-8 in the joined bytes becomes U+FFFD.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The raw bytes a token stands for (empty for an unknown id).
  const std::string& TokenBytes(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // The id of an added token's content or of a vocabulary entry (as the vocabulary spells it).
  std::optional<int32_t> TokenId(std::string_view token_content) const;
  std::optional<int32_t> bos_id() const { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool add_bos() const { return add_bos_; }
  bool IsSpecial(int32_t id) const;
  const std::string& chat_template() const { return chat_template_; }
  // The template for requests with tools, when the checkpoint names one "tool_use" (else empty).
  const std::string& tool_use_chat_template() const { return tool_use_chat_template_; }

 private:
  struct Scratch;
  Tokenizer() = default;
  // Which added tokens a walk matches: all, the non-special ones (special-token text is plain),
  // or none (the text is normalized and pre-tokenized as a whole).
  enum class AddedTokens { kAll, kNonSpecial, kNone };
  // Walks `text` as Encode does: on_id(id) for each added token matched, on_text(text) for each
  // normalized text between them that is to be pre-tokenized, in order. Texts may view scratch
  // buffers, valid during the call.
  template <typename OnId, typename OnText>
  void ForEachText(std::string_view text, AddedTokens added, Scratch* scratch, OnId&& on_id,
                   OnText&& on_text) const;
  // The same walk down to the pieces BPE encodes: on_piece(piece) for each.
  template <typename OnId, typename OnPiece>
  void ForEachPiece(std::string_view text, AddedTokens added, Scratch* scratch, OnId&& on_id,
                    OnPiece&& on_piece) const;
  // The text between the added tokens of a rendered prompt, and those tokens: each part is a
  // run of plain text (id < 0) or one added token.
  struct PromptPart {
    int32_t id = -1;
    std::string text;
  };
  std::vector<PromptPart> SplitPrompt(std::span<const PromptSegment> segments) const;
  std::vector<int32_t> EncodeParts(const std::vector<PromptPart>& parts, ThreadPool& pool) const;

  std::unique_ptr<AddedVocab> added_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  bool nfc_ = false;
  std::vector<std::string> token_bytes_;  // by id
  std::vector<uint8_t> special_;          // by id
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  bool add_bos_ = false;
  std::string chat_template_;
  std::string tool_use_chat_template_;
};

// Streams decoded text: Push returns only complete UTF-8; a multi-byte sequence split across
// tokens is held until it completes. Concatenating every Push and the final Flush gives exactly
// Decode(all ids, skip_special).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string Push(int32_t id);
  // The held-back rest (an incomplete sequence becomes U+FFFD); the stream starts over.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace dinfer::tokenizer
