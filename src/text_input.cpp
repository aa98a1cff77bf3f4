// Reading prompts from flags, files and stdin; UTF-8 validation.
#include "text_input.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "common.h"

namespace kvrun {

void note_reading_terminal() {
    if (::isatty(STDIN_FILENO) == 1)
        std::fprintf(stderr, "kvrun: reading standard input (end it with Ctrl-D)\n");
}

std::string read_file_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '{}' for reading", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail("error while reading '{}'", path);
    return ss.str();
}

size_t utf8_find_invalid(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            len = 2, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            len = 3, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            len = 4, cp = c & 0x07;
        else
            return i;
        if (i + len > s.size()) return i;
        for (size_t k = 1; k < len; ++k) {
            unsigned char cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += len;
    }
    return std::string::npos;
}

void utf8_require_valid(std::string_view s, std::string_view what) {
    size_t bad = utf8_find_invalid(s);
    if (bad != std::string::npos) fail("{} is not valid UTF-8 (byte offset {})", what, bad);
}

std::string read_text_input(const TextInput& in) {
    std::string text;
    std::string what = "the prompt";
    bool from_stream = true;  // a file or stdin, whose final line end may be dropped
    if (in.prompt) {
        text = *in.prompt;
        from_stream = false;
    } else if (!in.file.empty()) {
        text = read_file_text(in.file);
        what = "'" + in.file + "'";
    } else if (in.allow_stdin) {
        note_reading_terminal();
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        if (std::cin.bad()) fail("error while reading standard input");
        text = ss.str();
        what = "standard input";
    }
    if (from_stream && in.strip_final_newline && !text.empty() && text.back() == '\n') {
        text.pop_back();
        if (!text.empty() && text.back() == '\r') text.pop_back();
    }
    if (text.empty() && !in.allow_empty)
        fail("empty prompt: give one with -p TEXT, -f FILE or on standard input");
    utf8_require_valid(text, what);
    return text;
}

std::string read_prompt_text(const std::string& prompt, const std::string& file, bool allow_stdin) {
    TextInput in;
    if (!prompt.empty()) in.prompt = prompt;
    in.file = file;
    in.allow_stdin = allow_stdin;
    return read_text_input(in);
}

std::string unescape_text(const std::string& line) {
    std::string out;
    out.reserve(line.size());
    for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] != '\\' || i + 1 == line.size()) {
            out += line[i];
            continue;
        }
        char c = line[i + 1];
        if (c == 'n')
            out += '\n';
        else if (c == 't')
            out += '\t';
        else if (c == 'r')
            out += '\r';
        else if (c == '\\')
            out += '\\';
        else {
            out += '\\';
            continue;
        }
        ++i;
    }
    return out;
}

std::string escape_control_bytes(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c == '\r')
            out += "\\r";
        else if (c < 0x20 || c == 0x7f)
            out += fmt::format("\\x{:02x}", c);
        else
            out += static_cast<char>(c);
    }
    return out;
}

}  // namespace kvrun
