// Paged attention on the CPU (ops.h Attention): planning, threading and the portable kernel.
//
// Tiling. A tile is up to kTileRows query rows: consecutive query tokens of one sequence times
// the query heads that share a KV head (GQA), so every K/V row read from the paged cache serves
// all of them. The vector kernels walk a tile's keys 16 (AVX-512) or 8 (AVX2) at a time, block by
// block of the block table, with an online softmax in f32 (running max, running sum, rescaled
// accumulator): no scores buffer over the whole context. Prefill tasks take one KV head; decode
// tasks (a token or two per sequence) take several, so they read whole contiguous K/V rows.
//
// Chunks. Keys are cut into chunks of kChunkKeys at absolute positions [c * kChunkKeys,
// (c + 1) * kChunkKeys). Each chunk's softmax state starts afresh, and the chunks of a row are
// folded in position order by the same function whether one task walks them all or they are
// spread over tasks whose partial results (max, sum, accumulator) are combined afterwards
// (flash-decoding split-K, used when there are fewer tasks than twice the threads).
//
// Batch invariance. Every step of a row's arithmetic (dot products, masks, softmax updates,
// accumulation, folds) depends on that row and on absolute key positions only, never on the
// other rows of its tile, on the task's key range, or on how chunks are spread over tasks. So a
// query's output does not depend on the batch, the tiling, the chunking of a prompt, or the
// thread count (bitwise, for a given ISA). Keys outside a row's range contribute exact zeros.
//
// ISA kernels (attention_avx2.cc, attention_avx512.cc, AttentionTileScalar below) share the
// entry points declared here. Scratch per call holds ScratchFloats(rows, head_dim, kv_dim)
// floats, 64-byte aligned; a partial record for (row r, chunk c) sits at partials +
// (r * num_chunks + c - chunk_first) * RecordFloats(head_dim): the accumulator (padded to 16
// floats), then max and sum.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"

namespace dinfer::kernels::cpu {
namespace attention_internal {

// Processes query tokens [t0, t1) of one sequence for the query heads of KV heads [h0, h1), over
// key chunks [c0, c1). Rows are ordered KV head, token, query head within the group. With
// partials == nullptr the chunks cover all the tile's keys and the kernel writes p.out;
// otherwise it writes one partial record per row and chunk.
void AttentionTileAvx2(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                       int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                       int64_t num_chunks, float* partials, float* scratch);
void AttentionTileAvx512(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                         int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                         int64_t num_chunks, float* partials, float* scratch);
// Folds the partial records of chunks [0, num_chunks) in order and writes p.out.
void AttentionCombineAvx2(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                          int64_t num_chunks, const float* partials, float* scratch);
void AttentionCombineAvx512(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0,
                            int64_t h1, int64_t num_chunks, const float* partials, float* scratch);

}  // namespace attention_internal

namespace {

using TileFn = void (*)(const AttentionParams&, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t, float*, float*);
using CombineFn = void (*)(const AttentionParams&, int64_t, int64_t, int64_t, int64_t, int64_t,
                           const float*, float*);

constexpr int64_t kChunkKeys = 256;  // a multiple of every kernel's key vector
constexpr int64_t kTileRows = 48;    // query rows per tile (tokens × grouped heads)
constexpr int64_t kParallelCombineFloats = int64_t{1} << 20;
constexpr float kNegInf = -INFINITY;

int64_t PaddedDim(int64_t head_dim) { return (head_dim + 15) / 16 * 16; }
int64_t RecordFloats(int64_t head_dim) { return PaddedDim(head_dim) + 16; }
int64_t ScratchFloats(int64_t rows, int64_t head_dim, int64_t kv_dim) {
  const int64_t dp = PaddedDim(head_dim);
  return rows * (2 * dp + 40) + dp + kv_dim + kChunkKeys + 64;
}

// A per-thread buffer of at least n floats, 64-byte aligned.
float* ThreadScratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(n + 16)) buf.resize(static_cast<size_t>(n + 16));
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(float);
}

// Keys visible to the query token at `pos`: [lo, pos].
int64_t KeyLo(const AttentionParams& p, int64_t pos) {
  return p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
}

const float* KvRow(const float* cache, const int32_t* table, int64_t block_size, int64_t kv_dim,
                   int64_t pos) {
  const int64_t block = table[pos / block_size];
  return cache + (block * block_size + pos % block_size) * kv_dim;
}

// ---- Portable kernel: per row and chunk, scores into a buffer, then softmax and accumulation
// (two passes over at most kChunkKeys scores).

void FoldScalar(float& fm, float& fl, float* facc, float m, float l, const float* acc, int64_t dp) {
  if (m == kNegInf) return;
  if (fm == kNegInf) {
    fm = m;
    fl = l;
    std::memcpy(facc, acc, sizeof(float) * dp);
    return;
  }
  const float nm = std::max(fm, m);
  const float a = std::exp(fm - nm), b = std::exp(m - nm);
  for (int64_t i = 0; i < dp; ++i) facc[i] = facc[i] * a + acc[i] * b;
  fl = fl * a + l * b;
  fm = nm;
}

void WriteOut(float* out, const float* facc, float fl, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] = facc[i] / fl;
}

void AttentionTileScalar(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                         int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                         int64_t num_chunks, float* partials, float* scratch) {
  const int64_t d = p.head_dim, g = p.num_heads / p.num_kv_heads, dp = PaddedDim(d);
  const int64_t kv_dim = p.num_kv_heads * d, qs = p.q_stride ? p.q_stride : p.num_heads * d;
  const int64_t rec = RecordFloats(d), head_rows = (t1 - t0) * g;
  float* acc = scratch;
  float* facc = acc + dp;
  float* scores = facc + dp;
  const int32_t* table = p.block_tables + p.token_seq[t0] * p.max_blocks_per_seq;
  for (int64_t kvh = h0; kvh < h1; ++kvh) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t hi = p.q_pos[t], lo = KeyLo(p, hi);
      for (int64_t gi = 0; gi < g; ++gi) {
        const int64_t h = kvh * g + gi, r = (kvh - h0) * head_rows + (t - t0) * g + gi;
        const float* q = p.q + t * qs + h * d;
        float fm = kNegInf, fl = 0.0f;
        std::fill(facc, facc + dp, 0.0f);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t rlo = std::max(lo, c * chunk_keys);
          const int64_t rhi = std::min(hi, (c + 1) * chunk_keys - 1);
          float* record = partials ? partials + (r * num_chunks + c - chunk_first) * rec : nullptr;
          if (rlo > rhi) {
            if (record) {
              record[dp] = kNegInf;
              record[dp + 1] = 0.0f;
            }
            continue;
          }
          float m = kNegInf;
          for (int64_t pos = rlo; pos <= rhi; ++pos) {
            const float* k = KvRow(p.k_cache, table, p.block_size, kv_dim, pos) + kvh * d;
            float s = 0.0f;
            for (int64_t i = 0; i < d; ++i) s += q[i] * k[i];
            s *= p.scale;
            if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
            scores[pos - rlo] = s;
            m = std::max(m, s);
          }
          float l = 0.0f;
          std::fill(acc, acc + dp, 0.0f);
          for (int64_t pos = rlo; pos <= rhi; ++pos) {
            const float e = std::exp(scores[pos - rlo] - m);
            const float* v = KvRow(p.v_cache, table, p.block_size, kv_dim, pos) + kvh * d;
            l += e;
            for (int64_t i = 0; i < d; ++i) acc[i] += e * v[i];
          }
          if (record) {
            std::memcpy(record, acc, sizeof(float) * dp);
            record[dp] = m;
            record[dp + 1] = l;
          } else {
            FoldScalar(fm, fl, facc, m, l, acc, dp);
          }
        }
        if (!partials) WriteOut(p.out + (t * p.num_heads + h) * d, facc, fl, d);
      }
    }
  }
}

void AttentionCombineScalar(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0,
                            int64_t h1, int64_t num_chunks, const float* partials, float* scratch) {
  const int64_t d = p.head_dim, g = p.num_heads / p.num_kv_heads, dp = PaddedDim(d);
  const int64_t rec = RecordFloats(d), head_rows = (t1 - t0) * g;
  float* facc = scratch;
  for (int64_t r = 0; r < (h1 - h0) * head_rows; ++r) {
    float fm = kNegInf, fl = 0.0f;
    std::fill(facc, facc + dp, 0.0f);
    for (int64_t c = 0; c < num_chunks; ++c) {
      const float* record = partials + (r * num_chunks + c) * rec;
      FoldScalar(fm, fl, facc, record[dp], record[dp + 1], record, dp);
    }
    const int64_t t = t0 + r % head_rows / g, h = (h0 + r / head_rows) * g + r % g;
    WriteOut(p.out + (t * p.num_heads + h) * d, facc, fl, d);
  }
}

struct Tile {
  int64_t t0, t1;    // query tokens
  int64_t klo, khi;  // union of their key ranges
};

// Tiles of up to `tokens_per_tile` consecutive query tokens of one sequence.
void BuildTiles(const AttentionParams& p, int64_t tokens_per_tile, std::vector<Tile>& tiles) {
  tiles.clear();
  for (int64_t t = 0; t < p.num_tokens;) {
    int64_t run_end = t + 1;
    while (run_end < p.num_tokens && p.token_seq[run_end] == p.token_seq[t]) ++run_end;
    for (int64_t s = t; s < run_end; s += tokens_per_tile) {
      Tile tile{s, std::min(s + tokens_per_tile, run_end), INT64_MAX, -1};
      for (int64_t i = tile.t0; i < tile.t1; ++i) {
        tile.klo = std::min(tile.klo, KeyLo(p, p.q_pos[i]));
        tile.khi = std::max<int64_t>(tile.khi, p.q_pos[i]);
      }
      tiles.push_back(tile);
    }
    t = run_end;
  }
}

struct Task {
  int64_t tile, h0, h1, c0, c1;  // query tokens of tiles[tile], KV heads [h0, h1), chunks
  int64_t cost;
  int64_t partial_offset;  // -1: the task writes p.out
};

// Reused between calls by the calling thread. The tasks, running on pool threads, reach it
// through a reference (a thread_local named inside them would be the pool thread's own).
struct Plan {
  std::vector<Tile> tiles;
  std::vector<Task> tasks;
  std::vector<Task> combines;  // c1 - c0 = chunk count, partial_offset = its records
  std::vector<float> partials;
};

}  // namespace

void Attention(const AttentionParams& p) {
  if (p.num_tokens <= 0) return;
  namespace ai = attention_internal;
  TileFn tile_fn = AttentionTileScalar;
  CombineFn combine_fn = AttentionCombineScalar;
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      tile_fn = ai::AttentionTileAvx512;
      combine_fn = ai::AttentionCombineAvx512;
      break;
    case Isa::kAvx2:
      tile_fn = ai::AttentionTileAvx2;
      combine_fn = ai::AttentionCombineAvx2;
      break;
    case Isa::kScalar:
      break;
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int threads = p.pool != nullptr ? p.pool->num_threads() : 1;
  const int64_t want_tasks = threads > 1 ? 2 * threads : 1;

  // Tiles: as many tokens as fit kTileRows rows, fewer when that leaves threads idle. The tiling
  // never changes a row's result, only how the work is shared.
  int64_t max_run = 1;
  for (int64_t t = 0, run = 0; t < p.num_tokens; ++t) {
    run = t > 0 && p.token_seq[t] == p.token_seq[t - 1] ? run + 1 : 1;
    max_run = std::max(max_run, run);
  }
  int64_t tokens_per_tile = std::min(max_run, std::max<int64_t>(1, kTileRows / group));
  thread_local Plan tls_plan;
  Plan& plan = tls_plan;
  std::vector<Tile>& tiles = plan.tiles;
  std::vector<Task>& tasks = plan.tasks;
  std::vector<Task>& combines = plan.combines;
  BuildTiles(p, tokens_per_tile, tiles);
  while (tokens_per_tile > 1 && static_cast<int64_t>(tiles.size()) * p.num_kv_heads < want_tasks) {
    tokens_per_tile = (tokens_per_tile + 1) / 2;
    BuildTiles(p, tokens_per_tile, tiles);
  }
  // KV heads per task: small tiles (decode) take several, so that a task reads whole K/V rows
  // (contiguous memory) rather than one head's slice of each; fewer if that starves threads
  // even with the keys split.
  int64_t total_chunks = 0;
  for (const Tile& tile : tiles) total_chunks += tile.khi / kChunkKeys - tile.klo / kChunkKeys + 1;
  int64_t heads_per_task =
      std::clamp<int64_t>(kTileRows / (tokens_per_tile * group), 1, p.num_kv_heads);
  const auto head_groups = [&](int64_t per_task) {
    return (p.num_kv_heads + per_task - 1) / per_task;
  };
  while (heads_per_task > 1 && total_chunks * head_groups(heads_per_task) < want_tasks) {
    heads_per_task = (heads_per_task + 1) / 2;
  }
  const int64_t units = static_cast<int64_t>(tiles.size()) * head_groups(heads_per_task);

  // Tasks: one per (tile, KV heads); split over key chunks when there are too few of them.
  tasks.clear();
  combines.clear();
  const int64_t pieces_wanted = units < want_tasks ? (want_tasks * 2 + units - 1) / units : 1;
  const int64_t rec = RecordFloats(p.head_dim);
  int64_t partial_floats = 0, max_rows = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(tiles.size()); ++i) {
    const Tile& tile = tiles[i];
    const int64_t chunk_first = tile.klo / kChunkKeys;
    const int64_t num_chunks = tile.khi / kChunkKeys - chunk_first + 1;
    const int64_t pieces = std::min(pieces_wanted, num_chunks);
    for (int64_t h0 = 0; h0 < p.num_kv_heads; h0 += heads_per_task) {
      const int64_t h1 = std::min(h0 + heads_per_task, p.num_kv_heads);
      const int64_t rows = (tile.t1 - tile.t0) * group * (h1 - h0);
      max_rows = std::max(max_rows, rows);
      if (pieces == 1) {
        tasks.push_back({i, h0, h1, chunk_first, chunk_first + num_chunks,
                         rows * (tile.khi - tile.klo + 1), -1});
        continue;
      }
      for (int64_t k = 0; k < pieces; ++k) {
        const int64_t c0 = chunk_first + num_chunks * k / pieces;
        const int64_t c1 = chunk_first + num_chunks * (k + 1) / pieces;
        tasks.push_back({i, h0, h1, c0, c1, rows * (c1 - c0) * kChunkKeys, partial_floats});
      }
      combines.push_back({i, h0, h1, 0, num_chunks, 0, partial_floats});
      partial_floats += rows * num_chunks * rec;
    }
  }
  // Longest first, so the dynamic schedule balances the threads.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });

  if (plan.partials.size() < static_cast<size_t>(partial_floats)) {
    plan.partials.resize(static_cast<size_t>(partial_floats));
  }
  float* partials = plan.partials.data();
  const int64_t scratch_floats = ScratchFloats(max_rows, p.head_dim, p.num_kv_heads * p.head_dim);
  auto run_task = [&](int, int64_t index) {
    const Task& task = tasks[index];
    const Tile& tile = tiles[task.tile];
    tile_fn(p, tile.t0, tile.t1, task.h0, task.h1, kChunkKeys, task.c0, task.c1,
            tile.klo / kChunkKeys, tile.khi / kChunkKeys - tile.klo / kChunkKeys + 1,
            task.partial_offset < 0 ? nullptr : partials + task.partial_offset,
            ThreadScratch(scratch_floats));
  };
  auto run_combine = [&](int, int64_t index) {
    const Task& c = combines[index];
    const Tile& tile = tiles[c.tile];
    combine_fn(p, tile.t0, tile.t1, c.h0, c.h1, c.c1 - c.c0, partials + c.partial_offset,
               ThreadScratch(scratch_floats));
  };
  const auto num_tasks = static_cast<int64_t>(tasks.size());
  const auto num_combines = static_cast<int64_t>(combines.size());
  if (p.pool != nullptr) {
    p.pool->ParallelFor(num_tasks, run_task);
    // Combining is light (a few vector ops per row and chunk): a second parallel loop only
    // pays off for many records.
    if (partial_floats < kParallelCombineFloats) {
      for (int64_t i = 0; i < num_combines; ++i) run_combine(0, i);
    } else {
      p.pool->ParallelFor(num_combines, run_combine);
    }
  } else {
    for (int64_t i = 0; i < num_tasks; ++i) run_task(0, i);
    for (int64_t i = 0; i < num_combines; ++i) run_combine(0, i);
  }
}

}  // namespace dinfer::kernels::cpu
