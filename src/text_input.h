// Reading user text (prompts) from a flag, a file or standard input, with UTF-8 checks.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvrun {

// Where a command's text comes from and how strictly it is taken.
struct TextInput {
    std::optional<std::string> prompt;  // -p TEXT, when given (may be empty)
    std::string file;                   // -f FILE, when given
    bool allow_stdin = true;            // read standard input when neither is given
    bool allow_empty = false;           // else empty text is an Error
    // Drop one final "\n" (or "\r\n") of a file or of standard input: the line end of
    // `echo TEXT | kvrun run` or of a one-line prompt file, as llama.cpp's -f does. Off,
    // the text is byte-exact (tokenize, like llama-tokenize).
    bool strip_final_newline = true;
};

// The text `in` names: the prompt when given, else the file, else (when allowed) all of
// standard input. Throws Error for an unreadable file, empty text (unless allowed) or text
// that is not valid UTF-8 (naming the source and byte offset).
std::string read_text_input(const TextInput& in);
// For generation prompts: `prompt` when non-empty, else `file`, else standard input, with
// one final newline of a file or of stdin dropped; empty text is an Error.
std::string read_prompt_text(const std::string& prompt, const std::string& file, bool allow_stdin);
// When standard input is a terminal, tells stderr that the program waits for it there (a
// command run without -p/-f would otherwise seem to hang).
void note_reading_terminal();
// Reads a whole file; throws Error naming the path when it can't.
std::string read_file_text(const std::string& path);
// Typed escapes: \n newline, \t tab, \r carriage return, \\ backslash; any other
// backslash is kept as written (batch's text prompts, --dry-sequence-breaker).
std::string unescape_text(const std::string& text);
// For display: newline, tab and carriage return as \n \t \r, other control bytes as \xNN.
std::string escape_control_bytes(const std::string& s);
// Offset of the first invalid UTF-8 byte, or std::string::npos when valid.
size_t utf8_find_invalid(std::string_view s);
// Throws Error("<what> is not valid UTF-8 (byte offset N)") when invalid.
void utf8_require_valid(std::string_view s, std::string_view what);

}  // namespace kvrun
