// EscapeBytes: bytes from a file or a client, made safe to put in an error message that
// reaches a terminal or a log.
//
// Printable ASCII and valid UTF-8 characters from U+00A0 on stay as they are (so a GPT-2
// token such as "Ġworld" reads as itself); everything else is escaped C-style: \n \r \t,
// \\ and \" (messages quote such text), and \xNN for every other byte — control characters
// (ESC starts terminal escape sequences), DEL, C1 controls, invalid or overlong UTF-8. The
// bidirectional-override characters (U+202A..U+202E, U+2066..U+2069), which reorder what a
// terminal shows, are escaped byte by byte too.
#ifndef PREFIXD_BASE_ESCAPE_H_
#define PREFIXD_BASE_ESCAPE_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace prefixd {

namespace escape_internal {

// Length of the valid UTF-8 sequence at the start of `s` encoding a code point >= U+00A0
// that is not a bidirectional override, or 0.
inline size_t PrintableUtf8Length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  uint32_t cp;
  size_t n;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    if (!cont(1)) return 0;
    cp = ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu);
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (!cont(1) || !cont(2)) return 0;
    cp = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;  // overlong, surrogate
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    cp = ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    if (cp < 0x10000 || cp > 0x10FFFF) return 0;
  } else {
    return 0;
  }
  if (cp < 0xA0) return 0;  // C1 controls
  if ((cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069)) return 0;
  return n;
}

}  // namespace escape_internal

inline std::string EscapeBytes(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (const size_t n = escape_internal::PrintableUtf8Length(s.substr(i)); n > 0) {
        out.append(s.substr(i, n));
        i += n;
        continue;
      }
    }
    ++i;
    switch (c) {
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '"':
        out += "\\\"";
        continue;
      default:
        break;
    }
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

}  // namespace prefixd

#endif  // PREFIXD_BASE_ESCAPE_H_
