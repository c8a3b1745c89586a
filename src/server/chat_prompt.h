// ChatPromptRenderer: turns chat messages (the OpenAI chat shape that every protocol converts
// to) into a prompt of PromptSegments for Engine::EncodeSegments, with the model's own chat
// template (the Jinja interpreter in src/tokenizer) or, for DeepSeek V4, its native encoding.
// Text from the request is untrusted, so special-token markup in it stays text.
// Immutable after creation: thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include "dinfer/engine.h"
#include "dinfer/prompt.h"
#include "dinfer/status.h"
#include "server/protocol/types.h"

namespace dinfer::server {

struct ChatRenderRequest {
  const boost::json::array& messages;
  const boost::json::array& tools;  // empty: the model sees no tools
  const ToolChoice& tool_choice;
  const boost::json::object& kwargs;  // extra template variables (untrusted)
  // Open a new assistant turn, or end inside the last (assistant) message so that the model
  // continues it (Anthropic's prefill, vLLM's continue_final_message).
  bool continue_final_message = false;
};

class ChatPromptRenderer {
 public:
  virtual ~ChatPromptRenderer() = default;
  virtual StatusOr<std::vector<PromptSegment>> Render(const ChatRenderRequest& request) const = 0;
  // The Jinja source that renders a request with or without tools, or empty for DeepSeek V4's
  // encoding (what output format selection needs).
  virtual const std::string& chat_template(bool with_tools) const = 0;
  virtual bool deepseek_v4() const = 0;
};

// The renderer for the model: DeepSeek V4's encoding for its architecture, else the Jinja
// template `template_source` when given (the --chat-template override), else the checkpoint's
// (its "tool_use" template for requests with tools, when it has one).
// An error when there is none or it does not parse (chat endpoints then answer with it;
// /v1/completions still works).
StatusOr<std::unique_ptr<ChatPromptRenderer>> MakeChatPromptRenderer(
    const ModelInfo& model, const std::string& template_source);

}  // namespace dinfer::server
