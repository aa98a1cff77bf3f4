// Tests for LineEditor's non-terminal path: lines read from a pipe or file on stdin, end of
// input, and Ctrl-C (SIGINT) while blocked on an empty pipe.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "line_editor.h"
#include "test_util.h"

using kvrun::LineEditor;

namespace {

// Replaces fd 0 with `fd` for the lifetime of the object.
class StdinRedirect {
  public:
    explicit StdinRedirect(int fd) : saved_(::dup(STDIN_FILENO)) {
        REQUIRE(saved_ >= 0);
        REQUIRE(::dup2(fd, STDIN_FILENO) == STDIN_FILENO);
        ::close(fd);
    }
    ~StdinRedirect() {
        ::dup2(saved_, STDIN_FILENO);
        ::close(saved_);
    }

  private:
    int saved_;
};

void write_all(int fd, const std::string& s) {
    size_t done = 0;
    while (done < s.size()) {
        ssize_t n = ::write(fd, s.data() + done, s.size() - done);
        REQUIRE(n > 0);
        done += static_cast<size_t>(n);
    }
}

volatile sig_atomic_t g_caller_handler_ran = 0;
void caller_handler(int) {
    g_caller_handler_ran = 1;
}

}  // namespace

TEST_CASE("lines from a pipe: CRLF, empty lines, last line without newline, then EOF") {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    write_all(fds[1], "hello\nworld\r\n\nunicode é 世界\nlast-no-newline");
    ::close(fds[1]);
    StdinRedirect redirect(fds[0]);

    LineEditor editor;
    CHECK_FALSE(editor.uses_libedit());
    CHECK(editor.read_line("> ") == std::optional<std::string>("hello"));
    CHECK(editor.read_line("> ") == std::optional<std::string>("world"));
    CHECK(editor.read_line("> ") == std::optional<std::string>(""));
    CHECK(editor.read_line("> ") == std::optional<std::string>("unicode é 世界"));
    CHECK(editor.read_line("> ") == std::optional<std::string>("last-no-newline"));
    CHECK_FALSE(editor.interrupted());
    CHECK(editor.read_line("> ") == std::nullopt);
    CHECK(editor.read_line("> ") == std::nullopt);
    editor.add_history("ignored without a terminal");  // must not crash
}

TEST_CASE("a line longer than the pipe buffer arrives whole") {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    std::string big(300000, 'x');
    std::thread writer([&] {
        write_all(fds[1], big + "\nnext\n");
        ::close(fds[1]);
    });
    {
        StdinRedirect redirect(fds[0]);
        LineEditor editor;
        auto line = editor.read_line("");
        REQUIRE(line.has_value());
        CHECK(line->size() == big.size());
        CHECK(*line == big);
        CHECK(editor.read_line("") == std::optional<std::string>("next"));
        CHECK(editor.read_line("") == std::nullopt);
    }
    writer.join();
}

TEST_CASE("Ctrl-C while waiting returns an empty line, then the caller's handler is back") {
    struct sigaction sa {
    }, old{};
    sa.sa_handler = caller_handler;
    sigemptyset(&sa.sa_mask);
    REQUIRE(::sigaction(SIGINT, &sa, &old) == 0);

    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    {
        StdinRedirect redirect(fds[0]);
        LineEditor editor;
        // The signal lands on another thread (as with the engine's worker threads): the
        // self-pipe must still wake the reader.
        std::thread sender([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            ::kill(::getpid(), SIGINT);
        });
        sigset_t block, saved;
        sigemptyset(&block);
        sigaddset(&block, SIGINT);
        // Keep SIGINT away from this thread so that it is delivered to the sender thread.
        REQUIRE(::pthread_sigmask(SIG_BLOCK, &block, &saved) == 0);
        auto line = editor.read_line("> ");
        REQUIRE(::pthread_sigmask(SIG_SETMASK, &saved, nullptr) == 0);
        sender.join();
        CHECK(line == std::optional<std::string>(""));
        CHECK(editor.interrupted());
        CHECK(g_caller_handler_ran == 0);

        // Input typed afterwards is read normally.
        write_all(fds[1], "after\n");
        ::close(fds[1]);
        CHECK(editor.read_line("> ") == std::optional<std::string>("after"));
        CHECK_FALSE(editor.interrupted());
        CHECK(editor.read_line("> ") == std::nullopt);
    }
    ::raise(SIGINT);
    CHECK(g_caller_handler_ran == 1);
    ::sigaction(SIGINT, &old, nullptr);
}
