// HTTP/1.1 request parsing (see http_server.h). The parser follows RFC 9112 strictly where
// leniency would let a request be read two ways (conflicting lengths, folded headers,
// whitespace before a colon), and leniently where it is harmless (bare LF line ends, empty
// lines before a request).
#include <strings.h>

#include <cctype>
#include <charconv>

#include "common.h"
#include "http_server.h"

namespace kvrun {
namespace {

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// s without the optional whitespace (SP, HTAB) around it (RFC 9110's OWS).
std::string_view trim_ows(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// An RFC 9110 token (method and header names): letters, digits and !#$%&'*+-.^_`|~.
bool is_token(std::string_view s) {
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("!#$%&'*+-.^_`|~", c))
            return false;
    return !s.empty() && s.find('\0') == std::string_view::npos;
}

// Whether the comma-separated list `value` holds `token` (case-insensitive).
bool list_has(std::string_view value, std::string_view token) {
    for (size_t comma = 0; comma != std::string_view::npos; value.remove_prefix(comma + 1)) {
        comma = value.find(',');
        if (iequals(trim_ows(value.substr(0, comma)), token)) return true;
    }
    return false;
}

// The line starting at `from` without its line end (LF or CRLF), and the offset after it;
// false when no LF is buffered yet.
bool next_line(const std::string& buf, size_t from, std::string_view& line, size_t& after) {
    size_t nl = buf.find('\n', from);
    if (nl == std::string::npos) return false;
    line = std::string_view(buf).substr(from, nl - from);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    after = nl + 1;
    return true;
}

}  // namespace

// ---- HttpRequest ----

std::string HttpRequest::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (iequals(k, name)) return v;
    return {};
}

bool HttpRequest::keep_alive() const {
    bool close = false, keep = false;
    for (const auto& [k, v] : headers) {
        if (!iequals(k, "connection")) continue;
        close = close || list_has(v, "close");
        keep = keep || list_has(v, "keep-alive");
    }
    return !close && (version_minor >= 1 || keep);
}

// ---- HttpRequestParser ----

HttpRequestParser::HttpRequestParser(HttpLimits limits) : limits_(limits) {}

bool HttpRequestParser::reject(int status, std::string message) {
    phase_ = Phase::Error;
    error_status_ = status;
    error_message_ = std::move(message);
    return false;
}

HttpRequestParser::State HttpRequestParser::feed(std::string_view bytes) {
    buffer_.append(bytes);
    while (step()) {
    }
    // Drop consumed bytes once per feed, not per chunk: erasing the front is linear.
    if (pos_ > 0) {
        buffer_.erase(0, pos_);
        pos_ = 0;
    }
    if (phase_ == Phase::Done) return State::Done;
    return phase_ == Phase::Error ? State::Error : State::NeedMore;
}

HttpRequest HttpRequestParser::take() {
    HttpRequest out = std::move(request_);
    request_ = HttpRequest{};
    if (phase_ != Phase::Error) phase_ = Phase::Headers;
    scan_ = remaining_ = trailer_bytes_ = 0;
    return out;
}

bool HttpRequestParser::headers_done() const {
    return phase_ != Phase::Headers && phase_ != Phase::Error;
}

bool HttpRequestParser::expects_continue() const {
    // RFC 9110 10.1.1: an HTTP/1.0 client's expectation is ignored.
    return headers_done() && phase_ != Phase::Done && request_.version_minor >= 1 &&
           iequals(request_.header("expect"), "100-continue");
}

bool HttpRequestParser::idle() const {
    return phase_ == Phase::Headers && buffer_.empty();
}

bool HttpRequestParser::step() {
    size_t avail = buffer_.size() - pos_;
    switch (phase_) {
        case Phase::Headers:
            return parse_headers();
        case Phase::Body:
        case Phase::ChunkData: {
            size_t n = std::min(remaining_, avail);
            request_.body.append(buffer_, pos_, n);
            pos_ += n;
            remaining_ -= n;
            if (remaining_ > 0) return false;
            phase_ = phase_ == Phase::Body ? Phase::Done : Phase::ChunkEnd;
            return phase_ != Phase::Done;
        }
        case Phase::ChunkSize:
            return parse_chunk_size();
        case Phase::ChunkEnd: {
            size_t crlf = avail > 0 && buffer_[pos_] == '\r' ? 2 : 1;
            if (avail < crlf) return false;
            if (buffer_[pos_ + crlf - 1] != '\n')
                return reject(400, "chunk data is not followed by a line end");
            pos_ += crlf;
            phase_ = Phase::ChunkSize;
            return true;
        }
        case Phase::Trailers:
            return parse_trailers();
        default:
            return false;
    }
}

bool HttpRequestParser::parse_headers() {
    // RFC 9112 2.2: empty lines before a request line are ignored (some clients send an
    // extra CRLF after a POST body). The header section starts at offset 0 in this phase.
    while (scan_ == 0 && (buffer_.starts_with('\n') || buffer_.starts_with("\r\n")))
        buffer_.erase(0, buffer_[0] == '\n' ? 1 : 2);

    // Find the empty line ending the section, resuming where the last feed stopped.
    std::string_view line;
    size_t after = 0, end = 0;
    while (end == 0 && next_line(buffer_, scan_, line, after)) {
        if (line.empty() && scan_ > 0) end = after;
        scan_ = after;
    }
    if ((end == 0 ? buffer_.size() : end) > limits_.max_header_bytes)
        return reject(431,
                      fmt::format("the request headers exceed {} bytes", limits_.max_header_bytes));
    if (end == 0) return false;

    size_t at = 0;
    next_line(buffer_, at, line, at);
    if (!parse_request_line(line)) return false;
    while (next_line(buffer_, at, line, at) && !line.empty())
        if (!parse_header_line(line)) return false;
    pos_ = end;
    return start_body() && phase_ != Phase::Done;
}

bool HttpRequestParser::parse_request_line(std::string_view line) {
    size_t sp1 = line.find(' ');
    size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
        return reject(400, "the request line is not 'METHOD TARGET HTTP/1.x'");
    std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string_view version = line.substr(sp2 + 1);
    if (!is_token(method)) return reject(400, "the request method is not a token");
    bool target_ok = !target.empty();
    for (char c : target) target_ok = target_ok && (unsigned char)c > 0x20 && c != 0x7f;
    if (!target_ok) return reject(400, "the request target is empty or holds control characters");

    // "HTTP/" DIGIT "." DIGIT; a well-formed other major version is 505, anything else 400.
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    bool well_formed = version.starts_with("HTTP/") && version.size() == 8 && digit(version[5]) &&
                       version[6] == '.' && digit(version[7]);
    if (well_formed && version[5] != '1') {
        return reject(505, fmt::format("{} is not supported; use HTTP/1.1", version));
    } else if (!well_formed) {
        return reject(400, "the request line does not end with HTTP/1.x");
    }
    request_.method = std::string(method);
    request_.target = std::string(target);
    size_t q = target.find('?');
    request_.path = std::string(target.substr(0, q));
    request_.query = q == std::string_view::npos ? "" : std::string(target.substr(q + 1));
    request_.version_minor = version[7] - '0';
    return true;
}

bool HttpRequestParser::parse_header_line(std::string_view line) {
    if (line.front() == ' ' || line.front() == '\t')
        return reject(400, "obsolete header line folding is not accepted");
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return reject(400, "a header line has no ':'");
    // A non-token name includes whitespace before the colon, which RFC 9112 5.1 requires
    // rejecting: proxies disagree about what such a name means.
    std::string_view name = line.substr(0, colon);
    if (!is_token(name)) return reject(400, fmt::format("invalid header name '{}'", name));
    std::string_view value = trim_ows(line.substr(colon + 1));
    for (char c : value)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
            return reject(400, fmt::format("the '{}' header holds a control character", name));
    request_.headers.emplace_back(std::string(name), std::string(value));
    return true;
}

bool HttpRequestParser::start_body() {
    bool has_length = false, chunked = false;
    uint64_t length = 0;
    for (const auto& [k, v] : request_.headers) {
        if (iequals(k, "content-length")) {
            uint64_t n = 0;
            auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])) ||
                end != v.data() + v.size())
                return reject(400, fmt::format("Content-Length '{}' is not a decimal number", v));
            if (ec == std::errc::result_out_of_range) n = UINT64_MAX;  // over any limit
            if (has_length && n != length)
                return reject(400, "the request has conflicting Content-Length headers");
            has_length = true;
            length = n;
        } else if (iequals(k, "transfer-encoding")) {
            // Only a lone "chunked": any other coding would have to be decoded first.
            if (chunked || !iequals(v, "chunked"))
                return reject(
                    501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", v));
            chunked = true;
        }
    }
    // RFC 9112 6.1: both at once is a request-smuggling vector, so it is refused, not resolved.
    if (has_length && chunked)
        return reject(400, "the request has both Content-Length and Transfer-Encoding");
    if (length > limits_.max_body_bytes)
        return reject(413, fmt::format("the request body of {} bytes exceeds the limit of {} bytes",
                                       length, limits_.max_body_bytes));
    remaining_ = length;
    phase_ = chunked ? Phase::ChunkSize : length > 0 ? Phase::Body : Phase::Done;
    return true;
}

bool HttpRequestParser::parse_chunk_size() {
    constexpr size_t kMaxSizeLine = 4096;  // hex size plus extensions, which are ignored
    std::string_view line;
    size_t after = 0;
    bool complete = next_line(buffer_, pos_, line, after);
    if ((complete ? after : buffer_.size()) - pos_ > kMaxSizeLine)
        return reject(400, "a chunk size line is too long");
    if (!complete) return false;
    size_t size = 0;
    auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
    std::string_view rest = trim_ows(line.substr(size_t(end - line.data())));
    if (end == line.data() || (!rest.empty() && rest[0] != ';'))
        return reject(400, "a chunk size is not a hexadecimal number");
    // Out of range for size_t is also past the limit; the subtraction cannot wrap.
    if (ec == std::errc::result_out_of_range ||
        size > limits_.max_body_bytes - request_.body.size())
        return reject(413, fmt::format("the chunked request body exceeds the limit of {} bytes",
                                       limits_.max_body_bytes));
    pos_ = after;
    remaining_ = size;
    phase_ = size == 0 ? Phase::Trailers : Phase::ChunkData;
    return true;
}

bool HttpRequestParser::parse_trailers() {
    // Trailer fields are read and dropped: nothing here needs them, and merging them into
    // the headers would let them override what was checked before the body. The limit counts
    // their lines, not the empty line that ends them, the same whether they arrive at once or
    // byte by byte.
    std::string_view line;
    size_t after = 0;
    const auto too_long = [&] {
        return reject(
            431, fmt::format("the request trailers exceed {} bytes", limits_.max_header_bytes));
    };
    while (next_line(buffer_, pos_, line, after)) {
        if (line.empty()) {
            pos_ = after;
            phase_ = Phase::Done;
            return false;
        }
        trailer_bytes_ += after - pos_;
        pos_ = after;
        if (trailer_bytes_ > limits_.max_header_bytes) return too_long();
    }
    // An unfinished line counts too, unless it is a lone CR that may begin the empty line.
    const size_t pending = buffer_.size() - pos_;
    if (pending > 0 && !(pending == 1 && buffer_[pos_] == '\r') &&
        trailer_bytes_ + pending > limits_.max_header_bytes)
        return too_long();
    return false;
}

}  // namespace kvrun
