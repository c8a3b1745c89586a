// The OpenAI protocols: Chat Completions (/v1/chat/completions) and Completions
// (/v1/completions) — request parsing into GenerationRequest and their response encoders — and
// pieces the Responses API shares with them. Stateless functions; encoders as in encoder.h.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include "server/protocol/encoder.h"
#include "server/protocol/fields.h"
#include "server/protocol/types.h"

namespace dinfer::server {

ApiResult<GenerationRequest> ParseChatCompletion(const boost::json::object& body);
ApiResult<GenerationRequest> ParseCompletion(const boost::json::object& body);

std::unique_ptr<ResponseEncoder> MakeChatEncoder(const GenerationRequest& req, ResponseMeta meta);
std::unique_ptr<ResponseEncoder> MakeCompletionEncoder(const GenerationRequest& req,
                                                       ResponseMeta meta);

// Checks `tools` (function tools in the chat shape) and `tool_choice`; on success fills
// req.tools and req.tool_choice.
void ReadChatTools(FieldReader& r, GenerationRequest& req);
// Text of a message's content: a string or a list of text parts (other parts are refused).
// `text_types` are the part types that carry text ("text", or "input_text"/"output_text").
bool ContentText(FieldReader& r, std::string_view param, const boost::json::value& content,
                 std::initializer_list<std::string_view> text_types, std::string& out);

// Token logprobs as both OpenAI APIs list them: {"token", "logprob", "bytes", "top_logprobs":
// [{"token", "logprob", "bytes"}]}.
boost::json::array TokenLogprobsJson(const std::vector<LogprobEntry>& entries);
boost::json::object OpenAiUsage(const Usage& usage);
const char* OpenAiFinishReason(Finish finish);

}  // namespace dinfer::server
