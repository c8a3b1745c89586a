#include "tokenizer/tokenizer.h"

#include <algorithm>

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
  return tok;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  Scratch scratch;
  // Tokens matched on raw text first; the text between them is normalized, then cut around the
  // tokens matched on normalized text (HF's order).
  added_->Split(text, /*normalized_pass=*/false, parse_special, &scratch.raw_segments);
  for (const AddedVocab::Segment& seg : scratch.raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view segment = text.substr(seg.begin, seg.end - seg.begin);
    if (nfc_ && NormalizeNfc(segment, &scratch.normalized)) segment = scratch.normalized;
    EncodeSegment(segment, parse_special, &scratch, &ids);
  }
  return ids;
}

std::vector<int32_t> Tokenizer::EncodeSegments(std::span<const PromptSegment> segments) const {
  std::vector<int32_t> ids;
  Scratch scratch;
  std::string run;  // plain text since the last added token
  auto flush_run = [&] {
    if (run.empty()) return;
    std::string_view text = run;
    if (nfc_ && NormalizeNfc(text, &scratch.normalized)) text = scratch.normalized;
    EncodeText(text, &scratch, &ids);
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
        ids.push_back(raw.id);
        continue;
      }
      std::string_view piece(trusted.data() + raw.begin, raw.end - raw.begin);
      added_->Split(piece, /*normalized_pass=*/true, /*parse_special=*/true, &cuts);
      for (const AddedVocab::Segment& cut : cuts) {
        if (cut.id >= 0) {
          flush_run();
          ids.push_back(cut.id);
        } else {
          run.append(piece, cut.begin, cut.end - cut.begin);
        }
      }
    }
  }
  flush_run();
  return ids;
}

void Tokenizer::EncodeSegment(std::string_view text, bool parse_special, Scratch* scratch,
                              std::vector<int32_t>* ids) const {
  if (!added_->HasTokens(/*normalized_pass=*/true)) {
    EncodeText(text, scratch, ids);
    return;
  }
  added_->Split(text, /*normalized_pass=*/true, parse_special, &scratch->normalized_segments);
  for (const AddedVocab::Segment& seg : scratch->normalized_segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
    } else {
      EncodeText(text.substr(seg.begin, seg.end - seg.begin), scratch, ids);
    }
  }
}

void Tokenizer::EncodeText(std::string_view text, Scratch* scratch,
                           std::vector<int32_t>* ids) const {
  pre_tokenizer_->Split(text, &scratch->pre, &scratch->pieces);
  for (std::string_view piece : scratch->pieces) model_->Encode(piece, ids);
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
