// `dinfer tokenize`: text or a chat (rendered with the model's chat template) to token ids, and
// with --bench the time EncodeSegments takes at each thread count (bench/tokenize_vs_hf.py).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "base/thread_pool.h"
#include "model/loader.h"
#include "tokenizer/chat_template.h"
#include "tools/commands.h"

namespace dinfer::tools {

void AddTokenizeFlags(CLI::App& cmd, TokenizeArgs& a) {
  cmd.add_option("-m,--model", a.model,
                 "\"default\", an HF model directory or a .gguf file (its tokenizer is used)")
      ->capture_default_str();
  cmd.add_option("--tokenizer", a.tokenizer,
                 "an HF tokenizer directory or tokenizer.json instead of a model (no weights)");
  cmd.add_option("--text", a.text, "text to tokenize (special-token markup recognised)");
  cmd.add_option("--file", a.file, "file whose text to tokenize");
  cmd.add_option("--chat", a.chat,
                 "JSON file {\"messages\": [...], \"tools\": [...], \"documents\": [...], "
                 "\"add_generation_prompt\": true, \"continue_final_message\": false, "
                 "\"chat_template_kwargs\": {...}} rendered with the chat template");
  cmd.add_option("--chat-template", a.chat_template,
                 "Jinja file to render --chat with instead of the model's template");
  cmd.add_flag("--no-special", a.no_special, "treat special-token markup in the text as text");
  cmd.add_option("--text-out", a.text_out, "write the rendered chat prompt to this file");
  cmd.add_option("--ids-out", a.ids_out, "write the ids, comma-separated, to this file");
  cmd.add_flag("--bench", a.bench, "time the encoding at each --threads count");
  cmd.add_option("-t,--threads", a.threads, "thread counts to time, e.g. 1,2")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("-r,--repetitions", a.repetitions, "timed runs per thread count (median)")
      ->capture_default_str();
  cmd.add_option("--json", a.json, "write the --bench results as JSON to this file");
}

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// CPU time of the whole process (all threads): on a busy machine the single-thread figure that
// other jobs' load does not inflate.
double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const TokenizeArgs& a,
                                                              LoadedModel* model) {
  if (!a.tokenizer.empty()) return tokenizer::Tokenizer::FromTokenizerJsonFile(a.tokenizer);
  LoadOptions lo;
  lo.require_tokenizer = true;
  lo.show_progress = false;
  DINFER_ASSIGN_OR_RETURN(*model, LoadModel(a.model, lo));
  return std::move(model->tokenizer);
}

// The prompt as segments: a chat rendered by the template, or text (trusted, so its markup
// counts, unless --no-special).
StatusOr<std::vector<PromptSegment>> Prompt(const TokenizeArgs& a,
                                            const tokenizer::Tokenizer& tok) {
  if (a.chat.empty()) {
    std::string text = a.text;
    if (!a.file.empty()) {
      DINFER_ASSIGN_OR_RETURN(text, ReadFileToString(a.file));
    }
    return std::vector<PromptSegment>{{std::move(text), !a.no_special}};
  }
  DINFER_ASSIGN_OR_RETURN(std::string chat_text, ReadFileToString(a.chat));
  boost::json::error_code ec;
  const boost::json::value chat = boost::json::parse(chat_text, ec);
  if (ec || !chat.is_object() || !chat.as_object().contains("messages") ||
      !chat.at("messages").is_array()) {
    return InvalidArgument("{}: expected a JSON object with a \"messages\" array", a.chat);
  }
  const boost::json::object& c = chat.as_object();
  const bool has_tools = c.contains("tools") && !c.at("tools").is_null();
  // As transformers: a checkpoint's "tool_use" template serves requests with tools.
  std::string source = has_tools && !tok.tool_use_chat_template().empty()
                           ? tok.tool_use_chat_template()
                           : tok.chat_template();
  if (!a.chat_template.empty()) {
    DINFER_ASSIGN_OR_RETURN(source, ReadFileToString(a.chat_template));
  }
  if (source.empty()) return InvalidArgument("the tokenizer has no chat template: --chat-template");
  DINFER_ASSIGN_OR_RETURN(tokenizer::ChatTemplate tmpl, tokenizer::ChatTemplate::Parse(source));
  tokenizer::ChatRenderOptions o;
  if (const auto* v = c.if_contains("tools")) o.tools = *v;
  if (const auto* v = c.if_contains("documents")) o.documents = *v;
  if (const auto* v = c.if_contains("continue_final_message"); v && v->is_bool()) {
    o.continue_final_message = v->as_bool();
    o.add_generation_prompt = false;
  }
  if (const auto* v = c.if_contains("add_generation_prompt"); v && v->is_bool()) {
    o.add_generation_prompt = v->as_bool();
  }
  if (const auto* v = c.if_contains("chat_template_kwargs"); v && v->is_object()) {
    o.kwargs = v->as_object();
  }
  if (tok.bos_id()) o.bos_token = tok.TokenBytes(*tok.bos_id());
  if (!tok.eos_ids().empty()) o.eos_token = tok.TokenBytes(tok.eos_ids().front());
  // As a server prepares a request: arguments given as JSON text parsed, text parts joined for
  // templates that read strings.
  boost::json::array messages = c.at("messages").as_array();
  DINFER_RETURN_IF_ERROR(tokenizer::ParseToolCallArguments(&messages));
  if (tmpl.content_format() == tokenizer::ContentFormat::kString) {
    DINFER_RETURN_IF_ERROR(tokenizer::FlattenTextContent(&messages));
  }
  return tmpl.Render(messages, o);
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  return static_cast<bool>(f);
}

}  // namespace

int RunTokenize(const TokenizeArgs& a) {
  const int inputs = !a.text.empty() + !a.file.empty() + !a.chat.empty();
  if (inputs != 1) {
    std::fprintf(stderr, "dinfer tokenize: give exactly one of --text, --file or --chat\n");
    return 2;
  }
  LoadedModel model;
  auto tok = LoadTokenizer(a, &model);
  if (!tok.ok()) {
    std::fprintf(stderr, "dinfer tokenize: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  const auto prompt_start = Clock::now();
  auto segments = Prompt(a, **tok);
  const double prompt_ms = Ms(prompt_start, Clock::now());
  if (!segments.ok()) {
    std::fprintf(stderr, "dinfer tokenize: %s\n", segments.status().ToString().c_str());
    return 1;
  }
  const std::vector<int32_t> ids = (*tok)->EncodeSegments(*segments);
  std::string id_text;
  for (size_t i = 0; i < ids.size(); ++i) id_text += (i ? "," : "") + std::to_string(ids[i]);
  const std::string text = tokenizer::ChatTemplate::Join(*segments);
  if (!a.text_out.empty() && !WriteFile(a.text_out, text)) {
    std::fprintf(stderr, "dinfer tokenize: cannot write %s\n", a.text_out.c_str());
    return 1;
  }
  if (!a.ids_out.empty() && !WriteFile(a.ids_out, id_text + "\n")) {
    std::fprintf(stderr, "dinfer tokenize: cannot write %s\n", a.ids_out.c_str());
    return 1;
  }
  if (!a.bench) {
    if (a.ids_out.empty()) std::printf("%s\n", id_text.c_str());
    return 0;
  }

  boost::json::array runs;
  for (int threads : a.threads) {
    ThreadPool pool(std::max(1, threads));
    std::vector<double> ms, cpu_ms;
    for (int r = 0; r <= a.repetitions; ++r) {  // the first run warms caches and is not kept
      const double cpu_start = ProcessCpuMs();
      const auto start = Clock::now();
      const std::vector<int32_t> again = (*tok)->EncodeSegments(*segments, &pool);
      const auto end = Clock::now();
      const double cpu = ProcessCpuMs() - cpu_start;
      if (again != ids) {
        std::fprintf(stderr, "dinfer tokenize: %d threads gave other ids\n", threads);
        return 1;
      }
      if (r > 0) {
        ms.push_back(Ms(start, end));
        cpu_ms.push_back(cpu);
      }
    }
    const double median = Median(ms);
    std::printf("threads %d: %.2f ms median of %d (%.0f tokens/ms), CPU %.2f ms\n", threads, median,
                a.repetitions, static_cast<double>(ids.size()) / median, Median(cpu_ms));
    runs.push_back({{"threads", threads},
                    {"median_ms", median},
                    {"min_ms", *std::min_element(ms.begin(), ms.end())},
                    {"median_cpu_ms", Median(cpu_ms)},
                    {"runs_ms", boost::json::value_from(ms)},
                    {"runs_cpu_ms", boost::json::value_from(cpu_ms)}});
  }
  std::printf("%zu tokens, %zu bytes; reading and rendering the prompt %.2f ms\n", ids.size(),
              text.size(), prompt_ms);
  if (!a.json.empty()) {
    boost::json::object out{{"tokens", ids.size()},
                            {"bytes", text.size()},
                            {"segments", segments->size()},
                            {"prompt_ms", prompt_ms},
                            {"hardware_threads", DefaultThreadCount()},
                            {"encode", runs}};
    if (!WriteFile(a.json, boost::json::serialize(out) + "\n")) {
      std::fprintf(stderr, "dinfer tokenize: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace dinfer::tools
