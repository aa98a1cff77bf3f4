// UTF-8 decoding/encoding helpers shared by the tokenizers and the streaming decoder.
#include "unicode_text.h"

namespace kvrun {

namespace {

bool is_cont(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

// Strict step over one character starting at text[i]: returns its byte length (> 0), 0 when
// the bytes so far are a valid but unfinished prefix that runs into the end of `text`, or -1
// when text[i] starts no valid character (then one byte should be replaced).
int strict_char_len(std::string_view text, size_t i) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    if (b0 < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        if (b0 == 0xE0) lo = 0xA0;  // no overlongs
        if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
    } else {
        return -1;
    }
    for (int k = 1; k <= need; ++k) {
        if (i + k >= text.size()) return 0;
        const auto b = static_cast<uint8_t>(text[i + k]);
        if (k == 1 ? (b < lo || b > hi) : !is_cont(b)) return -1;
    }
    return need + 1;
}

}  // namespace

std::vector<uint32_t> utf8_decode_lenient(std::string_view text) {
    std::vector<uint32_t> out;
    out.reserve(text.size());
    size_t i = 0;
    const size_t n = text.size();
    while (i < n) {
        const auto b0 = static_cast<uint8_t>(text[i]);
        if (b0 < 0x80) {
            out.push_back(b0);
            i += 1;
            continue;
        }
        size_t len = 0;
        uint32_t cp = 0;
        if ((b0 & 0xE0) == 0xC0) {
            len = 2, cp = b0 & 0x1F;
        } else if ((b0 & 0xF0) == 0xE0) {
            len = 3, cp = b0 & 0x0F;
        } else if ((b0 & 0xF8) == 0xF0) {
            len = 4, cp = b0 & 0x07;
        }
        bool ok = len != 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; ++k) {
            const auto b = static_cast<uint8_t>(text[i + k]);
            ok = is_cont(b);
            cp = (cp << 6) | (b & 0x3F);
        }
        if (ok) {
            out.push_back(cp);
            i += len;
        } else {
            out.push_back(kReplacementChar);
            i += 1;
        }
    }
    return out;
}

void utf8_append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | ((cp >> 18) & 0x07));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

bool utf8_is_valid(std::string_view text) {
    for (size_t i = 0; i < text.size();) {
        const int len = strict_char_len(text, i);
        if (len <= 0) return false;
        i += static_cast<size_t>(len);
    }
    return true;
}

std::string utf8_take_complete(std::string& pending, bool final) {
    std::string out;
    out.reserve(pending.size());
    size_t i = 0;
    while (i < pending.size()) {
        const int len = strict_char_len(pending, i);
        if (len > 0) {
            out.append(pending, i, static_cast<size_t>(len));
            i += static_cast<size_t>(len);
        } else if (len == 0 && !final) {
            break;  // may still be completed by the next piece
        } else {
            utf8_append(out, kReplacementChar);
            i += (len == 0) ? pending.size() - i : 1;
        }
    }
    pending.erase(0, i);
    return out;
}

namespace {
bool ascii_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
}  // namespace

std::string_view trim_space_left(std::string_view s) {
    while (!s.empty() && ascii_space(s.front())) s.remove_prefix(1);
    return s;
}

std::string_view trim_space_right(std::string_view s) {
    while (!s.empty() && ascii_space(s.back())) s.remove_suffix(1);
    return s;
}

}  // namespace kvrun
