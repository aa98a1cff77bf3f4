// The HTTP layer: the request parser's framing rules and limits (pure, byte by byte), and a
// live server on a loopback port driven by a plain POSIX socket client written here: JSON
// echo, keep-alive, chunked streams, 100-continue, limits, peer_closed, stop and bind errors.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common.h"
#include "http_server.h"

using namespace kvrun;
using State = HttpRequestParser::State;
using json = nlohmann::json;

namespace {

// Feeds `text` whole (or one byte at a time) and returns the final state.
State feed_all(HttpRequestParser& p, std::string_view text, bool bytewise = false) {
    if (!bytewise) return p.feed(text);
    State s = State::NeedMore;
    for (char c : text) s = p.feed(std::string_view(&c, 1));
    return s;
}

int error_status_of(std::string_view text, HttpLimits limits = {}) {
    HttpRequestParser p(limits);
    State s = p.feed(text);
    if (s != State::Error) return 0;
    CHECK(!p.error_message().empty());
    return p.error_status();
}

}  // namespace

TEST_CASE("http parser: a simple GET, its target split and headers") {
    HttpRequestParser p;
    REQUIRE(p.feed("GET /v1/models?x=1&y=2 HTTP/1.1\r\nHost: localhost\r\nX-Thing: \t v 1 \r\n"
                   "x-thing: second\r\n\r\n") == State::Done);
    HttpRequest r = p.take();
    CHECK(r.method == "GET");
    CHECK(r.target == "/v1/models?x=1&y=2");
    CHECK(r.path == "/v1/models");
    CHECK(r.query == "x=1&y=2");
    CHECK(r.version_minor == 1);
    REQUIRE(r.headers.size() == 3);
    CHECK(r.headers[1].first == "X-Thing");  // names as sent
    CHECK(r.header("x-thing") == "v 1");     // the first, trimmed, case-insensitive
    CHECK(r.header("HOST") == "localhost");
    CHECK(r.header("missing").empty());
    CHECK(r.body.empty());
    CHECK(r.keep_alive());
    CHECK(p.idle());
}

TEST_CASE("http parser: a POST fed one byte at a time, bare LF line ends too") {
    for (std::string eol : {"\r\n", "\n"}) {
        std::string text = "POST /echo HTTP/1.1" + eol + "Content-Length: 11" + eol + eol;
        HttpRequestParser p;
        for (char c : text) {
            CHECK(!p.headers_done());
            CHECK(p.feed(std::string_view(&c, 1)) == State::NeedMore);
        }
        CHECK(p.headers_done());
        CHECK(feed_all(p, "hello worl", true) == State::NeedMore);
        CHECK(p.feed("d") == State::Done);
        HttpRequest r = p.take();
        CHECK(r.path == "/echo");
        CHECK(r.body == "hello world");
    }
}

TEST_CASE("http parser: pipelined requests in one feed come out one after the other") {
    HttpRequestParser p;
    // The extra CRLF between them is tolerated (RFC 9112 2.2).
    REQUIRE(p.feed("POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\r\n"
                   "GET /b HTTP/1.1\r\n\r\nGET /c HT") == State::Done);
    HttpRequest a = p.take();
    CHECK(a.path == "/a");
    CHECK(a.body == "abc");
    CHECK(!p.idle());
    REQUIRE(p.feed("") == State::Done);
    CHECK(p.take().path == "/b");
    CHECK(p.feed("") == State::NeedMore);
    CHECK(p.feed("TP/1.1\r\n\r\n") == State::Done);
    CHECK(p.take().path == "/c");
    CHECK(p.feed("") == State::NeedMore);
    CHECK(p.idle());
}

TEST_CASE("http parser: the same bytes split anywhere parse the same") {
    const std::string text =
        "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
        "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;x\r\nde\r\n0\r\n\r\n"
        "GET /c HTTP/1.0\n\n";
    for (size_t cut = 0; cut <= text.size(); ++cut) {
        CAPTURE(cut);
        HttpRequestParser p;
        std::string got;
        for (std::string_view part : {std::string_view(text).substr(0, cut),
                                      std::string_view(text).substr(cut), std::string_view()}) {
            for (State s = p.feed(part); s == State::Done; s = p.feed("")) {
                HttpRequest r = p.take();
                got += r.path + "=" + r.body + ";";
            }
        }
        CHECK(got == "/a=abc;/b=de;/c=;");
    }
}

TEST_CASE("http parser: chunked body with extensions and trailers") {
    const std::string text =
        "POST /c HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"
        "5;name=value\r\nhello\r\nA \r\n world, ok\r\n0\r\nX-Trailer: t\r\n\r\n";
    for (bool bytewise : {false, true}) {
        HttpRequestParser p;
        REQUIRE(feed_all(p, text, bytewise) == State::Done);
        HttpRequest r = p.take();
        CHECK(r.body == "hello world, ok");
        CHECK(r.header("x-trailer").empty());  // trailers are dropped
    }
    HttpRequestParser lf;
    CHECK(lf.feed("POST / HTTP/1.1\nTransfer-Encoding: chunked\n\n3\nabc\n0\n\n") == State::Done);
    CHECK(lf.take().body == "abc");
}

TEST_CASE("http parser: Expect: 100-continue is flagged while the body is pending") {
    HttpRequestParser p;
    CHECK(p.feed("POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n") ==
          State::NeedMore);
    CHECK(p.expects_continue());
    CHECK(p.feed("hi") == State::Done);
    CHECK(!p.expects_continue());
    CHECK(p.take().body == "hi");

    HttpRequestParser old;  // HTTP/1.0 expectations are ignored (RFC 9110 10.1.1)
    CHECK(old.feed("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n") ==
          State::NeedMore);
    CHECK(!old.expects_continue());
    HttpRequestParser plain;
    CHECK(plain.feed("POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n") == State::NeedMore);
    CHECK(!plain.expects_continue());
}

TEST_CASE("http parser: keep-alive rules for HTTP/1.0 and 1.1") {
    auto keep = [](std::string text) {
        HttpRequestParser p;
        REQUIRE(p.feed(text + "\r\n") == State::Done);
        return p.take().keep_alive();
    };
    CHECK(keep("GET / HTTP/1.1\r\n"));
    CHECK(!keep("GET / HTTP/1.1\r\nConnection: close\r\n"));
    CHECK(!keep("GET / HTTP/1.1\r\nConnection: Upgrade, Close\r\n"));
    CHECK(!keep("GET / HTTP/1.0\r\n"));
    CHECK(keep("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n"));
}

TEST_CASE("http parser: malformed requests are 400") {
    for (const char* text : {
             "GARBAGE\r\n\r\n",
             "GET  / HTTP/1.1\r\n\r\n",                          // two spaces
             "G@T / HTTP/1.1\r\n\r\n",                           // method not a token
             "GET / HTTPS/1.1\r\n\r\n",                          // not HTTP
             "GET / HTTP/1.12\r\n\r\n",                          // version shape
             "GET /\x01 HTTP/1.1\r\n\r\n",                       // control char in target
             "GET / HTTP/1.1\r\nNoColon\r\n\r\n",                // header without ':'
             "GET / HTTP/1.1\r\nName : v\r\n\r\n",               // whitespace before ':'
             "GET / HTTP/1.1\r\n: v\r\n\r\n",                    // empty name
             "GET / HTTP/1.1\r\nA: b\r\n  folded\r\n\r\n",       // obsolete line folding
             "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",                // bare CR in a value
             "POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",    // not decimal
             "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",    // not decimal
             "POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n",    // not decimal
             "POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",  // not decimal
             "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
             "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
             "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",        // chunk size
             "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",        // chunk size
             "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",  // no CRLF
         }) {
        CAPTURE(text);
        CHECK(error_status_of(text) == 400);
    }
    // Identical duplicates are one length.
    HttpRequestParser p;
    CHECK(p.feed("POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 02\r\n\r\nok") ==
          State::Done);
    CHECK(p.take().body == "ok");
}

TEST_CASE("http parser: 413, 431, 501 and 505") {
    HttpLimits small;
    small.max_body_bytes = 10;
    small.max_header_bytes = 64;
    // 413 as soon as the headers announce too much, before any body byte.
    CHECK(error_status_of("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", small) == 413);
    CHECK(error_status_of("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n") ==
          413);
    CHECK(error_status_of("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n", small) == 0);
    // Chunks summing past the limit, and a size too large for any integer.
    const std::string te = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    CHECK(error_status_of(te + "6\r\nabcdef\r\n5\r\n", small) == 413);
    CHECK(error_status_of(te + "6\r\nabcdef\r\n4\r\nabcd\r\n0\r\n\r\n", small) == 0);
    CHECK(error_status_of(te + "fffffffffffffffffffffffff\r\n") == 413);
    // 431 while the header section is still incomplete, and once complete.
    CHECK(error_status_of("GET / HTTP/1.1\r\nX-Long: " + std::string(60, 'a'), small) == 431);
    CHECK(error_status_of("GET / HTTP/1.1\r\nX: " + std::string(44, 'a') + "\r\n\r\n", small) ==
          431);
    CHECK(error_status_of("GET / HTTP/1.1\r\nX: " + std::string(20, 'a') + "\r\n\r\n", small) == 0);
    CHECK(error_status_of(te + "1\r\na\r\n0\r\nX-T: " + std::string(80, 'b'), small) == 431);
    // Trailers of exactly the limit, then the empty line: accepted whole and byte by byte
    // alike (found by fuzz/fuzz_http.cpp: the bytewise read counted the final CR).
    const std::string at_limit = te + "1\r\na\r\n0\r\nX-T: " + std::string(57, 'b') + "\r\n\r\n";
    for (bool bytewise : {false, true}) {
        HttpRequestParser q(small);
        CHECK(feed_all(q, at_limit, bytewise) == State::Done);
        HttpRequestParser over(small);
        CHECK(feed_all(over, te + "1\r\na\r\n0\r\nX-T: " + std::string(58, 'b') + "\r\n\r\n",
                       bytewise) == State::Error);
    }
    // Transfer codings other than a lone chunked.
    CHECK(error_status_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n") == 501);
    CHECK(error_status_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == 501);
    // Other HTTP versions.
    CHECK(error_status_of("GET / HTTP/2.0\r\n\r\n") == 505);
    CHECK(error_status_of("GET / HTTP/0.9\r\n\r\n") == 505);
    HttpRequestParser p;
    p.feed("GET / HTTP/3.0\r\n\r\n");
    CHECK(p.error_message() == "HTTP/3.0 is not supported; use HTTP/1.1");
}

TEST_CASE("http: error bodies and status texts") {
    auto body = json::parse(http_error_body(404, "no such model"));
    CHECK(body ==
          json{{"error",
                {{"code", 404}, {"message", "no such model"}, {"type", "not_found_error"}}}});
    CHECK(json::parse(http_error_body(400, "x"))["error"]["type"] == "invalid_request_error");
    CHECK(json::parse(http_error_body(401, "x"))["error"]["type"] == "authentication_error");
    CHECK(json::parse(http_error_body(503, "x"))["error"]["type"] == "unavailable_error");
    CHECK(json::parse(http_error_body(500, "x"))["error"]["type"] == "server_error");
    // Invalid UTF-8 is replaced, not thrown on.
    std::string bad = http_error_body(400, "bad \xff byte");
    CHECK(json::parse(bad)["error"]["message"] == "bad \xEF\xBF\xBD byte");
    CHECK(std::string(http_status_text(413)) == "Content Too Large");
    CHECK(std::string(http_status_text(431)) == "Request Header Fields Too Large");
    CHECK(std::string(http_status_text(100)) == "Continue");
}

// ---- a live server ----

namespace {

// A server on 127.0.0.1, any free port, serving on its own thread until destroyed.
struct TestServer {
    std::atomic<bool> stop{false};  // declared first: outlives the server using it
    HttpServer server;
    std::thread thread;

    explicit TestServer(HttpHandler handler, HttpServerOptions options = {})
        : server(local(options), std::move(handler)) {
        thread = std::thread([this] { server.serve(stop); });
    }
    ~TestServer() {
        stop = true;
        if (thread.joinable()) thread.join();
    }
    static HttpServerOptions local(HttpServerOptions o) {
        o.host = "127.0.0.1";
        o.port = 0;
        return o;
    }
};

struct Response {
    int status = 0;
    std::map<std::string, std::string> headers;  // lowercase names
    std::string body;                            // decoded
};

// A blocking client socket with a 5 s receive timeout, so a broken server fails the test
// instead of hanging it.
class Client {
  public:
    explicit Client(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd_ >= 0);
        timeval tv{5, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(uint16_t(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    }
    ~Client() { close(); }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

    void send(std::string_view data) {
        while (!data.empty()) {
            ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
            REQUIRE(n > 0);
            data.remove_prefix(size_t(n));
        }
    }

    // Reads one response (Content-Length, chunked, or up to the close).
    Response read_response() {
        Response r;
        size_t end;
        while ((end = buf_.find("\r\n\r\n")) == std::string::npos) REQUIRE(read_more());
        std::string head = take(end + 4);
        REQUIRE(head.starts_with("HTTP/1.1 "));
        r.status = std::stoi(head.substr(9, 3));
        for (size_t at = head.find("\r\n") + 2; at < end;) {
            size_t eol = head.find("\r\n", at), colon = head.find(':', at);
            std::string name = head.substr(at, colon - at);
            for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
            r.headers[name] = head.substr(colon + 2, eol - colon - 2);
            at = eol + 2;
        }
        if (r.headers["transfer-encoding"] == "chunked") {
            for (;;) {
                size_t size = std::stoul(read_line(), nullptr, 16);
                if (size == 0) break;
                while (buf_.size() < size + 2) REQUIRE(read_more());
                r.body += take(size);
                REQUIRE(take(2) == "\r\n");
            }
            while (!read_line().empty()) {
            }
        } else if (r.headers.count("content-length")) {
            size_t size = std::stoul(r.headers["content-length"]);
            while (buf_.size() < size) REQUIRE(read_more());
            r.body = take(size);
        } else if (r.status >= 200 && r.status != 204) {
            while (read_more()) {
            }
            r.body = take(buf_.size());
        }
        return r;
    }

    // True when the server closed the connection: a read returns end of stream (not the
    // receive timeout, nor more bytes).
    bool closed_by_server() {
        char c;
        return buf_.empty() && ::recv(fd_, &c, 1, 0) == 0;
    }

  private:
    bool read_more() {
        char chunk[4096];
        ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
        if (n <= 0) return false;
        buf_.append(chunk, size_t(n));
        return true;
    }
    std::string take(size_t n) {
        std::string out = buf_.substr(0, n);
        buf_.erase(0, n);
        return out;
    }
    std::string read_line() {
        size_t eol;
        while ((eol = buf_.find("\r\n")) == std::string::npos) REQUIRE(read_more());
        std::string line = take(eol);
        take(2);
        return line;
    }

    int fd_ = -1;
    std::string buf_;
};

std::string post(std::string_view path, std::string_view body, std::string_view extra = "") {
    return fmt::format("POST {} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n{}\r\n{}", path,
                       body.size(), extra, body);
}

// Waits up to 5 s for `flag`; true when it was set.
bool wait_for(const std::atomic<bool>& flag) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!flag && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return flag;
}

// Echoes a JSON body back under "got"; /stream sends two server-sent events.
void echo_handler(const HttpRequest& req, HttpConnection& conn) {
    if (req.path == "/stream") {
        conn.begin_chunked(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
        conn.send_chunk("data: 1\n\n");
        conn.send_chunk("");  // skipped, would end the stream
        conn.send_chunk("data: 2\n\n");
        conn.end_chunked();
        return;
    }
    if (req.path == "/throw") throw Error("handler failed");
    if (req.path == "/silent") return;
    json out = {{"got", json::parse(req.body)}, {"method", req.method}};
    conn.send(200, "application/json", out.dump());
}

}  // namespace

TEST_CASE("http server: JSON echo, keep-alive and Connection: close") {
    TestServer ts(echo_handler);
    Client c(ts.server.port());
    c.send(post("/echo", R"({"prompt":"hi"})"));
    Response r = c.read_response();
    CHECK(r.status == 200);
    CHECK(r.headers["content-type"] == "application/json");
    CHECK(r.headers["access-control-allow-origin"] == "*");
    CHECK(r.headers["connection"] == "keep-alive");
    CHECK(json::parse(r.body) == json{{"got", {{"prompt", "hi"}}}, {"method", "POST"}});

    // The same connection serves a second request, which asks to close it.
    c.send(post("/echo", "[1,2]", "Connection: close\r\n"));
    r = c.read_response();
    CHECK(r.status == 200);
    CHECK(r.headers["connection"] == "close");
    CHECK(json::parse(r.body)["got"] == json{1, 2});
    CHECK(c.closed_by_server());
}

TEST_CASE("http server: pipelined requests are answered in order") {
    TestServer ts(echo_handler);
    Client c(ts.server.port());
    c.send(post("/echo", "1") + post("/echo", "2"));
    CHECK(json::parse(c.read_response().body)["got"] == 1);
    CHECK(json::parse(c.read_response().body)["got"] == 2);
}

TEST_CASE("http server: a chunked event stream, then the connection is reused") {
    TestServer ts(echo_handler);
    Client c(ts.server.port());
    c.send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n");
    Response r = c.read_response();
    CHECK(r.status == 200);
    CHECK(r.headers["transfer-encoding"] == "chunked");
    CHECK(r.headers["content-type"] == "text/event-stream");
    CHECK(r.headers["cache-control"] == "no-cache");
    CHECK(r.headers.count("content-length") == 0);
    CHECK(r.body == "data: 1\n\ndata: 2\n\n");
    c.send(post("/echo", "3"));
    CHECK(json::parse(c.read_response().body)["got"] == 3);
}

TEST_CASE("http server: 100-continue is answered before the body is sent") {
    TestServer ts(echo_handler);
    Client c(ts.server.port());
    c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
    Response interim = c.read_response();
    CHECK(interim.status == 100);
    CHECK(interim.body.empty());
    c.send("true");
    Response r = c.read_response();
    CHECK(r.status == 200);
    CHECK(json::parse(r.body)["got"] == true);
}

TEST_CASE("http server: errors are JSON: 413, 400, a throwing and a silent handler") {
    HttpServerOptions options;
    options.limits.max_body_bytes = 1024;
    TestServer ts(echo_handler, options);
    {
        Client c(ts.server.port());
        c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n" +
               std::string(2000, 'x'));
        Response r = c.read_response();
        CHECK(r.status == 413);
        CHECK(r.headers["connection"] == "close");
        json e = json::parse(r.body)["error"];
        CHECK(e["code"] == 413);
        CHECK(e["type"] == "invalid_request_error");
        CHECK(e["message"] == "the request body of 5000 bytes exceeds the limit of 1024 bytes");
    }
    {
        Client c(ts.server.port());
        c.send("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n");
        Response r = c.read_response();
        CHECK(r.status == 400);
        CHECK(json::parse(r.body)["error"]["code"] == 400);
        CHECK(c.closed_by_server());
    }
    {
        Client c(ts.server.port());
        c.send(post("/throw", ""));
        Response r = c.read_response();
        CHECK(r.status == 500);
        CHECK(json::parse(r.body)["error"]["message"] == "handler failed");
        CHECK(json::parse(r.body)["error"]["type"] == "server_error");
        CHECK(c.closed_by_server());
    }
    {
        Client c(ts.server.port());
        c.send(post("/silent", ""));
        Response r = c.read_response();
        CHECK(r.status == 500);
        CHECK(json::parse(r.body)["error"]["message"] == "no response");
    }
}

TEST_CASE("http server: peer_closed sees the client go, but not pipelined bytes") {
    std::atomic<bool> peek_started{false}, more_sent{false}, started{false}, finished{false};
    std::atomic<int> pipelined_closed{-1}, closed_at_start{-1}, closed_seen{-1}, late_send{-1};
    TestServer ts([&](const HttpRequest& req, HttpConnection& conn) {
        if (req.path == "/peek") {
            // The next request arrives while this one runs: unread bytes, not a close.
            peek_started = true;
            if (wait_for(more_sent)) pipelined_closed = conn.peer_closed();
            conn.send(200, "text/plain", "peeked");
            return;
        }
        closed_at_start = conn.peer_closed();
        started = true;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        bool closed = false;
        while (!(closed = conn.peer_closed()) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        closed_seen = closed;
        late_send = conn.send(200, "text/plain", "too late");
        finished = true;
    });
    {
        Client c(ts.server.port());
        c.send(post("/peek", ""));
        REQUIRE(wait_for(peek_started));
        c.send(post("/wait", ""));
        more_sent = true;
        CHECK(c.read_response().body == "peeked");
        REQUIRE(wait_for(started));
        c.close();
        REQUIRE(wait_for(finished));
    }
    CHECK(pipelined_closed == 0);
    CHECK(closed_at_start == 0);
    CHECK(closed_seen == 1);
    CHECK(late_send == 0);  // writes fail once the client is known to be gone
}

TEST_CASE("http server: the stop flag ends serve() promptly with a keep-alive client open") {
    auto ts = std::make_unique<TestServer>(echo_handler);
    Client c(ts->server.port());
    c.send(post("/echo", "1"));
    CHECK(c.read_response().status == 200);  // the connection is open and idle now
    auto t0 = std::chrono::steady_clock::now();
    ts->stop = true;
    ts->thread.join();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(seconds < 2.0);
    CHECK(c.closed_by_server());
}

TEST_CASE("http server: more connections than allowed get 503") {
    HttpServerOptions options;
    options.max_connections = 1;
    TestServer ts(echo_handler, options);
    Client first(ts.server.port());
    first.send(post("/echo", "1"));
    CHECK(first.read_response().status == 200);  // accepted and counted
    Client second(ts.server.port());
    Response r = second.read_response();
    CHECK(r.status == 503);
    CHECK(json::parse(r.body)["error"]["type"] == "unavailable_error");
}

TEST_CASE("http server: a request that stalls past the idle timeout gets 408") {
    HttpServerOptions options;
    options.idle_timeout_s = 0.2;
    TestServer ts(echo_handler, options);
    Client partial(ts.server.port());
    partial.send("POST /echo HTTP/1.1\r\nContent-Le");
    CHECK(partial.read_response().status == 408);
    Client silent(ts.server.port());  // nothing sent: closed without a response
    CHECK(silent.closed_by_server());
}

TEST_CASE("http server: a busy port is an Error naming host:port") {
    TestServer ts(echo_handler);
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.port = ts.server.port();
    CHECK(options.port > 0);
    try {
        HttpServer second(options, echo_handler);
        FAIL("a second server listened on a busy port");
    } catch (const Error& e) {
        CHECK(std::string(e.what()) ==
              fmt::format("cannot listen on 127.0.0.1:{}: Address already in use", options.port));
    }
    // Host names resolve (here from /etc/hosts, so no DNS is needed).
    options.host = "localhost";
    options.port = 0;
    HttpServer by_name(options, echo_handler);
    CHECK(by_name.port() > 0);
}
