// ChatTemplate: renders a chat with the model's own Jinja chat template, exactly as HF
// transformers' apply_chat_template(..., tokenize=False) does (a sandboxed Jinja2 environment with
// trim_blocks and lstrip_blocks, raise_exception, strftime_now and HF's tojson), into
// PromptSegments. Text the template itself wrote (its literals and the bos/eos token variables)
// is trusted; text derived from the request (messages, tools, tool-call arguments,
// chat_template_kwargs) is not, however it was transformed (filters, slicing, concatenation,
// tojson), so Tokenizer::EncodeSegments never turns it into special tokens.
// A ChatTemplate is immutable after Parse; Render is safe from any number of threads at once.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json.hpp>

#include "base/status.h"
#include "dinfer/prompt.h"

namespace dinfer::tokenizer {

namespace jinja {
class Template;
}

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // The prompt ends inside the final (assistant) message, so that the model continues it, cut
  // where transformers' continue_final_message cuts. Excludes add_generation_prompt.
  bool continue_final_message = false;
  // null (no tools) or the OpenAI tool list ([{"type": "function", "function": {...}}, ...]).
  boost::json::value tools;
  // null, or documents for retrieval-augmented templates (a list of objects, e.g. title + text).
  boost::json::value documents;
  // chat_template_kwargs (enable_thinking, ...): extra template variables, untrusted.
  boost::json::object kwargs;
  // The special tokens' text, as the template refers to it (trusted).
  std::string bos_token, eos_token;
  // The clock behind strftime_now(); unset: the current local time. Tests fix it.
  std::optional<std::chrono::system_clock::time_point> now;
};

// How a template reads message content: as a string, or as OpenAI content parts it iterates over
// itself (Gemma 3, Mistral Small). Requests carrying parts for a kString template have them
// joined first (FlattenTextContent), as vLLM does.
enum class ContentFormat { kString, kParts };

class ChatTemplate {
 public:
  // Syntax errors are InvalidArgument with the line and column.
  static StatusOr<ChatTemplate> Parse(std::string_view source);

  // kParts when the template loops over some value's "content" (vLLM's detection), else kString.
  ContentFormat content_format() const { return content_format_; }

  // `messages` are OpenAI Chat Completions messages: role; content as a string, null or a list of
  // content parts; tool_calls whose function.arguments is a parsed JSON object (as servers pass
  // them to templates); tool_call_id; name; reasoning_content. Template errors
  // (raise_exception, type errors on unexpected input) are InvalidArgument with the line.
  StatusOr<std::vector<PromptSegment>> Render(const boost::json::array& messages,
                                              const ChatRenderOptions& options) const;

  // The rendered text without provenance (what HF's tokenize=False returns).
  static std::string Join(const std::vector<PromptSegment>& segments);

 private:
  ChatTemplate(std::shared_ptr<const jinja::Template> t, ContentFormat format)
      : template_(std::move(t)), content_format_(format) {}
  std::shared_ptr<const jinja::Template> template_;
  ContentFormat content_format_ = ContentFormat::kString;
};

// Request preparation servers share (what vLLM does before rendering):
// Assistant tool calls' function.arguments, a JSON string in the OpenAI API, become the object
// templates expect (empty or missing: {}). InvalidArgument names the message when it is not JSON.
Status ParseToolCallArguments(boost::json::array* messages);
// Content given as a list of text parts becomes one string, the texts joined by "\n". Other part
// types are InvalidArgument (this engine reads text only).
Status FlattenTextContent(boost::json::array* messages);

}  // namespace dinfer::tokenizer
