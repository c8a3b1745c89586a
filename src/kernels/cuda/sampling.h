// CUDA kernels on logits: greedy token choice per row (sample::Argmax semantics: the largest
// logit, the lowest index on ties), and the sampling step of sample::Sampler on the device —
// grammar bitmasks, logit bias, stop-token bans, repetition / presence / frequency penalties,
// temperature, top-k, min-p, top-p, a seeded draw, and logprobs. Launcher conventions as in
// elementwise.h.
//
// Sampling follows the CPU sampler's definitions so that the same seed draws the same token from
// the same distribution: the uniform number of a row is UniformDraw(seed, step) (a counter-based
// generator, so a row's draw depends on nothing but its seed and step), top-k / top-p / min-p
// keep a prefix of the tokens ordered by logit (descending, index ascending), and the draw walks
// that prefix in that order — or, without top-k and top-p, the vocabulary in index order. Token
// weights are exp((l - max) / temperature) held as 64-bit fixed-point integers, so every sum is
// exact and independent of the order of additions: results are deterministic and independent
// of the rows around a row. Truncations are found by radix selection over the logits' bits (a
// few passes over the row, no sort).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DINFER_HOST_DEVICE __host__ __device__
#else
#define DINFER_HOST_DEVICE
#endif

namespace dinfer::kernels::cuda {

// tokens[r] = argmax(logits[r, :vocab]); logits f32 [rows, stride]. A cluster of CTAs a row (a
// 129K vocabulary in a few microseconds); any rows, vocab and stride >= vocab.
int ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t* tokens,
               void* stream);

// Counter-based uniform number in [0, 1) for draw `step` of a sequence seeded with `seed`
// (SplitMix64 of seed + golden-ratio increments; sample::UniformDraw is the same function).
DINFER_HOST_DEVICE inline double SamplingUniform(uint64_t seed, uint64_t step) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z = z ^ (z >> 31);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// A sparse change to one token's logit, in the CPU sampler's order: the biases
// bias[bias_begin, bias_end) added one after the other (in f32), then -inf if `ban`, then (if
// `seen`) the repetition penalty and, with count > 0, presence + frequency * count (in f64).
struct TokenAdjustment {
  int32_t token = 0;
  int32_t count = 0;  // times generated
  uint32_t bias_begin = 0, bias_end = 0;
  uint8_t seen = 0;  // in the prompt or generated: the repetition penalty applies
  uint8_t ban = 0;
};

// One logits row's sampling parameters (sample::SamplingParams semantics).
struct SamplingRow {
  double temperature = 1.0;  // <= 0: greedy
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  uint64_t seed = 0;
  uint64_t step = 0;
  int32_t top_k = 0;
  int32_t logprobs = -1;  // -1: none; n >= 0: the chosen token's and the n most likely
  // Offset of this row's grammar mask in `masks` (words; bit t of word t / 32 set: token t is
  // allowed; tokens at or past mask_vocab are not), or -1 without a mask.
  int64_t mask_offset = -1;
  int32_t mask_vocab = 0;
  int32_t adjust_begin = 0, adjust_end = 0;  // this row's TokenAdjustments
};

inline constexpr int kMaxSampleLogprobs = 20;
// Vocabularies up to this size keep the fixed-point sums of weights within 64 bits.
inline constexpr int64_t kMaxSampleVocab = int64_t{1} << 19;

struct SampleRowsParams {
  float* logits = nullptr;  // f32 [rows, stride]; masks and adjustments are applied in place
  int64_t rows = 0, vocab = 0, stride = 0;
  const SamplingRow* params = nullptr;  // [rows]
  const uint32_t* masks = nullptr;
  const TokenAdjustment* adjustments = nullptr;
  const float* biases = nullptr;
  float* saved = nullptr;     // [adjustments]: each adjusted logit before its adjustment (scratch)
  int32_t* tokens = nullptr;  // [rows] out
  // Logprobs of the masked logits before bias and penalties (sample::SampleResult semantics),
  // for rows with logprobs >= 0 (others are left alone): [rows] the chosen token's, and
  // [rows, kMaxSampleLogprobs] the most likely tokens by logit (descending, index ascending).
  float* logprob = nullptr;
  int32_t* top_tokens = nullptr;
  float* top_logprobs = nullptr;
  double* log_norm = nullptr;  // [rows] scratch: max + log(sum exp(l - max))
  // What the host knows the rows need; launches nothing for what no row uses.
  bool any_mask = false, any_logprobs = false;
  int64_t num_adjustments = 0;
};

// Masks, logprob statistics, adjustments, then one token per row. vocab <= kMaxSampleVocab.
int SampleRows(const SampleRowsParams& p, void* stream);

}  // namespace dinfer::kernels::cuda
