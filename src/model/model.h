// Model: a causal language model's forward pass over a batch of tokens from several sequences,
// reading and writing a paged KV cache. KvStorage owns that cache's memory.
// A Model is immutable after construction; Forward may be called by one thread at a time
// (it uses internal scratch buffers).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace dinfer {

// A KV group: the planes the KV manager pages together, with their own block pool and block
// tables. Dense models have one (full attention, or a sliding window when every layer has one);
// DeepSeek-V4 has the window group and one group of compressed entries per compression rate.
struct KvGroup {
  std::string name;
  int64_t block_size = 0;      // tokens a block covers
  int64_t sliding_window = 0;  // 0: every block stays; else blocks behind the window are released
  int64_t entry_rate = 1;      // tokens per row (compressed entries); divides block_size
};

// One plane of a layer's paged KV memory: every block of its group holds rows_per_block rows of
// `width` elements of `dtype` (f32 or bf16: bf16 planes are written rounded to nearest even and
// widened to f32 when read; state that accumulates across steps stays f32). A dense layer has two
// planes of block_size rows (K and V); other attention kinds keep other per-token or per-block
// state (DeepSeek-V4: window keys, compressor state, compressed entries).
struct KvPlane {
  int64_t rows_per_block = 0;
  int64_t width = 0;
  int32_t group = 0;  // index into the model's KvGroupsFor
  DType dtype = DType::kF32;
};
using KvLayout = std::vector<std::vector<KvPlane>>;  // per layer, its planes

// How the KV cache is stored on the CPU: as the model chooses in KvLayoutFor (auto), every plane
// f32, or bf16 (the model's choice, which must store some planes as bf16: dense layers keep K and
// V in f32 on the CPU). kFp8: e4m3 — on the CUDA runner (dense models), and on the CPU for
// DeepSeek-V4, whose bf16 planes then hold kF8E4M3B32 rows (a UE8M0 scale per 32 values).
enum class KvCacheDType { kAuto, kF32, kBF16, kFp8 };
// "auto", "f32", "bf16", "fp8" (or "fp8_e4m3")
StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name);
// `layout` stored as `dtype` asks; `arch` names the model in errors.
StatusOr<KvLayout> ApplyKvCacheDType(KvLayout layout, KvCacheDType dtype, std::string_view arch);

// Paged KV memory for every layer: plane j of layer i is [num_blocks of its group, rows_per_block,
// width] of the plane's dtype.
class KvStorage {
 public:
  // `num_blocks`: per group.
  KvStorage(const KvLayout& layout, std::vector<int64_t> num_blocks, int64_t block_size);
  // Planes 0 and 1 (K and V, f32) of a dense layer.
  ops::KvLayerView layer(int64_t i) const;
  void* plane(int64_t layer, int64_t j) const { return planes_[layer][j].view().data; }
  DType plane_dtype(int64_t layer, int64_t j) const { return planes_[layer][j].view().dtype; }
  int64_t num_blocks(int64_t group = 0) const { return num_blocks_[static_cast<size_t>(group)]; }
  int64_t num_groups() const { return static_cast<int64_t>(num_blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  // Bytes of one block of every group together (all planes of all layers).
  static int64_t BytesPerBlock(const KvLayout& layout);
  // Bytes of one block of each of `num_groups` groups.
  static std::vector<int64_t> GroupBytesPerBlock(const KvLayout& layout, int64_t num_groups);

 private:
  std::vector<int64_t> num_blocks_;
  int64_t block_size_;
  std::vector<std::vector<Tensor>> planes_;
};

struct ForwardInput {
  std::span<const int32_t> tokens;
  ops::AttentionMetadata meta;
  // Indices into `tokens` whose next-token logits are wanted (e.g. each sequence's last token).
  std::span<const int32_t> logits_rows;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  int64_t kv_dim() const { return config_.num_kv_heads * config_.head_dim; }
  // The planes of each layer's KV memory for blocks of `block_size` tokens. By default K and V of
  // block_size rows of kv_dim per layer.
  virtual KvLayout KvLayoutFor(int64_t block_size) const;
  // The KV groups the planes of KvLayoutFor(block_size) belong to; group 0 has blocks of
  // block_size tokens and a row per token. By default one group: full attention, or a sliding
  // window when every layer has one.
  virtual std::vector<KvGroup> KvGroupsFor(int64_t block_size) const;
  // SWA bounded replay: R > 0 when, for any prefix of T tokens whose KV outside the sliding-window
  // groups is cached, computing positions [S, T) with S <= T - R (SeqChunk::replay_end = T) over
  // fresh window blocks rebuilds every window-group row that positions from T on read exactly as
  // computing the whole prefix would (up to batch-composition rounding). 0 (the default): the
  // window cannot be rebuilt that way, so a prefix hit needs its window blocks cached. A model
  // returning R > 0 must honour replay_end: write nothing outside the window groups for those
  // positions.
  virtual int64_t WindowReplayTokens() const { return 0; }

  // logits: [logits_rows.size(), vocab_size] f32, allocated by the caller.
  virtual Status Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                         const TensorView& logits) = 0;

  // Models with a next-token-prediction draft layer (DeepSeek's MTP): runs it over the rows of
  // the previous Forward. Row t combines that forward's final hidden state of token t with the
  // embedding of in.tokens[t] (the token that follows it) and predicts the token after that;
  // in.meta must place the rows as the previous Forward did (same positions and slots).
  virtual bool has_draft_layer() const { return false; }
  virtual Status ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in,
                              const KvStorage& kv, const TensorView& logits);

 protected:
  explicit Model(ModelConfig config) : config_(std::move(config)) {}
  ModelConfig config_;
};

}  // namespace dinfer
