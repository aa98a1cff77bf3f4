// Prompt cache files (--prompt-cache): a prompt's full KV blocks saved by one engine and
// loaded by a fresh backend and engine give the same greedy tokens while computing only the
// uncached tail (f16 and q8 KV), a prompt sharing only the first blocks adopts those, a small
// pool loads what fits, --prompt-cache-all keeps the generated blocks, and files for another
// model or KV format are ignored while truncated, corrupt or out-of-vocabulary ones are
// refused with one clear Error. Also KvBlockTable::import_cached_block's rules.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "kv_block_table.h"
#include "prompt_cache.h"
#include "test_model.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;
using kvrun::test::TempDir;

namespace {

using test::Model;

std::unique_ptr<Model> load(const char* name) {
    return test::load_shared_model(name);
}

// A backend plus engine over a fresh pool, as a new process would have them.
struct Run {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Engine> engine;
    PromptCacheKey key;
    Run(const Model& m, KvType kv, int64_t n_blocks = 64) {
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = n_blocks;
        o.kv_type_k = o.kv_type_v = kv;
        backend = make_cpu_backend(m.file, o);
        EngineOptions eo;
        eo.max_parallel = 2;
        engine = std::make_unique<Engine>(*backend, *m.tok, eo);
        key = prompt_cache_key(m.file, *backend, kv, kv, false);
    }
    GenerationResult generate(const std::vector<TokenId>& prompt, int32_t n = 24) {
        GenerationRequest req;
        req.prompt = prompt;
        req.n_predict = n;
        req.sampling.temperature = 0.0f;
        GenerationResult out;
        engine->on_finish([&](const GenerationResult& r) { out = r; });
        engine->submit(req);
        engine->run();
        return out;
    }
};

std::vector<TokenId> story(const Tokenizer& tok) {
    return tok.encode(
        std::string("Once upon a time, there was a little girl named Lily. She "
                    "loved to play outside in the park with her friends. One day, she saw a "
                    "big red ball in the old tree and wanted to get it."),
        true);
}

}  // namespace

TEST_CASE("import_cached_block registers evictable blocks the prefix cache adopts") {
    KvBlockTable t(4, 2);
    const std::vector<TokenId> toks = {5, 6, 7, 8, 9};
    const uint64_t h0 = KvBlockTable::hash_block(0, std::span(toks).subspan(0, 2));
    const BlockId a = t.import_cached_block(0, std::span(toks).subspan(0, 2));
    const BlockId b = t.import_cached_block(h0, std::span(toks).subspan(2, 2));
    REQUIRE(a >= 0);
    REQUIRE(b >= 0);
    CHECK(t.import_cached_block(0, std::span(toks).subspan(0, 2)) == -1);  // cached already
    CHECK(t.n_evictable_blocks() == 2);
    CHECK(t.n_used_blocks() == 0);
    CHECK(t.cached_hash(a) == h0);
    CHECK(t.cached_parent_hash(b) == h0);
    CHECK(t.match_prefix(toks) == 4);
    CHECK(t.cached_prefix_blocks(toks) == std::vector<BlockId>{a, b});
    const SeqId s = t.create_sequence_with_prefix(toks);
    CHECK(t.n_tokens(s) == 4);
    CHECK(t.block_ids(s) == std::vector<BlockId>{a, b});
    CHECK(t.n_evictable_blocks() == 0);
    t.free_sequence(s);
    CHECK(t.n_evictable_blocks() == 2);
    // Only free blocks are used: with the other two taken, nothing more is imported.
    const SeqId u = t.create_sequence();
    REQUIRE(t.append(u, std::vector<TokenId>{1, 2, 3, 4}));
    const std::vector<TokenId> other = {40, 41};
    CHECK(t.import_cached_block(0, other) == -1);
    CHECK_THROWS_AS(t.import_cached_block(0, std::vector<TokenId>{1}), Error);
}

TEST_CASE("import_cached_block with a window pool gives partners while free ones last") {
    // Blocks of 2, a window of 2 tokens (the rollback margin becomes one block), three window
    // blocks: the first three imported blocks get partners, the fourth none; adoption stops
    // where the last window's partner is missing.
    KvBlockTable t(8, 2, 0, KvWindowPool{3, 2, 0});
    const std::vector<TokenId> toks = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    uint64_t parent = 0;
    std::vector<BlockId> ids;
    for (int i = 0; i < 4; ++i) {
        const auto chunk = std::span(toks).subspan(size_t(2 * i), 2);
        ids.push_back(t.import_cached_block(parent, chunk, true));
        parent = KvBlockTable::hash_block(parent, chunk);
    }
    REQUIRE(ids[3] >= 0);
    for (int i = 0; i < 3; ++i) CHECK(t.window_of(ids[size_t(i)]) >= 0);
    CHECK(t.window_of(ids[3]) == -1);
    CHECK(t.n_available_window() == 3);  // evictable blocks' partners can still be taken
    const std::vector<TokenId> other = {1, 2};
    const BlockId plain = t.import_cached_block(0, other);  // without window: no partner
    CHECK(t.window_of(plain) == -1);
    const SeqId s = t.create_sequence_with_prefix(toks);
    CHECK(t.n_tokens(s) == 6);  // block 3 lacks the windowed layers its next query needs
    // Its next query and the margin reach back to block 1: block 0's partner is freed.
    CHECK(t.window_of(ids[0]) == -1);
    CHECK(t.window_of(ids[1]) >= 0);
    CHECK(t.window_of(ids[2]) >= 0);
    CHECK(t.stats().window_in_use == 2);
    // Without a window pool the flag changes nothing.
    KvBlockTable u(4, 2);
    CHECK(u.window_of(u.import_cached_block(0, other, true)) == -1);
}

TEST_CASE("a saved prompt cache gives a fresh engine the same tokens from fewer computed") {
    auto m = load("stories260K.gguf");
    if (!m) return;
    for (KvType kv : {KvType::F16, KvType::Q8}) {
        CAPTURE(std::string(kv_type_name(kv)));
        TempDir dir;
        const std::string path = dir.file("p.cache");
        const std::vector<TokenId> prompt = story(*m->tok);
        REQUIRE(prompt.size() > 48);
        const int64_t full = int64_t(prompt.size()) / 16;

        Run first(*m, kv);
        const GenerationResult want = first.generate(prompt);
        CHECK(want.timings.n_prompt_computed == int32_t(prompt.size()));
        CHECK(prompt_cache_save(path, first.key, first.engine->kv_table(), *first.backend,
                                {prompt}) == full);

        Run second(*m, kv);
        const PromptCacheLoad l = prompt_cache_load(path, second.key, second.engine->kv_table(),
                                                    *second.backend, m->tok->n_vocab());
        CHECK(l.found);
        CHECK(l.ignored.empty());
        CHECK(l.blocks_in_file == full);
        CHECK(l.blocks_loaded == full);
        const GenerationResult got = second.generate(prompt);
        CHECK(got.tokens == want.tokens);
        CHECK(got.timings.n_prompt_computed == int32_t(prompt.size() - full * 16));

        // A prompt that shares only the first blocks adopts those.
        Run third(*m, kv);
        prompt_cache_load(path, third.key, third.engine->kv_table(), *third.backend,
                          m->tok->n_vocab());
        std::vector<TokenId> shorter(prompt.begin(), prompt.begin() + 20);
        shorter.push_back(prompt[40]);
        const GenerationResult part = third.generate(shorter, 4);
        CHECK(part.timings.n_prompt_computed == int32_t(shorter.size()) - 16);
        Run plain(*m, kv);
        CHECK(plain.generate(shorter, 4).tokens == part.tokens);
    }
}

TEST_CASE("prompt cache: small pools, --prompt-cache-all, and files that do not apply") {
    auto m = load("stories260K.gguf");
    if (!m) return;
    TempDir dir;
    const std::string path = dir.file("p.cache");
    const std::vector<TokenId> prompt = story(*m->tok);
    const int64_t full = int64_t(prompt.size()) / 16;
    Run first(*m, KvType::F16);
    const GenerationResult r = first.generate(prompt, 60);
    // With the generated tokens: more blocks.
    std::vector<TokenId> all = prompt;
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    const int64_t n_all =
        prompt_cache_save(path, first.key, first.engine->kv_table(), *first.backend, {prompt, all});
    CHECK(n_all == int64_t(all.size()) / 16);
    CHECK(n_all > full);

    // A pool with room for two blocks loads the first two (a usable prefix).
    {
        Run small(*m, KvType::F16, 2);
        const PromptCacheLoad l = prompt_cache_load(path, small.key, small.engine->kv_table(),
                                                    *small.backend, m->tok->n_vocab());
        CHECK(l.blocks_in_file == n_all);
        CHECK(l.blocks_loaded == 2);
        CHECK(small.engine->kv_table().match_prefix(prompt) == 32);
    }
    // Another KV format, another model: ignored with the reason, the table untouched.
    {
        Run q8(*m, KvType::Q8);
        const PromptCacheLoad l =
            prompt_cache_load(path, q8.key, q8.engine->kv_table(), *q8.backend, m->tok->n_vocab());
        CHECK(l.found);
        CHECK(l.ignored.find("another KV cache") != std::string::npos);
        CHECK(l.blocks_loaded == 0);
        CHECK(q8.engine->kv_table().n_evictable_blocks() == 0);
    }
    if (auto other = load("stories260K-Q8_0.gguf")) {
        Run o(*other, KvType::F16);
        const PromptCacheLoad l =
            prompt_cache_load(path, o.key, o.engine->kv_table(), *o.backend, other->tok->n_vocab());
        CHECK(l.ignored.find("another model") != std::string::npos);
    }
    // Missing: nothing to do.
    {
        Run fresh(*m, KvType::F16);
        CHECK_FALSE(prompt_cache_load(dir.file("none"), fresh.key, fresh.engine->kv_table(),
                                      *fresh.backend, m->tok->n_vocab())
                        .found);
        // Token ids outside the vocabulary (a smaller one than the file's) are refused.
        CHECK_THROWS_WITH_AS(
            prompt_cache_load(path, fresh.key, fresh.engine->kv_table(), *fresh.backend, 3),
            doctest::Contains("outside the vocabulary"), Error);
        CHECK(fresh.engine->kv_table().n_evictable_blocks() == 0);
    }
    // Truncated, flipped byte, not a cache: one clear Error each, nothing loaded.
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto refused = [&](const std::string& content, const char* needle) {
        const std::string bad = dir.write("bad.cache", content);
        Run fresh(*m, KvType::F16);
        CHECK_THROWS_WITH_AS(prompt_cache_load(bad, fresh.key, fresh.engine->kv_table(),
                                               *fresh.backend, m->tok->n_vocab()),
                             doctest::Contains(needle), Error);
        CHECK(fresh.engine->kv_table().n_evictable_blocks() == 0);
    };
    refused(bytes.substr(0, bytes.size() - 1), "truncated or corrupt");
    refused(bytes + "x", "truncated or corrupt");  // bytes after the checksum
    refused(bytes.substr(0, 30), "truncated");
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x10;
    refused(flipped, "checksum mismatch");
    refused("hello", "not a kvrun prompt cache");
    // An unwritable destination is an Error, and no temporary file is left behind.
    CHECK_THROWS_AS(prompt_cache_save(dir.file("no/such/dir/p.cache"), first.key,
                                      first.engine->kv_table(), *first.backend, {prompt}),
                    Error);
}
