// Helpers of the structured-output tests: byte-level matching through a 256-token vocabulary of
// single bytes, the real tokenizers, and the brute-force mask (every token tried one by one).
// Plain functions; the shared tokenizer is loaded once and only read afterwards.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "structured/compiler.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

namespace dinfer::structured::testutil {

// Token i is the single byte i; token 256 is the stop token.
inline std::shared_ptr<const TokenIndex> ByteVocabulary() {
  static const auto index = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    tokens.emplace_back("");
    return TokenIndex::FromTokens(std::move(tokens), {256});
  }();
  return index;
}

inline const GrammarCompiler& ByteCompiler() {
  static const GrammarCompiler compiler(ByteVocabulary());
  return compiler;
}

// Whether `text` is a complete match of the compiled grammar, fed byte by byte.
inline bool FullMatch(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  for (char c : text) {
    if (!m.AcceptToken(static_cast<uint8_t>(c))) return false;
  }
  return m.IsCompleted();
}

inline std::string TokenizersDir() {
  if (const char* dir = std::getenv("DINFER_TEST_TOKENIZERS"); dir && *dir) return dir;
  return DINFER_SOURCE_DIR "/build/test-data/tokenizers";
}

// The default model's tokenizer (SmolLM2, 49,152 tokens), or null when the generated test data
// is missing (scripts/setup makes it).
inline const tokenizer::Tokenizer* DefaultTokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    auto t = tokenizer::Tokenizer::FromTokenizerJsonFile(TokenizersDir() + "/smollm2");
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return tok.get();
}

inline const GrammarCompiler* DefaultCompiler() {
  static const std::unique_ptr<GrammarCompiler> compiler =
      DefaultTokenizer()
          ? std::make_unique<GrammarCompiler>(TokenIndex::FromTokenizer(*DefaultTokenizer()))
          : nullptr;
  return compiler.get();
}

#define DINFER_REQUIRE_TOKENIZER()                                                  \
  if (::dinfer::structured::testutil::DefaultCompiler() == nullptr) {               \
    GTEST_SKIP() << "test tokenizers missing: run scripts/setup (build/test-data)"; \
  }

// Compares the matcher's mask with trying every token: AcceptToken then Rollback.
inline void ExpectMaskIsExact(Matcher& m, const std::string& where) {
  const int32_t vocab = m.vocab_size();
  std::vector<uint32_t> mask(BitmaskWords(vocab));
  m.FillNextTokenBitmask(mask.data());
  int mismatches = 0;
  for (int32_t t = 0; t < vocab; ++t) {
    const bool ok = m.AcceptToken(t);
    if (ok) m.Rollback(1);
    if (ok != TestBit(mask.data(), t) && ++mismatches <= 5) {
      ADD_FAILURE() << where << ": token " << t << " '" << m.grammar().tokens().bytes(t)
                    << "' accepted=" << ok << " mask=" << TestBit(mask.data(), t);
    }
  }
  EXPECT_EQ(mismatches, 0) << where;
}

}  // namespace dinfer::structured::testutil
