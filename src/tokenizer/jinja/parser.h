// Jinja parser: tokens -> statements and expressions (ast.h), with Jinja2's grammar and operator
// precedence. Stateless function; safe from any thread.
#pragma once

#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace dinfer::tokenizer::jinja {

// Throws TemplateError (with the line) on a syntax error.
Body ParseTemplate(std::string_view source);

}  // namespace dinfer::tokenizer::jinja
