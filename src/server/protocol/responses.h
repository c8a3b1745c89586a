// The OpenAI Responses API (/v1/responses): request parsing and its response encoder.
// Stateless functions; the encoder as in encoder.h.
#pragma once

#include <memory>

#include <boost/json/object.hpp>

#include "server/protocol/encoder.h"
#include "server/protocol/types.h"

namespace dinfer::server {

ApiResult<GenerationRequest> ParseResponsesRequest(const boost::json::object& body);
std::unique_ptr<ResponseEncoder> MakeResponsesEncoder(const GenerationRequest& req,
                                                      ResponseMeta meta);

}  // namespace dinfer::server
