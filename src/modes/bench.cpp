// `kvrun bench`: prefill (pp) and decode (tg) throughput at batch 1, at context depths,
// for KV cache types, with mean ± stddev over repetitions, and for decode the achieved
// memory bandwidth (weight + KV bytes read per token ÷ time per token) as a fraction of the
// device's measured copy bandwidth.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kv_block_table.h"
#include "kv_format.h"
#include "model_config.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#if KVRUN_HAS_CUDA
#include "cuda/bandwidth.h"
#endif

namespace kvrun {
namespace {

struct BenchOptions {
    ModelOptions model;
    std::string n_prompt = "512", n_gen = "128";  // comma-separated token counts
    std::vector<std::string> pg;                  // "PP,TG" prompt-then-generate tests
    int32_t reps = 3;
    std::string depths = "0", kv_types;
    std::string output = "md";
};

struct BenchRow {
    std::string test, kv;
    int32_t depth = 0, n = 0;
    double mean = 0, stddev = 0;   // tokens/s
    double bytes_per_token = 0;    // tg: weights + KV read per token
    double gbs = 0, fraction = 0;  // tg: achieved bandwidth and share of the copy bandwidth
};

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

// Host memcpy bandwidth (bytes read + written per second) over a buffer much larger than
// the caches: the practical ceiling for a memory-bound CPU decode.
double host_copy_bandwidth() {
    const size_t n = size_t(256) << 20;
    std::vector<char> a(n, 1), b(n, 2);
    std::memcpy(b.data(), a.data(), n);  // warm up / fault in
    double best = 0;
    for (int i = 0; i < 3; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        std::memcpy(b.data(), a.data(), n);
        best = std::max(best, 2.0 * n / seconds_since(t0));
    }
    return best;
}

// Bytes a decode step reads from the weights: every matrix once, but only one row of the
// token embedding table (unless it doubles as the output matrix), and of a mixture of
// experts only the experts one token uses (used / count of each ffn_*_exps tensor).
double weight_bytes_per_token(const GgufFile& f, const ModelConfig& c) {
    double total = 0;
    for (const auto& t : f.tensors()) {
        int layer = -1;  // (multi-token-prediction layers past n_layer do not run)
        if (std::sscanf(t.name.c_str(), "blk.%d.", &layer) == 1 && layer >= c.n_layer) continue;
        if (t.name == "token_embd.weight" && f.find_tensor("output.weight") != nullptr) {
            total += double(t.n_bytes) / double(t.dims.size() > 1 ? t.dims[1] : 1);
            continue;
        }
        if (c.moe() && t.name.find("_exps.weight") != std::string::npos) {
            total += double(t.n_bytes) * double(c.n_expert_used) / double(c.n_expert);
            continue;
        }
        total += double(t.n_bytes);
    }
    return total;
}

void mean_std(const std::vector<double>& v, double& mean, double& sd) {
    mean = 0;
    for (double x : v) mean += x;
    mean /= v.size();
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    sd = v.size() > 1 ? std::sqrt(var / (v.size() - 1)) : 0.0;
}

// Feeds n tokens of `seq` starting at `start` in batches of n_batch; returns seconds.
// Logits are computed for the last token of each pass, as a real prefill/decode does.
double feed(Backend& b, KvBlockTable& table, SeqId seq, const std::vector<TokenId>& toks,
            int32_t start, int32_t n, int32_t n_batch, std::vector<float>& logits) {
    auto t0 = std::chrono::steady_clock::now();
    for (int32_t s = start; s < start + n; s += n_batch) {
        const int32_t m = std::min(n_batch, start + n - s);
        if (!table.append(seq, m, toks.data() + s)) fail("KV pool too small for the benchmark");
        kv_apply_pending(table, b);
        ForwardBatch fb;
        fb.add_sequence(table, seq, s, m);
        fb.logit_rows.push_back(m - 1);
        b.forward(fb, logits.data());
    }
    return seconds_since(t0);
}

// A comma-separated list of token counts ("0,4096"); throws Error naming the flag.
std::vector<int32_t> count_list(const std::string& text, const char* flag) {
    std::vector<int32_t> out;
    for (auto& d : split_list(text)) {
        int32_t v = -1;
        const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
        if (ec != std::errc() || end != d.data() + d.size() || v < 0)
            fail("{}: '{}' is not a token count (expected e.g. 0,4096)", flag, d);
        out.push_back(v);
    }
    return out;
}

int run_bench(BenchOptions o) {
    auto kv_list = split_list(o.kv_types.empty() ? o.model.kv_type : o.kv_types);
    const std::vector<int32_t> depth_list = count_list(o.depths, "--depth");
    std::vector<int32_t> pp_list, tg_list;
    for (int32_t v : count_list(o.n_prompt, "-p"))
        if (v > 0) pp_list.push_back(v);
    for (int32_t v : count_list(o.n_gen, "-n"))
        if (v > 0) tg_list.push_back(v);
    std::vector<std::pair<int32_t, int32_t>> pg_list;
    for (const std::string& pg : o.pg) {
        const std::vector<int32_t> v = count_list(pg, "-pg");
        if (v.size() != 2 || v[0] == 0 || v[1] == 0)
            fail("-pg: '{}' is not PROMPT,GEN (two token counts above 0, e.g. 512,128)", pg);
        pg_list.emplace_back(v[0], v[1]);
    }
    int32_t max_depth = 0, max_tokens = 1;
    for (int32_t d : depth_list) max_depth = std::max(max_depth, d);
    for (int32_t v : pp_list) max_tokens = std::max(max_tokens, v);
    for (int32_t v : tg_list) max_tokens = std::max(max_tokens, v);
    for (const auto& [pp, tg] : pg_list) max_tokens = std::max(max_tokens, pp + tg);

    std::vector<BenchRow> rows;
    double copy_bw = 0;
    std::string device_name;
    std::string model_name;
    double model_bytes = 0, model_params = 0;  // llama-bench's "size" and "params"
    for (const std::string& kv : kv_list) {
        ModelOptions mo = o.model;
        mo.kv_type = kv;
        mo.kv_type_k.clear();
        mo.kv_type_v.clear();
        mo.n_ctx = max_depth + max_tokens + mo.kv_block_size;
        if (mo.kv_memory_mib <= 0) mo.kv_memory_mib = 0;
        // pp runs on a fork of the depth sequence; with sliding-window layers both hold a
        // window in the window pool, so it is sized for two sequences.
        const ModelConfig probe = model_config_from_gguf(*open_model_file(mo));
        const bool windowed = probe.n_swa > 0 && probe.swa_pattern > 0 && !mo.swa_full;
        LoadedModel m = load_model(mo, windowed ? 2 : 1);
        Backend& b = *m.backend;
        const ModelConfig& cfg = b.config();
        model_name = m.file->get_string_or("general.name", mo.model);
        model_bytes = 0;
        model_params = 0;
        for (const auto& t : m.file->tensors()) {
            model_bytes += double(t.n_bytes);
            model_params += double(t.n_elements);
        }
        device_name = m.device;
        if (copy_bw == 0) {
#if KVRUN_HAS_CUDA
            copy_bw = m.device == "cpu" ? host_copy_bandwidth() : cuda_copy_bandwidth();
#else
            copy_bw = host_copy_bandwidth();
#endif
        }
        const double w_bytes = weight_bytes_per_token(*m.file, m.backend->config());
        const double kv_tok =
            kv_bytes_per_token(cfg, kv_type_parse(kv), kv_type_parse(kv), mo.kv_block_size);
        std::mt19937 rng(42);
        std::vector<TokenId> toks(size_t(max_depth) + size_t(max_tokens) + 1);
        for (auto& t : toks) t = static_cast<TokenId>(rng() % cfg.n_vocab);
        std::vector<float> logits(cfg.n_vocab);
        for (int32_t depth : depth_list) {
            std::vector<std::vector<double>> pp(pp_list.size()), tg(tg_list.size()),
                pg(pg_list.size());
            for (int32_t r = -1; r < o.reps; ++r) {  // r = -1: warm-up
                KvBlockTable table = kv_table_for(b);
                SeqId seq = table.create_sequence();
                if (depth > 0) feed(b, table, seq, toks, 0, depth, mo.n_batch, logits);
                // Each test on a fork of the depth sequence, so the next starts from the depth
                // again (a window pool could not roll a sequence back).
                auto on_fork = [&](const std::function<double(SeqId)>& test) {
                    const SeqId f = table.fork(seq);
                    const double secs = test(f);
                    table.free_sequence(f);
                    return secs;
                };
                for (size_t i = 0; i < pp_list.size(); ++i) {
                    const double s = on_fork([&](SeqId f) {
                        return feed(b, table, f, toks, depth, pp_list[i], mo.n_batch, logits);
                    });
                    if (r >= 0) pp[i].push_back(pp_list[i] / s);
                }
                for (size_t i = 0; i < tg_list.size(); ++i) {
                    const double s = on_fork([&](SeqId f) {
                        return feed(b, table, f, toks, depth, tg_list[i], 1, logits);
                    });
                    if (r >= 0) tg[i].push_back(tg_list[i] / s);
                }
                for (size_t i = 0; i < pg_list.size(); ++i) {
                    const auto [np, ng] = pg_list[i];
                    const double s = on_fork([&](SeqId f) {
                        return feed(b, table, f, toks, depth, np, mo.n_batch, logits) +
                               feed(b, table, f, toks, depth + np, ng, 1, logits);
                    });
                    if (r >= 0) pg[i].push_back((np + ng) / s);
                }
            }
            for (size_t i = 0; i < pp_list.size(); ++i) {
                BenchRow row{"pp" + std::to_string(pp_list[i]), kv, depth, pp_list[i]};
                mean_std(pp[i], row.mean, row.stddev);
                rows.push_back(row);
            }
            for (size_t i = 0; i < tg_list.size(); ++i) {
                const int32_t n_gen = tg_list[i];
                BenchRow row{"tg" + std::to_string(n_gen), kv, depth, n_gen};
                mean_std(tg[i], row.mean, row.stddev);
                // KV read per decode step grows from depth to depth + n_gen: use the mean.
                // A sliding-window layer reads at most its window.
                const double ctx = depth + n_gen / 2.0;
                double kv_read = 0;
                for (int64_t l = 0; l < cfg.n_layer; ++l)
                    kv_read += cfg.window(l) > 0 ? std::min(ctx, double(cfg.window(l))) : ctx;
                row.bytes_per_token = w_bytes + kv_tok / double(cfg.n_layer) * kv_read;
                row.gbs = row.bytes_per_token * row.mean / 1e9;
                row.fraction = copy_bw > 0 ? row.bytes_per_token * row.mean / copy_bw : 0;
                rows.push_back(row);
            }
            for (size_t i = 0; i < pg_list.size(); ++i) {
                const auto [np, ng] = pg_list[i];
                BenchRow row{fmt::format("pp{}+tg{}", np, ng), kv, depth, np + ng};
                mean_std(pg[i], row.mean, row.stddev);
                rows.push_back(row);
            }
        }
    }

    auto row_json = [&](const BenchRow& r) {
        return nlohmann::json{{"test", r.test},
                              {"kv", r.kv},
                              {"depth", r.depth},
                              {"tokens", r.n},
                              {"tokens_per_s", r.mean},
                              {"stddev", r.stddev},
                              {"bytes_per_token", r.bytes_per_token},
                              {"gbs", r.gbs},
                              {"bandwidth_fraction", r.fraction}};
    };
    if (o.output == "json") {
        nlohmann::json j;
        j["model"] = o.model.model;
        j["device"] = device_name;
        j["copy_bandwidth_gbs"] = copy_bw / 1e9;
        j["model_bytes"] = model_bytes;
        j["model_params"] = model_params;
        j["results"] = nlohmann::json::array();
        for (auto& r : rows) j["results"].push_back(row_json(r));
        fmt::print("{}\n", j.dump(2));
    } else if (o.output == "jsonl") {  // one object per result, with the run's fields
        for (auto& r : rows) {
            nlohmann::json j = row_json(r);
            j["model"] = o.model.model;
            j["device"] = device_name;
            j["copy_bandwidth_gbs"] = copy_bw / 1e9;
            j["model_bytes"] = model_bytes;
            j["model_params"] = model_params;
            fmt::print("{}\n", j.dump());
        }
    } else if (o.output == "csv") {
        fmt::print("model,device,test,kv,depth,tokens_per_s,stddev,gbs,bandwidth_fraction\n");
        for (auto& r : rows)
            fmt::print("{},{},{},{},{},{:.3f},{:.3f},{:.2f},{:.4f}\n", o.model.model, device_name,
                       r.test, r.kv, r.depth, r.mean, r.stddev, r.gbs, r.fraction);
    } else if (o.output == "md") {
        const std::string size = model_bytes >= double(1 << 30)
                                     ? fmt::format("{:.2f} GiB", model_bytes / double(1 << 30))
                                     : fmt::format("{:.1f} MiB", model_bytes / double(1 << 20));
        const std::string params = model_params >= 1e9
                                       ? fmt::format("{:.2f} B", model_params / 1e9)
                                       : fmt::format("{:.2f} M", model_params / 1e6);
        fmt::print(
            "model: {} ({}, {}, {} params)  device: {}  measured copy bandwidth: {:.1f} "
            "GB/s\n\n",
            o.model.model, model_name, size, params, device_name, copy_bw / 1e9);
        fmt::print(
            "| test | kv | depth | t/s | ± | GB/s | % of copy bw "
            "|\n|---|---|---:|---:|---:|---:|---:|\n");
        for (auto& r : rows) {
            if (r.test[0] == 't')
                fmt::print("| {} | {} | {} | {:.2f} | {:.2f} | {:.1f} | {:.1f}% |\n", r.test, r.kv,
                           r.depth, r.mean, r.stddev, r.gbs, 100 * r.fraction);
            else
                fmt::print("| {} | {} | {} | {:.2f} | {:.2f} | | |\n", r.test, r.kv, r.depth,
                           r.mean, r.stddev);
        }
    } else {
        fail("unknown output format '{}' (expected md, csv, json or jsonl)", o.output);
    }
    return 0;
}

}  // namespace

void add_bench_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<BenchOptions>();
    CLI::App* cmd = root.add_subcommand(
        "bench",
        "Measure prefill (pp) and decode (tg) tokens/s at batch 1, with decode memory "
        "bandwidth as a fraction of the measured copy bandwidth");
    add_model_options(cmd, o->model);
    cmd->add_option("-p,--n-prompt", o->n_prompt,
                    "Prompt tokens for the prefill tests, comma-separated (0: none)")
        ->capture_default_str();
    cmd->add_option("-n,--n-gen", o->n_gen,
                    "Tokens for the decode tests, comma-separated (0: none)")
        ->capture_default_str();
    cmd->add_option("--pg", o->pg,
                    "A prompt-then-generate test PP,TG (llama-bench's -pg; repeatable): "
                    "(PP + TG) tokens / the time of both");
    cmd->add_option("-r,--repetitions", o->reps, "Repetitions (after one warm-up)")
        ->check(at_least(1))
        ->capture_default_str();
    cmd->add_option("-d,--depth,--n-depth", o->depths,
                    "Context depths, comma-separated (e.g. 0,4096)")
        ->capture_default_str();
    cmd->add_option("--kv-types", o->kv_types,
                    "KV cache types to compare, comma-separated (e.g. f16,q8)");
    cmd->add_option("-o,--output", o->output, "Output format: md, csv, json or jsonl")
        ->capture_default_str();
    cmd->callback([o, &exit_code] { exit_code = run_bench(*o); });
}

}  // namespace kvrun
