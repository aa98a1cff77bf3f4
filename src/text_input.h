// Reading user text (prompts) from a flag, a file or standard input, with UTF-8 checks.
#pragma once

#include <string>
#include <string_view>

namespace kvrun {

// Returns `prompt` when non-empty, else the contents of `file` when non-empty, else (when
// allow_stdin) all of standard input. Throws Error for an unreadable file, for empty input,
// or for text that is not valid UTF-8 (naming the byte offset).
std::string read_prompt_text(const std::string& prompt, const std::string& file, bool allow_stdin);
// Reads a whole file; throws Error naming the path when it can't.
std::string read_file_text(const std::string& path);
// Offset of the first invalid UTF-8 byte, or std::string::npos when valid.
size_t utf8_find_invalid(std::string_view s);
// Throws Error("<what> is not valid UTF-8 (byte offset N)") when invalid.
void utf8_require_valid(std::string_view s, std::string_view what);

}  // namespace kvrun
