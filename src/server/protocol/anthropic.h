// The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens): request parsing and its
// response encoder. Stateless functions; the encoder as in encoder.h.
#pragma once

#include <memory>

#include <boost/json/object.hpp>

#include "server/protocol/encoder.h"
#include "server/protocol/types.h"

namespace dinfer::server {

ApiResult<GenerationRequest> ParseMessages(const boost::json::object& body);
// The same request without the generation fields (max_tokens is not required).
ApiResult<GenerationRequest> ParseCountTokens(const boost::json::object& body);
std::unique_ptr<ResponseEncoder> MakeMessagesEncoder(ResponseMeta meta);

}  // namespace dinfer::server
