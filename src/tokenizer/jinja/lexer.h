// Jinja lexer: template source -> tokens (template data, tag delimiters, expression tokens), with
// Jinja2's whitespace handling as HF configures it: trim_blocks and lstrip_blocks on, `-`/`+`
// modifiers on tags, \r\n and \r read as \n, one trailing newline dropped, {% raw %} blocks.
// Stateless functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dinfer::tokenizer::jinja {

enum class TokenType : uint8_t {
  kData,           // template text, already whitespace-controlled
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // value unescaped
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string value;  // data, name, operator, or the unescaped string literal
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
  int column = 1;
};

// Throws TemplateError (with the line) on a lexical error.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace dinfer::tokenizer::jinja
