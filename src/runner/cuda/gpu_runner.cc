#include "runner/cuda/gpu_runner.h"

#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/sampling.h"

namespace dinfer {
namespace {

namespace kc = kernels::cuda;

// A chunk this long or longer uses the tensor-core prefill kernel (when the dtype and head size
// allow); shorter ones, like decode tokens, the one-token kernel.
constexpr int64_t kMinPrefillTokens = 16;

size_t Align(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

StatusOr<std::unique_ptr<GpuRunner>> GpuRunner::Create(std::unique_ptr<GpuModel> model,
                                                       const GpuRunnerOptions& options) {
  std::unique_ptr<GpuRunner> r(new GpuRunner());
  GpuRunnerOptions& o = r->options_;
  o = options;
  if (o.block_size <= 0 || o.max_seq_len <= 0 || o.max_num_tokens <= 0 || o.max_num_seqs <= 0) {
    return InvalidArgument("GPU runner options must be positive");
  }
  r->width_ = (o.max_seq_len + o.block_size - 1) / o.block_size;
  if (o.num_blocks <= 0) o.num_blocks = r->width_;
  if (o.max_logits_rows <= 0) o.max_logits_rows = o.max_num_seqs;
  r->model_ = std::move(model);
  DINFER_ASSIGN_OR_RETURN(const int device, cuda::CurrentDevice());
  DINFER_ASSIGN_OR_RETURN(r->device_, cuda::GetDeviceInfo(device));
  if (r->device_.sm_major != 9 || r->device_.sm_minor != 0) {
    return Unimplemented("the CUDA kernels are built for Hopper (sm_90a); {} is sm_{}{}",
                         r->device_.name, r->device_.sm_major, r->device_.sm_minor);
  }
  DINFER_ASSIGN_OR_RETURN(r->stream_, cuda::Stream::Create());

  const ModelConfig& c = r->model_->config();
  const bool fp8 = o.kv_cache_dtype == DType::kF8E4M3;
  if (fp8 && (!r->model_->dense_attention() || r->model_->dtype() != DType::kBF16 ||
              !kc::PrefillSupports(DType::kBF16, c.head_dim) || !(o.kv_scale > 0.0f))) {
    return InvalidArgument(
        "an FP8 KV cache needs dense attention, bf16 weights, head_dim 64 or 128 and a positive "
        "scale (got {}, {}, {})",
        DTypeName(r->model_->dtype()), c.head_dim, o.kv_scale);
  }
  // Each group's blocks and one sink block after them; each plane of each layer its own run.
  r->groups_ = r->model_->KvGroupsFor(o.block_size);
  if (r->groups_.size() > static_cast<size_t>(kMaxGpuKvGroups)) {
    return Unimplemented("{} KV groups (the GPU runner has at most {})", r->groups_.size(),
                         kMaxGpuKvGroups);
  }
  if (!o.group_num_blocks.empty() && o.group_num_blocks.size() != r->groups_.size()) {
    return InvalidArgument("blocks for {} KV groups given, but the model has {}",
                           o.group_num_blocks.size(), r->groups_.size());
  }
  for (size_t g = 0; g < r->groups_.size(); ++g) {
    r->group_blocks_.push_back(o.group_num_blocks.empty() ? o.num_blocks : o.group_num_blocks[g]);
  }
  o.num_blocks = r->group_blocks_[0];
  const KvLayout layout =
      r->model_->KvLayoutFor(o.block_size, fp8 ? DType::kF8E4M3 : r->model_->dtype());
  auto plane_bytes = [&](const KvPlane& p) {
    return static_cast<size_t>((r->group_blocks_[static_cast<size_t>(p.group)] + 1) *
                               p.rows_per_block * RowBytes(p.dtype, p.width));
  };
  size_t total = 0;
  for (const auto& planes : layout) {
    for (const KvPlane& p : planes) total += Align(plane_bytes(p));
  }
  DINFER_ASSIGN_OR_RETURN(r->kv_memory_, cuda::DeviceBuffer::Allocate(total));
  r->kv_.block_size = o.block_size;
  r->kv_.fp8 = fp8;
  r->kv_.k_scale = r->kv_.v_scale = o.kv_scale;
  char* at = static_cast<char*>(r->kv_memory_.data());
  for (const auto& planes : layout) {
    std::vector<void*>& ptrs = r->kv_.planes.emplace_back();
    for (const KvPlane& p : planes) {
      ptrs.push_back(at);
      at += Align(plane_bytes(p));
    }
    if (r->model_->dense_attention()) {
      r->kv_.k.push_back(ptrs[0]);
      r->kv_.v.push_back(ptrs[1]);
    }
  }

  const int64_t max_seqs = r->Bucket(o.max_num_seqs);
  const int64_t max_tokens = o.max_num_tokens + max_seqs;  // padding adds one token a sequence
  const int64_t max_logits = std::max(o.max_logits_rows, max_seqs);
  DINFER_RETURN_IF_ERROR(r->model_->Reserve(
      max_tokens, max_logits, c.num_heads * 4 * r->device_.multiprocessors, o.max_seq_len));
  const Layout cap =
      r->LayoutFor(max_tokens, max_seqs, max_tokens, max_tokens / kc::kPrefillTileTokens + max_seqs,
                   max_logits, r->width_);
  for (int i = 0; i < 2; ++i) {
    DINFER_ASSIGN_OR_RETURN(r->stage_[i], cuda::PinnedBuffer::Allocate(cap.total));
    DINFER_ASSIGN_OR_RETURN(r->stage_free_[i], cuda::Event::Create());
  }
  DINFER_ASSIGN_OR_RETURN(r->plan_, cuda::DeviceBuffer::Allocate(cap.total));
  DINFER_ASSIGN_OR_RETURN(
      r->logits_,
      cuda::DeviceBuffer::Allocate(static_cast<size_t>(max_logits * c.vocab_size * sizeof(float))));
  DINFER_ASSIGN_OR_RETURN(
      r->greedy_, cuda::DeviceBuffer::Allocate(static_cast<size_t>(max_logits) * sizeof(int32_t)));
  DINFER_ASSIGN_OR_RETURN(r->greedy_host_, cuda::PinnedBuffer::Allocate(
                                               static_cast<size_t>(max_logits) * sizeof(int32_t)));
  DINFER_ASSIGN_OR_RETURN(r->done_, cuda::Event::Create());
  return r;
}

int64_t GpuRunner::GroupWidth(size_t g, int64_t width) const {
  const int64_t tokens = groups_[g].block_size;
  return std::max<int64_t>(1, (width * options_.block_size + tokens - 1) / tokens);
}

int64_t GpuRunner::Bucket(int64_t n) const {
  if (n <= 8) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b;
  }
  const int64_t step = n <= 64 ? 8 : (n <= 256 ? 32 : 64);
  return (n + step - 1) / step * step;
}

GpuRunner::Layout GpuRunner::LayoutFor(int64_t tokens, int64_t seqs, int64_t rows, int64_t tiles,
                                       int64_t logits, int64_t width) const {
  Layout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t begin = at;
    at = Align(at + bytes);
    return begin;
  };
  const auto n = static_cast<size_t>(tokens);
  l.tokens = take(n * 4);
  l.positions = take(n * 4);
  l.token_seq = take(n * 4);
  l.slots = take(n * 8);
  l.seq_end = take(static_cast<size_t>(seqs) * 4);
  l.tables = take(static_cast<size_t>(seqs * width) * 4);
  l.logits_rows = take(static_cast<size_t>(logits) * 4);
  l.row_tokens = take(static_cast<size_t>(rows) * 4);
  l.tile_seq = take(static_cast<size_t>(tiles) * 4);
  l.tile_token = take(static_cast<size_t>(tiles) * 4);
  l.replay_end = take(static_cast<size_t>(seqs) * 4);
  for (size_t g = 0; g < static_cast<size_t>(kMaxGpuKvGroups); ++g) {
    l.group_tables[g] = g == 0 || g >= groups_.size()
                            ? l.tables
                            : take(static_cast<size_t>(seqs * GroupWidth(g, width)) * 4);
  }
  l.total = at;
  return l;
}

StatusOr<GpuStep> GpuRunner::Plan(std::span<const SeqChunk> chunks, int64_t pad_to, int64_t width,
                                  bool use_tiles, size_t* bytes) {
  const int64_t bs = options_.block_size;
  const int64_t vocab = model_->config().vocab_size;
  const int64_t real_seqs = static_cast<int64_t>(chunks.size());
  const int64_t seqs = std::max(real_seqs, pad_to);
  int64_t tokens = seqs - real_seqs, logits = seqs - real_seqs, rows = seqs - real_seqs, tiles = 0;
  for (const SeqChunk& c : chunks) {
    const auto len = static_cast<int64_t>(c.tokens.size());
    tokens += len;
    // Positions of a bounded replay rebuild KV only: no logits.
    const int64_t fresh = std::clamp<int64_t>(c.start_pos + len - c.replay_end, 0, len);
    logits += c.logits == SeqChunk::Logits::kAll
                  ? fresh
                  : (c.logits == SeqChunk::Logits::kLast && fresh > 0);
    if (use_tiles && len >= kMinPrefillTokens) {
      tiles += (len + kc::kPrefillTileTokens - 1) / kc::kPrefillTileTokens;
    } else {
      rows += len;
    }
  }
  if (tokens > model_->max_tokens() || seqs > Bucket(options_.max_num_seqs) ||
      logits > model_->max_logits()) {
    return InvalidArgument(
        "a step of {} tokens, {} sequences, {} logits rows exceeds the GPU "
        "runner's limits ({}, {}, {})",
        tokens, seqs, logits, options_.max_num_tokens, options_.max_num_seqs, model_->max_logits());
  }
  const Layout l = LayoutFor(tokens, seqs, rows, tiles, logits, width);
  DINFER_RETURN_IF_ERROR(stage_free_[stage_index_].Synchronize());
  char* h = static_cast<char*>(stage_[stage_index_].data());
  auto* tok = reinterpret_cast<int32_t*>(h + l.tokens);
  auto* pos = reinterpret_cast<int32_t*>(h + l.positions);
  auto* seq = reinterpret_cast<int32_t*>(h + l.token_seq);
  auto* slots = reinterpret_cast<int64_t*>(h + l.slots);
  auto* seq_end = reinterpret_cast<int32_t*>(h + l.seq_end);
  auto* tables = reinterpret_cast<int32_t*>(h + l.tables);
  auto* logits_rows = reinterpret_cast<int32_t*>(h + l.logits_rows);
  auto* row_tokens = reinterpret_cast<int32_t*>(h + l.row_tokens);
  auto* tile_seq = reinterpret_cast<int32_t*>(h + l.tile_seq);
  auto* tile_token = reinterpret_cast<int32_t*>(h + l.tile_token);
  auto* replay_end = reinterpret_cast<int32_t*>(h + l.replay_end);
  bool any_replay = false;
  // Groups 1, 2, ...: the chunk's own tables (or block_table when it gives none), the group's sink
  // block after them.
  auto fill_groups = [&](int64_t s, const SeqChunk* c) -> Status {
    for (size_t g = 1; g < groups_.size(); ++g) {
      int32_t* table = reinterpret_cast<int32_t*>(h + l.group_tables[g]) + s * GroupWidth(g, width);
      const auto sink = static_cast<int32_t>(group_blocks_[g]);
      std::span<const int32_t> src;
      if (c != nullptr) src = c->group_tables.empty() ? c->block_table : c->group_tables[g - 1];
      const int64_t copy =
          std::min<int64_t>(GroupWidth(g, width), static_cast<int64_t>(src.size()));
      for (int64_t b = 0; b < copy; ++b) {
        if (src[b] < 0 || src[b] >= group_blocks_[g]) {
          return InvalidArgument("block id {} of KV group {} out of range", src[b], g);
        }
        table[b] = src[b];
      }
      std::fill(table + copy, table + GroupWidth(g, width), sink);
    }
    return OkStatus();
  };

  int64_t t = 0, nl = 0, nr = 0, nt = 0, max_keys = 1;
  for (int64_t s = 0; s < seqs; ++s) {
    int32_t* table = tables + s * width;
    if (s >= real_seqs) {  // padding: one token at position 0 of the sink block
      std::fill(table, table + width, static_cast<int32_t>(group_blocks_[0]));
      tok[t] = 0;
      pos[t] = 0;
      seq[t] = static_cast<int32_t>(s);
      slots[t] = group_blocks_[0] * bs;
      replay_end[s] = 0;
      DINFER_RETURN_IF_ERROR(fill_groups(s, nullptr));
      logits_rows[nl++] = static_cast<int32_t>(t);
      row_tokens[nr++] = static_cast<int32_t>(t);
      seq_end[s] = static_cast<int32_t>(++t);
      continue;
    }
    const SeqChunk& c = chunks[s];
    const auto len = static_cast<int64_t>(c.tokens.size());
    const int64_t end = c.start_pos + len;
    const int64_t need = (end + bs - 1) / bs;
    if (need > width || need > static_cast<int64_t>(c.block_table.size())) {
      return InvalidArgument(
          "sequence {} needs {} positions: past its block table or the GPU "
          "runner's max_seq_len {}",
          s, end, options_.max_seq_len);
    }
    const int64_t copy = std::min<int64_t>(width, static_cast<int64_t>(c.block_table.size()));
    for (int64_t b = 0; b < copy; ++b) {
      const int32_t id = c.block_table[b];
      if (id < 0 || id >= options_.num_blocks)
        return InvalidArgument("block id {} out of range", id);
      table[b] = id;
    }
    std::fill(table + copy, table + width, static_cast<int32_t>(group_blocks_[0]));
    DINFER_RETURN_IF_ERROR(fill_groups(s, &c));
    replay_end[s] = static_cast<int32_t>(c.replay_end);
    any_replay = any_replay || c.replay_end > 0;
    for (int64_t i = 0; i < len; ++i) {
      const int32_t id = c.tokens[i];
      if (id < 0 || id >= vocab) {
        return InvalidArgument("token id {} is outside the vocabulary [0, {})", id, vocab);
      }
      const int64_t p = c.start_pos + i;
      tok[t + i] = id;
      pos[t + i] = static_cast<int32_t>(p);
      seq[t + i] = static_cast<int32_t>(s);
      slots[t + i] = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
      if (p >= c.replay_end && (c.logits == SeqChunk::Logits::kAll ||
                                (c.logits == SeqChunk::Logits::kLast && i + 1 == len))) {
        logits_rows[nl++] = static_cast<int32_t>(t + i);
      }
    }
    if (use_tiles && len >= kMinPrefillTokens) {
      for (int64_t i = 0; i < len; i += kc::kPrefillTileTokens) {
        tile_seq[nt] = static_cast<int32_t>(s);
        tile_token[nt++] = static_cast<int32_t>(t + i);
      }
    } else {
      for (int64_t i = 0; i < len; ++i) row_tokens[nr++] = static_cast<int32_t>(t + i);
      max_keys = std::max(max_keys, end);
    }
    t += len;
    seq_end[s] = static_cast<int32_t>(t);
  }
  // Longest tiles (latest positions) first, so the tail of the grid is short work.
  tile_order_.resize(static_cast<size_t>(nt));
  for (int64_t i = 0; i < nt; ++i) tile_order_[i] = static_cast<int32_t>(i);
  auto tile_end = [&](int32_t i) {
    return pos[std::min<int64_t>(tile_token[i] + kc::kPrefillTileTokens, seq_end[tile_seq[i]]) - 1];
  };
  std::sort(tile_order_.begin(), tile_order_.end(),
            [&](int32_t a, int32_t b) { return tile_end(a) > tile_end(b); });
  std::vector<int32_t> sorted_seq(static_cast<size_t>(nt)), sorted_token(static_cast<size_t>(nt));
  for (int64_t i = 0; i < nt; ++i) {
    sorted_seq[i] = tile_seq[tile_order_[i]];
    sorted_token[i] = tile_token[tile_order_[i]];
  }
  std::copy(sorted_seq.begin(), sorted_seq.end(), tile_seq);
  std::copy(sorted_token.begin(), sorted_token.end(), tile_token);

  const ModelConfig& mc = model_->config();
  const char* d = static_cast<const char*>(plan_.data());
  GpuStep step;
  step.num_tokens = tokens;
  step.num_seqs = seqs;
  step.tokens = reinterpret_cast<const int32_t*>(d + l.tokens);
  step.positions = reinterpret_cast<const int32_t*>(d + l.positions);
  step.token_seq = reinterpret_cast<const int32_t*>(d + l.token_seq);
  step.slots = reinterpret_cast<const int64_t*>(d + l.slots);
  step.seq_token_end = reinterpret_cast<const int32_t*>(d + l.seq_end);
  step.block_tables = reinterpret_cast<const int32_t*>(d + l.tables);
  step.max_blocks_per_seq = width;
  for (size_t g = 0; g < groups_.size(); ++g) {
    step.group_tables[g] = reinterpret_cast<const int32_t*>(d + l.group_tables[g]);
    step.group_width[g] = g == 0 ? width : GroupWidth(g, width);
    step.group_block_tokens[g] = groups_[g].block_size;
  }
  step.replay_end = any_replay ? reinterpret_cast<const int32_t*>(d + l.replay_end) : nullptr;
  step.logits_rows = reinterpret_cast<const int32_t*>(d + l.logits_rows);
  step.num_logits = logits;
  step.row_tokens = reinterpret_cast<const int32_t*>(d + l.row_tokens);
  step.num_rows = rows;
  // Graph steps are replayed while sequences grow: plan their splits for the longest context
  // the block tables can hold.
  step.num_splits = !model_->dense_attention()
                        ? 1
                        : kc::ChooseAttentionSplits(
                              rows,
                              kc::AttentionRowsCtas(rows, model_->dtype(), mc.head_dim,
                                                    options_.kv_cache_dtype == DType::kF8E4M3,
                                                    mc.num_heads, mc.num_kv_heads),
                              pad_to > 0 ? width * bs : max_keys, device_.multiprocessors);
  step.tile_seq = reinterpret_cast<const int32_t*>(d + l.tile_seq);
  step.tile_token = reinterpret_cast<const int32_t*>(d + l.tile_token);
  step.num_tiles = tiles;
  *bytes = l.total;
  return step;
}

Status GpuRunner::Launch(std::span<const SeqChunk> chunks, const LaunchOptions& options) {
  bool one_token = !chunks.empty();
  for (const SeqChunk& c : chunks) {
    one_token = one_token && c.tokens.size() == 1 && c.logits == SeqChunk::Logits::kLast;
  }
  if (options.tokens_from_last_step && !one_token) {
    return InvalidArgument("tokens from the last step need one-token chunks");
  }
  const auto n = static_cast<int64_t>(chunks.size());
  const bool graph =
      options_.cuda_graphs && one_token && n <= options_.max_num_seqs && !options.draft;
  if (options.draft && !model_->has_draft_layer()) {
    return MakeError(StatusCode::kFailedPrecondition, "the model has no draft layer");
  }
  const int64_t pad_to = graph ? Bucket(n) : 0;
  // Block tables as wide as the longest sequence needs, rounded up to a power of two so that
  // decode graphs are few and replayed while sequences grow.
  int64_t need = 1;
  for (const SeqChunk& ch : chunks) {
    const int64_t end = ch.start_pos + static_cast<int64_t>(ch.tokens.size());
    need = std::max(need, (end + options_.block_size - 1) / options_.block_size);
  }
  int64_t width = 16;
  while (width < need) width *= 2;
  width = std::min(width, width_);
  const ModelConfig& c = model_->config();
  size_t bytes = 0;
  DINFER_ASSIGN_OR_RETURN(
      GpuStep step,
      Plan(chunks, pad_to, width,
           model_->dense_attention() && kc::PrefillSupports(model_->dtype(), c.head_dim), &bytes));
  DINFER_RETURN_IF_ERROR(
      cuda::CopyToDeviceAsync(plan_.data(), stage_[stage_index_].data(), bytes, stream_));
  DINFER_RETURN_IF_ERROR(stage_free_[stage_index_].Record(stream_));
  stage_index_ ^= 1;
  if (options.tokens_from_last_step) {
    if (last_rows_ < n)
      return InvalidArgument("the last step sampled {} tokens, not {}", last_rows_, n);
    DINFER_RETURN_IF_ERROR(cuda::CopyOnDeviceAsync(const_cast<int32_t*>(step.tokens),
                                                   greedy_.data(), n * sizeof(int32_t), stream_));
  }
  auto* logits = static_cast<float*>(logits_.data());
  auto* greedy = static_cast<int32_t*>(greedy_.data());
  // Decode graphs always include the greedy choice (cheap), so one graph serves both kinds.
  if (options.draft && step.num_tokens > last_tokens_) {
    return InvalidArgument("a draft step of {} tokens after a step of {}", step.num_tokens,
                           last_tokens_);
  }
  auto enqueue = [&]() -> Status {
    if (options.draft) return model_->ForwardDraft(step, kv_, logits, stream_.get());
    DINFER_RETURN_IF_ERROR(model_->Forward(step, kv_, logits, stream_.get()));
    if (!graph && !options.greedy) return OkStatus();
    return cuda::CudaStatus(
        kc::ArgmaxRows(logits, step.num_logits, c.vocab_size, c.vocab_size, greedy, stream_.get()),
        "argmax");
  };
  const std::pair<int64_t, int64_t> key(pad_to, width);
  auto it = graph ? graphs_.find(key) : graphs_.end();
  if (graph && it != graphs_.end()) {
    DINFER_RETURN_IF_ERROR(it->second.Launch(stream_));
  } else {
    DINFER_RETURN_IF_ERROR(enqueue());
    if (graph) {
      // Captured after an eager run of the same work, so that one-time set-up (cuBLASLt
      // algorithm choice, module loading) happens outside the capture.
      DINFER_RETURN_IF_ERROR(cuda::Graph::BeginCapture(stream_));
      const Status captured = enqueue();
      auto g = cuda::Graph::EndCapture(stream_);
      DINFER_RETURN_IF_ERROR(captured);
      if (!g.ok()) return g.status();
      graphs_.emplace(key, std::move(*g));
    }
  }
  last_rows_ = step.num_logits - (pad_to > 0 ? pad_to - n : 0);
  if (!options.draft) last_tokens_ = step.num_tokens;
  last_greedy_ = options.greedy;
  if (options.greedy) {
    DINFER_RETURN_IF_ERROR(cuda::CopyToHostAsync(greedy_host_.data(), greedy,
                                                 static_cast<size_t>(last_rows_) * 4, stream_));
  }
  return done_.Record(stream_);
}

StatusOr<TensorView> GpuRunner::Logits() {
  const int64_t vocab = model_->config().vocab_size;
  const size_t bytes = static_cast<size_t>(last_rows_ * vocab) * sizeof(float);
  if (logits_host_.bytes() < bytes) {
    DINFER_ASSIGN_OR_RETURN(logits_host_, cuda::PinnedBuffer::Allocate(bytes));
  }
  if (bytes > 0) {
    DINFER_RETURN_IF_ERROR(
        cuda::CopyToHostAsync(logits_host_.data(), logits_.data(), bytes, stream_));
  }
  DINFER_RETURN_IF_ERROR(stream_.Synchronize());
  return TensorView::Make(logits_host_.data(), DType::kF32, {last_rows_, vocab});
}

StatusOr<std::span<const int32_t>> GpuRunner::GreedyTokens() {
  if (!last_greedy_) return InvalidArgument("the last step was not launched greedy");
  DINFER_RETURN_IF_ERROR(done_.Synchronize());
  return std::span<const int32_t>(greedy_host_.as<int32_t>(), static_cast<size_t>(last_rows_));
}

StatusOr<TensorView> GpuRunner::Execute(std::span<const SeqChunk> chunks) {
  DINFER_RETURN_IF_ERROR(Launch(chunks));
  return Logits();
}

StatusOr<TensorView> GpuRunner::ExecuteDraft(std::span<const SeqChunk> chunks) {
  LaunchOptions o;
  o.draft = true;
  DINFER_RETURN_IF_ERROR(Launch(chunks, o));
  return Logits();
}

}  // namespace dinfer

namespace dinfer {

StatusOr<DeviceSampleOutput> GpuRunner::Sample(const DeviceSampleBatch& batch) {
  const int64_t rows = last_rows_;
  const int64_t vocab = model_->config().vocab_size;
  if (static_cast<int64_t>(batch.rows.size()) != rows) {
    return InvalidArgument("sampling {} rows, but the last step has {} logits rows",
                           batch.rows.size(), rows);
  }
  static_assert(kc::kMaxSampleVocab == kMaxDeviceSampleVocab);
  if (vocab > kc::kMaxSampleVocab) {
    return Unimplemented("sampling on the device supports vocabularies up to {} tokens",
                         kc::kMaxSampleVocab);
  }
  DeviceSampleOutput out;
  if (rows == 0) return out;
  const auto n = static_cast<size_t>(rows);
  const size_t num_adjust = batch.adjustments.size();
  // Inputs: rows, masks, adjustments, biases.
  const size_t at_masks = Align(n * sizeof(kc::SamplingRow));
  const size_t at_adjust = Align(at_masks + batch.masks.size() * sizeof(uint32_t));
  const size_t at_biases = Align(at_adjust + num_adjust * sizeof(kc::TokenAdjustment));
  const size_t in_bytes = Align(at_biases + batch.biases.size() * sizeof(float));
  // Outputs copied back: tokens, logprobs, top tokens, top logprobs.
  constexpr size_t kTop = kc::kMaxSampleLogprobs;
  static_assert(kTop == DeviceSampleOutput::kTopStride);
  const size_t at_logprob = Align(n * 4);
  const size_t at_top = Align(at_logprob + n * 4);
  const size_t at_top_lp = Align(at_top + n * kTop * 4);
  const size_t out_bytes = Align(at_top_lp + n * kTop * 4);
  const size_t scratch_bytes = Align(n * sizeof(double)) + Align(num_adjust * sizeof(float));
  // Buffers grow between steps; the last Sample waited for its copies, so none is in use.
  auto grow_pinned = [](cuda::PinnedBuffer& b, size_t bytes) -> Status {
    if (b.bytes() >= bytes) return OkStatus();
    DINFER_ASSIGN_OR_RETURN(b, cuda::PinnedBuffer::Allocate(bytes + bytes / 2));
    return OkStatus();
  };
  auto grow_device = [](cuda::DeviceBuffer& b, size_t bytes) -> Status {
    if (b.bytes() >= bytes) return OkStatus();
    DINFER_ASSIGN_OR_RETURN(b, cuda::DeviceBuffer::Allocate(bytes + bytes / 2));
    return OkStatus();
  };
  DINFER_RETURN_IF_ERROR(grow_pinned(sample_stage_, in_bytes));
  DINFER_RETURN_IF_ERROR(grow_pinned(sample_out_host_, out_bytes));
  DINFER_RETURN_IF_ERROR(grow_device(sample_in_, in_bytes));
  DINFER_RETURN_IF_ERROR(grow_device(sample_out_, out_bytes));
  DINFER_RETURN_IF_ERROR(grow_device(sample_scratch_, scratch_bytes));

  char* h = static_cast<char*>(sample_stage_.data());
  auto* params = reinterpret_cast<kc::SamplingRow*>(h);
  bool any_mask = false, any_logprobs = false;
  for (size_t i = 0; i < n; ++i) {
    const DeviceSampleRow& r = batch.rows[i];
    kc::SamplingRow& k = params[i];
    k = kc::SamplingRow{};
    k.temperature = r.temperature;
    k.top_p = r.top_p;
    k.min_p = r.min_p;
    k.repetition_penalty = r.repetition_penalty;
    k.presence_penalty = r.presence_penalty;
    k.frequency_penalty = r.frequency_penalty;
    k.seed = r.seed;
    k.step = r.step;
    k.top_k = r.top_k;
    k.logprobs = std::min(r.logprobs, kc::kMaxSampleLogprobs);
    k.mask_offset = r.mask_offset;
    k.mask_vocab = r.mask_vocab;
    k.adjust_begin = r.adjust_begin;
    k.adjust_end = r.adjust_end;
    if (r.mask_offset >= 0 && r.mask_offset + (std::min<int64_t>(r.mask_vocab, vocab) + 31) / 32 >
                                  static_cast<int64_t>(batch.masks.size())) {
      return InvalidArgument("sampling row {}: its mask lies past the masks given", i);
    }
    if (r.adjust_begin < 0 || r.adjust_end < r.adjust_begin ||
        static_cast<size_t>(r.adjust_end) > num_adjust) {
      return InvalidArgument("sampling row {}: its adjustments lie past those given", i);
    }
    any_mask |= r.mask_offset >= 0;
    any_logprobs |= r.logprobs >= 0;
  }
  std::copy(batch.masks.begin(), batch.masks.end(), reinterpret_cast<uint32_t*>(h + at_masks));
  auto* adjust = reinterpret_cast<kc::TokenAdjustment*>(h + at_adjust);
  for (size_t j = 0; j < num_adjust; ++j) {
    const DeviceTokenAdjust& a = batch.adjustments[j];
    if (a.bias_end < a.bias_begin || a.bias_end > batch.biases.size()) {
      return InvalidArgument("sampling adjustment {}: its biases lie past those given", j);
    }
    adjust[j] = kc::TokenAdjustment{a.token,
                                    a.count,
                                    a.bias_begin,
                                    a.bias_end,
                                    static_cast<uint8_t>(a.seen),
                                    static_cast<uint8_t>(a.ban)};
  }
  std::copy(batch.biases.begin(), batch.biases.end(), reinterpret_cast<float*>(h + at_biases));
  DINFER_RETURN_IF_ERROR(
      cuda::CopyToDeviceAsync(sample_in_.data(), sample_stage_.data(), in_bytes, stream_));

  char* d = static_cast<char*>(sample_in_.data());
  char* o = static_cast<char*>(sample_out_.data());
  char* scratch = static_cast<char*>(sample_scratch_.data());
  kc::SampleRowsParams p;
  p.logits = static_cast<float*>(logits_.data());
  p.rows = rows;
  p.vocab = vocab;
  p.stride = vocab;
  p.params = reinterpret_cast<const kc::SamplingRow*>(d);
  p.masks = reinterpret_cast<const uint32_t*>(d + at_masks);
  p.adjustments = reinterpret_cast<const kc::TokenAdjustment*>(d + at_adjust);
  p.biases = reinterpret_cast<const float*>(d + at_biases);
  p.log_norm = reinterpret_cast<double*>(scratch);
  p.saved = reinterpret_cast<float*>(scratch + Align(n * sizeof(double)));
  p.tokens = reinterpret_cast<int32_t*>(o);
  p.logprob = reinterpret_cast<float*>(o + at_logprob);
  p.top_tokens = reinterpret_cast<int32_t*>(o + at_top);
  p.top_logprobs = reinterpret_cast<float*>(o + at_top_lp);
  p.any_mask = any_mask;
  p.any_logprobs = any_logprobs;
  p.num_adjustments = static_cast<int64_t>(num_adjust);
  DINFER_RETURN_IF_ERROR(cuda::CudaStatus(kc::SampleRows(p, stream_.get()), "sampling"));
  DINFER_RETURN_IF_ERROR(cuda::CopyToHostAsync(sample_out_host_.data(), sample_out_.data(),
                                               any_logprobs ? out_bytes : n * 4, stream_));
  DINFER_RETURN_IF_ERROR(stream_.Synchronize());
  const char* host = static_cast<const char*>(sample_out_host_.data());
  out.tokens = {reinterpret_cast<const int32_t*>(host), n};
  if (any_logprobs) {
    out.logprobs = {reinterpret_cast<const float*>(host + at_logprob), n};
    out.top_tokens = {reinterpret_cast<const int32_t*>(host + at_top), n * kTop};
    out.top_logprobs = {reinterpret_cast<const float*>(host + at_top_lp), n * kTop};
  }
  return out;
}

}  // namespace dinfer
