// Python bindings (module dinfer._dinfer) over the public C++ Engine API. Waiting on a request
// stream releases the GIL, so Python threads and the engine run concurrently.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dinfer/engine.h"

namespace py = pybind11;

namespace {

template <typename T>
T Unwrap(dinfer::StatusOr<T> v) {
  if (!v.ok()) {
    const auto code = v.status().code();
    if (code == dinfer::StatusCode::kInvalidArgument || code == dinfer::StatusCode::kOutOfRange) {
      throw py::value_error(v.status().message());
    }
    if (code == dinfer::StatusCode::kNotFound) throw py::key_error(v.status().message());
    throw std::runtime_error(v.status().ToString());
  }
  return std::move(v).value();
}

}  // namespace

PYBIND11_MODULE(_dinfer, m) {
  m.doc() = "dinfer: LLM inference engine (C++ core)";

  py::class_<dinfer::EngineOptions>(m, "EngineOptions")
      .def(py::init<>())
      .def_readwrite("model", &dinfer::EngineOptions::model)
      .def_readwrite("threads", &dinfer::EngineOptions::threads)
      .def_readwrite("kv_cache_mib", &dinfer::EngineOptions::kv_cache_mib)
      .def_readwrite("block_size", &dinfer::EngineOptions::block_size)
      .def_readwrite("max_num_seqs", &dinfer::EngineOptions::max_num_seqs)
      .def_readwrite("max_num_batched_tokens", &dinfer::EngineOptions::max_num_batched_tokens)
      .def_readwrite("max_model_len", &dinfer::EngineOptions::max_model_len)
      .def_readwrite("enable_prefix_caching", &dinfer::EngineOptions::enable_prefix_caching)
      .def_readwrite("swa_replay_tokens", &dinfer::EngineOptions::swa_replay_tokens)
      .def_readwrite("f32_activations", &dinfer::EngineOptions::f32_activations)
      .def_readwrite("step_time_budget_ms", &dinfer::EngineOptions::step_time_budget_ms)
      .def_readwrite("cost_profile", &dinfer::EngineOptions::cost_profile)
      .def_readwrite("show_progress", &dinfer::EngineOptions::show_progress)
      .def_readwrite("device", &dinfer::EngineOptions::device)
      .def_readwrite("kv_cache_dtype", &dinfer::EngineOptions::kv_cache_dtype)
      .def_readwrite("kv_cache_scale", &dinfer::EngineOptions::kv_cache_scale)
      .def_readwrite("quantization", &dinfer::EngineOptions::quantization)
      .def_readwrite("num_speculative_tokens", &dinfer::EngineOptions::num_speculative_tokens)
      .def_readwrite("speculative_min_confidence",
                     &dinfer::EngineOptions::speculative_min_confidence)
      .def_readwrite("speculative_min_acceptance",
                     &dinfer::EngineOptions::speculative_min_acceptance);

  py::class_<dinfer::StructuredOutput>(m, "StructuredOutput")
      .def(py::init<>())
      .def_readwrite("type", &dinfer::StructuredOutput::type)
      .def_readwrite("value", &dinfer::StructuredOutput::value)
      .def_readwrite("choices", &dinfer::StructuredOutput::choices)
      .def_readwrite("max_whitespace", &dinfer::StructuredOutput::max_whitespace);

  py::class_<dinfer::SamplingParams>(m, "SamplingParams")
      .def(py::init<>())
      .def_readwrite("temperature", &dinfer::SamplingParams::temperature)
      .def_readwrite("top_p", &dinfer::SamplingParams::top_p)
      .def_readwrite("top_k", &dinfer::SamplingParams::top_k)
      .def_readwrite("min_p", &dinfer::SamplingParams::min_p)
      .def_readwrite("seed", &dinfer::SamplingParams::seed)
      .def_readwrite("max_tokens", &dinfer::SamplingParams::max_tokens)
      .def_readwrite("stop_token_ids", &dinfer::SamplingParams::stop_token_ids)
      .def_readwrite("ignore_eos", &dinfer::SamplingParams::ignore_eos)
      .def_readwrite("skip_special_tokens", &dinfer::SamplingParams::skip_special_tokens)
      .def_readwrite("repetition_penalty", &dinfer::SamplingParams::repetition_penalty)
      .def_readwrite("presence_penalty", &dinfer::SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &dinfer::SamplingParams::frequency_penalty)
      .def_readwrite("logit_bias", &dinfer::SamplingParams::logit_bias)
      .def_readwrite("min_tokens", &dinfer::SamplingParams::min_tokens)
      .def_readwrite("logprobs", &dinfer::SamplingParams::logprobs)
      .def_readwrite("n", &dinfer::SamplingParams::n)
      .def_readwrite("structured", &dinfer::SamplingParams::structured);

  py::class_<dinfer::TokenLogprob>(m, "TokenLogprob")
      .def_readonly("token", &dinfer::TokenLogprob::token)
      .def_readonly("logprob", &dinfer::TokenLogprob::logprob)
      .def_readonly("top", &dinfer::TokenLogprob::top);

  py::class_<dinfer::RequestSpec>(m, "RequestSpec")
      .def(py::init<>())
      .def_readwrite("prompt", &dinfer::RequestSpec::prompt)
      .def_readwrite("prompt_ids", &dinfer::RequestSpec::prompt_ids)
      .def_readwrite("sampling", &dinfer::RequestSpec::sampling)
      .def_readwrite("priority", &dinfer::RequestSpec::priority)
      .def_readwrite("cache_salt", &dinfer::RequestSpec::cache_salt);

  py::class_<dinfer::RequestOutput>(m, "RequestOutput")
      .def_readonly("request_id", &dinfer::RequestOutput::request_id)
      .def_readonly("index", &dinfer::RequestOutput::index)
      .def_readonly("token_ids", &dinfer::RequestOutput::token_ids)
      .def_readonly("logprobs", &dinfer::RequestOutput::logprobs)
      .def_property_readonly(
          "text",
          [](const dinfer::RequestOutput& o) {
            // Complete UTF-8 by construction; replace defensively.
            return py::str(PyUnicode_DecodeUTF8(o.text.data(), o.text.size(), "replace"));
          })
      .def_readonly("finished", &dinfer::RequestOutput::finished)
      .def_readonly("finish_reason", &dinfer::RequestOutput::finish_reason)
      .def_readonly("error", &dinfer::RequestOutput::error)
      .def_readonly("prompt_tokens", &dinfer::RequestOutput::prompt_tokens)
      .def_readonly("cached_prompt_tokens", &dinfer::RequestOutput::cached_prompt_tokens);

  py::class_<dinfer::RequestStream, std::shared_ptr<dinfer::RequestStream>>(m, "RequestStream")
      .def_property_readonly("id", &dinfer::RequestStream::id)
      .def("next", &dinfer::RequestStream::Next, py::call_guard<py::gil_scoped_release>(),
           "Blocks for the next output; None after the last one");

  py::class_<dinfer::EngineStatsSnapshot>(m, "EngineStats")
      .def_readonly("running", &dinfer::EngineStatsSnapshot::running)
      .def_readonly("waiting", &dinfer::EngineStatsSnapshot::waiting)
      .def_readonly("steps", &dinfer::EngineStatsSnapshot::steps)
      .def_readonly("prompt_tokens", &dinfer::EngineStatsSnapshot::prompt_tokens)
      .def_readonly("generated_tokens", &dinfer::EngineStatsSnapshot::generated_tokens)
      .def_readonly("preemptions", &dinfer::EngineStatsSnapshot::preemptions)
      .def_readonly("kv_usage", &dinfer::EngineStatsSnapshot::kv_usage)
      .def_readonly("prefix_queries", &dinfer::EngineStatsSnapshot::prefix_queries)
      .def_readonly("prefix_hits", &dinfer::EngineStatsSnapshot::prefix_hits)
      .def_readonly("prefix_replay_tokens", &dinfer::EngineStatsSnapshot::prefix_replay_tokens)
      .def_readonly("draft_tokens", &dinfer::EngineStatsSnapshot::draft_tokens)
      .def_readonly("accepted_draft_tokens", &dinfer::EngineStatsSnapshot::accepted_draft_tokens)
      .def_readonly("low_confidence_drafts", &dinfer::EngineStatsSnapshot::low_confidence_drafts)
      .def_readonly("paused_drafts", &dinfer::EngineStatsSnapshot::paused_drafts);

  py::class_<dinfer::Engine>(m, "Engine")
      .def(py::init([](const dinfer::EngineOptions& o) {
             py::gil_scoped_release release;
             return Unwrap(dinfer::Engine::Create(o));
           }),
           py::arg("options"))
      .def("submit",
           [](dinfer::Engine& e, const dinfer::RequestSpec& r) { return Unwrap(e.Submit(r)); })
      .def("abort", &dinfer::Engine::Abort)
      .def("stats", &dinfer::Engine::Stats)
      .def("encode",
           [](const dinfer::Engine& e, const std::string& t) { return Unwrap(e.Encode(t)); })
      .def("decode", &dinfer::Engine::Decode)
      .def_property_readonly("vocab_size", &dinfer::Engine::vocab_size);
}
