#include "server/protocol/encoder.h"

#include <random>

#include <fmt/format.h>
#include <boost/json/serialize.hpp>

#include "server/protocol/anthropic.h"
#include "server/protocol/openai.h"
#include "server/protocol/responses.h"

namespace dinfer::server {

namespace json = boost::json;

std::unique_ptr<ResponseEncoder> MakeEncoder(const GenerationRequest& req, ResponseMeta meta) {
  switch (req.api) {
    case Api::kChatCompletions:
      return MakeChatEncoder(req, std::move(meta));
    case Api::kCompletions:
      return MakeCompletionEncoder(req, std::move(meta));
    case Api::kResponses:
      return MakeResponsesEncoder(req, std::move(meta));
    case Api::kMessages:
      return MakeMessagesEncoder(std::move(meta));
  }
  return nullptr;
}

std::string NewId(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

std::string ErrorBody(Api api, const ApiError& e) {
  if (api == Api::kMessages) {
    std::string_view type = "api_error";
    switch (e.kind) {
      case ErrorKind::kInvalidRequest:
      case ErrorKind::kUnsupportedMedia:
        type = "invalid_request_error";
        break;
      case ErrorKind::kAuthentication:
        type = "authentication_error";
        break;
      case ErrorKind::kNotFound:
        type = "not_found_error";
        break;
      case ErrorKind::kRequestTooLarge:
        type = "request_too_large";
        break;
      case ErrorKind::kOverloaded:
        type = "overloaded_error";
        break;
      case ErrorKind::kRateLimited:
        type = "rate_limit_error";
        break;
      case ErrorKind::kInternal:
        type = "api_error";
        break;
    }
    return json::serialize(json::object{
        {"type", "error"}, {"error", json::object{{"type", type}, {"message", e.message}}}});
  }
  std::string_view type = "invalid_request_error";
  std::string_view code;
  switch (e.kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kUnsupportedMedia:
      break;
    case ErrorKind::kAuthentication:
      code = "invalid_api_key";
      break;
    case ErrorKind::kNotFound:
      code = "model_not_found";
      break;
    case ErrorKind::kRequestTooLarge:
      code = "request_too_large";
      break;
    case ErrorKind::kOverloaded:
      type = "server_overloaded";
      break;
    case ErrorKind::kRateLimited:
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case ErrorKind::kInternal:
      type = "server_error";
      break;
  }
  if (!e.code.empty()) code = e.code;
  return json::serialize(json::object{
      {"error",
       json::object{{"message", e.message},
                    {"type", type},
                    {"param", e.param.empty() ? json::value(nullptr) : json::value(e.param)},
                    {"code", code.empty() ? json::value(nullptr) : json::value(code)}}}});
}

void AppendEvent(std::string& out, std::string_view event, const json::object& data) {
  if (!event.empty()) {
    out += "event: ";
    out += event;
    out += '\n';
  }
  out += "data: ";
  out += json::serialize(data);
  out += "\n\n";
}

}  // namespace dinfer::server
