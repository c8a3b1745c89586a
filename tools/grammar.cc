// `dinfer grammar`: compile a constraint and print its statistics, match a text against it token by
// token, and benchmark compile and mask times over a folder of JSON Schemas.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "model/loader.h"
#include "structured/compiler.h"
#include "structured/constraint.h"
#include "structured/matcher.h"
#include "tools/commands.h"

namespace dinfer::tools {
namespace {

namespace fs = std::filesystem;
using structured::CompiledGrammar;
using structured::Constraint;
using structured::ConstraintKind;

constexpr int kExitRejected = 1;
constexpr int kExitUnsupported = 2;
constexpr int kExitUsage = 3;

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the calling thread: on a shared machine it does not count time spent descheduled.
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

void AddConstraintFlags(CLI::App& cmd, GrammarArgs& a) {
  cmd.add_option("--json-schema", a.json_schema, "file holding a JSON Schema");
  cmd.add_flag("--json-object", a.json_object, "any JSON object");
  cmd.add_option("--regex", a.regex, "a regular expression the whole text must match");
  cmd.add_option("--ebnf", a.ebnf, "file holding a GBNF or W3C EBNF grammar (root: 'root')");
  cmd.add_option("--choice", a.choices, "one of these strings (repeat the flag)");
  cmd.add_option("--max-whitespace", a.max_whitespace,
                 "JSON: whitespace bytes allowed at each place JSON allows them (-1: unbounded)")
      ->capture_default_str();
}

void AddTokenizerFlags(CLI::App& cmd, GrammarArgs& a) {
  cmd.add_option("-m,--model", a.model,
                 "model whose tokenizer is used: \"default\", an HF directory or a .gguf file")
      ->capture_default_str();
  cmd.add_option("--tokenizer", a.tokenizer,
                 "a tokenizer.json (or its directory) instead of a model's tokenizer");
}

StatusOr<Constraint> ConstraintFromArgs(const GrammarArgs& a) {
  Constraint c;
  c.json.max_whitespace = a.max_whitespace;
  const int given = !a.json_schema.empty() + a.json_object + !a.regex.empty() + !a.ebnf.empty() +
                    !a.choices.empty();
  if (given != 1) {
    return InvalidArgument(
        "give exactly one of --json-schema, --json-object, --regex, --ebnf, --choice");
  }
  if (!a.json_schema.empty()) {
    c.kind = ConstraintKind::kJsonSchema;
    DINFER_ASSIGN_OR_RETURN(c.text, ReadFileToString(a.json_schema));
  } else if (a.json_object) {
    c.kind = ConstraintKind::kJsonObject;
  } else if (!a.regex.empty()) {
    c.kind = ConstraintKind::kRegex;
    c.text = a.regex;
  } else if (!a.ebnf.empty()) {
    c.kind = ConstraintKind::kGrammar;
    DINFER_ASSIGN_OR_RETURN(c.text, ReadFileToString(a.ebnf));
  } else {
    c.kind = ConstraintKind::kChoice;
    c.choices = a.choices;
  }
  return c;
}

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const GrammarArgs& a) {
  if (!a.tokenizer.empty()) return tokenizer::Tokenizer::FromTokenizerJsonFile(a.tokenizer);
  DINFER_ASSIGN_OR_RETURN(LoadedModel m,
                          LoadModel(a.model, {.show_progress = false, .require_tokenizer = true}));
  return std::move(m.tokenizer);
}

int RunCompile(const GrammarArgs& a) {
  auto c = ConstraintFromArgs(a);
  if (!c.ok()) {
    std::fprintf(stderr, "dinfer grammar: %s\n", c.status().message().c_str());
    return kExitUsage;
  }
  auto tok = LoadTokenizer(a);
  if (!tok.ok()) {
    std::fprintf(stderr, "dinfer grammar: %s\n", tok.status().ToString().c_str());
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto grammar = structured::BuildGrammar(*c);
  if (!grammar.ok()) {
    std::fprintf(stderr, "unsupported: %s\n", grammar.status().ToString().c_str());
    return kExitUnsupported;
  }
  const double translate_ms = MsSince(t0);
  if (a.print_grammar) std::printf("%s\n", grammar->ToString().c_str());
  structured::GrammarCompiler compiler(structured::TokenIndex::FromTokenizer(**tok));
  auto compiled = compiler.Compile(*grammar);
  if (!compiled.ok()) {
    std::fprintf(stderr, "unsupported: %s\n", compiled.status().ToString().c_str());
    return kExitUnsupported;
  }
  const structured::GrammarStats& s = (*compiled)->stats();
  std::printf(
      "supported\nrules: %d\nstates: %d\ntransitions: %lld\nstates that consume bytes: %d (%d "
      "masked at compile time, the rest on first use)\nmask memory: %.1f KiB\ntranslate: %.3f "
      "ms\nautomaton: %.3f ms\nmasks: %.3f ms (the first grammar of a tokenizer also computes the "
      "shared string and whitespace masks)\n",
      s.rules, s.states, static_cast<long long>(s.transitions), s.mask_states, s.eager_states,
      static_cast<double>(s.mask_bytes) / 1024.0, translate_ms, s.build_ms, s.mask_ms);
  return 0;
}

int RunMatch(const GrammarArgs& a) {
  auto c = ConstraintFromArgs(a);
  if (!c.ok()) {
    std::fprintf(stderr, "dinfer grammar: %s\n", c.status().message().c_str());
    return kExitUsage;
  }
  auto text = ReadFileToString(a.text_file);
  // The line break that ends a text file is not part of the text.
  if (text.ok() && text->ends_with('\n'))
    text->resize(text->size() - (text->ends_with("\r\n") ? 2 : 1));
  auto tok = LoadTokenizer(a);
  if (!text.ok() || !tok.ok()) {
    std::fprintf(stderr, "dinfer grammar: %s\n",
                 (!text.ok() ? text.status() : tok.status()).ToString().c_str());
    return kExitUsage;
  }
  auto grammar = structured::BuildGrammar(*c);
  structured::GrammarCompiler compiler(structured::TokenIndex::FromTokenizer(**tok));
  const StatusOr<std::shared_ptr<const CompiledGrammar>> compiled =
      grammar.ok() ? compiler.Compile(*grammar)
                   : StatusOr<std::shared_ptr<const CompiledGrammar>>(grammar.status());
  if (!compiled.ok()) {
    std::fprintf(stderr, "unsupported: %s\n", compiled.status().ToString().c_str());
    return kExitUnsupported;
  }
  structured::Matcher m(*compiled);
  std::vector<uint32_t> mask(structured::BitmaskWords(m.vocab_size()));
  const std::vector<int32_t> ids = (*tok)->Encode(*text, false);
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    m.FillNextTokenBitmask(mask.data());
    const bool allowed = structured::TestBit(mask.data(), ids[i]);
    if (!allowed || !m.AcceptToken(ids[i])) {
      std::fprintf(stderr, "rejected: token %zu (%d, '%s') at byte %zu\n", i, ids[i],
                   (*tok)->TokenBytes(ids[i]).c_str(), offset);
      return kExitRejected;
    }
    offset += (*tok)->TokenBytes(ids[i]).size();
  }
  if (!m.IsCompleted()) {
    std::fprintf(stderr, "rejected: the text ends before the grammar allows it to\n");
    return kExitRejected;
  }
  std::printf("valid: %zu tokens\n", ids.size());
  return 0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

int RunBenchDir(const GrammarArgs& a) {
  auto tok = LoadTokenizer(a);
  if (!tok.ok()) {
    std::fprintf(stderr, "dinfer grammar: %s\n", tok.status().ToString().c_str());
    return kExitUsage;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(a.dir)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (a.per_folder_limit > 0) {
    std::map<fs::path, int> taken;
    std::erase_if(files,
                  [&](const fs::path& f) { return ++taken[f.parent_path()] > a.per_folder_limit; });
  }
  if (a.limit > 0 && files.size() > static_cast<size_t>(a.limit)) files.resize(a.limit);
  // Token ids of a valid instance per schema (relative path), to walk while timing masks.
  std::map<std::string, std::vector<int32_t>> instances;
  if (!a.instances.empty()) {
    std::ifstream in(a.instances);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const boost::json::object o = boost::json::parse(line).as_object();
      std::vector<int32_t> ids;
      for (const auto& x : o.at("ids").as_array())
        ids.push_back(static_cast<int32_t>(x.to_number<int64_t>()));
      instances[std::string(o.at("file").as_string())] = std::move(ids);
    }
  }
  const auto t_setup = std::chrono::steady_clock::now();
  structured::GrammarCompiler compiler(structured::TokenIndex::FromTokenizer(**tok));
  // Masks every JSON grammar shares (strings, whitespace) are computed once per tokenizer.
  structured::Constraint warm;
  warm.kind = structured::ConstraintKind::kJsonObject;
  warm.json.max_whitespace = a.max_whitespace;
  (void)compiler.Compile(*structured::BuildGrammar(warm));
  const double setup_ms = MsSince(t_setup);

  boost::json::array records;
  std::vector<double> compile_ms, mask_us, compile_cpu_ms, mask_cpu_us;
  int compiled_count = 0, walked = 0, accepted = 0;
  for (const fs::path& file : files) {
    const std::string rel = fs::relative(file, a.dir).string();
    boost::json::object rec;
    rec["file"] = rel;
    auto text = ReadFileToString(file.string());
    if (!text.ok()) continue;
    structured::Constraint c;
    c.text = *text;
    c.json.max_whitespace = a.max_whitespace;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuMs();
    auto grammar = structured::BuildGrammar(c);
    const StatusOr<std::shared_ptr<const CompiledGrammar>> compiled =
        grammar.ok() ? compiler.Compile(*grammar)
                     : StatusOr<std::shared_ptr<const CompiledGrammar>>(grammar.status());
    const double ms = MsSince(t0);
    const double cpu_ms = ThreadCpuMs() - c0;
    rec["compile_ms"] = ms;
    rec["compile_cpu_ms"] = cpu_ms;
    rec["ok"] = compiled.ok();
    if (!compiled.ok()) {
      rec["error"] = compiled.status().ToString();
      records.push_back(std::move(rec));
      continue;
    }
    ++compiled_count;
    compile_ms.push_back(ms);
    compile_cpu_ms.push_back(cpu_ms);
    rec["states"] = (*compiled)->stats().states;
    auto inst = instances.find(rel);
    if (inst != instances.end()) {
      ++walked;
      structured::Matcher m(*compiled);
      std::vector<uint32_t> mask(structured::BitmaskWords(m.vocab_size()));
      boost::json::array times, cpu_times;
      bool ok = true;
      for (int32_t id : inst->second) {
        const auto m0 = std::chrono::steady_clock::now();
        const double cm0 = ThreadCpuMs();
        m.FillNextTokenBitmask(mask.data());
        const double cpu_us = (ThreadCpuMs() - cm0) * 1000.0;
        const double us = MsSince(m0) * 1000.0;
        times.push_back(us);
        cpu_times.push_back(cpu_us);
        mask_us.push_back(us);
        mask_cpu_us.push_back(cpu_us);
        if (!structured::TestBit(mask.data(), id) || !m.AcceptToken(id)) {
          ok = false;
          break;
        }
      }
      ok = ok && m.IsCompleted();
      accepted += ok;
      rec["instance_accepted"] = ok;
      rec["mask_us"] = std::move(times);
      rec["mask_cpu_us"] = std::move(cpu_times);
    }
    records.push_back(std::move(rec));
  }
  auto mean_of = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  boost::json::object summary{
      {"schemas", files.size()},
      {"compiled", compiled_count},
      {"compiled_share", files.empty() ? 0.0 : static_cast<double>(compiled_count) / files.size()},
      {"tokenizer_setup_ms", setup_ms},
      {"compile_ms_median", Percentile(compile_ms, 0.5)},
      {"compile_ms_p99", Percentile(compile_ms, 0.99)},
      {"compile_ms_mean", mean_of(compile_ms)},
      {"compile_cpu_ms_median", Percentile(compile_cpu_ms, 0.5)},
      {"compile_cpu_ms_p99", Percentile(compile_cpu_ms, 0.99)},
      {"instances_walked", walked},
      {"instances_accepted", accepted},
      {"mask_tokens", mask_us.size()},
      {"mask_us_mean", mean_of(mask_us)},
      {"mask_us_p50", Percentile(mask_us, 0.5)},
      {"mask_us_p99", Percentile(mask_us, 0.99)},
      {"mask_us_max", Percentile(mask_us, 1.0)},
      {"mask_cpu_us_mean", mean_of(mask_cpu_us)},
      {"mask_cpu_us_p99", Percentile(mask_cpu_us, 0.99)},
  };
  std::printf("%s\n", boost::json::serialize(summary).c_str());
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << boost::json::serialize(boost::json::object{{"summary", summary}, {"schemas", records}});
  }
  return 0;
}

}  // namespace

void AddGrammarCommands(CLI::App& cmd, GrammarArgs& a) {
  cmd.require_subcommand(1);
  CLI::App* compile = cmd.add_subcommand(
      "compile", "Compile a constraint; print its statistics, or why it is unsupported (exit 2)");
  AddConstraintFlags(*compile, a);
  AddTokenizerFlags(*compile, a);
  compile->add_flag("--print-grammar", a.print_grammar, "print the grammar's rules");
  compile->callback([&a] { a.command = "compile"; });

  CLI::App* match = cmd.add_subcommand(
      "match",
      "Walk a text token by token: exit 0 if it is a complete valid instance, 1 if rejected, 2 if "
      "the constraint is unsupported (reason on stderr)");
  AddConstraintFlags(*match, a);
  AddTokenizerFlags(*match, a);
  match->add_option("--text-file", a.text_file, "the text to check (a final line break is ignored)")
      ->required();
  match->callback([&a] { a.command = "match"; });

  CLI::App* bench = cmd.add_subcommand(
      "bench", "Compile every JSON Schema under a folder; time masks along valid instances");
  bench->add_option("dir", a.dir, "folder of *.json schemas")->required();
  AddTokenizerFlags(*bench, a);
  bench->add_option("--instances", a.instances,
                    "JSONL of {\"file\": path relative to dir, \"ids\": [token ids]} to walk");
  bench->add_option("--json", a.json, "write every schema's figures and the summary here");
  bench->add_option("--limit", a.limit, "only the first N schemas (0: all)");
  bench->add_option("--per-folder-limit", a.per_folder_limit,
                    "only the first N schemas of each folder (0: all)");
  bench->add_option("--max-whitespace", a.max_whitespace, "JSON whitespace limit")
      ->capture_default_str();
  bench->callback([&a] { a.command = "bench"; });
}

int RunGrammar(const GrammarArgs& a) {
  if (a.command == "compile") return RunCompile(a);
  if (a.command == "match") return RunMatch(a);
  return RunBenchDir(a);
}

}  // namespace dinfer::tools
