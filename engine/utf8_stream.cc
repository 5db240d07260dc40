#include <string>
#include <string_view>

#include "engine/tokenizer.h"

namespace prefixd {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence that starts with `lead`, or 0 if `lead` cannot start one.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `c` may follow `lead` as the second byte (excludes overlongs, surrogates and
// code points above U+10FFFF, as the Unicode standard's table 3-7 does).
bool ValidSecond(unsigned char lead, unsigned char c) {
  if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
  if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
  if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
  if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
  return c >= 0x80 && c <= 0xBF;
}

}  // namespace

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  const size_t n = pending_.size();
  while (i < n) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    const int len = SequenceLength(lead);
    if (len == 0) {  // stray continuation or invalid lead byte
      out.append(kReplacement);
      ++i;
      continue;
    }
    if (len == 1) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    // Check the bytes that are present; an incomplete but so-far-valid tail is held back.
    int ok = 1;
    while (ok < len && i + ok < n) {
      const auto c = static_cast<unsigned char>(pending_[i + ok]);
      const bool valid = ok == 1 ? ValidSecond(lead, c) : (c >= 0x80 && c <= 0xBF);
      if (!valid) break;
      ++ok;
    }
    if (ok == len) {
      out.append(pending_, i, len);
      i += len;
    } else if (i + ok == n) {
      break;  // incomplete: wait for more bytes
    } else {
      out.append(kReplacement);  // maximal invalid prefix becomes one U+FFFD
      i += ok;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  std::string out = pending_.empty() ? "" : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace prefixd
