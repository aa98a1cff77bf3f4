// The sliding-window layers' own KV pool (KvWindowPool, docs/kv-cache.md): on a Gemma 3
// shaped model it gives the logits of the full pool bit for bit — prefill in chunks, decode
// far past the window, a second sequence adopting a cached prefix, a fork, a rollback within
// the margin, f16 and q8 storage — while holding only each sequence's window of the windowed
// layers; the engine and the CLI (`--swa-full`, speculative decoding, prompt caches, a chat
// session rolled back past the window) give the same tokens with and without it.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "synthetic_model.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;
using kvrun::test::TempDir;

namespace {

// Six layers, five with an 8-token window (Gemma 3's pattern), small enough to run fast.
SyntheticModelConfig gemma3_small() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "gemma3";
    c.n_layer = 6, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96, c.n_vocab = 300;
    c.sliding_window = 8;
    c.weight_std = 0.15f;
    c.seed = 21;
    return c;
}

// One backend with its table; a sequence's logits after feeding tokens.
struct Side {
    std::unique_ptr<Backend> backend;
    KvBlockTable table;
    Side(const GgufFile& f, BackendOptions o)
        : backend(make_cpu_backend(f, o)), table(kv_table_for(*backend)) {}

    // Feeds tokens [n_tokens(seq), want.size()) of `want` in passes of at most `chunk`;
    // returns the last token's logits.
    std::vector<float> feed(SeqId seq, const std::vector<TokenId>& want, int32_t chunk) {
        const int64_t V = backend->config().n_vocab;
        std::vector<float> logits(size_t(V), 0.0f);
        for (int32_t at = table.n_tokens(seq); at < int32_t(want.size());) {
            const int32_t n = std::min<int32_t>(chunk, int32_t(want.size()) - at);
            REQUIRE(table.append(seq, n, want.data() + at));
            kv_apply_pending(table, *backend);
            ForwardBatch fb;
            fb.add_sequence(table, seq, at, n);
            fb.logit_rows.push_back(n - 1);
            backend->forward(fb, logits.data());
            at += n;
        }
        return logits;
    }
};

std::vector<TokenId> random_tokens(size_t n, uint32_t seed) {
    std::vector<TokenId> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = TokenId((seed * 2654435761u + i * 40503u) % 290 + 5);
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("a window pool gives the full pool's logits bit for bit and holds only the window") {
    TempDir dir;
    synthetic_model_write(gemma3_small(), dir.file("g3.gguf"));
    GgufFile f = GgufFile::open(dir.file("g3.gguf"));
    for (const std::string kv : {"f16", "q8"}) {
        CAPTURE(kv);
        BackendOptions o;
        o.kv_block_size = 4;
        o.n_kv_blocks = 240;
        o.n_batch = 8;
        o.n_parallel = 3;
        o.kv_type_k = o.kv_type_v = kv_type_parse(kv);
        BackendOptions full_o = o;
        full_o.swa_full = true;
        Side split(f, o), full(f, full_o);
        REQUIRE(split.table.windowed());
        REQUIRE_FALSE(full.table.windowed());
        // (8 + 64 + 8) / 4 + 2 = 22 window blocks per sequence, 3 sequences.
        CHECK(split.backend->kv_window_pool().n_blocks == 66);
        CHECK(split.backend->kv_window_pool().window == 8);

        const auto text = random_tokens(300, 7);
        auto both = [&](const char* what, SeqId a, SeqId b, const std::vector<TokenId>& want,
                        int32_t chunk) {
            CAPTURE(what);
            const auto la = split.feed(a, want, chunk);
            const auto lb = full.feed(b, want, chunk);
            CHECK(same_bits(la, lb));
        };
        // Sequence 1: a 37-token prompt in chunks of 8, then 160 decode steps.
        SeqId s1 = split.table.create_sequence(), f1 = full.table.create_sequence();
        std::vector<TokenId> want(text.begin(), text.begin() + 37);
        both("prefill", s1, f1, want, 8);
        int32_t peak = 0;
        for (int i = 37; i < 197; ++i) {
            want.push_back(text[size_t(i)]);
            both("decode", s1, f1, want, 1);
            peak = std::max(peak, split.table.stats().window_in_use);
        }
        // One sequence of 197 tokens holds about (8 + 64) / 4 + 2 window blocks, not 50.
        CHECK(peak <= 22);
        CHECK(split.table.window_of(split.table.block_ids(s1)[0]) == -1);

        // A rollback within the margin, then different tokens.
        split.table.truncate(s1, 181);
        full.table.truncate(f1, 181);
        want.resize(181);
        for (int i = 0; i < 12; ++i) {
            want.push_back(text[size_t(250 + i)]);
            both("after rollback", s1, f1, want, 1);
        }
        // A fork diverging from the middle of a block (193 tokens: copy-on-write).
        SeqId s2 = split.table.fork(s1), f2 = full.table.fork(f1);
        auto want2 = want;
        for (int i = 0; i < 20; ++i) {
            want2.push_back(text[size_t(100 + i)]);
            both("fork", s2, f2, want2, 1);
        }
        // A new prompt sharing sequence 1's first 188 tokens adopts what each pool still has
        // (the split pool: the blocks whose window is kept, or none) and computes the rest.
        split.table.free_sequence(s2);
        full.table.free_sequence(f2);
        auto want3 = std::vector<TokenId>(want.begin(), want.begin() + 188);  // whole blocks
        want3.push_back(17);
        want3.push_back(18);
        std::vector<TokenId> prefix(want3.begin(), want3.end() - 1);
        SeqId s3 = split.table.create_sequence_with_prefix(prefix);
        SeqId f3 = full.table.create_sequence_with_prefix(prefix);
        CHECK(full.table.n_tokens(f3) == 188);
        MESSAGE(kv << ": the split pool adopted " << split.table.n_tokens(s3) << " of 188");
        both("adopted prefix", s3, f3, want3, 8);
        for (SeqId s : {s1, s3}) split.table.free_sequence(s);
        CHECK(split.table.n_used_blocks() == 0);
    }
}

TEST_CASE("the window pool is chosen only when it holds more context, and is reported") {
    TempDir dir;
    synthetic_model_write(gemma3_small(), dir.file("g3.gguf"));
    const ModelConfig c = model_config_from_gguf(GgufFile::open(dir.file("g3.gguf")));
    BackendOptions o;
    o.kv_block_size = 16;
    o.n_batch = 512;
    o.n_kv_blocks = 8;  // 128 tokens: a window pool of (8 + 64 + 512) / 16 + 2 would be larger
    CHECK(kv_layout_for(c, o).window.n_blocks == 0);
    o.n_kv_blocks = 1024;
    const KvLayout l = kv_layout_for(c, o);
    CHECK(l.window.n_blocks == 39);
    CHECK(l.n_blocks == 1024);
    o.swa_full = true;
    CHECK(kv_layout_for(c, o).window.n_blocks == 0);
    // A memory budget: the split gives the main pool (the one global layer) many more blocks.
    o.swa_full = false;
    o.n_kv_blocks = 0;
    o.kv_memory_mib = 4;
    const KvLayout b = kv_layout_for(c, o);
    o.swa_full = true;
    const int64_t one_pool = kv_layout_for(c, o).n_blocks;
    CHECK(b.window.n_blocks == 39);
    CHECK(b.n_blocks > 4 * one_pool);
    // A budget too small for the window pool keeps one pool.
    o.swa_full = false;
    o.kv_memory_mib = 0.05;
    CHECK(kv_layout_for(c, o).window.n_blocks == 0);
    // A model without windowed layers never splits.
    SyntheticModelConfig llama = gemma3_small();
    llama.arch = "llama";
    synthetic_model_write(llama, dir.file("llama.gguf"));
    const ModelConfig lc = model_config_from_gguf(GgufFile::open(dir.file("llama.gguf")));
    o.kv_memory_mib = 4;
    CHECK(kv_layout_for(lc, o).window.n_blocks == 0);
}

TEST_CASE("engine and CLI on a windowed model: same tokens with and without the window pool") {
    TempDir dir;
    synthetic_model_write(gemma3_small(), dir.file("g3.gguf"));
    const std::string bin = kvrun::test::kvrun_binary();
    auto run = [&](const std::string& extra,
                   const std::string& prompt = "Once upon a time there was") {
        auto r = kvrun::test::run_command(
            bin + " run -m " + dir.file("g3.gguf") + " -p '" + prompt +
            "' -n 90 --temp 0 --ignore-eos --device cpu --kv-block-size 4 -b 8 -c 512 --stats " +
            extra);
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        return r;
    };
    const auto split = run("");
    const auto full = run("--swa-full");
    CHECK(split.out == full.out);
    CHECK(split.out.size() > 40);
    CHECK(split.err.find("sliding-window layers (window 8 + 64)") != std::string::npos);
    CHECK(split.err.find("KV window blocks  ") != std::string::npos);
    CHECK(full.err.find("sliding-window layers") == std::string::npos);
    // Self-speculation (the model drafts for itself): every draft is accepted and rolled back
    // within the margin; --draft-n is capped below it.
    const auto spec = run("--draft-model " + dir.file("g3.gguf") + " --draft-n 100");
    CHECK(spec.out == full.out);
    // A prompt cache with the window pool: the file holds the windowed layers' K/V of the
    // prompt's last blocks, kept when the prompt was computed (the 90 generated tokens move
    // the window far past them), so a second run adopts the whole prompt (its full blocks
    // before the last token) and still gives the tokens of --swa-full.
    const std::string long_prompt =
        "Once upon a time there was a little dog who lived in a small house near the river "
        "with his friends the cat and the bird";
    const std::string pc = "--prompt-cache " + dir.file("p.cache");
    const auto long_full = run("--swa-full", long_prompt);
    const auto cached1 = run(pc, long_prompt);
    const auto cached2 = run(pc, long_prompt);
    CHECK(cached1.out == long_full.out);
    CHECK(cached2.out == long_full.out);
    CHECK(cached1.err.find("sliding-window layers (window 8 + 64)") != std::string::npos);
    const auto prompt_stats = [](const std::string& err) {
        int n = 0, computed = 0, cached = 0;
        const auto at = err.find("prompt tokens ");
        if (at != std::string::npos)
            std::sscanf(err.c_str() + at, "prompt tokens %d (%d computed, %d from", &n, &computed,
                        &cached);
        return std::array<int, 3>{n, computed, cached};
    };
    const auto s1 = prompt_stats(cached1.err), s2 = prompt_stats(cached2.err);
    CHECK(s1[0] > 20);
    CHECK(s1[2] == 0);
    CHECK(s2[2] == (s2[0] - 1) / 4 * 4);
    CHECK(cached2.err.find("with their sliding-window layers") != std::string::npos);
    // The same file in a --swa-full run: another KV layout, not used (and rewritten).
    const auto cached3 = run("--swa-full " + pc, long_prompt);
    CHECK(cached3.out == long_full.out);
    CHECK(cached3.err.find("swa=split") != std::string::npos);
    CHECK(prompt_stats(cached3.err)[2] == 0);
    const auto info = kvrun::test::run_command(bin + " info -m " + dir.file("g3.gguf"));
    CHECK(info.out.find("per token of the 1 global layers: 128.0 bytes in f16; the 5 "
                        "sliding-window layers keep each sequence's last 8 + 64") !=
          std::string::npos);
    // bench at a depth past the window: its prompt runs on a fork of the depth sequence.
    const auto bench = kvrun::test::run_command(bin + " bench -m " + dir.file("g3.gguf") +
                                                " -p 24 -n 8 -r 1 --depth 0,122 --device cpu "
                                                "--kv-block-size 4 -b 16 -o csv");
    CHECK_MESSAGE(bench.exit_code == 0, bench.err);
    CHECK(bench.out.find("pp24") != std::string::npos);

    // An engine session rolled back far past the window recomputes and still gives the
    // tokens of a fresh run.
    GgufFile f = GgufFile::open(dir.file("g3.gguf"));
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions o;
    o.kv_block_size = 4;
    o.n_kv_blocks = 200;
    o.n_batch = 8;
    auto backend = make_cpu_backend(f, o);
    REQUIRE(backend->kv_window_pool().n_blocks > 0);
    EngineOptions eo;
    eo.n_batch = 8;
    Engine engine(*backend, *tok, eo);
    std::vector<GenerationResult> results;
    engine.on_finish([&](const GenerationResult& r) { results.push_back(r); });
    const int32_t ses = engine.open_session();
    GenerationRequest r;
    r.session = ses;
    r.prompt = random_tokens(20, 3);
    r.n_predict = 120;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(r);
    engine.run();
    REQUIRE(results.size() == 1);
    engine.truncate_session(ses, 30);  // 110 tokens back: past the window and its margin
    CHECK(engine.session_cached_tokens(ses) == 0);
    r.prompt = {40, 41, 42};
    engine.submit(r);
    engine.run();
    REQUIRE(results.size() == 2);
    std::vector<TokenId> whole = engine.session_tokens(ses);
    whole.resize(33);
    BackendOptions fo = o;
    fo.swa_full = true;
    auto fresh_backend = make_cpu_backend(f, fo);
    Engine fresh(*fresh_backend, *tok, eo);
    GenerationResult got;
    fresh.on_finish([&](const GenerationResult& g) { got = g; });
    GenerationRequest w;
    w.prompt = whole;
    w.n_predict = 120;
    w.ignore_eos = true;
    w.sampling.temperature = 0;
    fresh.submit(w);
    fresh.run();
    CHECK(results[1].tokens == got.tokens);
}
