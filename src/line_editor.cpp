// Line input for the chat mode: libedit's native API on terminals, buffered reads from pipes
// and files. Ctrl-C is caught for the duration of one read by a temporary SIGINT handler that
// wakes the reader through a self-pipe (see line_editor.h for the behaviour).
#include "line_editor.h"

#include <fcntl.h>
#include <langinfo.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <cwchar>

#include "common.h"

#ifdef KVRUN_HAS_LIBEDIT
#include <histedit.h>
#endif

namespace kvrun {

namespace {

volatile sig_atomic_t g_sigint = 0;
volatile sig_atomic_t g_sigwinch = 0;
int g_wake_fds[2] = {-1, -1};  // self-pipe: [0] polled by the reader, [1] written by handlers

void on_signal(int sig) {
    int saved_errno = errno;
    if (sig == SIGINT) g_sigint = 1;
    if (sig == SIGWINCH) g_sigwinch = 1;
    if (g_wake_fds[1] >= 0) {
        char byte = 1;
        [[maybe_unused]] ssize_t r = ::write(g_wake_fds[1], &byte, 1);
    }
    errno = saved_errno;
}

void drain_wake_pipe() {
    char buf[64];
    while (g_wake_fds[0] >= 0 && ::read(g_wake_fds[0], buf, sizeof buf) > 0) {
    }
}

// While alive (one read_line call), SIGINT and SIGWINCH set flags and wake the reader; the
// caller's handlers are restored afterwards. No SA_RESTART, so blocked calls see EINTR too.
class SignalScope {
  public:
    SignalScope() {
        if (g_wake_fds[0] < 0 && ::pipe2(g_wake_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
            g_wake_fds[0] = g_wake_fds[1] = -1;  // still works when the signal hits this thread
        }
        drain_wake_pipe();
        g_sigint = 0;
        g_sigwinch = 0;
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;
        ::sigaction(SIGINT, &sa, &old_int_);
        ::sigaction(SIGWINCH, &sa, &old_winch_);
    }
    ~SignalScope() {
        ::sigaction(SIGINT, &old_int_, nullptr);
        ::sigaction(SIGWINCH, &old_winch_, nullptr);
    }
    SignalScope(const SignalScope&) = delete;
    SignalScope& operator=(const SignalScope&) = delete;

  private:
    struct sigaction old_int_ {};
    struct sigaction old_winch_ {};
};

enum class Wait { Ready, Interrupted, Resized, Error };

// Blocks until `fd` is readable (data, EOF or hang-up), Ctrl-C, or a terminal resize.
Wait wait_input(int fd) {
    for (;;) {
        if (g_sigint) return Wait::Interrupted;
        if (g_sigwinch) {
            g_sigwinch = 0;
            return Wait::Resized;
        }
        pollfd fds[2] = {{fd, POLLIN, 0}, {g_wake_fds[0], POLLIN, 0}};
        int n = ::poll(fds, g_wake_fds[0] >= 0 ? 2 : 1, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Wait::Error;
        }
        if (g_wake_fds[0] >= 0 && fds[1].revents != 0) {
            drain_wake_pipe();
            continue;  // the flags say why
        }
        if (fds[0].revents & POLLNVAL) return Wait::Error;
        if (fds[0].revents != 0) return Wait::Ready;
    }
}

void strip_line_end(std::string& line) {
    if (!line.empty() && line.back() == '\n') line.pop_back();
    if (!line.empty() && line.back() == '\r') line.pop_back();
}

}  // namespace

#ifdef KVRUN_HAS_LIBEDIT

// One libedit editor and its history. The callbacks are static members so that they can
// reach this (private) type through EL_CLIENTDATA.
struct LineEditor::Libedit {
    EditLine* el = nullptr;
    History* hist = nullptr;
    std::string prompt;

    Libedit() {
        el = el_init("kvrun", stdin, stdout, stderr);
        hist = history_init();
        if (!el || !hist) fail("line editor: libedit failed to initialize");
        HistEvent ev;
        history(hist, &ev, H_SETSIZE, 1000);
        history(hist, &ev, H_SETUNIQUE, 1);
        el_set(el, EL_CLIENTDATA, this);
        el_set(el, EL_EDITOR, "emacs");
        el_set(el, EL_SIGNAL, 0);  // kvrun handles SIGINT/SIGWINCH itself (getc below)
        el_set(el, EL_PROMPT, &Libedit::prompt_fn);
        el_set(el, EL_GETCFN, &Libedit::getc_fn);
        el_set(el, EL_HIST, history, hist);
        // Keys terminals send that libedit's emacs map lacks; ^R searches history.
        el_set(el, EL_BIND, "^R", "em-inc-search-prev", nullptr);
        el_set(el, EL_BIND, "\\e[H", "ed-move-to-beg", nullptr);
        el_set(el, EL_BIND, "\\e[F", "ed-move-to-end", nullptr);
        el_set(el, EL_BIND, "\\e[1~", "ed-move-to-beg", nullptr);
        el_set(el, EL_BIND, "\\e[4~", "ed-move-to-end", nullptr);
        el_set(el, EL_BIND, "\\e[3~", "ed-delete-next-char", nullptr);
        el_set(el, EL_BIND, "\\e[1;5C", "em-next-word", nullptr);
        el_set(el, EL_BIND, "\\e[1;5D", "ed-prev-word", nullptr);
        el_source(el, nullptr);  // the user's ~/.editrc, if any
    }
    ~Libedit() {
        if (el) el_end(el);
        if (hist) history_end(hist);
    }

    static char* prompt_fn(EditLine* el) {
        void* data = nullptr;
        el_get(el, EL_CLIENTDATA, &data);
        return data ? static_cast<Libedit*>(data)->prompt.data() : const_cast<char*>("");
    }

    // libedit's read function: one character, decoded from UTF-8 (the locale's encoding).
    // Returns 1 with a character, 0 at end of input, -1 (errno EINTR) on Ctrl-C.
    static int getc_fn(EditLine* el, wchar_t* out) {
        std::mbstate_t state{};
        for (;;) {
            Wait w = wait_input(STDIN_FILENO);
            if (w == Wait::Interrupted) {
                errno = EINTR;
                return -1;
            }
            if (w == Wait::Resized) {
                el_resize(el);  // new width; libedit redraws on the next key
                continue;
            }
            if (w == Wait::Error) return -1;
            char byte = 0;
            ssize_t r = ::read(STDIN_FILENO, &byte, 1);
            if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (r < 0) return -1;
            if (r == 0) return 0;
            wchar_t wc = 0;
            size_t n = std::mbrtowc(&wc, &byte, 1, &state);
            if (n == static_cast<size_t>(-2)) continue;  // inside a multi-byte character
            *out = n == static_cast<size_t>(-1) ? L'\uFFFD' : wc;
            return 1;
        }
    }
};

namespace {

bool ctype_is_utf8() {
    const char* codeset = nl_langinfo(CODESET);
    return codeset && (std::strcmp(codeset, "UTF-8") == 0 || std::strcmp(codeset, "utf8") == 0);
}

// libedit decodes and encodes input with the LC_CTYPE locale, which is "C" (ASCII) until
// the program sets one: take the environment's, or C.UTF-8 when that is not UTF-8.
void use_utf8_ctype() {
    if (ctype_is_utf8()) return;
    if (std::setlocale(LC_CTYPE, "") && ctype_is_utf8()) return;
    if (std::setlocale(LC_CTYPE, "C.UTF-8") && ctype_is_utf8()) return;
    std::setlocale(LC_CTYPE, "C");
}

}  // namespace

#else

struct LineEditor::Libedit {};

#endif

LineEditor::LineEditor(std::string history_file) : history_file_(std::move(history_file)) {
    stdin_tty_ = ::isatty(STDIN_FILENO) == 1;
#ifdef KVRUN_HAS_LIBEDIT
    if (stdin_tty_ && ::isatty(STDOUT_FILENO) == 1) {
        use_utf8_ctype();
        libedit_ = std::make_unique<Libedit>();
        if (!history_file_.empty()) {
            HistEvent ev;
            history(libedit_->hist, &ev, H_LOAD, history_file_.c_str());  // absent: fine
        }
    }
#endif
}

LineEditor::~LineEditor() = default;

bool LineEditor::uses_libedit() const {
    return libedit_ != nullptr;
}

std::optional<std::string> LineEditor::read_line(const std::string& prompt) {
    interrupted_ = false;
#ifdef KVRUN_HAS_LIBEDIT
    if (libedit_) {
        std::fflush(stdout);
        libedit_->prompt = prompt;
        SignalScope signals;
        int count = 0;
        const char* line = el_gets(libedit_->el, &count);
        if (g_sigint) {
            interrupted_ = true;
            std::fputs("^C\n", stdout);  // libedit left the cursor on the abandoned line
            std::fflush(stdout);
            return std::string();
        }
        if (!line || count <= 0) {
            std::fputs("\n", stdout);
            std::fflush(stdout);
            return std::nullopt;
        }
        std::string text(line, static_cast<size_t>(count));
        strip_line_end(text);
        return text;
    }
#endif
    return read_plain(prompt);
}

std::optional<std::string> LineEditor::read_plain(const std::string& prompt) {
    if (stdin_tty_) std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
    SignalScope signals;
    for (;;) {
        size_t nl = pending_.find('\n');
        if (nl != std::string::npos) {
            std::string line = pending_.substr(0, nl + 1);
            pending_.erase(0, nl + 1);
            strip_line_end(line);
            return line;
        }
        if (eof_) {
            if (stdin_tty_) eof_ = false;  // a terminal can be read again after Ctrl-D
            if (pending_.empty()) {
                if (stdin_tty_) std::fputs("\n", stdout);
                std::fflush(stdout);
                return std::nullopt;
            }
            std::string line = std::move(pending_);
            pending_.clear();
            strip_line_end(line);
            return line;
        }
        Wait w = wait_input(STDIN_FILENO);
        if (w == Wait::Interrupted) {
            interrupted_ = true;
            if (stdin_tty_) {
                pending_.clear();          // the terminal discarded the half-typed line too
                std::fputs("\n", stdout);  // the terminal itself echoed "^C"
                std::fflush(stdout);
            }
            return std::string();
        }
        if (w == Wait::Resized) continue;
        if (w == Wait::Error) {
            eof_ = true;
            continue;
        }
        char buf[4096];
        ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) {
            eof_ = true;
            continue;
        }
        pending_.append(buf, static_cast<size_t>(r));
    }
}

void LineEditor::add_history(const std::string& line) {
#ifdef KVRUN_HAS_LIBEDIT
    if (!libedit_ || line.empty()) return;
    HistEvent ev;
    history(libedit_->hist, &ev, H_ENTER, line.c_str());
    if (!history_file_.empty() && history(libedit_->hist, &ev, H_SAVE, history_file_.c_str()) < 0 &&
        !history_warned_) {
        history_warned_ = true;
        fmt::print(stderr, "warning: could not save the input history to {}\n", history_file_);
    }
#else
    (void)line;
#endif
}

}  // namespace kvrun
