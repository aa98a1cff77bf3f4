// Interactive line input for `kvrun chat`: line editing and history through libedit when
// stdin and stdout are terminals, plain buffered reads otherwise (pipes, files).
//
// Ctrl-C while reading: read_line() returns an empty string and interrupted() turns true
// (the caller shows a fresh prompt, or exits on a second Ctrl-C if it likes); it never
// exits the program. To do this, read_line() installs its own SIGINT handler for its
// duration and restores the caller's before returning, so a Ctrl-C typed at the prompt never
// reaches the handler the chat mode uses to stop generation. The handler wakes the read
// through a self-pipe, so it works whichever thread the signal lands on.
//
// libedit is used through its native API (<histedit.h>), not its readline emulation: only the
// native API lets kvrun supply the read function (needed to wake on Ctrl-C) while libedit
// still decodes UTF-8. For UTF-8 input the constructor sets LC_CTYPE from the environment,
// falling back to C.UTF-8 when that is not a UTF-8 locale. libedit state is per object, the
// signal plumbing is process-wide: use one LineEditor at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace kvrun {

class LineEditor {
  public:
    // history_file: where libedit loads and saves history ("" for none; unused without a
    // terminal). A missing file is fine; it is created on the first add_history.
    explicit LineEditor(std::string history_file = {});
    ~LineEditor();
    LineEditor(const LineEditor&) = delete;
    LineEditor& operator=(const LineEditor&) = delete;

    // Shows `prompt` (only when stdin is a terminal) and reads one line without its "\n"
    // (or "\r\n"). nullopt at end of input (Ctrl-D on an empty line, or EOF on a pipe); a
    // last line without "\n" is still returned. "" with interrupted() on Ctrl-C.
    std::optional<std::string> read_line(const std::string& prompt);

    // Adds a line to the in-memory history (up arrow) and saves the history file. Empty
    // lines and repeats of the previous entry are skipped. No-op without libedit.
    void add_history(const std::string& line);

    // Whether the last read_line() ended because of Ctrl-C.
    bool interrupted() const { return interrupted_; }

    // Whether libedit is editing the input (a terminal and libedit compiled in).
    bool uses_libedit() const;

  private:
    struct Libedit;
    std::optional<std::string> read_plain(const std::string& prompt);

    std::string history_file_;
    std::unique_ptr<Libedit> libedit_;  // null without a terminal or without libedit
    std::string pending_;               // plain mode: bytes read but not yet returned
    bool stdin_tty_ = false;
    bool eof_ = false;
    bool interrupted_ = false;
    [[maybe_unused]] bool history_warned_ = false;  // libedit: the save warning was shown
};

}  // namespace kvrun
