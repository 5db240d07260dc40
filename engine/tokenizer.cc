// GPT-2 byte-level BPE. Tokens are stored as raw bytes: vocab.json and merges.txt spell
// bytes with GPT-2's printable byte alphabet (bytes_to_unicode in OpenAI's encoder.py),
// which Load maps back once, so encoding and decoding never touch that alphabet.
#include "engine/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/escape.h"
#include "engine/internal/bpe_pretokenizer.h"
#include "base/file.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

constexpr uint32_t kNoByte = std::numeric_limits<uint32_t>::max();

// encoder.py's bytes_to_unicode, inverted: code point of the alphabet -> byte. Printable
// Latin-1 bytes stand for themselves; the other 68 bytes map to U+0100.. in byte order.
std::array<uint32_t, 324> AlphabetToByte() {
  std::array<uint32_t, 324> to_byte;
  to_byte.fill(kNoByte);
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    to_byte[printable ? b : 256 + next++] = static_cast<uint32_t>(b);
  }
  return to_byte;
}

// Maps a token spelled in the byte alphabet (UTF-8 text) back to raw bytes; false if it
// contains a character outside the alphabet.
bool AlphabetToBytes(std::string_view spelled, std::string* out) {
  static const std::array<uint32_t, 324> kToByte = AlphabetToByte();
  out->clear();
  for (size_t i = 0; i < spelled.size();) {
    const auto c0 = static_cast<unsigned char>(spelled[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if (c0 >= 0xC2 && c0 <= 0xDF && i + 1 < spelled.size() &&
               (static_cast<unsigned char>(spelled[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // the alphabet lies below U+0800: two UTF-8 bytes at most
    }
    if (cp >= kToByte.size() || kToByte[cp] == kNoByte) return false;
    out->push_back(static_cast<char>(kToByte[cp]));
  }
  return true;
}

uint64_t PairKey(uint32_t left, uint32_t right) {
  return (static_cast<uint64_t>(left) << 32) | right;
}

struct Merge {
  uint32_t rank;    // line order in merges.txt: lower merges first
  uint32_t merged;  // id of left + right
};

// Piece -> ids, shared by all Encode calls (most pieces are common words). Sharded so
// concurrent encoders rarely meet on a lock; bounded by clearing a shard when it fills,
// which is crude but keeps memory fixed and needs no bookkeeping on hits.
class PieceCache {
 public:
  static constexpr size_t kMaxPieceBytes = 64;  // longer pieces are rare: not worth caching
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 8192;  // 128K pieces, ~20 MB at most

  // Appends the cached ids of `piece` to `out` and returns true, or returns false.
  bool Lookup(std::string_view piece, std::vector<uint32_t>* out) const {
    const size_t h = absl::Hash<std::string_view>{}(piece);
    Shard& shard = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    // Debian's absl has its own string_view type; that is what heterogeneous lookup takes.
    const auto it = shard.map.find(absl::string_view(piece.data(), piece.size()));
    if (it == shard.map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(std::string_view piece, absl::Span<const uint32_t> ids) const {
    const size_t h = absl::Hash<std::string_view>{}(piece);
    Shard& shard = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
    shard.map.try_emplace(std::string(piece), ids.begin(), ids.end());
  }

 private:
  struct Shard {
    // std::mutex, not absl::Mutex: Debian's absl is built with deadlock detection on,
    // which costs more than the lookup it guards.
    std::mutex mu;
    absl::flat_hash_map<std::string, std::vector<uint32_t>> map;  // guarded by mu
  };
  mutable std::array<Shard, kShards> shards_;
};

// Per-call scratch, reused across the pieces of one Encode so BPE allocates nothing per
// byte or per piece.
struct Scratch {
  struct Symbol {
    uint32_t id;
    int prev;  // index of the previous live symbol, -1 if none
    int next;  // index of the next live symbol, -1 if none
  };
  struct Candidate {
    uint32_t rank;
    int left;  // index of the pair's left symbol; ties merge leftmost first
    uint32_t left_id;
    uint32_t right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Create(std::string_view vocab_text,
                                                               std::string_view merges_text,
                                                               const std::string& vocab_path,
                                                               const std::string& merges_path);

  std::vector<uint32_t> Encode(std::string_view text) const override {
    return EncodeAtMost(text, std::numeric_limits<size_t>::max());
  }

  std::vector<uint32_t> EncodeAtMost(std::string_view text, size_t max_tokens) const override {
    std::vector<uint32_t> ids;
    // GPT-2 averages ~4 bytes per token on English.
    ids.reserve(std::min(text.size() / 3 + 8, max_tokens == std::numeric_limits<size_t>::max()
                                                  ? max_tokens
                                                  : max_tokens + 1));
    Scratch scratch;
    internal::PreTokenizeWhile(text, [&](std::string_view piece) {
      if (piece.size() == 1) {
        ids.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      } else {
        const bool cacheable = piece.size() <= PieceCache::kMaxPieceBytes;
        if (!cacheable || !cache_.Lookup(piece, &ids)) {
          const size_t begin = ids.size();
          Bpe(piece, &scratch, &ids);
          if (cacheable) cache_.Insert(piece, absl::MakeConstSpan(ids).subspan(begin));
        }
      }
      return ids.size() <= max_tokens;
    });
    return ids;
  }

  size_t max_token_bytes() const override { return max_token_bytes_; }

  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override {
    size_t total = 0;
    for (const uint32_t id : ids) {
      if (id >= vocab_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is out of range [0, ", vocab_size(), ")"));
      }
      total += offsets_[id + 1] - offsets_[id];
    }
    std::string out;
    out.reserve(total);
    for (const uint32_t id : ids) out.append(TokenBytes(id));
    return out;
  }

  std::string_view TokenBytes(uint32_t id) const override {
    if (id >= vocab_size()) return {};
    return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }

  size_t vocab_size() const override { return offsets_.size() - 1; }

 private:
  // OpenAI's bpe(): repeatedly merge the lowest-ranked adjacent pair, every occurrence of it
  // left to right, until no pair has a rank. Done with a heap of candidate pairs over a
  // linked list, so long pieces (a megabyte of spaces) cost O(n log n), not O(n^2).
  // Equal ranks mean the same pair and pop leftmost first, which is encoder.py's
  // left-to-right pass; a merge's result only joins pairs ranked later (merges.txt lists a
  // token's own merge before any merge that uses it), so the order of passes is kept too.
  void Bpe(std::string_view piece, Scratch* s, std::vector<uint32_t>* out) const {
    auto& sym = s->symbols;
    auto& heap = s->heap;
    const int n = static_cast<int>(piece.size());
    sym.resize(n);
    heap.clear();
    for (int i = 0; i < n; ++i) {
      sym[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
    }
    const auto cmp = std::greater<Scratch::Candidate>();
    const auto push = [&](int left) {
      const int right = sym[left].next;
      if (right < 0) return;
      const auto it = merges_.find(PairKey(sym[left].id, sym[right].id));
      if (it == merges_.end()) return;
      heap.push_back({it->second.rank, left, sym[left].id, sym[right].id});
      std::push_heap(heap.begin(), heap.end(), cmp);
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      const Scratch::Candidate c = heap.back();
      heap.pop_back();
      // Stale if either side has merged since: ids at a position only ever grow longer.
      const int right = sym[c.left].next;
      if (sym[c.left].id != c.left_id || right < 0 || sym[right].id != c.right_id) continue;
      if (sym[c.left].prev == -2) continue;  // left symbol was absorbed
      sym[c.left].id = merges_.find(PairKey(c.left_id, c.right_id))->second.merged;
      sym[c.left].next = sym[right].next;
      if (sym[right].next >= 0) sym[sym[right].next].prev = c.left;
      sym[right].prev = -2;  // dead
      sym[right].id = kNoByte;
      if (sym[c.left].prev >= 0) push(sym[c.left].prev);
      push(c.left);
    }
    for (int i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
  }

  std::string bytes_;              // all tokens' bytes, concatenated in id order
  std::vector<uint32_t> offsets_;  // token id's bytes are [offsets_[id], offsets_[id + 1])
  std::array<uint32_t, 256> byte_ids_{};
  size_t max_token_bytes_ = 1;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // PairKey(left, right) -> merge
  PieceCache cache_;
};

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Create(
    std::string_view vocab_text, std::string_view merges_text, const std::string& vocab_path,
    const std::string& merges_path) {
  auto tok = std::make_unique<Gpt2Tokenizer>();

  // vocab.json: {"token in byte alphabet": id, ...}, ids dense from 0.
  const nlohmann::json vocab = nlohmann::json::parse(vocab_text, nullptr, false);
  if (vocab.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": not valid JSON"));
  if (!vocab.is_object() || vocab.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(vocab_path, ": expected a non-empty JSON object of token -> id"));
  }
  const size_t n = vocab.size();
  std::vector<std::string> tokens(n);
  std::vector<bool> present(n, false);
  absl::flat_hash_map<std::string, uint32_t> id_of;
  id_of.reserve(n);
  std::string raw;
  for (const auto& item : vocab.items()) {
    const std::string& spelled = item.key();
    const nlohmann::json& value = item.value();
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= n) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": token \"", EscapeBytes(spelled),
                                                     "\" has an id that is not an integer in [0, ",
                                                     n, ")"));
    }
    const auto id = value.get<uint32_t>();
    if (present[id]) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": id ", id, " is used twice"));
    }
    if (!AlphabetToBytes(spelled, &raw) || raw.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token \"", EscapeBytes(spelled),
                       "\" is empty or not spelled in GPT-2's byte alphabet"));
    }
    if (!id_of.try_emplace(raw, id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token \"", EscapeBytes(spelled), "\" appears twice"));
    }
    present[id] = true;
    tokens[id] = raw;
  }
  // n distinct ids, each < n: the ids are exactly 0..n-1.
  tok->offsets_.reserve(n + 1);
  tok->offsets_.push_back(0);
  for (const std::string& t : tokens) {
    tok->bytes_.append(t);
    tok->offsets_.push_back(static_cast<uint32_t>(tok->bytes_.size()));
    tok->max_token_bytes_ = std::max(tok->max_token_bytes_, t.size());
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(std::string(1, static_cast<char>(b)));
    if (it == id_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          vocab_path, ": byte ", b, " has no token, so some text could not be encoded"));
    }
    tok->byte_ids_[b] = it->second;
  }

  // merges.txt: an optional "#version" line, then "left right" per line, best first.
  uint32_t rank = 0;
  int line_no = 0;
  std::string left_raw, right_raw;
  const std::string_view all = merges_text;
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find('\n', start);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    const auto where = [&] { return absl::StrCat(merges_path, ":", line_no, ": "); };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "expected \"left right\", got \"", EscapeBytes(line), "\""));
    }
    if (!AlphabetToBytes(line.substr(0, space), &left_raw) ||
        !AlphabetToBytes(line.substr(space + 1), &right_raw)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "not spelled in GPT-2's byte alphabet"));
    }
    const auto left = id_of.find(left_raw);
    const auto right = id_of.find(right_raw);
    const auto merged = id_of.find(left_raw + right_raw);
    if (left == id_of.end() || right == id_of.end() || merged == id_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "\"", EscapeBytes(line),
                                                     "\" uses or makes a token that is not in ",
                                                     vocab_path));
    }
    // As encoder.py's dict(zip(merges, range(...))): a repeated pair keeps its last rank.
    tok->merges_[PairKey(left->second, right->second)] = Merge{rank++, merged->second};
  }
  // Without merges every token longer than a byte is unreachable: text would silently
  // encode as single bytes (an empty or header-only merges.txt next to GPT-2's vocab.json
  // turns "Hello world" into 11 tokens). A vocabulary of byte tokens needs no merges.
  if (tok->merges_.empty()) {
    size_t multi_byte = 0;
    for (const std::string& t : tokens) multi_byte += t.size() > 1 ? 1 : 0;
    if (multi_byte > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          merges_path, ": holds no merges, but ", vocab_path, " has ", multi_byte,
          " tokens longer than one byte that only merges can produce (GPT-2's merges.txt "
          "has a \"#version\" line, then 50,000 lines \"left right\")"));
    }
  }
  return tok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& vocab_json_path,
                                                           const std::string& merges_txt_path) {
  absl::StatusOr<std::string> vocab = ReadWholeFile(vocab_json_path);
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<std::string> merges = ReadWholeFile(merges_txt_path);
  if (!merges.ok()) return merges.status();
  return FromText(*vocab, *merges, vocab_json_path, merges_txt_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromText(std::string_view vocab_json,
                                                               std::string_view merges_txt,
                                                               const std::string& vocab_json_path,
                                                               const std::string& merges_txt_path) {
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tok =
      Gpt2Tokenizer::Create(vocab_json, merges_txt, vocab_json_path, merges_txt_path);
  if (!tok.ok()) return tok.status();
  return std::unique_ptr<Tokenizer>(std::move(*tok));
}

}  // namespace prefixd
