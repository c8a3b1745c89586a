// Loading: tokenizer.json options, tokenizer_config.json / generation_config.json metadata, GGUF
// specs, and the errors for what is malformed or unsupported.

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"

namespace dinfer::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

// A tiny byte-level BPE: "abc" merges in two steps, "Ġa" is a merge, "bc" only a vocabulary entry.
std::string TinyJson(std::string_view model_extra = "", std::string_view normalizer = "null",
                     std::string_view pre_tokenizer = R"({"type": "ByteLevel",
    "add_prefix_space": false, "trim_offsets": true, "use_regex": true})",
                     std::string_view decoder = R"({"type": "ByteLevel"})",
                     std::string_view post_processor = "null") {
  return fmt::format(R"({{
  "version": "1.0",
  "added_tokens": [
    {{"id": 7, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true}},
    {{"id": 8, "content": "</s>", "special": true}}
  ],
  "normalizer": {},
  "pre_tokenizer": {},
  "post_processor": {},
  "decoder": {},
  "model": {{"type": "BPE", "dropout": null, "unk_token": null, {}
    "vocab": {{"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "abc": 5, "Ġa": 6, "<s>": 7, "</s>": 8,
              "bc": 9}},
    "merges": ["a b", "ab c", "Ġ a"]}}
}})",
                     normalizer, pre_tokenizer, post_processor, decoder, model_extra);
}

std::unique_ptr<Tokenizer> MustLoad(std::string_view json, std::string_view config = "") {
  auto tok = Tokenizer::FromTokenizerJson(json, config);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

void ExpectError(const Status& status, StatusCode code, std::string_view needle) {
  EXPECT_EQ(status.code(), code) << status.ToString();
  EXPECT_NE(status.message().find(needle), std::string::npos)
      << "'" << needle << "' not in: " << status.ToString();
}

TEST(TokenizerJsonTest, MergesByRank) {
  auto tok = MustLoad(TinyJson());
  ASSERT_NE(tok, nullptr);
  // "abc" -> a b c -> ab c -> abc; " ab": "a b" (rank 0) beats "Ġ a" (rank 2).
  EXPECT_EQ(tok->Encode("abc ab"), (Ids{5, 3, 4}));
  EXPECT_EQ(tok->Encode("bc"), (Ids{1, 2}));
  EXPECT_EQ(tok->Decode(Ids{5, 3, 4}), "abc ab");
  EXPECT_EQ(tok->vocab_size(), 10);
  EXPECT_EQ(tok->Encode("<s>ab</s>"), (Ids{7, 4, 8}));
  EXPECT_TRUE(tok->IsSpecial(7));
  EXPECT_FALSE(tok->IsSpecial(4));
}

TEST(TokenizerJsonTest, MergesAsPairsAndIgnoreMerges) {
  std::string json = TinyJson(R"("ignore_merges": true,)");
  const std::string strings = R"(["a b", "ab c", "Ġ a"])";
  json.replace(json.find(strings), strings.size(), R"([["a", "b"], ["ab", "c"], ["Ġ", "a"]])");
  auto tok = MustLoad(json);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("bc"), (Ids{9}));  // a vocabulary entry no merge reaches
  EXPECT_EQ(tok->Encode("abc ab"), (Ids{5, 3, 4}));
}

TEST(TokenizerJsonTest, ByteFallbackAndUnknown) {
  // No ByteLevel: the model sees Unicode chars.
  const std::string vocab =
      R"("vocab": {"a": 0, "b": 1, "<unk>": 2, "<0xC3>": 3, "<0xA9>": 4, "ab": 5},
    "merges": ["a b"]}})";
  auto make = [&](std::string_view options) {
    return fmt::format(R"({{"added_tokens": [], "normalizer": null, "decoder": null,
      "pre_tokenizer": {{"type": "Split", "pattern": {{"String": " "}}, "behavior": "Removed",
                        "invert": false}},
      "model": {{"type": "BPE", {} {})",
                       options, vocab);
  };
  auto fallback = MustLoad(make(R"("byte_fallback": true, "unk_token": "<unk>",)"));
  ASSERT_NE(fallback, nullptr);
  EXPECT_EQ(fallback->Encode("abé a"), (Ids{5, 3, 4, 0}));
  auto fused = MustLoad(make(R"("unk_token": "<unk>", "fuse_unk": true,)"));
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->Encode("aééb"), (Ids{0, 2, 1}));
  auto unfused = MustLoad(make(R"("unk_token": "<unk>",)"));
  ASSERT_NE(unfused, nullptr);
  EXPECT_EQ(unfused->Encode("aééb"), (Ids{0, 2, 2, 1}));
  auto dropped = MustLoad(make(""));
  ASSERT_NE(dropped, nullptr);
  // No unk token: unknown chars vanish, and what was around them merges (as in HF).
  EXPECT_EQ(dropped->Encode("aééb"), (Ids{5}));
}

TEST(TokenizerJsonTest, ConfigMetadata) {
  const std::string config = R"({
    "bos_token": "<s>",
    "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false},
    "add_bos_token": true,
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
  })";
  auto tok = MustLoad(TinyJson(), config);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 7);
  EXPECT_EQ(tok->eos_ids(), Ids{8});
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->chat_template(), "D");
  EXPECT_EQ(tok->tool_use_chat_template(), "T");

  auto bare = MustLoad(TinyJson());
  ASSERT_NE(bare, nullptr);
  EXPECT_FALSE(bare->bos_id().has_value());
  EXPECT_TRUE(bare->eos_ids().empty());
  EXPECT_FALSE(bare->add_bos());
  EXPECT_EQ(bare->chat_template(), "");
}

TEST(TokenizerJsonTest, TemplatePostProcessorMeansAddBos) {
  // Llama 3 has no add_bos_token; its post-processor puts <|begin_of_text|> first.
  const std::string post = R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [], "special_tokens": {}}]})";
  auto tok =
      MustLoad(TinyJson("", "null", R"({"type": "ByteLevel"})", R"({"type": "ByteLevel"})", post));
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 7);
  // An explicit add_bos_token wins.
  auto off =
      MustLoad(TinyJson("", "null", R"({"type": "ByteLevel"})", R"({"type": "ByteLevel"})", post),
               R"({"add_bos_token": false})");
  ASSERT_NE(off, nullptr);
  EXPECT_FALSE(off->add_bos());
}

TEST(TokenizerJsonTest, AddedTokenIdsFollowHf) {
  // HF ignores the ids written for added tokens: vocabulary entries keep theirs, new ones follow.
  std::string json = TinyJson();
  json.replace(json.find(R"("id": 8)"), 7, R"("id": 42)");
  const std::string more =
      R"({"id": 3, "content": "<new>", "special": false}, {"id": 99, "content": "ab"}, )";
  json.insert(json.find(R"({"id": 7)"), more);
  auto tok = MustLoad(json);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->TokenId("</s>"), 8);
  EXPECT_EQ(tok->TokenId("<new>"), 10);
  EXPECT_EQ(tok->TokenId("ab"), 4);
  EXPECT_EQ(tok->vocab_size(), 11);
  EXPECT_EQ(tok->Encode("x<new>"), (Ids{10}));  // 'x' is in no token and there is no unk
}

TEST(TokenizerJsonTest, Errors) {
  ExpectError(Tokenizer::FromTokenizerJson("{not json", "").status(), StatusCode::kDataLoss,
              "tokenizer.json");
  ExpectError(Tokenizer::FromTokenizerJson("[1, 2]", "").status(), StatusCode::kDataLoss,
              "tokenizer.json");
  ExpectError(Tokenizer::FromTokenizerJson(TinyJson(), "{bad").status(), StatusCode::kDataLoss,
              "tokenizer_config.json");
  std::string wordpiece = TinyJson();
  wordpiece.replace(wordpiece.find(R"("type": "BPE")"), 13, R"("type": "WordPiece")");
  ExpectError(Tokenizer::FromTokenizerJson(wordpiece, "").status(), StatusCode::kUnimplemented,
              "WordPiece");
  ExpectError(Tokenizer::FromTokenizerJson(TinyJson("", R"({"type": "Lowercase"})"), "").status(),
              StatusCode::kUnimplemented, "Lowercase");
  ExpectError(Tokenizer::FromTokenizerJson(
                  TinyJson("", R"({"type": "Sequence", "normalizers": [{"type": "NFC"},
                                   {"type": "NFKC"}]})"),
                  "")
                  .status(),
              StatusCode::kUnimplemented, "NFKC");
  ExpectError(Tokenizer::FromTokenizerJson(
                  TinyJson("", "null", R"({"type": "Metaspace", "replacement": "▁"})"), "")
                  .status(),
              StatusCode::kUnimplemented, "Metaspace");
  ExpectError(Tokenizer::FromTokenizerJson(
                  TinyJson("", "null", R"({"type": "ByteLevel"})", R"({"type": "WordPiece"})"), "")
                  .status(),
              StatusCode::kUnimplemented, "WordPiece");
  std::string bad_merge = TinyJson();
  bad_merge.replace(bad_merge.find(R"("ab c")"), 6, R"("ab zz")");
  ExpectError(Tokenizer::FromTokenizerJson(bad_merge, "").status(), StatusCode::kDataLoss, "zz");
  ExpectError(
      Tokenizer::FromTokenizerJson(
          TinyJson("", "null",
                   R"({"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"})"),
          "")
          .status(),
      StatusCode::kInvalidArgument, "((");
}

class TokenizerFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("dinfer_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, std::string_view text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(TokenizerFilesTest, ReadsFilesBeside) {
  Write("tokenizer.json", TinyJson());
  Write("tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  Write("generation_config.json", R"({"eos_token_id": [8, 7]})");
  Write("chat_template.jinja", "{{ messages }}");
  for (const std::string& path : {dir_.string(), (dir_ / "tokenizer.json").string()}) {
    auto tok = Tokenizer::FromTokenizerJsonFile(path);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    EXPECT_EQ((*tok)->bos_id(), 7);
    EXPECT_EQ((*tok)->eos_ids(), (Ids{8, 7}));
    EXPECT_EQ((*tok)->chat_template(), "{{ messages }}");
  }
}

TEST_F(TokenizerFilesTest, TemplateFilesWinOverTheConfig) {
  // As in transformers: chat_template.jinja and additional_chat_templates/<name>.jinja replace
  // the config's templates; the config's are used where no file exists.
  Write("tokenizer.json", TinyJson());
  Write("tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "D"},
                              {"name": "tool_use", "template": "T"}]})");
  auto config_only = Tokenizer::FromTokenizerJsonFile(dir_.string());
  ASSERT_TRUE(config_only.ok()) << config_only.status().ToString();
  EXPECT_EQ((*config_only)->chat_template(), "D");
  EXPECT_EQ((*config_only)->tool_use_chat_template(), "T");
  Write("chat_template.jinja", "file default");
  std::filesystem::create_directories(dir_ / "additional_chat_templates");
  Write("additional_chat_templates/tool_use.jinja", "file tool_use");
  auto files = Tokenizer::FromTokenizerJsonFile(dir_.string());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->chat_template(), "file default");
  EXPECT_EQ((*files)->tool_use_chat_template(), "file tool_use");
}

TEST_F(TokenizerFilesTest, ErrorsNameTheFile) {
  ExpectError(Tokenizer::FromTokenizerJsonFile((dir_ / "nowhere").string()).status(),
              StatusCode::kNotFound, (dir_ / "nowhere").string());
  Write("tokenizer.json", "{\"model\": ");
  ExpectError(Tokenizer::FromTokenizerJsonFile(dir_.string()).status(), StatusCode::kDataLoss,
              (dir_ / "tokenizer.json").string());
  Write("tokenizer.json", TinyJson());
  Write("tokenizer_config.json", "{\"bos_token\": ");
  ExpectError(Tokenizer::FromTokenizerJsonFile(dir_.string()).status(), StatusCode::kDataLoss,
              (dir_ / "tokenizer_config.json").string());
  Write("tokenizer_config.json", "{}");
  Write("tokenizer.json", TinyJson("", R"({"type": "NFKD"})"));
  ExpectError(Tokenizer::FromTokenizerJsonFile(dir_.string()).status(), StatusCode::kUnimplemented,
              (dir_ / "tokenizer.json").string());
}

GgufTokenizerSpec TinyGguf() {
  GgufTokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  spec.tokens = {"a", "b", "c", "Ġ", "ab", "<s>", "x y"};
  spec.token_types = {1, 1, 1, 1, 1, 3, 4};
  spec.merges = {"a b"};
  spec.bos_id = 5;
  spec.eos_id = 5;
  return spec;
}

TEST(GgufTokenizerTest, TokenTypes) {
  auto tok = Tokenizer::FromGguf(TinyGguf());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_TRUE((*tok)->IsSpecial(5));
  EXPECT_FALSE((*tok)->IsSpecial(6));
  // A user-defined token is plain text and matches even when special tokens are not parsed.
  EXPECT_EQ((*tok)->TokenBytes(6), "x y");
  EXPECT_EQ((*tok)->Encode("abx y<s>", /*parse_special=*/true), (Ids{4, 6, 5}));
  EXPECT_EQ((*tok)->Encode("abx y<s>", /*parse_special=*/false).front(), 4);
  EXPECT_EQ((*tok)->Encode("abx y<s>", /*parse_special=*/false).at(1), 6);
  EXPECT_EQ((*tok)->Decode(Ids{4, 3, 6, 5}), "ab x y<s>");
  EXPECT_EQ((*tok)->Decode(Ids{4, 3, 6, 5}, /*skip_special=*/true), "ab x y");
  EXPECT_EQ((*tok)->eos_ids(), Ids{5});
}

TEST(GgufTokenizerTest, ChatTemplates) {
  GgufTokenizerSpec spec = TinyGguf();
  spec.chat_template = "{{ messages }}";
  spec.tool_use_chat_template = "{{ tools }}";
  auto tok = Tokenizer::FromGguf(spec);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->chat_template(), "{{ messages }}");
  EXPECT_EQ((*tok)->tool_use_chat_template(), "{{ tools }}");
}

TEST(GgufTokenizerTest, Errors) {
  GgufTokenizerSpec spec = TinyGguf();
  spec.model = "llama";
  ExpectError(Tokenizer::FromGguf(spec).status(), StatusCode::kUnimplemented, "SentencePiece");
  spec = TinyGguf();
  spec.pre = "some-new-model";
  ExpectError(Tokenizer::FromGguf(spec).status(), StatusCode::kUnimplemented, "some-new-model");
  spec = TinyGguf();
  spec.token_types.pop_back();
  ExpectError(Tokenizer::FromGguf(spec).status(), StatusCode::kDataLoss, "token types");
  spec = TinyGguf();
  spec.bos_id = 100;
  ExpectError(Tokenizer::FromGguf(spec).status(), StatusCode::kInvalidArgument, "bos");
}

}  // namespace
}  // namespace dinfer::tokenizer
