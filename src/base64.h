// Standard base64 (RFC 4648, with padding): embeddings' "encoding_format": "base64", and the
// Responses API's opaque reasoning items.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvrun {

std::string base64_encode(std::string_view bytes);
// The bytes of a padded base64 text; nullopt when it is not one (a length that is not a
// multiple of 4, a character outside the alphabet, padding anywhere but the end).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace kvrun
