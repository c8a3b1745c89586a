// Template: a parsed Jinja template and its evaluator. Parse once; Render any number of times,
// from any threads at once (each render has its own scopes and output; the parsed tree is
// read-only). Output is a Text: template literals are trusted, text from `globals` keeps the
// provenance it was given.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"

namespace dinfer::tokenizer::jinja {

class Template {
 public:
  // Throws TemplateError on a syntax error.
  static std::shared_ptr<const Template> Parse(std::string_view source);

  // `globals` are the template's variables; Jinja's own globals (range, dict, namespace) are
  // visible unless a global shadows them. Throws TemplateError.
  Text Render(const std::vector<std::pair<std::string, Value>>& globals) const;

  // Whether some for loop iterates over an attribute or item named `name` (`x.content`,
  // `x['content']`): how servers tell templates that read content parts from those that read
  // strings.
  bool LoopsOver(std::string_view name) const;

 private:
  Body body_;
};

}  // namespace dinfer::tokenizer::jinja
