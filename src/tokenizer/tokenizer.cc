#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <deque>

#include "base/thread_pool.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace dinfer::tokenizer {

struct Tokenizer::Scratch {
  std::vector<AddedVocab::Segment> raw_segments;
  std::vector<AddedVocab::Segment> normalized_segments;
  std::string normalized;
  PreTokenizer::Scratch pre;
  std::vector<std::string_view> pieces;
};

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Build(TokenizerDefinition def) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  DINFER_ASSIGN_OR_RETURN(tok->pre_tokenizer_, PreTokenizer::Create(std::move(def.pre_tokenizer)));
  def.bpe.byte_level = tok->pre_tokenizer_->byte_level();
  DINFER_ASSIGN_OR_RETURN(tok->model_, BpeModel::Create(def.vocab, def.merges, def.bpe));

  int32_t limit = tok->model_->id_limit();
  for (const AddedToken& t : def.added_tokens) limit = std::max(limit, t.id + 1);
  tok->token_bytes_.resize(static_cast<size_t>(limit));
  tok->special_.assign(static_cast<size_t>(limit), 0);
  for (int32_t id = 0; id < tok->model_->id_limit(); ++id) {
    tok->token_bytes_[id] = DecodeByteLevel(tok->model_->IdToToken(id));
  }
  DINFER_ASSIGN_OR_RETURN(tok->added_, AddedVocab::Create(std::move(def.added_tokens)));
  // HF's ByteLevel decoder treats an added token's content like any token's text.
  for (const AddedToken& t : tok->added_->tokens()) {
    tok->token_bytes_[t.id] = DecodeByteLevel(t.content);
    tok->special_[t.id] = t.special;
  }
  for (int32_t id : def.raw_text_ids) {
    if (id < 0 || id >= limit) return InvalidArgument("raw-text token id {} out of range", id);
    const AddedToken* added = tok->added_->FindById(id);
    tok->token_bytes_[id] = added ? added->content : tok->model_->IdToToken(id);
  }

  auto check_id = [limit](std::optional<int32_t> id, std::string_view what) -> Status {
    if (id && (*id < 0 || *id >= limit)) {
      return InvalidArgument("{} id {} is outside the vocabulary (size {})", what, *id, limit);
    }
    return OkStatus();
  };
  DINFER_RETURN_IF_ERROR(check_id(def.bos_id, "bos"));
  for (int32_t id : def.eos_ids) DINFER_RETURN_IF_ERROR(check_id(id, "eos"));
  tok->nfc_ = def.nfc;
  tok->bos_id_ = def.bos_id;
  for (int32_t id : def.eos_ids) {
    if (std::find(tok->eos_ids_.begin(), tok->eos_ids_.end(), id) == tok->eos_ids_.end()) {
      tok->eos_ids_.push_back(id);
    }
  }
  tok->add_bos_ = def.add_bos;
  tok->chat_template_ = std::move(def.chat_template);
  tok->tool_use_chat_template_ = std::move(def.tool_use_chat_template);
  return tok;
}

template <typename OnId, typename OnText>
void Tokenizer::ForEachText(std::string_view text, AddedTokens added, Scratch* scratch,
                            OnId&& on_id, OnText&& on_text) const {
  if (added == AddedTokens::kNone) {
    if (nfc_ && NormalizeNfc(text, &scratch->normalized)) text = scratch->normalized;
    on_text(text);
    return;
  }
  const bool parse_special = added == AddedTokens::kAll;
  // Tokens matched on raw text first; the text between them is normalized, then cut around the
  // tokens matched on normalized text (HF's order).
  added_->Split(text, /*normalized_pass=*/false, parse_special, &scratch->raw_segments);
  for (const AddedVocab::Segment& seg : scratch->raw_segments) {
    if (seg.id >= 0) {
      on_id(seg.id);
      continue;
    }
    std::string_view segment = text.substr(seg.begin, seg.end - seg.begin);
    if (nfc_ && NormalizeNfc(segment, &scratch->normalized)) segment = scratch->normalized;
    if (!added_->HasTokens(/*normalized_pass=*/true)) {
      on_text(segment);
      continue;
    }
    added_->Split(segment, /*normalized_pass=*/true, parse_special, &scratch->normalized_segments);
    for (const AddedVocab::Segment& n : scratch->normalized_segments) {
      if (n.id >= 0) {
        on_id(n.id);
      } else {
        on_text(segment.substr(n.begin, n.end - n.begin));
      }
    }
  }
}

template <typename OnId, typename OnPiece>
void Tokenizer::ForEachPiece(std::string_view text, AddedTokens added, Scratch* scratch,
                             OnId&& on_id, OnPiece&& on_piece) const {
  ForEachText(text, added, scratch, on_id, [&](std::string_view s) {
    pre_tokenizer_->Split(s, &scratch->pre, &scratch->pieces);
    for (std::string_view piece : scratch->pieces) on_piece(piece);
  });
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  Scratch scratch;
  ForEachPiece(
      text, parse_special ? AddedTokens::kAll : AddedTokens::kNonSpecial, &scratch,
      [&](int32_t id) { ids.push_back(id); },
      [&](std::string_view piece) { model_->Encode(piece, &ids); });
  return ids;
}

std::vector<Tokenizer::PromptPart> Tokenizer::SplitPrompt(
    std::span<const PromptSegment> segments) const {
  std::vector<PromptPart> parts;
  std::string run;  // plain text since the last added token
  auto flush_run = [&] {
    if (!run.empty()) parts.push_back({-1, std::move(run)});
    run.clear();
  };
  std::vector<AddedVocab::Segment> raw_cuts, cuts;
  for (size_t i = 0; i < segments.size();) {
    if (!segments[i].trusted) {
      run += segments[i++].text;
      continue;
    }
    // Adjacent trusted segments form one text, so markup split across them still matches.
    std::string trusted;
    for (; i < segments.size() && segments[i].trusted; ++i) trusted += segments[i].text;
    // Every added token the template wrote is markup, whether or not tokenizer.json calls it
    // special (DeepSeek's role and DSML tokens are not); both of HF's passes look for them, the
    // normalized one on the raw text, which template markup leaves unchanged.
    added_->Split(trusted, /*normalized_pass=*/false, /*parse_special=*/true, &raw_cuts);
    for (const AddedVocab::Segment& raw : raw_cuts) {
      if (raw.id >= 0) {
        flush_run();
        parts.push_back({raw.id, {}});
        continue;
      }
      std::string_view piece(trusted.data() + raw.begin, raw.end - raw.begin);
      added_->Split(piece, /*normalized_pass=*/true, /*parse_special=*/true, &cuts);
      for (const AddedVocab::Segment& cut : cuts) {
        if (cut.id >= 0) {
          flush_run();
          parts.push_back({cut.id, {}});
        } else {
          run.append(piece, cut.begin, cut.end - cut.begin);
        }
      }
    }
  }
  flush_run();
  return parts;
}

std::vector<int32_t> Tokenizer::EncodeSegments(std::span<const PromptSegment> segments,
                                               ThreadPool* pool) const {
  // Below this much text, handing work to other threads costs more than it saves.
  constexpr size_t kParallelMinBytes = 32 << 10;
  const std::vector<PromptPart> parts = SplitPrompt(segments);
  size_t bytes = 0;
  for (const PromptPart& part : parts) bytes += part.text.size();
  if (pool != nullptr && pool->num_threads() > 1 && bytes >= kParallelMinBytes) {
    return EncodeParts(parts, *pool);
  }
  std::vector<int32_t> ids;
  Scratch scratch;
  for (const PromptPart& part : parts) {
    if (part.id >= 0) {
      ids.push_back(part.id);
    } else {
      ForEachPiece(
          part.text, AddedTokens::kNone, &scratch, [&](int32_t id) { ids.push_back(id); },
          [&](std::string_view piece) { model_->Encode(piece, &ids); });
    }
  }
  return ids;
}

// Parallel loops, each calling what Encode calls on the same text, so the ids are Encode's.
// First, every plain run is walked (normalization, pre-tokenization) on its own
// thread, largest first; short runs are BPE-encoded right there, long ones keep their pieces.
// Texts too long for one thread to pre-tokenize are left for PreTokenizer::SplitParallel. Last,
// the long runs' pieces, cut into chunks of about kChunkBytes, are BPE-encoded concurrently.
std::vector<int32_t> Tokenizer::EncodeParts(const std::vector<PromptPart>& parts,
                                            ThreadPool& pool) const {
  constexpr size_t kChunkBytes = 16 << 10;           // a task of roughly a millisecond
  constexpr size_t kParallelSplitBytes = 256 << 10;  // pre-tokenized on the pool
  struct Item {
    int32_t id = -1;         // an added token, or
    std::string_view piece;  // a piece, or
    int32_t deferred = -1;   // the pieces of RunWork::deferred[deferred]
  };
  struct Deferred {
    std::string_view text;
    std::vector<std::string_view> pieces;
  };
  struct RunWork {
    std::vector<int32_t> ids;  // a short run's encoding
    std::vector<Item> items;   // a long run's added tokens and pieces, in order
    std::vector<Deferred> deferred;
    std::deque<std::string> copies;  // texts and pieces that viewed a thread's scratch buffers
  };
  std::vector<size_t> runs;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].id < 0) runs.push_back(i);
  }
  std::stable_sort(runs.begin(), runs.end(),
                   [&](size_t a, size_t b) { return parts[a].text.size() > parts[b].text.size(); });
  std::vector<RunWork> work(parts.size());
  std::vector<Scratch> scratch(static_cast<size_t>(pool.num_threads()));
  pool.ParallelFor(static_cast<int64_t>(runs.size()), [&](int thread, int64_t task) {
    const std::string& text = parts[runs[static_cast<size_t>(task)]].text;
    RunWork& w = work[runs[static_cast<size_t>(task)]];
    Scratch* s = &scratch[static_cast<size_t>(thread)];
    if (text.size() <= kChunkBytes) {
      w.ids.reserve(text.size() / 3 + 8);
      ForEachPiece(
          text, AddedTokens::kNone, s, [&](int32_t id) { w.ids.push_back(id); },
          [&](std::string_view piece) { model_->Encode(piece, &w.ids); });
      return;
    }
    auto stable = [&, begin = text.data(), end = text.data() + text.size()](std::string_view v) {
      return v.data() < begin || v.data() + v.size() > end
                 ? std::string_view(w.copies.emplace_back(v))
                 : v;
    };
    ForEachText(
        text, AddedTokens::kNone, s,
        [&](int32_t id) {
          w.items.push_back({id, {}, -1});
        },
        [&](std::string_view t) {
          if (t.size() >= kParallelSplitBytes) {
            w.items.push_back({-1, {}, static_cast<int32_t>(w.deferred.size())});
            w.deferred.push_back({stable(t), {}});
            return;
          }
          pre_tokenizer_->Split(t, &s->pre, &s->pieces);
          for (std::string_view piece : s->pieces) w.items.push_back({-1, stable(piece), -1});
        });
  });

  std::vector<PreTokenizer::Scratch> pre_scratch(static_cast<size_t>(pool.num_threads()));
  for (RunWork& w : work) {
    for (Deferred& d : w.deferred) {
      pre_tokenizer_->SplitParallel(d.text, pool, pre_scratch, &d.pieces, &w.copies);
    }
  }

  // The long runs' tokens and pieces in order, cut into chunks.
  struct Chunk {
    size_t part;
    std::vector<std::pair<int32_t, std::string_view>> items;  // an added token, or a piece
    std::vector<int32_t> ids;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < parts.size(); ++i) {
    size_t bytes = kChunkBytes;  // starts a chunk at the first item
    auto add = [&](int32_t id, std::string_view piece) {
      if (bytes >= kChunkBytes) {
        chunks.push_back({i, {}, {}});
        bytes = 0;
      }
      chunks.back().items.emplace_back(id, piece);
      bytes += piece.size();
    };
    for (const Item& item : work[i].items) {
      if (item.deferred < 0) {
        add(item.id, item.piece);
        continue;
      }
      for (std::string_view piece : work[i].deferred[static_cast<size_t>(item.deferred)].pieces) {
        add(-1, piece);
      }
    }
  }
  pool.ParallelFor(static_cast<int64_t>(chunks.size()), [&](int, int64_t c) {
    Chunk& chunk = chunks[static_cast<size_t>(c)];
    for (const auto& [id, piece] : chunk.items) {
      if (id >= 0) {
        chunk.ids.push_back(id);
      } else {
        model_->Encode(piece, &chunk.ids);
      }
    }
  });

  std::vector<int32_t> ids;
  size_t next_chunk = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].id >= 0) {
      ids.push_back(parts[i].id);
      continue;
    }
    ids.insert(ids.end(), work[i].ids.begin(), work[i].ids.end());
    for (; next_chunk < chunks.size() && chunks[next_chunk].part == i; ++next_chunk) {
      ids.insert(ids.end(), chunks[next_chunk].ids.begin(), chunks[next_chunk].ids.end());
    }
  }
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    bytes += TokenBytes(id);
  }
  return Utf8Lossy(bytes);
}

const std::string& Tokenizer::TokenBytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return token_bytes_[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token_content) const {
  if (const AddedToken* t = added_->FindByContent(token_content)) return t->id;
  return model_->TokenToId(token_content);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  pending_ += tokenizer_.TokenBytes(id);
  // Emit everything up to an incomplete sequence at the very end; ill-formed bytes before it are
  // final and become U+FFFD now, exactly as Decode would replace them.
  size_t pos = 0;
  std::string out;
  while (pos < pending_.size()) {
    const Utf8Char ch = DecodeUtf8(pending_, pos);
    if (ch.status == Utf8Status::kIncomplete) break;
    if (ch.status == Utf8Status::kValid) {
      out.append(pending_, pos, ch.length);
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    pos += ch.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dinfer::tokenizer
