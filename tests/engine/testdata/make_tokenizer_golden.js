// Regenerates tokenizer_golden.jsonl: node tests/engine/testdata/make_tokenizer_golden.js \
//   .deps/gpt2-tokenizer > tests/engine/testdata/tokenizer_golden.jsonl
//
// The oracle is OpenAI's GPT-2 encoder as ported to JS by the npm package gpt-3-encoder
// (Encoder.js), loaded from the given directory with one patch: JS's `\s` is not the
// `\s` of Python's `regex` module, which OpenAI's encoder.py uses. Python's is the Unicode
// White_Space property (includes U+0085, excludes U+FEFF); JS's includes U+FEFF and excludes
// U+0085. We follow Python, so the pattern is rewritten with that class spelled out.
// Each output line is {"text": ..., "ids": [...]}; the script fails if any id is missing
// or a line does not round-trip.
'use strict';
const fs = require('fs');
const path = require('path');

const dir = path.resolve(process.argv[2] || '.deps/gpt2-tokenizer');
const W = '\\t\\n\\v\\f\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const pythonPat = `/'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${W}\\p{L}\\p{N}]+|[${W}]+(?![^${W}])|[${W}]+/gu`;
let src = fs.readFileSync(path.join(dir, 'Encoder.js'), 'utf-8');
const patLine = /^const pat = .*$/m;
if (!patLine.test(src)) throw new Error('Encoder.js: pattern line not found');
src = src.replace(patLine, () => `const pat = ${pythonPat}`);
const mod = { exports: {} };
new Function('require', '__dirname', 'module', 'exports', src)(require, dir, mod, mod.exports);
const { encode, decode } = mod.exports;

// Deterministic PRNG (mulberry32) so the corpus is the same on every run.
let seed = 12345;
function rand() {
  seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

const lines = [
  'Hello world',
  'Hello, world! How are you doing today?',
  "I'm sure you've seen it; they'll say it's what we'd do, and we're right.",
  "DON'T SHOUT, it's rude. She'S odd. 'tis the season. rock 'n' roll",
  "He said 'hello' and 'sup'. The dogs' bones. '' ''' 'll 've",
  'The quick brown fox jumps over the lazy dog.',
  'Ask not what your country can do for you — ask what you can do for your country.',
  'It was the best of times, it was the worst of times, it was the age of wisdom...',
  'In 1969, Apollo 11 landed on the Moon; 600,000,000 people watched. Pi is 3.14159265358979.',
  'Phone: +1 (555) 010-9999, price $1,299.99, 50% off, 1e-9, 0x7FFF, 2nd 3rd 4th.',
  '12345678901234567890 007 1.0.0-rc1 v2.3.4 10/11/2026 23:59:59',
  '    four leading spaces',
  'trailing spaces    ',
  'a  b   c    d     e',
  'tabs\there\t\tand\t\t\tthere',
  'line one\nline two\n\nline four\n\n\n\nline eight',
  '\n\n\n',
  '   \n   \n',
  ' ',
  '  ',
  '\t',
  'x\r\ny\r\n\r\nz',
  'mixed \t \n whitespace \n\t runs',
  'def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
  'for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product',
  '#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size() == 3 ? 0 : 1;\n}',
  'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%son\';',
  '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}',
  '<html><body><p class="x">Hi &amp; bye</p></body></html>',
  'https://example.com/path/to/page?query=1&lang=en#section-2',
  'email: first.last+tag@example.co.uk',
  '!!! ??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ||| ~~~ ```',
  '<|endoftext|>',
  'Before<|endoftext|>after <|endoftext|> spaced',
  'Café, naïve, résumé, façade, jalapeño, Ångström, Straße, Øresund, Łódź.',
  'Ça va? Où est la bibliothèque? Él está aquí. Über alles. Ελληνικά γράμματα.',
  'Русский текст: съешь же ещё этих мягких французских булок, да выпей чаю.',
  'العربية: مرحبا بالعالم. עברית: שלום עולם.',
  'हिन्दी: नमस्ते दुनिया। தமிழ்: வணக்கம் உலகம்.',
  '日本語のテキスト：こんにちは世界。カタカナとひらがな。',
  '中文文本：你好，世界！我们今天去公园散步吧。',
  '한국어 텍스트: 안녕하세요 세계.',
  'ไทย: สวัสดีชาวโลก',
  'Emoji: 😀 😂 🤖 🚀 ❤️ 👍🏽 🇺🇸 🇯🇵',
  'Family: 👨‍👩‍👧‍👦 and 👩‍💻 and 🏳️‍🌈 and 🧑🏿‍🚀 zwj sequences',
  '😀😀😀😀😀 repeated emoji',
  'Math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ π ≈ ∂ ∇ ∈ ∉ ∀ ∃',
  'Superscripts ² ³ ¹ and fractions ½ ¾ ⅓ and Roman Ⅻ ⅻ and circled ① ②',
  'Arabic-Indic digits ٠١٢٣٤٥٦٧٨٩ and Devanagari digits ०१२३',
  'Full-width: ＡＢＣ　１２３　ｘｙｚ',
  'Ideographic space:\u3000between\u3000words',
  'No-break\u00a0space and narrow\u202fnbsp and thin\u2009space and hair\u200aspace',
  'Line\u2028separator and paragraph\u2029separator',
  'Next line\u0085char (Python whitespace, not JS)',
  'BOM\ufeffinside (JS whitespace, not Python)',
  '\ufeffleading BOM',
  'Zero\u200bwidth\u200cnon\u200djoiner',
  'Combining: e\u0301 a\u0308 n\u0303 vs é ä ñ',
  'Control chars: \u0001\u0002\u001b[31mred\u001b[0m \u007f',
  'Private use \ue000\uf8ff and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 𐍈',
  "Mixed 123abc abc123 a1b2c3 3.5x x3.5 -42 +42 ~42",
  'CamelCaseIdentifier snake_case_identifier kebab-case-id SCREAMING_CASE',
  'supercalifragilisticexpialidocious antidisestablishmentarianism',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  '                                                                              x',
  '----------------------------------------------------------------------------',
  'ŉ ǅ ǈ ǋ ǲ Titlecase letters and modifier ʰ ʲ ˠ',
];

const words = ['the', 'of', 'and', 'to', 'in', 'is', 'that', 'it', 'was', 'for', 'on',
  'are', 'with', 'as', 'I', 'his', 'they', 'be', 'at', 'one', 'have', 'this', 'from',
  'model', 'token', 'cache', 'prefix', 'GPU', 'kernel', 'attention', 'server', 'request',
  "don't", "it's", "we'll", "you're", "they've", "I'm", "he'd", 'café', 'naïve', 'über',
  '東京', '北京', 'こんにちは', 'Москва', 'Αθήνα', '😀', '👩‍💻', '🇫🇷', '42', '3.14',
  '1,000', '2026', '(x)', '[y]', '{z}', '"quoted"', '--flag', '#tag', '@user', 'a+b=c',
  '\n', '\n\n', '  ', '\t', ' \n', '...', '!', '?', ';', ':', '—', '’s', '‘quoted’'];
const seps = [' ', ' ', ' ', ' ', '  ', '\n', '', '\t', ', ', '. ', '\u00a0', '\u3000'];
for (let i = 0; i < 260; ++i) {
  const n = 1 + Math.floor(rand() * 24);
  let s = '';
  for (let k = 0; k < n; ++k) s += pick(words) + (k + 1 < n ? pick(seps) : '');
  if (rand() < 0.2) s = pick(['  ', ' ', '\n', '\t ']) + s;
  if (rand() < 0.2) s += pick(['  ', ' ', '\n', ' \n ', '\n\n']);
  lines.push(s);
}

// Random strings of fragments that meet at every kind of boundary: ASCII and Unicode
// letters, digits of other scripts, Unicode spaces (including the JS/Python differences),
// joiners, combining marks, contractions, control characters.
const frags = ['a', 'Z', 'é', 'ß', '中', '日本', '😀', '👩‍💻', '🇺🇸', ' ', '  ', '\n', '\r\n', '\t',
  '\u00a0', '\u3000', '\u2009', '\u0085', '\ufeff', '\u200d', '\u0301', '7', '42', '٣', 'Ⅷ', '½',
  '²', "'", "'s", "'ll", "'re", "'D", '!', '?', '...', '—', '“', '”', '$', '<|endoftext|>',
  '\u001c', '\u001f', '\u000b', '\u000c'];
for (let i = 0; i < 300; ++i) {
  let s = '';
  for (let k = Math.floor(rand() * 14); k >= 0; --k) s += pick(frags);
  lines.push(s);
}

for (const text of lines) {
  const ids = encode(text);
  if (ids.some((x) => !Number.isInteger(x))) throw new Error('missing id for ' + JSON.stringify(text));
  // TextDecoder drops a leading BOM, so compare without it.
  if (decode(ids) !== text.replace(/^\ufeff/, '')) throw new Error('no round trip for ' + JSON.stringify(text));
  process.stdout.write(JSON.stringify({ text, ids }) + '\n');
}
