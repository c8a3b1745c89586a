// ChatPromptRenderer: turns chat messages (the OpenAI chat shape that every protocol converts
// to) into a prompt of PromptSegments for Engine::EncodeSegments. The text of messages is
// untrusted, so special-token markup in it stays text. Immutable after Create: thread-safe.
#pragma once

#include <memory>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include "dinfer/engine.h"
#include "dinfer/prompt.h"
#include "dinfer/status.h"

namespace dinfer::server {

struct ChatRenderRequest {
  const boost::json::array& messages;
  const boost::json::array& tools;    // empty: the model sees no tools
  const boost::json::object& kwargs;  // extra template variables
  bool add_generation_prompt = true;
};

class ChatPromptRenderer {
 public:
  virtual ~ChatPromptRenderer() = default;
  virtual StatusOr<std::vector<PromptSegment>> Render(const ChatRenderRequest& request) const = 0;
};

// The renderer for the model's chat template; an error when the model has none this server
// can render (chat endpoints then answer with it, /v1/completions still works).
StatusOr<std::unique_ptr<ChatPromptRenderer>> MakeChatPromptRenderer(const ModelInfo& model);

}  // namespace dinfer::server
