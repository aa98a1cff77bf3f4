// Standard base64 (see base64.h).
#include "base64.h"

#include <algorithm>
#include <cstdint>

namespace kvrun {

namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64_encode(std::string_view bytes) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t n = std::min<size_t>(3, bytes.size() - i);
        uint32_t v = 0;
        for (size_t k = 0; k < 3; ++k)
            v = (v << 8) | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
        for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
    if (text.size() % 4 != 0) return std::nullopt;
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (size_t i = 0; i < text.size(); i += 4) {
        const bool last = i + 4 == text.size();
        uint32_t v = 0;
        size_t pad = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = text[i + k];
            if (c == '=') {
                // Padding: only in the last group's final one or two places.
                if (!last || k < 2) return std::nullopt;
                ++pad;
                v <<= 6;
                continue;
            }
            const size_t d = kAlphabet.find(c);
            if (d == std::string_view::npos || pad > 0) return std::nullopt;
            v = (v << 6) | uint32_t(d);
        }
        for (size_t k = 0; k < 3 - pad; ++k) out += char((v >> (16 - 8 * k)) & 0xff);
    }
    return out;
}

}  // namespace kvrun
