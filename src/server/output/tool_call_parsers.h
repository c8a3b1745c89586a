// The tool-call block parsers behind OutputParser, one per markup: JSON calls (Hermes/Qwen
// <tool_call> blocks and Llama 3's bare objects) and DeepSeek's DSML blocks. Each turns the text
// of one block into calls whose JSON arguments stream as the text arrives. One parser per block
// of one stream; not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace dinfer::output {

// Where a block parser reports its calls; OutputParser numbers them and makes the events.
class ToolCallSink {
 public:
  virtual ~ToolCallSink() = default;
  virtual void Begin(std::string name) = 0;
  virtual void Args(std::string_view piece) = 0;
  virtual void End() = 0;
};

class ToolBlockParser {
 public:
  enum class Status {
    kMore,       // the block goes on: feed more text
    kDone,       // the block ended; `consumed` includes its closing markup
    kMalformed,  // no call can be read from the block: give its text back as content
  };
  struct Result {
    size_t consumed = 0;
    Status status = Status::kMore;
  };
  virtual ~ToolBlockParser() = default;
  // `text` is the block's text that was not consumed yet, from just after its opening markup.
  // Until the block's first call has begun nothing is consumed, so a malformed block can still
  // become content. `final`: the output ended; what is open ends with it.
  virtual Result Feed(std::string_view text, bool final, ToolCallSink* sink) = 0;
};

// One {"name": ..., "arguments" | "parameters": ...} object, then `close` (Hermes:
// "</tool_call>"); with `chained` (Llama 3), more objects may follow after ';' and the block ends
// with the last object.
std::unique_ptr<ToolBlockParser> MakeJsonToolParser(std::string_view close, bool chained);

// <｜DSML｜invoke name="..."> elements with <｜DSML｜parameter name="..." string="true|false">
// values, up to </｜DSML｜tool_calls> (or V3.2's </｜DSML｜function_calls>). The arguments stream
// as {"name": value, ...} with ", " and ": " separators, string="true" values as JSON strings,
// others as written. Stray text in the block is skipped (as DeepSeek's own parser does); a
// block that ends without a call is malformed.
std::unique_ptr<ToolBlockParser> MakeDsmlToolParser();

}  // namespace dinfer::output
