// PromptSegment: a piece of a rendered prompt with where it came from. Chat templates and the
// DeepSeek encoding produce segments; tokenizers honour special-token markup only in trusted
// ones, so text from users, tools or tool arguments can never inject a control token.
#pragma once

#include <string>

namespace dinfer {

struct PromptSegment {
  std::string text;
  bool trusted = false;  // written by the template itself (its literals, bos/eos variables)
};

}  // namespace dinfer
