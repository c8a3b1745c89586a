#include "server/output/output_parser.h"

#include <algorithm>
#include <array>
#include <random>

#include "server/output/json_scan.h"
#include "server/output/tool_call_parsers.h"

namespace dinfer::output {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsml = "｜DSML｜";
constexpr std::array<std::string_view, 2> kDsmlOpens = {"<｜DSML｜tool_calls>",
                                                        "<｜DSML｜function_calls>"};

std::string RandomCallId() {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

}  // namespace

class OutputParser::Impl : public ToolCallSink {
 public:
  explicit Impl(OutputFormat format) : f_(std::move(format)) {
    for (const std::string& s : f_.stop) {
      if (!s.empty()) stops_.push_back(s);
    }
    switch (f_.tools) {
      case ToolCallFormat::kNone:
        break;
      case ToolCallFormat::kHermes:
        markers_ = {kHermesOpen};
        break;
      case ToolCallFormat::kLlama3Json:
        markers_ = {kPythonTag};
        break;
      case ToolCallFormat::kDeepSeekDsml:
        markers_.assign(kDsmlOpens.begin(), kDsmlOpens.end());
    }
    if (f_.tools == ToolCallFormat::kDeepSeekDsml && f_.starts_in_tool_calls) {
      StartBlock("", "");
    } else if (f_.reasoning == ReasoningFormat::kThink) {
      mode_ = f_.starts_in_reasoning ? Mode::kReasoning : Mode::kStart;
      trim_ = true;
    }
  }

  std::vector<OutputEvent> Push(std::string_view delta) {
    if (mode_ != Mode::kStopped && !finished_) {
      buf_.append(delta);
      Run(/*final=*/false);
    }
    return TakeEvents();
  }

  std::vector<OutputEvent> Finish() {
    if (!finished_) {
      Run(/*final=*/true);
      finished_ = true;
    }
    return TakeEvents();
  }

  bool stopped() const { return mode_ == Mode::kStopped; }
  int tool_calls() const { return calls_; }

  void Begin(std::string name) override {
    OutputEvent e;
    e.type = OutputEvent::Type::kToolCallBegin;
    e.tool_index = calls_;
    e.id = f_.tool_call_id ? f_.tool_call_id(calls_) : RandomCallId();
    e.name = std::move(name);
    events_.push_back(std::move(e));
    ++calls_;
  }
  void Args(std::string_view piece) override { Emit(OutputEvent::Type::kToolCallArgs, piece); }
  void End() override {
    OutputEvent e;
    e.type = OutputEvent::Type::kToolCallEnd;
    e.tool_index = calls_ - 1;
    events_.push_back(std::move(e));
  }

 private:
  enum class Mode { kStart, kReasoning, kContent, kTool, kStopped };

  std::vector<OutputEvent> TakeEvents() {
    std::vector<OutputEvent> out;
    out.swap(events_);
    return out;
  }

  void Run(bool final) {
    bool progress = true;
    while (progress) {
      switch (mode_) {
        case Mode::kStart:
          progress = StepStart(final);
          break;
        case Mode::kReasoning:
          progress = StepReasoning(final);
          break;
        case Mode::kContent:
          progress = StepContent(final);
          break;
        case Mode::kTool:
          progress = StepTool(final);
          break;
        case Mode::kStopped:
          buf_.clear();
          progress = false;
          break;
      }
    }
  }

  // Does the output open with <think> (after whitespace)?
  bool StepStart(bool final) {
    const size_t ws = std::find_if_not(buf_.begin(), buf_.end(), IsJsonSpace) - buf_.begin();
    const std::string_view rest = std::string_view(buf_).substr(ws);
    if (StartsWith(rest, kThinkOpen)) {
      buf_.erase(0, ws + kThinkOpen.size());
      mode_ = Mode::kReasoning;
      return true;
    }
    if (!final && StartsWith(kThinkOpen, rest)) return false;
    mode_ = Mode::kContent;
    trim_ = false;
    return true;
  }

  // Reasoning up to </think>. Newlines at its start and end are layout, not reasoning: those at
  // the end are held back until more reasoning follows.
  bool StepReasoning(bool final) {
    const size_t close = buf_.find(kThinkClose);
    const bool ends = close != std::string::npos || final;
    const size_t end = close != std::string::npos ? close
                       : final                    ? buf_.size()
                                                  : buf_.size() - PartialSuffix(buf_, kThinkClose);
    std::string_view text = std::string_view(buf_).substr(0, end);
    size_t skip = 0;
    if (trim_) {
      while (skip < text.size() && text[skip] == '\n') ++skip;
    }
    text.remove_prefix(skip);
    size_t keep = text.size();
    while (keep > 0 && text[keep - 1] == '\n') --keep;
    if (keep > 0) {
      Emit(OutputEvent::Type::kReasoning, text.substr(0, keep));
      trim_ = false;
    }
    size_t consumed = skip + (ends ? text.size() : keep);
    if (close != std::string::npos) {
      consumed = close + kThinkClose.size();
      mode_ = Mode::kContent;
      trim_ = true;
    } else if (final) {
      mode_ = Mode::kContent;
    }
    buf_.erase(0, consumed);
    return consumed > 0 || ends;
  }

  bool StepContent(bool final) {
    if (trim_) {
      const size_t n = buf_.find_first_not_of('\n');
      buf_.erase(0, n == std::string::npos ? buf_.size() : n);
      if (buf_.empty()) return false;
      trim_ = false;
    }
    // Llama 3 writes a call as the whole output: an object at the very start.
    if (f_.tools == ToolCallFormat::kLlama3Json && content_start_) {
      const size_t ws = std::find_if_not(buf_.begin(), buf_.end(), IsJsonSpace) - buf_.begin();
      if (ws == buf_.size() && !final) return false;
      if (ws < buf_.size() && buf_[ws] == '{') {
        StartBlock(buf_.substr(0, ws), "");
        buf_.erase(0, ws);
        return true;
      }
    }
    // The earliest tool-call marker, complete or (until the output ends) begun at the end.
    size_t marker_at = std::string::npos, region_end = buf_.size();
    std::string_view marker;
    for (std::string_view m : markers_) {
      size_t at = buf_.find(m);
      if (at == not_marker_at_) at = buf_.find(m, at + 1);
      if (at < marker_at) marker_at = at, marker = m;
      const size_t partial = final ? 0 : PartialSuffix(buf_, m);
      if (partial > 0) region_end = std::min(region_end, buf_.size() - partial);
    }
    region_end = std::min(region_end, marker_at);
    const std::string_view region = std::string_view(buf_).substr(0, region_end);
    // Stop sequences apply to content only: one must lie wholly before the markup. The one that
    // ends first wins (as streaming would see it first), the longer one on a tie.
    size_t stop_at = std::string::npos, stop_end = std::string::npos;
    std::string_view stop;
    for (std::string_view s : stops_) {
      const size_t at = region.find(s);
      if (at == std::string::npos) continue;
      if (at + s.size() < stop_end || (at + s.size() == stop_end && at < stop_at)) {
        stop_at = at, stop_end = at + s.size(), stop = s;
      }
    }
    if (stop_at != std::string::npos) {
      Emit(OutputEvent::Type::kText, region.substr(0, stop_at));
      OutputEvent e;
      e.type = OutputEvent::Type::kStop;
      e.text = stop;
      events_.push_back(std::move(e));
      mode_ = Mode::kStopped;
      buf_.clear();
      return true;
    }
    if (marker_at != std::string::npos && marker_at == region_end) {
      // Whitespace that separates content from a tool-call block is not content.
      size_t text_end = marker_at;
      while (text_end > 0 && IsJsonSpace(buf_[text_end - 1])) --text_end;
      Emit(OutputEvent::Type::kText, region.substr(0, text_end));
      StartBlock(buf_.substr(text_end, marker_at - text_end), std::string(marker));
      buf_.erase(0, marker_at + marker.size());
      not_marker_at_ = std::string::npos;
      return true;
    }
    size_t emit_end = region_end;
    if (!final) {
      for (std::string_view s : stops_) {
        emit_end = std::min(emit_end, region_end - PartialSuffix(region, s));
      }
      if (f_.tools != ToolCallFormat::kNone) {
        while (emit_end > 0 && IsJsonSpace(buf_[emit_end - 1])) --emit_end;
      }
    }
    if (emit_end == 0) return false;
    Emit(OutputEvent::Type::kText, region.substr(0, emit_end));
    buf_.erase(0, emit_end);
    content_start_ = false;
    not_marker_at_ = not_marker_at_ == std::string::npos || not_marker_at_ < emit_end
                         ? std::string::npos
                         : not_marker_at_ - emit_end;
    return true;
  }

  bool StepTool(bool final) {
    const ToolBlockParser::Result r = tool_->Feed(buf_, final, this);
    switch (r.status) {
      case ToolBlockParser::Status::kMore:
        buf_.erase(0, r.consumed);
        return r.consumed > 0;
      case ToolBlockParser::Status::kDone:
        buf_.erase(0, r.consumed);
        break;
      case ToolBlockParser::Status::kMalformed:
        // Not a call after all: the block, its opening markup and the whitespace before it
        // included, is content.
        buf_.insert(0, block_space_ + block_open_);
        not_marker_at_ = block_open_.empty() ? std::string::npos : block_space_.size();
        break;
    }
    tool_.reset();
    mode_ = Mode::kContent;
    trim_ = r.status == ToolBlockParser::Status::kDone;
    content_start_ = false;
    return true;
  }

  // `space`: the whitespace dropped before the block; `open`: the markup that opened it.
  void StartBlock(std::string space, std::string open) {
    tool_ = f_.tools == ToolCallFormat::kDeepSeekDsml ? MakeDsmlToolParser()
            : f_.tools == ToolCallFormat::kHermes     ? MakeJsonToolParser(kHermesClose, false)
                                                      : MakeJsonToolParser("", true);
    block_space_ = std::move(space);
    block_open_ = std::move(open);
    mode_ = Mode::kTool;
  }

  void Emit(OutputEvent::Type type, std::string_view text) {
    if (text.empty()) return;
    const int index = type == OutputEvent::Type::kToolCallArgs ? calls_ - 1 : 0;
    if (!events_.empty() && events_.back().type == type && events_.back().tool_index == index) {
      events_.back().text.append(text);
      return;
    }
    OutputEvent e;
    e.type = type;
    e.text = text;
    e.tool_index = index;
    events_.push_back(std::move(e));
  }

  const OutputFormat f_;
  std::vector<std::string> stops_;
  std::vector<std::string_view> markers_;  // what opens a tool-call block in content
  Mode mode_ = Mode::kContent;
  std::string buf_;  // text not decided yet
  std::vector<OutputEvent> events_;
  bool trim_ = false;  // drop newlines at the start of what follows
  bool content_start_ = true;
  // Where buf_ holds markup that turned out to be content (npos: nowhere).
  size_t not_marker_at_ = std::string::npos;
  std::unique_ptr<ToolBlockParser> tool_;
  std::string block_space_, block_open_;
  int calls_ = 0;
  bool finished_ = false;
};

OutputParser::OutputParser(OutputFormat format)
    : impl_(std::make_unique<Impl>(std::move(format))) {}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;
std::vector<OutputEvent> OutputParser::Push(std::string_view delta) { return impl_->Push(delta); }
std::vector<OutputEvent> OutputParser::Finish() { return impl_->Finish(); }
bool OutputParser::stopped() const { return impl_->stopped(); }
int OutputParser::tool_calls() const { return impl_->tool_calls(); }

ParsedOutput Accumulate(const std::vector<OutputEvent>& events) {
  ParsedOutput out;
  for (const OutputEvent& e : events) {
    switch (e.type) {
      case OutputEvent::Type::kText:
        out.content += e.text;
        break;
      case OutputEvent::Type::kReasoning:
        out.reasoning += e.text;
        break;
      case OutputEvent::Type::kToolCallBegin:
        out.tool_calls.push_back({e.id, e.name, ""});
        break;
      case OutputEvent::Type::kToolCallArgs:
        if (e.tool_index >= 0 && static_cast<size_t>(e.tool_index) < out.tool_calls.size()) {
          out.tool_calls[static_cast<size_t>(e.tool_index)].arguments += e.text;
        }
        break;
      case OutputEvent::Type::kToolCallEnd:
        break;
      case OutputEvent::Type::kStop:
        out.stop = e.text;
        break;
    }
  }
  return out;
}

ParsedOutput ParseOutput(const OutputFormat& format, std::string_view text) {
  OutputParser parser(format);
  std::vector<OutputEvent> events = parser.Push(text);
  for (OutputEvent& e : parser.Finish()) events.push_back(std::move(e));
  return Accumulate(events);
}

OutputFormat SelectOutputFormat(const ModelTraits& model, std::span<const PromptSegment> prompt) {
  OutputFormat f;
  const std::string& t = model.chat_template;
  auto mentions = [&](std::string_view s) { return t.find(s) != std::string::npos; };
  const bool dsv4 = model.deepseek_v4_encoding || model.architecture == "deepseek_v4";
  if (dsv4 || mentions(kDsml)) {
    f.tools = ToolCallFormat::kDeepSeekDsml;
  } else if (mentions(kHermesOpen)) {
    f.tools = ToolCallFormat::kHermes;
  } else if (mentions(kPythonTag) || (mentions("ipython") && mentions("\"parameters\""))) {
    f.tools = ToolCallFormat::kLlama3Json;
  }
  if (dsv4 || mentions(kThinkOpen) || mentions(kThinkClose)) f.reasoning = ReasoningFormat::kThink;

  // Only markup the template wrote counts.
  size_t at = 0, last_open = std::string::npos, last_close = std::string::npos;
  std::string_view last_trusted;
  std::string tail;  // the prompt's text after its last trusted segment
  for (const PromptSegment& s : prompt) {
    if (s.trusted) {
      if (size_t p = s.text.rfind(kThinkOpen); p != std::string::npos) last_open = at + p;
      if (size_t p = s.text.rfind(kThinkClose); p != std::string::npos) last_close = at + p;
      last_trusted = s.text;
      tail.clear();
    } else {
      tail += s.text;
    }
    at += s.text.size();
  }
  f.starts_in_reasoning = f.reasoning == ReasoningFormat::kThink &&
                          last_open != std::string::npos &&
                          (last_close == std::string::npos || last_close < last_open);
  const size_t tail_end = tail.find_last_not_of(" \n");
  const std::string_view opened =
      std::string_view(tail).substr(0, tail_end == std::string::npos ? 0 : tail_end + 1);
  f.starts_in_tool_calls = f.tools == ToolCallFormat::kDeepSeekDsml &&
                           last_trusted.ends_with(kDsml) &&
                           (opened == "tool_calls>" || opened == "function_calls>");
  return f;
}

}  // namespace dinfer::output
