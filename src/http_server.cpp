// HTTP/1.1 responses and the thread-per-connection server (see http_server.h; the request
// parser is in http_parser.cpp).
#include "http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common.h"

namespace kvrun {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// ---- responses ----

const char* http_status_text(int status) {
    static const std::pair<int, const char*> kTexts[] = {{100, "Continue"},
                                                         {200, "OK"},
                                                         {201, "Created"},
                                                         {204, "No Content"},
                                                         {304, "Not Modified"},
                                                         {400, "Bad Request"},
                                                         {401, "Unauthorized"},
                                                         {403, "Forbidden"},
                                                         {404, "Not Found"},
                                                         {405, "Method Not Allowed"},
                                                         {408, "Request Timeout"},
                                                         {409, "Conflict"},
                                                         {413, "Content Too Large"},
                                                         {422, "Unprocessable Content"},
                                                         {429, "Too Many Requests"},
                                                         {431, "Request Header Fields Too Large"},
                                                         {500, "Internal Server Error"},
                                                         {501, "Not Implemented"},
                                                         {503, "Service Unavailable"},
                                                         {505, "HTTP Version Not Supported"}};
    for (const auto& [code, text] : kTexts)
        if (code == status) return text;
    return "Unknown";
}

std::string http_error_body(int status, std::string_view message) {
    const char* type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 503 ? "unavailable_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    nlohmann::json body = {
        {"error", {{"code", status}, {"message", std::string(message)}, {"type", type}}}};
    return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpConnection::HttpConnection(int fd, const std::atomic<bool>* stop, double write_timeout_s)
    : fd_(fd), stop_(stop), write_timeout_s_(write_timeout_s) {}

void HttpConnection::start_request(bool request_keep_alive, int version_minor) {
    keep_alive = request_keep_alive;
    version_minor_ = version_minor;
    responded_ = chunked_open_ = chunked_raw_ = false;
}

bool HttpConnection::write_all(std::string_view data) {
    // MSG_DONTWAIT + poll instead of a blocking send: a client that stops reading must not
    // hold a thread forever, nor past a stop request.
    auto last_progress = Clock::now();
    while (!data.empty() && !gone_) {
        ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            data.remove_prefix(size_t(n));
            last_progress = Clock::now();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) break;
        double limit = stop_ && *stop_ ? std::min(1.0, write_timeout_s_) : write_timeout_s_;
        if (seconds_since(last_progress) > limit) break;
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 100);
    }
    if (!data.empty()) gone_ = true;
    return !gone_;
}

std::string HttpConnection::response_head(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& extra, std::string_view framing) {
    if (stop_ && *stop_) keep_alive = false;  // the server is stopping: no next request
    std::string head = fmt::format("HTTP/1.1 {} {}\r\n", status, http_status_text(status));
    if (!content_type.empty()) head += fmt::format("Content-Type: {}\r\n", content_type);
    head += framing;
    head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    head += "Access-Control-Allow-Origin: *\r\n";
    // A line break in a header would let a caller's string inject a header or a body.
    for (const auto& [name, value] : extra)
        if ((name + value).find_first_of("\r\n") == std::string::npos)
            head += fmt::format("{}: {}\r\n", name, value);
    head += "\r\n";
    return head;
}

bool HttpConnection::send(int status, std::string_view content_type, std::string_view body,
                          const std::vector<std::pair<std::string, std::string>>& extra_headers) {
    if (responded_ || gone_) return false;
    responded_ = true;
    bool no_body = status < 200 || status == 204 || status == 304;
    std::string out = no_body ? response_head(status, {}, extra_headers, {})
                              : response_head(status, content_type, extra_headers,
                                              fmt::format("Content-Length: {}\r\n", body.size()));
    if (!no_body) out += body;
    return write_all(out);
}

bool HttpConnection::send_error(int status, std::string_view message) {
    return send(status, "application/json", http_error_body(status, message));
}

bool HttpConnection::begin_chunked(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& extra_headers) {
    if (responded_ || gone_) return false;
    responded_ = chunked_open_ = true;
    // HTTP/1.0 has no chunked coding: the body is delimited by closing the connection.
    chunked_raw_ = version_minor_ == 0;
    if (chunked_raw_) keep_alive = false;
    return write_all(response_head(status, content_type, extra_headers,
                                   chunked_raw_ ? "" : "Transfer-Encoding: chunked\r\n"));
}

bool HttpConnection::send_chunk(std::string_view data) {
    if (!chunked_open_ || gone_) return false;
    if (data.empty()) return true;
    if (chunked_raw_) return write_all(data);
    return write_all(fmt::format("{:x}\r\n{}\r\n", data.size(), data));
}

bool HttpConnection::end_chunked() {
    if (!chunked_open_ || gone_) return false;
    chunked_open_ = false;
    return chunked_raw_ || write_all("0\r\n\r\n");
}

bool HttpConnection::peer_closed() {
    if (gone_) return true;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    int r = ::poll(&p, 1, 0);
    if (r <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return gone_ = true;
    // Readable: either bytes (a pipelined request: still there) or end of stream.
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return gone_ = true;
    return false;
}

// ---- the server ----

namespace {

std::string host_port(const std::string& host, int port) {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                               : fmt::format("{}:{}", host, port);
}

// Closes after sending a response the client may not have finished sending a request for:
// closing with unread bytes makes the kernel send a reset, which can destroy the response
// before the client reads it. So: end our side, read and drop what still comes, briefly.
template <typename Stopping>
void linger_close(int fd, Stopping stopping) {
    ::shutdown(fd, SHUT_WR);
    auto start = Clock::now();
    char buf[16 * 1024];
    while (!stopping() && seconds_since(start) < 1.0) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    }
    ::close(fd);
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {
    std::string where = host_port(options_.host, options_.port);
    if (options_.port < 0 || options_.port > 65535)
        fail("cannot listen on {}: the port must be 0..65535", where);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    std::string port_text = std::to_string(options_.port);
    int rc = ::getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(),
                           port_text.c_str(), &hints, &found);
    if (rc != 0) fail("cannot listen on {}: {}", where, ::gai_strerror(rc));
    int err = 0, one = 1;
    for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
        int fd =
            ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
            ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
            listen_fd_ = fd;
        } else {
            err = errno;
            if (fd >= 0) ::close(fd);
        }
    }
    ::freeaddrinfo(found);
    if (listen_fd_ < 0) {
        std::string message = fmt::format("cannot listen on {}: {}", where, std::strerror(err));
        if (err == EADDRINUSE)
            throw Error(message, "another program is using that port; choose another port");
        throw Error(message);
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

HttpServer::~HttpServer() {
    join_all();
    if (listen_fd_ >= 0) ::close(listen_fd_);
}

void HttpServer::reap_finished() {
    std::erase_if(workers_, [](Worker& w) {
        if (*w.done) w.thread.join();
        return bool(*w.done);
    });
}

void HttpServer::join_all() {
    stopping_ = true;
    for (auto& w : workers_) w.thread.join();
    workers_.clear();
}

void HttpServer::serve(const std::atomic<bool>& stop) {
    stopping_ = false;
    // Connection threads hold a reference to `stop`, so none may outlive this call.
    struct JoinOnExit {
        HttpServer* server;
        ~JoinOnExit() { server->join_all(); }
    } join_on_exit{this};

    while (!stop) {
        reap_finished();
        pollfd p{listen_fd_, POLLIN, 0};
        int r = ::poll(&p, 1, 50);
        if (r < 0 && errno != EINTR) fail("http server: poll failed: {}", std::strerror(errno));
        if (r <= 0 || stop) continue;
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            // Out of descriptors or memory: wait for connections to finish instead of spinning.
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                ::poll(nullptr, 0, 50);
            continue;
        }
        int one = 1;  // stream tokens as they come instead of batching small writes
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        reap_finished();
        if (int(workers_.size()) >= options_.max_connections) {
            HttpConnection conn(fd, &stop, 0.1);
            conn.keep_alive = false;
            conn.send_error(503, fmt::format("the server is busy ({} connections); try again later",
                                             options_.max_connections));
            ::shutdown(fd, SHUT_WR);
            ::close(fd);
            continue;
        }
        auto done = std::make_shared<std::atomic<bool>>(false);
        workers_.reserve(workers_.size() + 1);  // so that push_back cannot throw with a thread
        try {
            std::thread t([this, fd, &stop, done] {
                serve_connection(fd, stop);
                *done = true;
            });
            workers_.push_back({std::move(t), done});
        } catch (const std::system_error&) {
            ::close(fd);  // no thread to spare: drop this connection, keep serving the others
        }
    }
}

bool HttpServer::dispatch(const HttpRequest& request, HttpConnection& conn) {
    conn.start_request(request.keep_alive(), request.version_minor);
    std::string failure;
    try {
        handler_(request, conn);
    } catch (const std::exception& e) {
        failure = e.what();
    } catch (...) {
        failure = "unknown error";
    }
    if (!failure.empty()) {
        // The handler's state is unknown after a throw, and so is how much of a stream went out.
        conn.keep_alive = false;
        if (!conn.responded()) conn.send_error(500, failure);
        return false;
    }
    if (!conn.responded()) {
        conn.send_error(500, "no response");
    } else if (conn.chunked_open_) {
        conn.end_chunked();
    }
    return conn.keep_alive && !conn.gone_ && !conn.chunked_raw_;
}

void HttpServer::serve_connection(int fd, const std::atomic<bool>& stop) {
    auto stopping = [&] { return stop || stopping_; };
    bool linger = false;  // close with linger_close (a response may race unread request bytes)
    try {
        HttpRequestParser parser(options_.limits);
        HttpConnection conn(fd, &stop, options_.idle_timeout_s);
        auto send_error = [&](int status, std::string_view message) {
            conn.start_request(false, 1);
            conn.send_error(status, message);
            linger = true;
        };
        auto idle_since = Clock::now();
        bool continue_sent = false;
        auto state = HttpRequestParser::State::NeedMore;
        char buf[16 * 1024];
        while (!linger) {
            if (state == HttpRequestParser::State::Done && !stopping()) {
                HttpRequest request = parser.take();
                continue_sent = false;
                linger = !dispatch(request, conn);
                idle_since = Clock::now();
                state = parser.feed({});  // a pipelined request may be complete already
                continue;
            }
            if (stopping()) break;
            if (state == HttpRequestParser::State::Error) {
                send_error(parser.error_status(), parser.error_message());
                break;
            }
            if (parser.expects_continue() && !continue_sent) {
                continue_sent = true;
                if (!conn.write_all("HTTP/1.1 100 Continue\r\n\r\n")) break;
            }
            pollfd p{fd, POLLIN, 0};
            int r = ::poll(&p, 1, 100);
            if (stopping() || (r < 0 && errno != EINTR)) break;
            if (r <= 0) {
                if (seconds_since(idle_since) < options_.idle_timeout_s) continue;
                if (!parser.idle()) send_error(408, "the request did not arrive in time");
                break;
            }
            ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n <= 0) break;
            state = parser.feed(std::string_view(buf, size_t(n)));
        }
    } catch (...) {
        // Out of memory or similar in this connection only: drop it, keep the server up.
        linger = false;
    }
    if (linger) {
        linger_close(fd, stopping);
    } else {
        ::close(fd);
    }
}

}  // namespace kvrun
