// UTF-8 helpers for the tokenizers: lenient decoding (as llama.cpp decodes), encoding,
// and cutting a byte stream into whole, valid UTF-8 characters for streaming output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvrun {

constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence a lead byte announces, judged by its high nibble only
// (continuation bytes and 0xF8..0xFF count as 1 and 4): the tokenizers' "character" unit.
inline size_t utf8_lead_len(uint8_t lead) {
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLen[lead >> 4];
}

// Decodes leniently: a lead byte with the right number of continuation bytes is accepted
// even when overlong or a surrogate; any other byte becomes U+FFFD and decoding resumes
// at the next byte.
std::vector<uint32_t> utf8_decode_lenient(std::string_view text);

// Appends the 1..4-byte encoding of `cp` (values up to 0x1FFFFF, as lenient decoding makes).
void utf8_append(std::string& out, uint32_t cp);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or values > U+10FFFF).
bool utf8_is_valid(std::string_view text);

// Moves the complete characters at the front of `pending` into the returned string, which is
// always valid UTF-8: malformed bytes become U+FFFD. A trailing sequence that may still be
// completed by later bytes stays in `pending`, unless `final`, when it becomes U+FFFD too.
std::string utf8_take_complete(std::string& pending, bool final);

// s without leading (trailing) ASCII white space: space, tab, CR, LF.
std::string_view trim_space_left(std::string_view s);
std::string_view trim_space_right(std::string_view s);

}  // namespace kvrun
