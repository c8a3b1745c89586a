#include "server/output/tool_call_parsers.h"

#include <algorithm>
#include <array>
#include <optional>

#include "base/json_escape.h"
#include "server/output/json_scan.h"

namespace dinfer::output {
namespace {

enum class Match { kYes, kPartial, kNo };

// Whether `literal` is at text[pos]; kPartial when the text ends inside it.
Match MatchAt(std::string_view text, size_t pos, std::string_view literal) {
  const std::string_view rest = text.substr(pos);
  if (rest.size() >= literal.size()) {
    return rest.substr(0, literal.size()) == literal ? Match::kYes : Match::kNo;
  }
  return literal.substr(0, rest.size()) == rest ? Match::kPartial : Match::kNo;
}

using Result = ToolBlockParser::Result;
using Status = ToolBlockParser::Status;

// Hermes / Llama 3 JSON calls. Until a call's name is read, every Feed scans the call from its
// start again (nothing is consumed, so the text can still become content); after that the
// scan goes on where it stopped and the arguments stream as they are scanned.
class JsonToolParser : public ToolBlockParser {
 public:
  JsonToolParser(std::string_view close, bool chained) : close_(close), chained_(chained) {}

  Result Feed(std::string_view text, bool final, ToolCallSink* sink) override {
    if (!began_) StartCall(0);
    size_t pos = 0;
    while (phase_ != Phase::kDone && pos < text.size()) {
      const char c = text[pos];
      switch (phase_) {
        case Phase::kBeforeObject:
          if (IsJsonSpace(c)) {
            ++pos;
          } else if (c == '{') {
            ++pos;
            phase_ = Phase::kBeforeKey;
          } else if (auto r = Fail(pos, sink)) {
            return *r;
          }
          break;
        case Phase::kBeforeKey:
          if (IsJsonSpace(c) || c == ',') {
            ++pos;
          } else if (c == '}') {
            ++pos;
            if (began_) {
              EndObject(sink);
            } else if (auto r = Fail(pos, sink)) {
              return *r;
            }
          } else if (c == '"') {
            ++pos;
            key_.clear();
            key_escape_ = false;
            phase_ = Phase::kKey;
          } else if (auto r = Fail(pos, sink)) {
            return *r;
          }
          break;
        case Phase::kKey:
          ++pos;
          if (!key_escape_ && c == '"') {
            JsonStringDecoder decoder;
            key_ = decoder.Push(key_) + decoder.Finish();
            phase_ = Phase::kColon;
          } else {
            key_escape_ = !key_escape_ && c == '\\';
            key_ += c;
          }
          break;
        case Phase::kColon:
          if (IsJsonSpace(c)) {
            ++pos;
          } else if (c == ':') {
            ++pos;
            phase_ = Phase::kBeforeValue;
          } else if (auto r = Fail(pos, sink)) {
            return *r;
          }
          break;
        case Phase::kBeforeValue:
          if (IsJsonSpace(c)) {
            ++pos;
            break;
          }
          scanner_.Reset();
          value_.clear();
          role_ = key_ == "name" && !began_                                      ? Role::kName
                  : (key_ == "arguments" || key_ == "parameters") && !args_seen_ ? Role::kArgs
                                                                                 : Role::kSkip;
          if (role_ == Role::kArgs) args_seen_ = true;
          phase_ = Phase::kValue;
          break;
        case Phase::kValue: {
          const JsonValueScanner::Step step = scanner_.Feed(c);
          if (step == JsonValueScanner::Step::kError) {
            if (auto r = Fail(pos, sink)) return *r;
            break;
          }
          if (step == JsonValueScanner::Step::kTaken) {
            ++pos;
            TakeValueChar(c, sink);
          }
          if (step == JsonValueScanner::Step::kEnded || scanner_.complete()) {
            phase_ = Phase::kAfterValue;
            if (!EndValue(sink)) {
              if (auto r = Fail(pos, sink)) return *r;
            }
          }
          break;
        }
        case Phase::kAfterValue:
          if (IsJsonSpace(c)) {
            ++pos;
          } else if (c == ',') {
            ++pos;
            phase_ = Phase::kBeforeKey;
          } else if (c == '}') {
            ++pos;
            if (began_) {
              EndObject(sink);
            } else if (auto r = Fail(pos, sink)) {
              return *r;
            }
          } else if (auto r = Fail(pos, sink)) {
            return *r;
          }
          break;
        case Phase::kAfterObject:
          if (IsJsonSpace(c)) {
            ++pos;
          } else if (chained_) {
            if (c != ';') {
              phase_ = Phase::kDone;
              break;
            }
            ++pos;
            phase_ = Phase::kAfterSemicolon;
          } else {
            const Match m = MatchAt(text, pos, close_);
            if (m == Match::kPartial && !final) return {pos, Status::kMore};
            if (m == Match::kNo) {
              phase_ = Phase::kSkipToClose;
            } else {
              pos = std::min(text.size(), pos + close_.size());
              phase_ = Phase::kDone;
            }
          }
          break;
        case Phase::kAfterSemicolon:
          if (IsJsonSpace(c)) {
            ++pos;
          } else if (c == '{') {
            StartCall(pos);
          } else {
            phase_ = Phase::kDone;
          }
          break;
        case Phase::kSkipToClose: {
          const size_t at = text.find(close_, pos);
          if (at != std::string_view::npos) {
            pos = at + close_.size();
            phase_ = Phase::kDone;
          } else if (final) {
            pos = text.size();
            phase_ = Phase::kDone;
          } else {
            return {text.size() - PartialSuffix(text, close_), Status::kMore};
          }
          break;
        }
        case Phase::kDone:
          break;
      }
    }
    if (phase_ == Phase::kDone) return {pos, Status::kDone};
    if (!final) return {began_ ? pos : call_start_, Status::kMore};
    if (!began_) return *Fail(pos, sink);
    if (phase_ == Phase::kValue && role_ == Role::kArgs && scanner_.is_string()) {
      sink->Args(string_args_.Finish());
    }
    if (!ended_) sink->End();
    return {text.size(), Status::kDone};
  }

 private:
  enum class Phase {
    kBeforeObject,
    kBeforeKey,
    kKey,
    kColon,
    kBeforeValue,
    kValue,
    kAfterValue,
    kAfterObject,
    kAfterSemicolon,
    kSkipToClose,
    kDone,
  };
  enum class Role { kName, kArgs, kSkip };

  void StartCall(size_t at) {
    call_start_ = at;
    phase_ = Phase::kBeforeObject;
    began_ = ended_ = args_seen_ = false;
    early_args_.clear();
  }

  // Malformed JSON at `pos`: the result to return, or none when the scan goes on (skipping to
  // the end of the block).
  std::optional<Result> Fail(size_t pos, ToolCallSink* sink) {
    if (!began_) {
      // The block's first call cannot be read: the block is content. A later call of a chained
      // block ends the block before it instead, and its text is content.
      if (calls_ == 0) return Result{0, Status::kMalformed};
      return Result{call_start_, Status::kDone};
    }
    if (!ended_) sink->End();
    ended_ = true;
    if (chained_) return Result{pos, Status::kDone};
    phase_ = Phase::kSkipToClose;
    return std::nullopt;
  }

  void TakeValueChar(char c, ToolCallSink* sink) {
    if (role_ == Role::kName) {
      value_ += c;
    } else if (role_ == Role::kArgs) {
      // Arguments written as a JSON string (some models quote them) stream decoded.
      std::string piece;
      if (!scanner_.is_string()) {
        piece.assign(1, c);
      } else if (value_.empty()) {  // the opening quote
        value_ = "\"";
        string_args_ = JsonStringDecoder();
      } else if (!scanner_.complete()) {  // not the closing quote
        piece = string_args_.Push(std::string_view(&c, 1));
      }
      if (began_) {
        sink->Args(piece);
      } else {
        early_args_ += piece;
      }
    }
  }

  bool EndValue(ToolCallSink* sink) {
    if (role_ == Role::kArgs && scanner_.is_string()) {
      std::string rest = string_args_.Finish();
      began_ ? sink->Args(rest) : void(early_args_ += rest);
    }
    if (role_ != Role::kName) return true;
    if (!scanner_.is_string() || value_.size() < 2) return false;
    JsonStringDecoder decoder;
    std::string name = decoder.Push(std::string_view(value_).substr(1, value_.size() - 2));
    name += decoder.Finish();
    if (name.empty()) return false;
    began_ = true;
    ++calls_;
    sink->Begin(std::move(name));
    if (!early_args_.empty()) sink->Args(early_args_);
    return true;
  }

  void EndObject(ToolCallSink* sink) {
    if (!args_seen_) sink->Args("{}");
    if (!ended_) sink->End();
    ended_ = true;
    phase_ = Phase::kAfterObject;
  }

  const std::string close_;
  const bool chained_;
  Phase phase_ = Phase::kBeforeObject;
  Role role_ = Role::kSkip;
  size_t call_start_ = 0;
  int calls_ = 0;
  bool began_ = false, ended_ = false, args_seen_ = false;
  std::string key_, value_, early_args_;
  bool key_escape_ = false;
  JsonValueScanner scanner_;
  JsonStringDecoder string_args_;
};

constexpr std::string_view kInvoke = "<｜DSML｜invoke name=\"";
constexpr std::string_view kInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kParam = "<｜DSML｜parameter name=\"";
constexpr std::string_view kParamEnd = "</｜DSML｜parameter>";
constexpr std::array<std::string_view, 2> kBlockEnds = {"</｜DSML｜tool_calls>",
                                                        "</｜DSML｜function_calls>"};
// Names and parameter headers longer than this are not DSML.
constexpr size_t kMaxHeader = 1024;

class DsmlToolParser : public ToolBlockParser {
 public:
  Result Feed(std::string_view text, bool final, ToolCallSink* sink) override {
    if (calls_ == 0) phase_ = Phase::kBetween;  // rescan until the first call begins
    size_t pos = 0;
    while (phase_ != Phase::kDone) {
      if (phase_ == Phase::kBetween || phase_ == Phase::kInInvoke) {
        while (pos < text.size() && IsJsonSpace(text[pos])) ++pos;
      }
      if (pos == text.size()) break;
      bool more = false;
      switch (phase_) {
        case Phase::kBetween: {
          const Match invoke = MatchAt(text, pos, kInvoke);
          if (invoke == Match::kYes) {
            pos += kInvoke.size();
            header_.clear();
            phase_ = Phase::kName;
            break;
          }
          bool partial = invoke == Match::kPartial;
          for (std::string_view end : kBlockEnds) {
            const Match m = MatchAt(text, pos, end);
            if (m == Match::kYes) {
              // A block without a single call is not a tool call.
              if (calls_ == 0) return {0, Status::kMalformed};
              pos += end.size();
              phase_ = Phase::kDone;
            }
            partial = partial || m == Match::kPartial;
          }
          if (phase_ == Phase::kDone) break;
          if (partial && !final) {
            more = true;
          } else {
            ++pos;  // stray text in the block, skipped as DeepSeek's parser does
          }
          break;
        }
        case Phase::kName: {
          const size_t quote = text.find('"', pos);
          header_.append(
              text.substr(pos, quote == std::string_view::npos ? text.npos : quote - pos));
          pos = quote == std::string_view::npos ? text.size() : quote;
          if (header_.size() > kMaxHeader || header_.find('\n') != std::string::npos ||
              (quote != std::string_view::npos && MatchAt(text, quote, "\">") == Match::kNo)) {
            phase_ = Phase::kBetween;  // not an invoke tag: stray text
            break;
          }
          if (quote == std::string_view::npos || MatchAt(text, quote, "\">") != Match::kYes) {
            more = true;
            break;
          }
          pos += 2;
          ++calls_;
          params_ = 0;
          in_call_ = true;
          sink->Begin(header_);
          phase_ = Phase::kInInvoke;
          break;
        }
        case Phase::kInInvoke: {
          const Match param = MatchAt(text, pos, kParam);
          const Match end = MatchAt(text, pos, kInvokeEnd);
          if (param == Match::kYes) {
            pos += kParam.size();
            header_.clear();
            phase_ = Phase::kParamHeader;
          } else if (end == Match::kYes) {
            pos += kInvokeEnd.size();
            sink->Args(params_ == 0 ? "{}" : "}");
            sink->End();
            in_call_ = false;
            phase_ = Phase::kBetween;
          } else if ((param == Match::kPartial || end == Match::kPartial) && !final) {
            more = true;
          } else {
            ++pos;  // stray text inside the invoke
          }
          break;
        }
        case Phase::kParamHeader: {
          const size_t close = text.find('>', pos);
          header_.append(
              text.substr(pos, close == std::string_view::npos ? text.npos : close + 1 - pos));
          pos = close == std::string_view::npos ? text.size() : close + 1;
          if (close == std::string_view::npos && header_.size() <= kMaxHeader) {
            more = true;
            break;
          }
          StartParam(sink);
          break;
        }
        case Phase::kValue: {
          const size_t end = text.find(kParamEnd, pos);
          // At the end of the output too, a closing tag cut short is markup, not value.
          const size_t stop = end != std::string_view::npos
                                  ? end
                                  : text.size() - PartialSuffix(text.substr(pos), kParamEnd);
          Value(text.substr(pos, stop - pos), sink);
          pos = stop;
          if (end == std::string_view::npos) {
            more = true;
            break;
          }
          pos += kParamEnd.size();
          if (value_is_string_) sink->Args("\"");
          phase_ = Phase::kInInvoke;
          break;
        }
        case Phase::kDone:
          break;
      }
      if (more) break;
    }
    if (phase_ == Phase::kDone) return {pos, Status::kDone};
    if (!final) return {calls_ > 0 ? pos : 0, Status::kMore};
    if (calls_ == 0) return {0, Status::kMalformed};
    if (in_call_) sink->End();
    in_call_ = false;
    return {text.size(), Status::kDone};
  }

 private:
  enum class Phase { kBetween, kName, kInInvoke, kParamHeader, kValue, kDone };

  // header_ holds `NAME" string="true|false">`.
  void StartParam(ToolCallSink* sink) {
    std::string_view header = header_;
    const size_t quote = header.find('"');
    const std::string_view name = header.substr(0, quote);
    value_is_string_ = header.find("string=\"false\"", quote) == std::string_view::npos;
    std::string piece = params_ == 0 ? "{\"" : ", \"";
    AppendJsonEscaped(name, &piece);
    piece += value_is_string_ ? "\": \"" : "\": ";
    sink->Args(piece);
    ++params_;
    phase_ = Phase::kValue;
  }

  void Value(std::string_view raw, ToolCallSink* sink) {
    if (raw.empty()) return;
    if (!value_is_string_) {
      sink->Args(raw);
      return;
    }
    std::string escaped;
    AppendJsonEscaped(raw, &escaped);
    sink->Args(escaped);
  }

  Phase phase_ = Phase::kBetween;
  std::string header_;
  int calls_ = 0, params_ = 0;
  bool in_call_ = false, value_is_string_ = true;
};

}  // namespace

std::unique_ptr<ToolBlockParser> MakeJsonToolParser(std::string_view close, bool chained) {
  return std::make_unique<JsonToolParser>(close, chained);
}

std::unique_ptr<ToolBlockParser> MakeDsmlToolParser() { return std::make_unique<DsmlToolParser>(); }

}  // namespace dinfer::output
