// Tests for KvBlockTable: allocation, copy-on-write, truncation, prefix caching with LRU
// eviction, atomic out-of-blocks failures, and a randomized run checked against a naive model.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "common.h"
#include "kv_block_table.h"

using kvrun::BlockCopy;
using kvrun::BlockId;
using kvrun::KvAppendResult;
using kvrun::KvBlockStats;
using kvrun::KvBlockTable;
using kvrun::SeqId;
using kvrun::TokenId;

namespace {

std::vector<TokenId> iota_tokens(int n, TokenId start = 100) {
    std::vector<TokenId> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), start);
    return v;
}

// Everything observable about one sequence plus the pool counters.
struct Snapshot {
    std::vector<BlockId> blocks;
    std::vector<TokenId> tokens;
    int32_t free = 0, used = 0, evictable = 0;
    std::vector<int32_t> refcounts;
    bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const KvBlockTable& t, SeqId seq) {
    Snapshot s{t.block_ids(seq),  t.tokens(seq),          t.n_free_blocks(),
               t.n_used_blocks(), t.n_evictable_blocks(), {}};
    for (BlockId b = 0; b < t.n_blocks(); ++b) s.refcounts.push_back(t.refcount(b));
    return s;
}

}  // namespace

TEST_CASE("kv table: constructor validates sizes") {
    CHECK_THROWS_AS(KvBlockTable(8, 0), kvrun::Error);
    CHECK_THROWS_AS(KvBlockTable(8, 257), kvrun::Error);
    CHECK_THROWS_AS(KvBlockTable(0, 16), kvrun::Error);
    CHECK_THROWS_AS(KvBlockTable(-3, 16), kvrun::Error);
    KvBlockTable t(8, 16);
    CHECK(t.n_free_blocks() == 8);
    CHECK(t.n_used_blocks() == 0);
    CHECK(t.block_size() == 16);
}

TEST_CASE("kv table: append allocates blocks on demand at exact boundaries") {
    KvBlockTable t(10, 4);
    SeqId s = t.create_sequence();
    auto toks = iota_tokens(9);
    REQUIRE(t.append(s, 4, toks.data()));
    CHECK(t.block_ids(s).size() == 1);
    CHECK(t.n_used_blocks() == 1);
    REQUIRE(t.append(s, 1, toks.data() + 4));
    CHECK(t.block_ids(s).size() == 2);
    REQUIRE(t.append(s, 3, toks.data() + 5));
    CHECK(t.block_ids(s).size() == 2);  // exactly 8 tokens = 2 blocks
    REQUIRE(t.append(s, 1, toks.data() + 8));
    CHECK(t.block_ids(s).size() == 3);
    CHECK(t.n_tokens(s) == 9);
    CHECK(t.tokens(s) == toks);
    CHECK(t.n_free_blocks() == 7);
    CHECK(t.slot(s, 5).block == t.block_ids(s)[1]);
    CHECK(t.slot(s, 5).row == 1);
    CHECK_THROWS_AS(t.slot(s, 9), kvrun::Error);
    CHECK(t.append(s, 0, nullptr));
    CHECK_THROWS_AS((void)t.append(s, 2, nullptr), kvrun::Error);
    CHECK_THROWS_AS((void)t.append(s, -1, toks.data()), kvrun::Error);
    CHECK_THROWS_AS((void)t.append(12345, 1, toks.data()), kvrun::Error);
    // Distinct blocks, each referenced once.
    auto ids = t.block_ids(s);
    std::sort(ids.begin(), ids.end());
    CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
    for (BlockId b : ids) CHECK(t.refcount(b) == 1);
    t.free_sequence(s);
    CHECK(t.n_free_blocks() + t.n_evictable_blocks() == 10);
    CHECK(t.n_used_blocks() == 0);
    CHECK_THROWS_AS(t.free_sequence(s), kvrun::Error);
}

TEST_CASE("kv table: block size 1 and 256") {
    KvBlockTable one(5, 1);
    SeqId a = one.create_sequence();
    auto toks = iota_tokens(5);
    REQUIRE(one.append(a, 5, toks.data()));
    CHECK(one.block_ids(a).size() == 5);
    CHECK(one.n_free_blocks() == 0);
    CHECK_FALSE(one.append(a, 1, toks.data()));
    SeqId b = one.fork(a);
    one.truncate(b, 2);
    CHECK(one.n_used_blocks() == 5);
    CHECK(one.refcount(one.block_ids(a)[0]) == 2);
    CHECK(one.refcount(one.block_ids(a)[4]) == 1);

    KvBlockTable big(3, 256);
    SeqId c = big.create_sequence();
    auto many = iota_tokens(513);
    REQUIRE(big.append(c, 256, many.data()));
    CHECK(big.block_ids(c).size() == 1);
    REQUIRE(big.append(c, 257, many.data() + 256));
    CHECK(big.block_ids(c).size() == 3);
    CHECK(big.slot(c, 512).row == 0);
    CHECK(big.slot(c, 511).row == 255);
    CHECK(big.match_prefix(many) == 512);
}

TEST_CASE("kv table: truncate releases blocks, truncate to 0 frees everything") {
    KvBlockTable t(8, 4);
    SeqId s = t.create_sequence();
    auto toks = iota_tokens(14);
    REQUIRE(t.append(s, toks));
    CHECK(t.n_used_blocks() == 4);
    t.truncate(s, 8);
    CHECK(t.block_ids(s).size() == 2);
    CHECK(t.n_used_blocks() == 2);
    t.truncate(s, 7);
    CHECK(t.block_ids(s).size() == 2);
    CHECK(t.tokens(s) == std::vector<TokenId>(toks.begin(), toks.begin() + 7));
    CHECK_THROWS_AS(t.truncate(s, 8), kvrun::Error);
    CHECK_THROWS_AS(t.truncate(s, -1), kvrun::Error);
    t.truncate(s, 0);
    CHECK(t.block_ids(s).empty());
    CHECK(t.n_tokens(s) == 0);
    CHECK(t.n_used_blocks() == 0);
    CHECK(t.n_free_blocks() + t.n_evictable_blocks() == 8);
    REQUIRE(t.append(s, 3, toks.data()));
    CHECK(t.block_ids(s).size() == 1);
}

TEST_CASE("kv table: fork shares blocks; append into shared partial block copies once") {
    KvBlockTable t(8, 4);
    SeqId a = t.create_sequence();
    auto toks = iota_tokens(6);
    REQUIRE(t.append(a, toks));
    SeqId b = t.fork(a);
    CHECK(t.block_ids(b) == t.block_ids(a));
    for (BlockId id : t.block_ids(a)) CHECK(t.refcount(id) == 2);
    CHECK(t.n_used_blocks() == 2);
    const BlockId shared_last = t.block_ids(a)[1];

    TokenId x = 7;
    REQUIRE(t.append(b, 1, &x));
    auto copies = t.take_pending_copies();
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].src == shared_last);
    CHECK(copies[0].dst == t.block_ids(b)[1]);
    CHECK(copies[0].n_rows == 2);
    CHECK(t.block_ids(b)[1] != shared_last);
    CHECK(t.block_ids(b)[0] == t.block_ids(a)[0]);
    CHECK(t.refcount(shared_last) == 1);
    CHECK(t.refcount(t.block_ids(b)[1]) == 1);
    CHECK(t.refcount(t.block_ids(a)[0]) == 2);
    CHECK(t.take_pending_copies().empty());

    // Now a owns its partial block alone: no further copy.
    REQUIRE(t.append(a, 1, &x));
    CHECK(t.take_pending_copies().empty());
    CHECK(t.block_ids(a)[1] == shared_last);

    // Forking at a block boundary never copies.
    SeqId c = t.create_sequence();
    auto four = iota_tokens(4);
    REQUIRE(t.append(c, four));
    SeqId d = t.fork(c);
    REQUIRE(t.append(d, 1, &x));
    CHECK(t.take_pending_copies().empty());
    CHECK(t.stats().copies == 1);
    CHECK_THROWS_AS(t.fork(999), kvrun::Error);
}

TEST_CASE("kv table: out of blocks is an error value and changes nothing") {
    KvBlockTable t(4, 4);
    SeqId a = t.create_sequence();
    auto toks = iota_tokens(20);
    REQUIRE(t.append(a, 10, toks.data()));  // 3 blocks
    Snapshot before = snapshot(t, a);
    auto r = t.append(a, 7, toks.data() + 10);  // needs 2 more, 1 available
    CHECK_FALSE(r);
    CHECK(r.n_blocks_needed == 2);
    CHECK(r.n_blocks_available == 1);
    CHECK(r.reason().find("out of KV blocks") != std::string::npos);
    CHECK(snapshot(t, a) == before);
    CHECK(t.append(a, 6, toks.data() + 10));  // exactly the last block

    // A copy-on-write that cannot get its block fails atomically too.
    KvBlockTable u(3, 4);
    SeqId p = u.create_sequence();
    REQUIRE(u.append(p, 6, toks.data()));  // 2 blocks, last partial
    SeqId q = u.fork(p);
    SeqId filler = u.create_sequence();
    REQUIRE(u.append(filler, 1, toks.data()));
    CHECK(u.n_available_blocks() == 0);
    Snapshot before_q = snapshot(u, q);
    CHECK(u.blocks_needed(q, 1) == 1);
    CHECK_FALSE(u.append(q, 1, toks.data()));
    CHECK(snapshot(u, q) == before_q);
    CHECK_FALSE(u.has_pending_copies());
    u.free_sequence(filler);
    CHECK(u.append(q, 1, toks.data()));
    CHECK(u.take_pending_copies().size() == 1);
}

TEST_CASE("kv table: prefix cache shares full blocks and survives the owner") {
    KvBlockTable t(16, 4);
    auto prompt = iota_tokens(14);
    SeqId a = t.create_sequence();
    REQUIRE(t.append(a, prompt));
    CHECK(t.match_prefix(prompt) == 12);
    CHECK(t.match_prefix(std::span(prompt).first(11)) == 8);
    auto other = prompt;
    other[5] = 9999;
    CHECK(t.match_prefix(other) == 4);
    CHECK(t.match_prefix({}) == 0);

    SeqId b = t.create_sequence_with_prefix(prompt);
    CHECK(t.n_tokens(b) == 12);
    CHECK(t.tokens(b) == std::vector<TokenId>(prompt.begin(), prompt.begin() + 12));
    for (int i = 0; i < 3; ++i) {
        CHECK(t.block_ids(b)[i] == t.block_ids(a)[i]);
        CHECK(t.refcount(t.block_ids(a)[i]) == 2);
    }
    CHECK(t.stats().prefix_hit_tokens == 12);
    CHECK_THROWS_AS(t.adopt_prefix(b, prompt), kvrun::Error);  // not empty

    auto a_blocks = t.block_ids(a);
    t.free_sequence(a);
    t.free_sequence(b);
    CHECK(t.n_used_blocks() == 0);
    CHECK(t.n_evictable_blocks() == 3);  // the partial 4th block was never cached
    CHECK(t.n_free_blocks() == 13);
    CHECK(t.match_prefix(prompt) == 12);

    SeqId c = t.create_sequence();
    CHECK(t.adopt_prefix(c, prompt) == 12);
    CHECK(t.n_evictable_blocks() == 0);
    CHECK(t.n_used_blocks() == 3);
    for (int i = 0; i < 3; ++i) CHECK(t.block_ids(c)[i] == a_blocks[i]);

    // The same block tokens after a different parent are not a match.
    auto shifted = prompt;
    std::rotate(shifted.begin(), shifted.begin() + 4, shifted.begin() + 8);
    CHECK(t.match_prefix(shifted) == 0);
}

TEST_CASE("kv table: evictable blocks are reused only when no free block remains, LRU first") {
    KvBlockTable t(6, 2);
    auto p1 = iota_tokens(4, 10);
    auto p2 = iota_tokens(4, 50);
    SeqId a = t.create_sequence();
    REQUIRE(t.append(a, p1));
    SeqId b = t.create_sequence();
    REQUIRE(t.append(b, p2));
    auto a_blocks = t.block_ids(a);
    auto b_blocks = t.block_ids(b);
    t.free_sequence(a);  // released first: least recently used
    t.free_sequence(b);
    CHECK(t.n_evictable_blocks() == 4);
    CHECK(t.n_free_blocks() == 2);

    SeqId c = t.create_sequence();
    auto fresh = iota_tokens(4, 900);
    REQUIRE(t.append(c, fresh));  // two free blocks: no eviction
    CHECK(t.n_evictable_blocks() == 4);
    CHECK(t.match_prefix(p1) == 4);

    TokenId x = 1;
    REQUIRE(t.append(c, 1, &x));  // evicts a's tail block first
    CHECK(t.block_ids(c).back() == a_blocks[1]);
    CHECK_FALSE(t.is_cached(a_blocks[1]));
    CHECK(t.match_prefix(p1) == 2);
    CHECK(t.match_prefix(p2) == 4);
    REQUIRE(t.append(c, 2, fresh.data()));  // then a's first block
    CHECK(t.block_ids(c).back() == a_blocks[0]);
    CHECK(t.match_prefix(p1) == 0);
    CHECK(t.match_prefix(p2) == 4);
    CHECK(t.n_evictable_blocks() == 2);
    CHECK(t.is_cached(b_blocks[0]));

    t.clear_cache();
    CHECK(t.n_evictable_blocks() == 0);
    CHECK(t.match_prefix(p2) == 0);
    CHECK(t.n_free_blocks() == 2);
}

TEST_CASE("kv table: truncating into a cached block then appending") {
    KvBlockTable t(8, 4);
    auto prompt = iota_tokens(8);
    SeqId a = t.create_sequence();
    REQUIRE(t.append(a, prompt));
    const BlockId second = t.block_ids(a)[1];

    // Sole owner: rolling back keeps the cache entry until the block is overwritten.
    t.truncate(a, 6);
    CHECK(t.match_prefix(prompt) == 8);
    SeqId b = t.create_sequence_with_prefix(prompt);
    CHECK(t.refcount(second) == 2);
    TokenId x = 77;
    REQUIRE(t.append(a, 1, &x));  // shared now: copy-on-write of 2 rows
    auto copies = t.take_pending_copies();
    REQUIRE(copies.size() == 1);
    CHECK(copies[0] == BlockCopy{second, t.block_ids(a)[1], 2});
    CHECK(t.match_prefix(prompt) == 8);  // b's copy is intact
    t.free_sequence(b);

    // Sole owner of a cached block that it overwrites: entry dropped, no copy.
    SeqId c = t.create_sequence_with_prefix(prompt);
    t.truncate(c, 5);
    REQUIRE(t.append(c, 1, &x));
    CHECK(t.take_pending_copies().empty());
    CHECK(t.block_ids(c)[1] == second);
    CHECK_FALSE(t.is_cached(second));
    CHECK(t.match_prefix(prompt) == 4);
}

TEST_CASE("kv table: stats report waste and peak") {
    KvBlockTable t(10, 4);
    SeqId a = t.create_sequence();
    auto toks = iota_tokens(9);
    REQUIRE(t.append(a, toks));
    auto st = t.stats();
    CHECK(st.used_blocks == 3);
    CHECK(st.unfilled_slots == 3);
    CHECK(st.waste_fraction() == doctest::Approx(3.0 / 12.0));
    SeqId b = t.fork(a);
    t.truncate(b, 5);
    st = t.stats();
    CHECK(st.used_blocks == 3);
    CHECK(st.unfilled_slots == 3);  // a still fills the shared block up to row 1
    CHECK(st.n_sequences == 2);
    t.free_sequence(a);
    st = t.stats();
    CHECK(st.used_blocks == 2);
    CHECK(st.unfilled_slots == 3);
    CHECK(st.peak_used_blocks == 3);
    CHECK(st.cached_blocks == 2);
    CHECK(st.evictable_blocks == 0);  // b still holds both cached blocks
    CHECK(st.free_blocks == 8);
    t.free_sequence(b);
    st = t.stats();
    CHECK(st.used_blocks == 0);
    CHECK(st.unfilled_slots == 0);
    CHECK(st.evictable_blocks == 2);
    CHECK(st.waste_fraction() == 0.0);
}

// ---- randomized run against a naive model ----

namespace {

struct Model {
    KvBlockTable table;
    int32_t bs;
    std::vector<std::vector<TokenId>> storage;  // [n_blocks][block_size] simulated K/V rows
    std::map<SeqId, std::vector<TokenId>> naive;
    std::map<SeqId, int> source;  // which prompt stream a sequence follows

    Model(int32_t n_blocks, int32_t block_size)
        : table(n_blocks, block_size),
          bs(block_size),
          storage(static_cast<size_t>(n_blocks), std::vector<TokenId>(block_size, -1)) {}

    void execute_copies() {
        for (const BlockCopy& c : table.take_pending_copies()) {
            REQUIRE(c.n_rows > 0);
            REQUIRE(c.n_rows < bs);
            REQUIRE(table.refcount(c.src) >= 1);
            REQUIRE(table.refcount(c.dst) == 1);
            std::copy_n(storage[c.src].begin(), c.n_rows, storage[c.dst].begin());
        }
    }

    void check() const {
        const int32_t nb = table.n_blocks();
        std::vector<int32_t> refs(static_cast<size_t>(nb), 0);
        for (const auto& [seq, toks] : naive) {
            REQUIRE(table.tokens(seq) == toks);
            const auto& ids = table.block_ids(seq);
            REQUIRE(ids.size() == (toks.size() + bs - 1) / bs);
            for (BlockId b : ids) ++refs[static_cast<size_t>(b)];
            // Read the sequence back through its block list from the simulated storage.
            std::vector<TokenId> read(toks.size());
            for (size_t i = 0; i < toks.size(); ++i) {
                read[i] = storage[static_cast<size_t>(ids[i / bs])][i % bs];
            }
            REQUIRE(read == toks);
        }
        int32_t used = 0, evictable = 0;
        for (BlockId b = 0; b < nb; ++b) {
            REQUIRE(table.refcount(b) == refs[static_cast<size_t>(b)]);
            if (refs[static_cast<size_t>(b)] > 0)
                ++used;
            else if (table.is_cached(b))
                ++evictable;
        }
        REQUIRE(table.n_used_blocks() == used);
        REQUIRE(table.n_evictable_blocks() == evictable);
        REQUIRE(table.n_free_blocks() + used + evictable == nb);
        REQUIRE(table.n_sequences() == static_cast<int32_t>(naive.size()));
    }
};

void run_random(int32_t n_blocks, int32_t bs, int n_ops, uint64_t seed) {
    CAPTURE(bs);
    Model m(n_blocks, bs);
    std::mt19937_64 rng(seed);
    auto rnd = [&](int lo, int hi) {  // inclusive
        return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
    };
    // A few long prompt streams so sequences share prefixes.
    std::vector<std::vector<TokenId>> prompts(4);
    for (auto& p : prompts) {
        p.resize(static_cast<size_t>(bs * 12));
        for (auto& t : p) t = rnd(0, 7);
    }
    int n_fail = 0, n_hits = 0;
    for (int op = 0; op < n_ops; ++op) {
        CAPTURE(op);
        const int kind = rnd(0, 99);
        std::vector<SeqId> live;
        for (const auto& [s, _] : m.naive) live.push_back(s);
        if (live.empty() || kind < 10) {
            const int src = rnd(-1, 3);
            SeqId s;
            if (src >= 0 && rnd(0, 1) == 0) {
                auto& p = prompts[static_cast<size_t>(src)];
                const int len = rnd(0, static_cast<int>(p.size()));
                std::span<const TokenId> want(p.data(), static_cast<size_t>(len));
                const int32_t expect = m.table.match_prefix(want);
                REQUIRE(expect % bs == 0);
                REQUIRE(expect <= len);
                s = m.table.create_sequence_with_prefix(want);
                REQUIRE(m.table.n_tokens(s) == expect);
                n_hits += expect > 0;
                m.naive[s] = std::vector<TokenId>(p.begin(), p.begin() + expect);
            } else {
                s = m.table.create_sequence();
                m.naive[s] = {};
            }
            m.source[s] = src;
        } else {
            const SeqId s = live[static_cast<size_t>(rnd(0, static_cast<int>(live.size()) - 1))];
            auto& toks = m.naive[s];
            if (kind < 55) {
                const int n = rnd(1, 3 * bs);
                std::vector<TokenId> add(static_cast<size_t>(n));
                const int src = m.source[s];
                const bool follow_prompt = src >= 0 && rnd(0, 3) != 0;
                for (int i = 0; i < n; ++i) {
                    const size_t pos = toks.size() + static_cast<size_t>(i);
                    const bool follow =
                        follow_prompt && pos < prompts[static_cast<size_t>(src)].size();
                    add[static_cast<size_t>(i)] =
                        follow ? prompts[static_cast<size_t>(src)][pos] : rnd(0, 7);
                }
                const Snapshot before = snapshot(m.table, s);
                const int32_t need = m.table.blocks_needed(s, n);
                auto r = m.table.append(s, add);
                if (!r) {
                    ++n_fail;
                    REQUIRE(need > m.table.n_available_blocks());
                    REQUIRE(snapshot(m.table, s) == before);
                    REQUIRE_FALSE(m.table.has_pending_copies());
                } else {
                    m.execute_copies();
                    for (int i = 0; i < n; ++i) {
                        auto sl = m.table.slot(s, static_cast<int32_t>(toks.size()) + i);
                        m.storage[static_cast<size_t>(sl.block)][static_cast<size_t>(sl.row)] =
                            add[static_cast<size_t>(i)];
                    }
                    toks.insert(toks.end(), add.begin(), add.end());
                }
            } else if (kind < 67) {
                const SeqId f = m.table.fork(s);
                m.naive[f] = toks;
                m.source[f] = m.source[s];
            } else if (kind < 85) {
                const int n = rnd(0, static_cast<int>(toks.size()));
                m.table.truncate(s, n);
                toks.resize(static_cast<size_t>(n));
            } else {
                m.table.free_sequence(s);
                m.naive.erase(s);
                m.source.erase(s);
            }
        }
        m.check();
    }
    MESSAGE("bs=" << bs << ": " << n_fail << " out-of-blocks, " << n_hits << " prefix hits, "
                  << m.table.stats().copies << " copies");
    CHECK(n_fail > 0);
    CHECK(n_hits > 0);
    if (bs > 1) CHECK(m.table.stats().copies > 0);  // block size 1 has no partial blocks
    for (const auto& [s, _] : m.naive) m.table.free_sequence(s);
    m.naive.clear();
    m.check();
    CHECK(m.table.n_used_blocks() == 0);
    CHECK(m.table.n_free_blocks() + m.table.n_evictable_blocks() == n_blocks);
    m.table.clear_cache();
    CHECK(m.table.n_free_blocks() == n_blocks);
}

}  // namespace

TEST_CASE("kv table: randomized operations match a naive model") {
    run_random(48, 1, 4000, 1);
    run_random(40, 4, 4000, 2);
    run_random(36, 16, 3000, 3);
    run_random(12, 256, 1500, 4);
}

namespace {

// A stand-in for K/V storage that executes what the table asks the way a backend does:
// copies (stage->stage, pool->stage), the pass's row writes into stages, and sealing a
// block into the pool when its last row is written. Each row holds its token id, so reads
// can be checked against the sequence.
struct StagedStorage {
    int32_t bs;
    std::vector<std::vector<TokenId>> pool;   // [n_blocks][bs]
    std::vector<std::vector<TokenId>> stage;  // [n_stages][bs]
    StagedStorage(int32_t n_blocks, int32_t n_stages, int32_t block_size)
        : bs(block_size),
          pool(size_t(n_blocks), std::vector<TokenId>(size_t(block_size), -1)),
          stage(size_t(n_stages), std::vector<TokenId>(size_t(block_size), -1)) {}

    void copy(const BlockCopy& c) {
        REQUIRE(c.dst_stage >= 0);
        for (int32_t r = 0; r < c.n_rows; ++r)
            stage[size_t(c.dst_stage)][size_t(r)] = c.src_stage >= 0
                                                        ? stage[size_t(c.src_stage)][size_t(r)]
                                                        : pool[size_t(c.src)][size_t(r)];
    }
    // One pass: positions [start, start + n) of seq were appended.
    void write(const KvBlockTable& t, SeqId seq, int32_t start, int32_t n) {
        for (int32_t p = start; p < start + n; ++p) {
            const int32_t st = t.stage_of_slot(seq, p);
            REQUIRE(st >= 0);
            stage[size_t(st)][size_t(p % bs)] = t.tokens(seq)[size_t(p)];
        }
        for (int32_t p = start; p < start + n; ++p)
            if (p % bs == bs - 1)
                pool[size_t(t.slot(seq, p).block)] = stage[size_t(t.stage_of_slot(seq, p))];
    }
    // What attention reads for position p: earlier blocks from the pool, its own block from
    // its stage. Every row must hold the sequence's token.
    bool reads_ok(const KvBlockTable& t, SeqId seq, int32_t p) const {
        const auto& toks = t.tokens(seq);
        const auto& blocks = t.block_ids(seq);
        for (int32_t q = 0; q < (p / bs) * bs; ++q)
            if (pool[size_t(blocks[size_t(q / bs)])][size_t(q % bs)] != toks[size_t(q)])
                return false;
        const int32_t st = t.stage_of_slot(seq, p);
        if (st < 0) return false;
        for (int32_t q = (p / bs) * bs; q <= p; ++q)
            if (stage[size_t(st)][size_t(q % bs)] != toks[size_t(q)]) return false;
        return true;
    }
};

void run_random_staged(int32_t n_blocks, int32_t bs, int32_t n_stages, int n_ops, uint32_t seed) {
    CAPTURE(bs);
    CAPTURE(n_stages);
    KvBlockTable t(n_blocks, bs, n_stages);
    StagedStorage store(n_blocks, n_stages, bs);
    std::mt19937 rng(seed);
    auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<SeqId> seqs;
    int n_appends = 0, n_fail = 0, n_restages = 0, n_adopted = 0;
    for (int op = 0; op < n_ops; ++op) {
        const int kind = seqs.empty() ? 0 : rnd(0, 9);
        if (kind == 0 && seqs.size() < 6) {
            // New sequence, often with a prefix other sequences hold (tokens from a tiny
            // alphabet so prefixes repeat).
            std::vector<TokenId> want(size_t(rnd(0, 3 * bs)));
            for (auto& x : want) x = rnd(0, 1);
            seqs.push_back(t.create_sequence_with_prefix(want));
            n_adopted += t.n_tokens(seqs.back()) > 0;
        } else if (kind == 1 && seqs.size() < 6) {
            seqs.push_back(t.fork(seqs[size_t(rnd(0, int(seqs.size()) - 1))]));
        } else if (kind == 2) {
            const size_t i = size_t(rnd(0, int(seqs.size()) - 1));
            t.free_sequence(seqs[i]);
            seqs.erase(seqs.begin() + int64_t(i));
        } else if (kind == 3) {
            // Roll back (speculative rejection, chat truncation), often across blocks.
            const SeqId s = seqs[size_t(rnd(0, int(seqs.size()) - 1))];
            t.truncate(s, rnd(0, t.n_tokens(s)));
        } else {
            // One pass: 1-3 sequences append 1..2*bs tokens each.
            std::vector<std::pair<SeqId, int32_t>> parts;  // (seq, start)
            std::vector<int32_t> lens;
            const int n_parts = rnd(1, std::min<int>(3, int(seqs.size())));
            for (int k = 0; k < n_parts; ++k) {
                const SeqId s = seqs[size_t(rnd(0, int(seqs.size()) - 1))];
                bool dup = false;
                for (auto& p : parts) dup |= p.first == s;
                if (dup) continue;
                std::vector<TokenId> toks(size_t(rnd(1, 2 * bs)));
                for (auto& x : toks) x = rnd(0, 1);
                const int32_t start = t.n_tokens(s);
                const int32_t need_stages = t.stages_needed(s, int32_t(toks.size()));
                KvAppendResult r = t.append(s, toks);
                if (!r) {
                    ++n_fail;
                    CHECK(t.n_tokens(s) == start);  // atomic
                    continue;
                }
                CHECK(r.n_stages_needed == need_stages);
                parts.push_back({s, start});
                lens.push_back(int32_t(toks.size()));
            }
            for (const BlockCopy& c : t.take_pending_copies()) {
                n_restages += c.src_stage < 0;
                store.copy(c);
            }
            for (size_t k = 0; k < parts.size(); ++k)
                store.write(t, parts[k].first, parts[k].second, lens[k]);
            for (size_t k = 0; k < parts.size(); ++k) {
                ++n_appends;
                for (int32_t p = parts[k].second; p < parts[k].second + lens[k]; ++p)
                    if (!store.reads_ok(t, parts[k].first, p)) {
                        FAIL("position " << p << " of sequence " << parts[k].first
                                         << " reads the wrong rows");
                    }
            }
        }
        // Every full block of every sequence is sealed in the pool.
        for (SeqId s : seqs) {
            const auto& toks = t.tokens(s);
            const auto& blocks = t.block_ids(s);
            for (size_t q = 0; q < toks.size() / size_t(bs) * size_t(bs); ++q)
                if (store.pool[size_t(blocks[q / size_t(bs)])][q % size_t(bs)] != toks[q])
                    FAIL("full block of sequence " << s << " is not sealed");
        }
        KvBlockStats st = t.stats();
        CHECK(st.stages_in_use <= n_stages);
    }
    CHECK(n_appends > n_ops / 4);
    if (bs > 1 && bs <= 4) CHECK(n_adopted > 0);  // random 16-token blocks rarely repeat
    MESSAGE("staged run bs " << bs << ": " << n_appends << " appends, " << n_fail << " refused, "
                             << n_restages << " stage restores from the pool");
    for (SeqId s : seqs) t.free_sequence(s);
    CHECK(t.n_used_blocks() == 0);
    CHECK(t.stats().stages_in_use == 0);
}

}  // namespace

TEST_CASE("kv table: staging for quantized storage, randomized against a simulated backend") {
    run_random_staged(40, 4, 8, 3000, 11);
    run_random_staged(40, 4, 24, 3000, 12);
    run_random_staged(24, 16, 6, 2000, 13);
    run_random_staged(64, 1, 10, 2000, 14);
    run_random_staged(30, 3, 5, 3000, 15);
}

TEST_CASE("kv table: stage slots run out like blocks and are reclaimed from sealed blocks") {
    KvBlockTable t(16, 4, 3);
    SeqId a = t.create_sequence();
    // 10 tokens: 3 blocks, 3 stages: all slots taken in this pass.
    CHECK(t.append(a, iota_tokens(10)));
    CHECK(t.stats().stages_in_use == 3);
    SeqId b = t.create_sequence();
    // Same pass (no take_pending_copies yet): the sealed blocks' stages are protected.
    KvAppendResult r = t.append(b, iota_tokens(2, 500));
    CHECK_FALSE(r);
    CHECK(r.n_stages_needed == 1);
    CHECK(r.n_stages_available == 0);
    CHECK(r.reason().find("stage") != std::string::npos);
    CHECK(t.take_pending_copies().empty());
    // Next pass: the two sealed blocks' stages can be reclaimed (oldest first).
    CHECK(t.n_available_stages() == 2);
    CHECK(t.append(b, iota_tokens(2, 500)));
    CHECK(t.stage_of(t.block_ids(a)[2]) >= 0);  // a's partial block keeps its stage
    // Rolling a back into its first (sealed, stage reclaimed) block: the next append restores
    // the kept rows from the pool into a stage.
    t.truncate(a, 3);
    (void)t.take_pending_copies();
    CHECK(t.append(a, iota_tokens(1, 900)));
    auto copies = t.take_pending_copies();
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].src == t.block_ids(a)[0]);
    CHECK(copies[0].dst == copies[0].src);
    CHECK(copies[0].src_stage == -1);
    CHECK(copies[0].dst_stage == t.stage_of(t.block_ids(a)[0]));
    CHECK(copies[0].n_rows == 3);
}

namespace {

// Storage for a table with a window pool, executed the way a backend does: the global layers
// live in `pool` (main block ids), the windowed layers in `wpool` (window partner ids). With
// staging, each kind of layer has its own f16 stage rows (stage, wstage). Each row holds its
// token id, so reads can be checked against the sequence.
struct WindowedStorage {
    int32_t bs, window;
    bool staged;
    std::vector<std::vector<TokenId>> pool, wpool, stage, wstage;
    WindowedStorage(int32_t n_blocks, int32_t n_window, int32_t n_stages, int32_t block_size,
                    int32_t win)
        : bs(block_size),
          window(win),
          staged(n_stages > 0),
          pool(size_t(n_blocks), std::vector<TokenId>(size_t(block_size), -1)),
          wpool(size_t(n_window), std::vector<TokenId>(size_t(block_size), -1)),
          stage(size_t(n_stages), std::vector<TokenId>(size_t(block_size), -1)),
          wstage(size_t(n_stages), std::vector<TokenId>(size_t(block_size), -1)) {}

    void copy(const BlockCopy& c) {
        REQUIRE(c.wsrc >= 0);
        REQUIRE(c.wdst >= 0);
        for (int32_t r = 0; r < c.n_rows; ++r) {
            const size_t i = size_t(r);
            if (!staged) {
                pool[size_t(c.dst)][i] = pool[size_t(c.src)][i];
                wpool[size_t(c.wdst)][i] = wpool[size_t(c.wsrc)][i];
            } else if (c.src_stage >= 0) {
                stage[size_t(c.dst_stage)][i] = stage[size_t(c.src_stage)][i];
                wstage[size_t(c.dst_stage)][i] = wstage[size_t(c.src_stage)][i];
            } else {
                stage[size_t(c.dst_stage)][i] = pool[size_t(c.src)][i];
                wstage[size_t(c.dst_stage)][i] = wpool[size_t(c.wsrc)][i];
            }
        }
    }
    void write(const KvBlockTable& t, SeqId seq, int32_t start, int32_t n) {
        const auto w = t.window_ids(seq);
        for (int32_t p = start; p < start + n; ++p) {
            const TokenId tok = t.tokens(seq)[size_t(p)];
            const size_t r = size_t(p % bs);
            const size_t blk = size_t(p / bs);
            REQUIRE(w[blk] >= 0);
            if (staged) {
                const int32_t st = t.stage_of_slot(seq, p);
                REQUIRE(st >= 0);
                stage[size_t(st)][r] = tok;
                wstage[size_t(st)][r] = tok;
            } else {
                pool[size_t(t.slot(seq, p).block)][r] = tok;
                wpool[size_t(w[blk])][r] = tok;
            }
        }
        if (staged)
            for (int32_t p = start; p < start + n; ++p)
                if (p % bs == bs - 1) {
                    const size_t st = size_t(t.stage_of_slot(seq, p));
                    pool[size_t(t.slot(seq, p).block)] = stage[st];
                    wpool[size_t(w[size_t(p / bs)])] = wstage[st];
                }
    }
    // What position p's attention reads: every earlier row of the global layers, and the
    // last `window` rows of the windowed ones (its own block from the stage when staged).
    bool reads_ok(const KvBlockTable& t, SeqId seq, int32_t p) const {
        const auto& toks = t.tokens(seq);
        const auto& blocks = t.block_ids(seq);
        const auto w = t.window_ids(seq);
        const int32_t own = staged ? (p / bs) * bs : p + 1;
        for (int32_t q = 0; q < own; ++q)
            if (pool[size_t(blocks[size_t(q / bs)])][size_t(q % bs)] != toks[size_t(q)])
                return false;
        for (int32_t q = std::max(0, p - window + 1); q < own; ++q) {
            const BlockId wb = w[size_t(q / bs)];
            if (wb < 0 || wpool[size_t(wb)][size_t(q % bs)] != toks[size_t(q)]) return false;
        }
        if (staged) {
            const int32_t st = t.stage_of_slot(seq, p);
            if (st < 0) return false;
            for (int32_t q = own; q <= p; ++q)
                if (stage[size_t(st)][size_t(q % bs)] != toks[size_t(q)] ||
                    (q > p - window && wstage[size_t(st)][size_t(q % bs)] != toks[size_t(q)]))
                    return false;
        }
        return true;
    }
};

struct WindowRun {
    int32_t n_blocks, n_window, bs, n_stages, window, margin;
};

void run_random_windowed(WindowRun cfg, int n_ops, uint32_t seed) {
    CAPTURE(cfg.bs);
    CAPTURE(cfg.n_stages);
    CAPTURE(cfg.window);
    KvBlockTable t(cfg.n_blocks, cfg.bs, cfg.n_stages, {cfg.n_window, cfg.window, cfg.margin});
    REQUIRE(t.windowed());
    WindowedStorage store(cfg.n_blocks, cfg.n_window, cfg.n_stages, cfg.bs, cfg.window);
    std::mt19937 rng(seed);
    auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<SeqId> seqs;
    int n_appends = 0, n_fail = 0, n_adopted = 0, n_refused_rollbacks = 0, n_rollbacks = 0;
    int32_t longest = 0;
    for (int op = 0; op < n_ops; ++op) {
        const int kind = seqs.empty() ? 0 : rnd(0, 11);
        if (kind == 0 && seqs.size() < 5) {
            // Prompts from a tiny alphabet so that prefixes repeat, some past the window.
            std::vector<TokenId> want(size_t(rnd(0, 2 * cfg.window)));
            for (auto& x : want) x = rnd(0, 1);
            seqs.push_back(t.create_sequence_with_prefix(want));
            n_adopted += t.n_tokens(seqs.back()) > 0;
            // What the adopter's next query sees is there.
            const int32_t n = t.n_tokens(seqs.back());
            if (n > 0 && !store.staged)
                for (int32_t q = std::max(0, n - cfg.window + 1); q < n; ++q)
                    CHECK(t.window_ids(seqs.back())[size_t(q / cfg.bs)] >= 0);
        } else if (kind == 1 && seqs.size() < 5) {
            seqs.push_back(t.fork(seqs[size_t(rnd(0, int(seqs.size()) - 1))]));
        } else if (kind == 2) {
            const size_t i = size_t(rnd(0, int(seqs.size()) - 1));
            t.free_sequence(seqs[i]);
            seqs.erase(seqs.begin() + int64_t(i));
        } else if (kind == 3) {
            // Roll back: within the margin it must work; further it may be refused.
            const SeqId s = seqs[size_t(rnd(0, int(seqs.size()) - 1))];
            const int32_t n = t.n_tokens(s);
            const int32_t to = rnd(0, 1) ? std::max(0, n - rnd(0, cfg.margin)) : rnd(0, n);
            if (n - to <= cfg.margin) CHECK(t.can_truncate(s, to));
            if (t.can_truncate(s, to)) {
                t.truncate(s, to);
                ++n_rollbacks;
            } else {
                CHECK_THROWS_AS(t.truncate(s, to), kvrun::Error);
                CHECK(t.n_tokens(s) == n);  // refused: unchanged
                ++n_refused_rollbacks;
                CHECK(t.can_truncate(s, 0));
            }
        } else {
            // One pass: 1-3 sequences append 1..2*bs tokens each.
            std::vector<std::pair<SeqId, int32_t>> parts;
            std::vector<int32_t> lens;
            const int n_parts = rnd(1, std::min<int>(3, int(seqs.size())));
            for (int k = 0; k < n_parts; ++k) {
                const SeqId s = seqs[size_t(rnd(0, int(seqs.size()) - 1))];
                bool dup = false;
                for (auto& p : parts) dup |= p.first == s;
                if (dup) continue;
                std::vector<TokenId> toks(size_t(rnd(1, 2 * cfg.bs)));
                for (auto& x : toks) x = rnd(0, 1);
                const int32_t start = t.n_tokens(s);
                KvAppendResult r = t.append(s, toks);
                if (!r) {
                    ++n_fail;
                    CHECK(t.n_tokens(s) == start);
                    CHECK_FALSE(r.reason().empty());
                    continue;
                }
                parts.push_back({s, start});
                lens.push_back(int32_t(toks.size()));
            }
            for (const BlockCopy& c : t.take_pending_copies()) store.copy(c);
            for (size_t k = 0; k < parts.size(); ++k)
                store.write(t, parts[k].first, parts[k].second, lens[k]);
            for (size_t k = 0; k < parts.size(); ++k) {
                ++n_appends;
                for (int32_t p = parts[k].second; p < parts[k].second + lens[k]; ++p)
                    if (!store.reads_ok(t, parts[k].first, p))
                        FAIL("position " << p << " of sequence " << parts[k].first
                                         << " reads the wrong rows");
            }
        }
        // No window block is the partner of two blocks; the counters agree.
        std::vector<int> owners(size_t(cfg.n_window), 0);
        int32_t partners = 0;
        for (BlockId b = 0; b < cfg.n_blocks; ++b)
            if (t.window_of(b) >= 0) {
                ++owners[size_t(t.window_of(b))];
                ++partners;
            }
        for (int o : owners) CHECK(o <= 1);
        CHECK(t.stats().window_in_use == partners);
        for (SeqId s : seqs) longest = std::max(longest, t.n_tokens(s));
    }
    CHECK(n_appends > n_ops / 4);
    CHECK(n_rollbacks > 0);
    CHECK(longest > 2 * cfg.window);  // the window really slid
    MESSAGE("windowed run bs " << cfg.bs << ": " << n_appends << " appends, " << n_fail
                               << " refused, " << n_adopted << " prefix adoptions, "
                               << n_refused_rollbacks << " rollbacks refused, longest " << longest);
    for (SeqId s : seqs) t.free_sequence(s);
    CHECK(t.n_used_blocks() == 0);
    t.clear_cache();
    CHECK(t.stats().window_in_use == 0);
}

}  // namespace

TEST_CASE("kv table: window pool, randomized against a simulated backend") {
    // n_blocks, n_window, bs, n_stages, window, margin
    run_random_windowed({400, 40, 4, 0, 12, 4}, 4000, 21);
    run_random_windowed({400, 60, 2, 0, 7, 3}, 4000, 22);
    run_random_windowed({200, 24, 8, 0, 20, 8}, 3000, 23);
    run_random_windowed({400, 40, 4, 10, 12, 4}, 4000, 24);
    run_random_windowed({600, 90, 1, 0, 5, 2}, 3000, 25);
}

TEST_CASE("kv table: a long sequence holds only its window in the window pool") {
    // Window 32, margin 16, blocks of 4: the window pool needs ceil((32 + 16) / 4) + 2 = 14
    // blocks however long the sequence grows; the main pool holds all of it.
    KvBlockTable t(300, 4, 0, {14, 32, 16});
    SeqId a = t.create_sequence();
    int32_t peak = 0;
    for (int i = 0; i < 1000; ++i) {
        REQUIRE(t.append(a, iota_tokens(1, i)));
        (void)t.take_pending_copies();
        peak = std::max(peak, t.stats().window_in_use);
    }
    CHECK(t.n_used_blocks() == 250);
    CHECK(peak <= 14);
    CHECK(t.stats().window_peak == peak);
    const auto w = t.window_ids(a);
    CHECK(w.front() == -1);  // dropped
    CHECK(w.back() >= 0);
    // Rolling back by the margin works; far back it is refused, and 0 always works.
    CHECK(t.can_truncate(a, 1000 - 16));
    CHECK_FALSE(t.can_truncate(a, 500));
    CHECK_THROWS_AS(t.truncate(a, 500), kvrun::Error);
    CHECK(t.n_tokens(a) == 1000);
    t.truncate(a, 990);
    CHECK(t.append(a, iota_tokens(10, 7)));
    (void)t.take_pending_copies();

    // A prefill pass of 40 tokens needs partners for all of them at once: it fails cleanly
    // when the window pool is too small, and the pool is unchanged.
    KvBlockTable small(300, 4, 0, {8, 32, 16});
    SeqId b = small.create_sequence();
    KvAppendResult r = small.append(b, iota_tokens(40));
    CHECK_FALSE(r);
    CHECK(r.n_window_needed == 10);
    CHECK(r.n_window_available == 8);
    CHECK(r.reason().find("sliding-window") != std::string::npos);
    CHECK(small.n_tokens(b) == 0);
    CHECK(small.stats().window_in_use == 0);
}

TEST_CASE("kv table: a finished sequence's window survives for prefix reuse") {
    // Chat-like: a conversation is freed, then a longer prompt with the same start adopts
    // it whole, window included (its last blocks kept their partners).
    KvBlockTable t(100, 4, 0, {20, 8, 4});
    const auto conv = iota_tokens(50);
    SeqId a = t.create_sequence();
    REQUIRE(t.append(a, conv));
    (void)t.take_pending_copies();
    t.free_sequence(a);
    auto longer = conv;
    for (int i = 0; i < 9; ++i) longer.push_back(1000 + i);
    SeqId b = t.create_sequence_with_prefix(longer);
    CHECK(t.n_tokens(b) == 48);
    // Another sequence now needs the whole window pool: the evictable partners are taken
    // (the unused blocks lose theirs first), and a later adoption finds no window.
    t.free_sequence(b);
    SeqId c = t.create_sequence();
    REQUIRE(t.append(c, iota_tokens(80, 5000)));
    (void)t.take_pending_copies();
    CHECK(t.stats().window_in_use <= 20);
    SeqId d = t.create_sequence_with_prefix(longer);
    CHECK(t.n_tokens(d) == 0);
}

TEST_CASE("kv table: the window advances once per pass, never under the pass's own reads") {
    KvBlockTable t(100, 4, 0, {40, 8, 4});
    SeqId a = t.create_sequence();
    REQUIRE(t.append(a, iota_tokens(100)));
    (void)t.take_pending_copies();
    // One pass appends 40 tokens, then 1 more: the first of them (position 100) still reads
    // positions 93.. (block 23), whatever the second append would drop.
    REQUIRE(t.append(a, iota_tokens(40, 500)));
    REQUIRE(t.append(a, iota_tokens(1, 900)));
    const auto w = t.window_ids(a);
    for (size_t i = 23; i < w.size(); ++i) CHECK(w[i] >= 0);
    (void)t.take_pending_copies();
    // The next pass's first append drops what position 141 (minus the margin) cannot see.
    REQUIRE(t.append(a, iota_tokens(1, 901)));
    CHECK(t.window_of(t.block_ids(a)[23]) == -1);
    CHECK(t.window_of(t.block_ids(a)[32]) >= 0);
}
