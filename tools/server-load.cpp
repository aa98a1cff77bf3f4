// server-load: a load generator for `kvrun server` (vLLM's benchmark_serving, in small).
// C client threads each send R streamed /v1/completions requests one after another (every
// request generates exactly --max-tokens tokens: ignore_eos), and the tool reports what a
// user of a busy server sees and what the server delivers: time to first token (TTFT), time
// per output token after the first (TPOT), end-to-end latency, requests/s and output
// tokens/s over the run. Comparing -c 1 with -c 8 shows what continuous batching gives.
//
//   kvrun server -m model.gguf --parallel 8 --port 8080 &
//   server-load --port 8080 -c 8 -r 4 --max-tokens 128 --prompt-tokens 256 [-o md|json]
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common.h"
#include "http_client.h"

using namespace kvrun;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
    std::string host = "127.0.0.1";
    int port = 8080;
    int clients = 4;
    int requests = 4;  // per client
    int max_tokens = 128;
    int prompt_words = 128;  // --prompt-tokens: about one token per word
    std::string prompt;      // overrides the generated prompt
    std::string format = "md";
    double temperature = 0.8;
};

struct Sample {
    double ttft_ms = 0, e2e_ms = 0, tpot_ms = 0;
    int64_t n_out = 0, n_prompt = 0;
    std::string error;
};

// A prompt of about n tokens; each client's prompts differ from the first word on, so the
// prefix cache does not make the benchmark look better than a real mixed load.
std::string make_prompt(int client, int request, int n_words) {
    static const char* kWords[] = {"the",  "little", "girl", "saw", "a",   "big", "red",
                                   "ball", "in",     "park", "and", "she", "was", "happy"};
    std::string p = fmt::format("Story {} of reader {}:", request, client);
    for (int i = 0; i < n_words; ++i)
        p += std::string(" ") + kWords[(i * 7 + client + request) % 14];
    return p;
}

Sample one_request(const Options& o, const std::string& prompt) {
    Sample s;
    HttpClient c(o.port, 600, o.host);
    if (!c.connected()) {
        s.error = fmt::format("cannot connect to {}:{}", o.host, o.port);
        return s;
    }
    const nlohmann::json body = {
        {"prompt", prompt},   {"max_tokens", o.max_tokens},
        {"ignore_eos", true}, {"temperature", o.temperature},
        {"stream", true},     {"stream_options", {{"include_usage", true}}}};
    const std::string text = body.dump();
    const auto t0 = Clock::now();
    if (!c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nContent-Length: " +
                    std::to_string(text.size()) + "\r\n\r\n" + text)) {
        s.error = "the request could not be sent";
        return s;
    }
    const HttpReply head = c.read_head();
    if (head.status != 200) {
        s.error = fmt::format("HTTP {}: {}", head.status, c.read_reply().body);
        return s;
    }
    std::optional<Clock::time_point> first;
    for (;;) {
        bool ok = false;
        const std::string chunk = c.read_chunk(&ok);
        if (!ok) {
            s.error = "the stream broke off";
            return s;
        }
        if (chunk.empty()) break;
        for (const std::string& data : sse_data(chunk)) {
            if (data == "[DONE]") continue;
            const nlohmann::json e = nlohmann::json::parse(data, nullptr, false);
            if (e.is_discarded()) continue;
            if (e.contains("usage")) {
                s.n_out = e["usage"]["completion_tokens"];
                s.n_prompt = e["usage"]["prompt_tokens"];
            } else if (!first && e.contains("choices") && !e["choices"].empty() &&
                       !e["choices"][0].value("text", "").empty()) {
                first = Clock::now();
            }
            if (e.contains("error")) s.error = e["error"].dump();
        }
    }
    const auto t1 = Clock::now();
    auto ms = [](Clock::duration d) {
        return std::chrono::duration<double, std::milli>(d).count();
    };
    s.e2e_ms = ms(t1 - t0);
    s.ttft_ms = first ? ms(*first - t0) : s.e2e_ms;
    s.tpot_ms = s.n_out > 1 ? ms(t1 - (first ? *first : t0)) / double(s.n_out - 1) : 0.0;
    return s;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double at = q * double(v.size() - 1);
    const size_t lo = size_t(at);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (at - double(lo));
}

double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
}

int run(const Options& o) {
    std::vector<Sample> samples;
    std::mutex mu;
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < o.clients; ++c)
        threads.emplace_back([&, c] {
            for (int r = 0; r < o.requests; ++r) {
                Sample s =
                    one_request(o, o.prompt.empty() ? make_prompt(c, r, o.prompt_words) : o.prompt);
                std::lock_guard lk(mu);
                samples.push_back(std::move(s));
            }
        });
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

    std::vector<double> ttft, tpot, e2e;
    int64_t n_out = 0, n_prompt = 0;
    int n_err = 0;
    std::string first_error;
    for (const Sample& s : samples) {
        if (!s.error.empty()) {
            if (n_err++ == 0) first_error = s.error;
            continue;
        }
        ttft.push_back(s.ttft_ms);
        tpot.push_back(s.tpot_ms);
        e2e.push_back(s.e2e_ms);
        n_out += s.n_out;
        n_prompt += s.n_prompt;
    }
    if (n_err == int(samples.size())) fail("every request failed; the first: {}", first_error);
    const nlohmann::json j = {
        {"clients", o.clients},
        {"requests", samples.size()},
        {"errors", n_err},
        {"seconds", seconds},
        {"prompt_tokens_mean", ttft.empty() ? 0.0 : double(n_prompt) / double(ttft.size())},
        {"output_tokens", n_out},
        {"requests_per_s", double(ttft.size()) / seconds},
        {"output_tokens_per_s", double(n_out) / seconds},
        {"ttft_ms",
         {{"mean", mean(ttft)}, {"p50", percentile(ttft, 0.5)}, {"p99", percentile(ttft, 0.99)}}},
        {"tpot_ms",
         {{"mean", mean(tpot)}, {"p50", percentile(tpot, 0.5)}, {"p99", percentile(tpot, 0.99)}}},
        {"e2e_ms",
         {{"mean", mean(e2e)}, {"p50", percentile(e2e, 0.5)}, {"p99", percentile(e2e, 0.99)}}}};
    if (o.format == "json") {
        fmt::print("{}\n", j.dump());
    } else {
        fmt::print(
            "| clients | requests | errors | out tok/s | req/s | TTFT p50 / p99 ms | TPOT p50 / "
            "p99 ms | "
            "e2e p50 ms |\n|---|---|---|---|---|---|---|---|\n");
        fmt::print(
            "| {} | {} | {} | {:.1f} | {:.2f} | {:.1f} / {:.1f} | {:.2f} / {:.2f} | {:.0f} |\n",
            o.clients, samples.size(), n_err, double(n_out) / seconds,
            double(ttft.size()) / seconds, percentile(ttft, 0.5), percentile(ttft, 0.99),
            percentile(tpot, 0.5), percentile(tpot, 0.99), percentile(e2e, 0.5));
    }
    if (n_err > 0)
        fmt::print(stderr, "server-load: {} requests failed; the first: {}\n", n_err, first_error);
    return n_err > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app(
        "server-load: concurrent streamed requests against `kvrun server`: TTFT, TPOT, "
        "throughput");
    Options o;
    app.add_option("--host", o.host, "Server address (IPv4)")->capture_default_str();
    app.add_option("--port", o.port, "Server port")
        ->check(CLI::Range(1, 65535))
        ->capture_default_str();
    app.add_option("-c,--clients", o.clients, "Concurrent clients")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    app.add_option("-r,--requests", o.requests, "Requests per client, one after another")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    app.add_option("-n,--max-tokens", o.max_tokens, "Tokens generated per request")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    app.add_option("--prompt-tokens", o.prompt_words, "Prompt length, about (words)")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    app.add_option("-p,--prompt", o.prompt, "One prompt for every request (instead)");
    app.add_option("--temp", o.temperature, "Sampling temperature")->capture_default_str();
    app.add_option("-o,--output", o.format, "md or json")
        ->check(CLI::IsMember({"md", "json"}))
        ->capture_default_str();
    try {
        app.parse(argc, argv);
        return run(o);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const Error& e) {
        fmt::print(stderr, "server-load: error: {}\n", e.what());
        return 1;
    }
}
