#include "engine/internal/bpe_pretokenizer.h"

#include <cstddef>
#include <string>
#include <string_view>

#include "base/check.h"
#include "re2/re2.h"

namespace prefixd::internal {
namespace {

// Python `regex`'s `\s` in Unicode mode: the White_Space property. RE2's own `\s` is
// ASCII-only, so the class is spelled out; IsWhiteSpace below must list the same set.
#define PREFIXD_WS                                                                 \
  "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
  "\\x{202F}\\x{205F}\\x{3000}"

// encoder.py's pattern without its `\s+(?!\S)` alternative: RE2 has no lookahead, so a
// whitespace run always matches the final `[WS]+` alternative greedily and PreTokenize
// gives back its last character when a non-space follows (see there). RE2's default
// semantics are leftmost-first, like Python's, so the alternation order is kept.
constexpr char kPattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" PREFIXD_WS
                            "\\p{L}\\p{N}]+|[" PREFIXD_WS "]+";
#undef PREFIXD_WS

bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Start of the last UTF-8 character of `s` (non-empty, valid UTF-8 since RE2 matched it).
size_t LastCharStart(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

char32_t DecodeAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[k])); };
  const char32_t lead = b(i);
  if (lead < 0x80) return lead;
  if (lead < 0xE0) return ((lead & 0x1F) << 6) | (b(i + 1) & 0x3F);
  if (lead < 0xF0) return ((lead & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
  return ((lead & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
         (b(i + 3) & 0x3F);
}

const RE2& Pattern() {
  static const RE2* const re = [] {
    RE2::Options options;  // UTF-8, leftmost-first
    options.set_log_errors(false);
    auto* r = new RE2(kPattern, options);
    PREFIXD_CHECK(r->ok());
    return r;
  }();
  return *re;
}

bool IsAsciiLetter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
bool IsAsciiDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsAsciiSpace(unsigned char c) { return (c >= 0x09 && c <= 0x0D) || c == ' '; }

// The length of the piece at `pos` when ASCII alone decides it, else 0 (the caller asks
// RE2). A piece ends at the first character outside its class, so whenever that character
// (or the one that decides a whitespace run's end) is non-ASCII, its Unicode class matters
// and RE2 must decide. Only ASCII classes are spelled out here; they are the pattern's
// classes restricted to ASCII, and a test checks this path against RE2 alone.
size_t AsciiPieceLength(std::string_view text, size_t pos) {
  const size_t n = text.size();
  const auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char c = at(pos);
  if (c >= 0x80) return 0;
  if (c == '\'' && pos + 1 < n) {
    const unsigned char d = at(pos + 1);
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
    if (pos + 2 < n) {
      const unsigned char e = at(pos + 2);
      if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return 3;
    }
  }
  size_t i = pos;
  unsigned char first = c;
  if (c == ' ' && pos + 1 < n) {
    const unsigned char d = at(pos + 1);
    if (d >= 0x80) return 0;  // " é", " 中": the class of d decides
    if (!IsAsciiSpace(d)) {
      i = pos + 1;  // " word", " 42", " !!"
      first = d;
    }
  }
  if (IsAsciiSpace(first)) {
    size_t j = pos;
    while (j < n && IsAsciiSpace(at(j))) ++j;
    if (j == n) return j - pos;
    if (at(j) >= 0x80) return 0;            // U+00A0 and friends may continue the run
    return j - pos >= 2 ? j - pos - 1 : 1;  // \s+(?!\S): leave one space for the next piece
  }
  bool (*same)(unsigned char);
  if (IsAsciiLetter(first)) {
    same = IsAsciiLetter;
  } else if (IsAsciiDigit(first)) {
    same = IsAsciiDigit;
  } else {
    same = [](unsigned char x) {
      return x < 0x80 && !IsAsciiLetter(x) && !IsAsciiDigit(x) && !IsAsciiSpace(x);
    };
  }
  size_t j = i + 1;
  while (j < n && same(at(j))) ++j;
  if (j < n && at(j) >= 0x80) return 0;
  return j - pos;
}

// Stops early when `emit` returns false.
void Scan(std::string_view text, bool ascii_fast_path,
          absl::FunctionRef<bool(std::string_view)> emit) {
  const RE2& re = Pattern();
  const re2::StringPiece input(text.data(), text.size());
  size_t pos = 0;
  size_t gap_start = 0;  // start of a run of bytes no match can begin at (invalid UTF-8)
  bool in_gap = false;
  while (pos < text.size()) {
    if (ascii_fast_path && !in_gap) {
      if (const size_t len = AsciiPieceLength(text, pos); len > 0) {
        if (!emit(text.substr(pos, len))) return;
        pos += len;
        continue;
      }
    }
    re2::StringPiece m;
    if (!re.Match(input, pos, text.size(), RE2::ANCHOR_START, &m, 1) || m.empty()) {
      if (!in_gap) gap_start = pos;
      in_gap = true;
      ++pos;
      continue;
    }
    if (in_gap) {
      if (!emit(text.substr(gap_start, pos - gap_start))) return;
      in_gap = false;
    }
    std::string_view piece(m.data(), m.size());
    // Emulates `\s+(?!\S)|\s+`: a whitespace run (only the last alternative ends in
    // whitespace) that is followed by something — necessarily non-space, as the run is
    // greedy — and has at least two characters leaves its last one to the next piece,
    // so that " word" stays together.
    if (pos + piece.size() < text.size()) {
      const size_t last = LastCharStart(piece);
      if (last > 0 && IsWhiteSpace(DecodeAt(piece, last))) piece = piece.substr(0, last);
    }
    if (!emit(piece)) return;
    pos += piece.size();
  }
  if (in_gap) emit(text.substr(gap_start));
}

}  // namespace

void PreTokenize(std::string_view text, absl::FunctionRef<void(std::string_view)> emit) {
  Scan(text, /*ascii_fast_path=*/true, [&](std::string_view piece) {
    emit(piece);
    return true;
  });
}

void PreTokenizeWhile(std::string_view text, absl::FunctionRef<bool(std::string_view)> emit) {
  Scan(text, /*ascii_fast_path=*/true, emit);
}

void PreTokenizeWithRe2Only(std::string_view text, absl::FunctionRef<void(std::string_view)> emit) {
  Scan(text, /*ascii_fast_path=*/false, [&](std::string_view piece) {
    emit(piece);
    return true;
  });
}

}  // namespace prefixd::internal
