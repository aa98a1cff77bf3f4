// A small blocking HTTP/1.1 client (the server tests and tools/server-load): one TCP
// connection to a loopback port, requests written as given, replies read with
// Content-Length, chunked transfer encoding or up to the end of the connection. Every read
// has a timeout, so a broken server fails a test instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace kvrun {

struct HttpReply {
    int status = 0;  // 0: no complete reply (connection closed or timed out)
    std::map<std::string, std::string> headers;  // lowercase names
    std::string body;                            // decoded
};

class HttpClient {
  public:
    // host: an IPv4 address.
    explicit HttpClient(int port, int timeout_s = 60, const std::string& host = "127.0.0.1") {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        timeval tv{timeout_s, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        connected_ = ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1 &&
                     ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    ~HttpClient() { close(); }
    HttpClient(const HttpClient&) = delete;
    HttpClient& operator=(const HttpClient&) = delete;

    bool connected() const { return connected_; }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

    bool send_raw(const std::string& bytes) {
        size_t done = 0;
        while (done < bytes.size()) {
            const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
            if (n <= 0) return false;
            done += size_t(n);
        }
        return true;
    }

    // Sends one request (a JSON body gets its Content-Type) and reads the reply.
    HttpReply request(const std::string& method, const std::string& path,
                      const std::string& body = {}, const std::string& extra_headers = {}) {
        std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers;
        if (!body.empty() || method == "POST")
            r +=
                "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                "\r\n";
        r += "\r\n" + body;
        if (!send_raw(r)) return {};
        return read_reply();
    }

    // Reads the status line and headers only (a streamed body is then read with
    // read_chunk()).
    HttpReply read_head() {
        HttpReply out;
        size_t end;
        while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
            if (!fill()) return out;
        std::istringstream head(buf_.substr(0, end));
        buf_.erase(0, end + 4);
        std::string line;
        std::getline(head, line);
        if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12) return out;
        out.status = std::stoi(line.substr(9, 3));
        while (std::getline(head, line)) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            const size_t colon = line.find(':');
            if (colon == std::string::npos) continue;
            std::string name = line.substr(0, colon);
            std::transform(name.begin(), name.end(), name.begin(),
                           [](unsigned char c) { return char(std::tolower(c)); });
            size_t v = colon + 1;
            while (v < line.size() && line[v] == ' ') ++v;
            out.headers[name] = line.substr(v);
        }
        return out;
    }

    // One chunk of a chunked body ("" at its end or on failure; ok tells which).
    std::string read_chunk(bool* ok = nullptr) {
        if (ok) *ok = false;
        size_t eol;
        while ((eol = buf_.find("\r\n")) == std::string::npos)
            if (!fill()) return {};
        const size_t size = std::stoul(buf_.substr(0, eol), nullptr, 16);
        while (buf_.size() < eol + 2 + size + 2)
            if (!fill()) return {};
        std::string data = buf_.substr(eol + 2, size);
        buf_.erase(0, eol + 2 + size + 2);
        if (ok) *ok = true;
        return data;
    }

    HttpReply read_reply() {
        HttpReply out = read_head();
        if (out.status == 0) return out;
        if (out.status == 100) return read_reply();
        if (out.headers.count("content-length")) {
            const size_t n = std::stoul(out.headers["content-length"]);
            while (buf_.size() < n)
                if (!fill()) return {};
            out.body = buf_.substr(0, n);
            buf_.erase(0, n);
        } else if (out.headers["transfer-encoding"] == "chunked") {
            for (;;) {
                bool ok = false;
                std::string data = read_chunk(&ok);
                if (!ok) return {};
                if (data.empty()) break;
                out.body += data;
            }
        } else {
            while (fill()) {
            }
            out.body = std::move(buf_);
            buf_.clear();
        }
        return out;
    }

  private:
    bool fill() {
        char tmp[16384];
        const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
        if (n <= 0) return false;
        buf_.append(tmp, size_t(n));
        return true;
    }

    int fd_ = -1;
    bool connected_ = false;
    std::string buf_;
};

// The payloads of a server-sent-event body: each "data: X" line's X, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> out;
    std::istringstream in(body);
    for (std::string line; std::getline(in, line);)
        if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    return out;
}

}  // namespace kvrun
