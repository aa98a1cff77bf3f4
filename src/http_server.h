// A small HTTP/1.1 server for `kvrun server`: an incremental request parser (pure, so the
// protocol rules are unit-testable without sockets), a connection object handlers write
// responses to (whole, or chunked for server-sent events), and a thread-per-connection
// server with keep-alive, pipelining, 100-continue, limits and a cooperative stop flag.
// Handlers get whole requests (body decoded); the routing and JSON APIs live above this.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace kvrun {

struct HttpRequest {
    std::string method;     // "GET", "POST", ...
    std::string target;     // as sent, e.g. "/v1/completions?x=1"
    std::string path;       // target up to '?'
    std::string query;      // after '?' ("" if none)
    int version_minor = 1;  // HTTP/1.x
    std::vector<std::pair<std::string, std::string>> headers;  // names as sent, values trimmed
    std::string body;  // decoded (Content-Length or chunked transfer encoding)

    // The first header of that name, case-insensitive; "" if none.
    std::string header(std::string_view name) const;
    // HTTP/1.1: unless "Connection: close"; HTTP/1.0: only with "Connection: keep-alive".
    bool keep_alive() const;
};

struct HttpLimits {
    size_t max_header_bytes = 64 * 1024;       // request line + headers -> 431 beyond
    size_t max_body_bytes = 32 * 1024 * 1024;  // -> 413 beyond
};

// Incremental request parser (pure; no sockets). Feed it bytes as they arrive.
class HttpRequestParser {
  public:
    explicit HttpRequestParser(HttpLimits limits = {});
    enum class State { NeedMore, Done, Error };

    // Appends bytes and parses as far as possible. Done: a whole request is ready (take()).
    // Bytes after it stay buffered for the next request (pipelining): after take(), call
    // feed("") to parse them. Once Done or Error, further feeds only buffer.
    State feed(std::string_view bytes);
    HttpRequest take();  // the parsed request; resets for the next one
    // The current request's headers are parsed (its body may be pending).
    bool headers_done() const;
    // headers_done(), "Expect: 100-continue" in an HTTP/1.1 request, and the body is pending.
    bool expects_continue() const;
    bool idle() const;  // no byte of a next request is buffered yet
    // On Error: 400 (malformed), 413, 431, 501 (unsupported transfer-encoding), 505 (not HTTP/1.x).
    int error_status() const { return error_status_; }
    const std::string& error_message() const { return error_message_; }  // one clear sentence

  private:
    enum class Phase { Headers, Body, ChunkSize, ChunkData, ChunkEnd, Trailers, Done, Error };
    // Each parses one piece at the cursor; false when it cannot go on (needs bytes, Done, Error).
    bool step();
    bool parse_headers();
    bool parse_request_line(std::string_view line);
    bool parse_header_line(std::string_view line);
    bool start_body();  // after the headers: picks Content-Length, chunked or no body
    bool parse_chunk_size();
    bool parse_trailers();
    bool reject(int status, std::string message);  // enters Error; returns false

    HttpLimits limits_;
    Phase phase_ = Phase::Headers;
    std::string buffer_;  // unconsumed bytes; pos_ is the parse cursor within it
    size_t pos_ = 0;
    size_t scan_ = 0;       // Headers: start of the next line not yet checked for the end
    size_t remaining_ = 0;  // Body: Content-Length bytes left; ChunkData: chunk bytes left
    size_t trailer_bytes_ = 0;
    HttpRequest request_;
    int error_status_ = 0;
    std::string error_message_;
};

// One client connection as a handler sees it. All writes return false once the client is
// gone (send() with MSG_NOSIGNAL; SIGPIPE is never raised).
class HttpConnection {
  public:
    // Wraps a connected stream socket, which it does not own (the server closes it; a test
    // can use one end of a socketpair). `stop`: while set, responses say "Connection: close"
    // and a write stalled by a client that does not read gives up after 1 s instead of
    // write_timeout_s.
    explicit HttpConnection(int fd, const std::atomic<bool>* stop = nullptr,
                            double write_timeout_s = 600);
    HttpConnection(const HttpConnection&) = delete;
    HttpConnection& operator=(const HttpConnection&) = delete;

    // A whole response with Content-Length. Adds Content-Type, Content-Length, Connection
    // (keep-alive or close per keep_alive), Access-Control-Allow-Origin: *, and the extra
    // headers. 1xx, 204 and 304 carry no body. False also when a response was already sent.
    bool send(int status, std::string_view content_type, std::string_view body,
              const std::vector<std::pair<std::string, std::string>>& extra_headers = {});
    // send() of http_error_body(status, message) as application/json.
    bool send_error(int status, std::string_view message);
    // A streamed response with Transfer-Encoding: chunked (for server-sent events): begin, any
    // number of chunks (empty data is skipped: it would end the stream), end. An HTTP/1.0
    // client gets the raw bytes and the connection closes to end them.
    bool begin_chunked(int status, std::string_view content_type,
                       const std::vector<std::pair<std::string, std::string>>& extra_headers = {});
    bool send_chunk(std::string_view data);
    bool end_chunked();
    // Non-blocking: the client closed its side or the socket failed. Pipelined bytes waiting
    // to be read do not count as closed.
    bool peer_closed();

    bool keep_alive = true;  // set by the server from the request before the handler runs;
                             // a handler may clear it
    bool responded() const { return responded_; }  // a response (or its start) was sent

  private:
    friend class HttpServer;
    void start_request(bool request_keep_alive, int version_minor);  // before each handler call
    bool write_all(std::string_view data);
    std::string response_head(int status, std::string_view content_type,
                              const std::vector<std::pair<std::string, std::string>>& extra,
                              std::string_view framing);

    int fd_;
    const std::atomic<bool>* stop_;
    double write_timeout_s_;
    int version_minor_ = 1;
    bool responded_ = false;
    bool chunked_open_ = false;  // begin_chunked sent, end_chunked not yet
    bool chunked_raw_ = false;   // HTTP/1.0: the stream is unframed, ended by closing
    bool gone_ = false;          // a write failed or the peer was seen closed
};

using HttpHandler = std::function<void(const HttpRequest&, HttpConnection&)>;

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;  // 0: any free port (see HttpServer::port())
    HttpLimits limits;
    int max_connections = 256;    // more at once get 503 and are closed
    double idle_timeout_s = 600;  // a connection with no complete request for this long is
                                  // closed (408 if partial request bytes came)
};

class HttpServer {
  public:
    // Binds and listens (getaddrinfo, SO_REUSEADDR, IPv4/IPv6 host names). Throws Error naming
    // host:port, e.g. "cannot listen on 127.0.0.1:8080: Address already in use".
    HttpServer(HttpServerOptions options, HttpHandler handler);
    ~HttpServer();  // closes the listening socket; joins any thread still running
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    int port() const { return port_; }  // the bound port (useful with port 0)

    // Accepts and serves connections, one std::thread each, until `stop` becomes true. Then
    // stops accepting, closes idle keep-alive connections and waits for running handlers to
    // return (a handler must finish promptly once stop is set). Returns only when every
    // connection thread has been joined, also when it throws.
    void serve(const std::atomic<bool>& stop);

  private:
    struct Worker {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    void reap_finished();
    void join_all();
    void serve_connection(int fd, const std::atomic<bool>& stop);
    bool dispatch(const HttpRequest& request, HttpConnection& conn);  // true: keep it open

    HttpServerOptions options_;
    HttpHandler handler_;
    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stopping_{false};  // serve() is leaving: connections close
    std::vector<Worker> workers_;
};

// "OK", "Bad Request", ... ("Unknown" for codes it does not know).
const char* http_status_text(int status);

// The JSON error body used everywhere (OpenAI / llama.cpp server shape):
// {"error":{"code":STATUS,"message":MESSAGE,"type":TYPE}}, TYPE "invalid_request_error" for
// 4xx except 401 "authentication_error", 404 "not_found_error"; 503 "unavailable_error";
// other 5xx "server_error". Invalid UTF-8 in the message is replaced, never thrown on.
std::string http_error_body(int status, std::string_view message);

}  // namespace kvrun
