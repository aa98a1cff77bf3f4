// libFuzzer target for the HTTP/1.1 request parser, which reads whatever a network client
// sends: the input's first byte picks how the rest is cut into pieces, the rest is the byte
// stream of a connection. The parser must never crash or hang, must end in NeedMore, Done or
// Error with a status it documents, must keep bodies within the limit, and must read the
// stream the same way whether it arrives whole or in pieces (same requests, same error).
// Run with KVRUN_FUZZ_WRITE_SEEDS=<dir> to write a small seed corpus and exit.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_seeds.h"
#include "http_server.h"

namespace {

[[noreturn]] void trap(const char* what) {
    std::fprintf(stderr, "fuzz_http: %s\n", what);
    std::abort();
}

void write_seeds(const char* dir) {
    const char* seeds[] = {
        "\x01GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "\x03POST /v1/completions HTTP/1.1\r\nContent-Length: 13\r\n\r\n{\"prompt\":\"\"}"
        "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "\x07POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nabcd\r\n0\r\n"
        "Trailer: y\r\n\r\n",
        "\x05POST /x HTTP/1.1\nExpect: 100-continue\nContent-Length: 2\n\nhi",
        "\x02GET / HTTP/2.0\r\n\r\n",
        "\x09POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    };
    int n = 0;
    for (const char* s : seeds) {
        std::ofstream out(std::string(dir) + "/seed_" + std::to_string(n++), std::ios::binary);
        out << s;
    }
}

struct Outcome {
    std::vector<std::string> requests;  // method, target, body of each parsed request
    int error = 0;                      // error status (0: none)
};

constexpr kvrun::HttpLimits kLimits{512, 1024};

Outcome parse(std::string_view stream, size_t piece) {
    kvrun::HttpRequestParser p(kLimits);
    Outcome out;
    for (size_t at = 0; at <= stream.size() && out.error == 0; at += piece) {
        auto state = p.feed(stream.substr(at, piece));
        while (state == kvrun::HttpRequestParser::State::Done) {
            kvrun::HttpRequest r = p.take();
            if (r.body.size() > kLimits.max_body_bytes) trap("body beyond the limit");
            out.requests.push_back(r.method + " " + r.target + " " +
                                   std::to_string(r.version_minor) + " " + r.body);
            state = p.feed("");
        }
        if (state == kvrun::HttpRequestParser::State::Error) {
            out.error = p.error_status();
            const int e = out.error;
            if (e != 400 && e != 413 && e != 431 && e != 501 && e != 505) trap("unknown status");
            if (p.error_message().empty()) trap("an error without a message");
        }
        if (piece == 0) break;
    }
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return fuzz_write_seeds_if_asked(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const size_t piece = 1 + data[0] % 16;
    const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
    const Outcome whole = parse(stream, stream.size() + 1);
    const Outcome pieces = parse(stream, piece);
    if (whole.requests != pieces.requests) trap("pieces parse to other requests");
    if (whole.error != pieces.error) trap("pieces give another error");
    return 0;
}
