// ResponseEncoder: turns choice updates into one protocol's wire format — server-sent events
// while streaming, one JSON body otherwise — and each protocol's error body. An encoder belongs
// to one request and is used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "server/protocol/types.h"

namespace dinfer::server {

class ResponseEncoder {
 public:
  virtual ~ResponseEncoder() = default;
  // Each appends the events to send to `out`. StreamStart comes once the prompt's token counts
  // are known (with the first output), StreamEnd after every choice finished.
  virtual void StreamStart(const Usage& usage, std::string& out) = 0;
  virtual void StreamUpdate(const ChoiceUpdate& update, std::string& out) = 0;
  virtual void StreamEnd(const Usage& usage, std::string& out) = 0;
  // A failure after the stream began.
  virtual void StreamError(const ApiError& error, std::string& out) = 0;
  // The non-streaming response.
  virtual std::string Body(const std::vector<ChoiceResult>& choices, const Usage& usage) = 0;
};

// What encoders echo back: the response id, creation time and model name.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The encoder for `req.api`.
std::unique_ptr<ResponseEncoder> MakeEncoder(const GenerationRequest& req, ResponseMeta meta);

// `prefix` followed by 24 random hex digits ("chatcmpl-1f0c...").
std::string NewId(std::string_view prefix);

// The error body in the protocol's JSON shape.
std::string ErrorBody(Api api, const ApiError& error);

// One SSE event: "data: <json>\n\n", with an "event: <name>" line when `event` is not empty.
void AppendEvent(std::string& out, std::string_view event, const boost::json::object& data);

}  // namespace dinfer::server
