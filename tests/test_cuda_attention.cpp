// CUDA paged attention vs cpu::paged_attention on random caches: decode batches (one token
// per sequence, contexts up to 2100 so split-K engages), prefill batches (several
// sequences interleaved, cached prefixes, a decode token mixed in), speculative-style
// verification; block sizes 1/16/64, GQA 1/4/8/12, head_dim 8..256 and DeepSeek's 576 (V
// reading K's rows), f16 and f32 pools, and
// the same scenarios on quantized (q8/q4, staged) caches; every instantiation of the decode
// kernel (query rows 1/2/4/8 x key-group lanes 4/8/16/32) and its long splits (large pools);
// the prefill batches through both prefill kernels (f32 tiles, and tensor-core flash tiles
// for head_dim 64/96/128 on f16 and quantized caches, within a looser bound).
// Decode tokens must give the same bits alone as in a batch of several sequences.
// Exits 77 (skipped) without a GPU (see cuda_test_util.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn_window.h"
#include "common.h"
#include "cpu_ops.h"
#include "cuda_test_util.h"
#include "kv_format.h"

#ifdef KVRUN_HAS_CUDA

using namespace kvrun;
using namespace kvrun::test;

namespace {

constexpr double kAttnBound = 1e-8;  // both sides read identical K/V and compute in f32
// The flash kernel rounds q and the softmax weights to f16 (and q8/q4 values decoded to f32
// on the CPU are rounded to f16 on the GPU) for its tensor-core products.
constexpr double kFlashBound = 1e-6;

struct AttnShape {
    int64_t block_size, n_kv_head, group, head_dim;
    KvType k_type, v_type;
    bool v_is_k = false;  // V reads K's rows (DeepSeek's latent cache): one pool, K's format
};

// A batch: sequence s holds history[s] cached slots; `tokens` are (seq, slot) pairs whose
// K/V are written (with the history) before attention runs.
struct Scenario {
    std::vector<int64_t> history;
    std::vector<std::pair<int32_t, int32_t>> tokens;
    // Blocks in the pool at least (the decode splits grow with the pool: above 128 Ki slots
    // each warp of a decode block walks several 32-key tiles).
    int64_t min_pool_blocks = 0;
    // Gemma's options for every call: soft cap (0: none) and sliding window (0: none).
    float softcap = 0.0f;
    int64_t window = 0;
    bool sinks = false;  // gpt-oss's attention sinks: one random logit per head
};

// Fraction of differing bytes (0 when equal).
double byte_mismatch(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    if (a.size() != b.size()) return 1.0;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return a.empty() ? 0.0 : double(n) / double(a.size());
}

void run_scenario(const AttnShape& sh, const Scenario& sc, uint32_t seed) {
    const int64_t n_seqs = int64_t(sc.history.size());
    const int64_t n_head = sh.n_kv_head * sh.group, hd = sh.head_dim, bs = sh.block_size;
    // Context length of each sequence: history plus the batch's slots.
    std::vector<int64_t> len(sc.history);
    for (auto [s, slot] : sc.tokens) len[s] = std::max<int64_t>(len[s], slot + 1);
    int64_t max_blocks = 1, total_blocks = 0;
    for (int64_t l : len) {
        max_blocks = std::max(max_blocks, (l + bs - 1) / bs);
        total_blocks += (l + bs - 1) / bs;
    }
    max_blocks += 1;  // a spare, unused column
    const int64_t n_blocks = std::max(total_blocks + 3, sc.min_pool_blocks);  // some unused
    std::mt19937 rng(seed);
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> table(static_cast<size_t>(n_seqs * max_blocks), -1);
    size_t next = 0;
    for (int64_t s = 0; s < n_seqs; ++s)
        for (int64_t b = 0; b < (len[s] + bs - 1) / bs; ++b)
            table[size_t(s * max_blocks + b)] = perm[next++];

    // Every cached slot (history and batch) gets random K/V, written on both sides.
    std::vector<int32_t> w_seq, w_slot;
    for (int64_t s = 0; s < n_seqs; ++s)
        for (int64_t j = 0; j < sc.history[s]; ++j)
            w_seq.push_back(int32_t(s)), w_slot.push_back(int32_t(j));
    for (auto [s, slot] : sc.tokens) w_seq.push_back(s), w_slot.push_back(slot);
    const int64_t nw = int64_t(w_seq.size());
    const std::vector<float> k =
        random_floats(static_cast<size_t>(nw * sh.n_kv_head * hd), seed + 1);
    const std::vector<float> v =
        random_floats(static_cast<size_t>(nw * sh.n_kv_head * hd), seed + 2);

    // Quantized caches are staged; here every block has a stage slot of its own (stage id =
    // block id), so a token's own block is read from its stage and every other block from
    // the pool, which holds it sealed when its last row was written.
    const bool staged = kv_type_quantized(sh.k_type) || kv_type_quantized(sh.v_type);
    const int64_t n_stages = staged ? n_blocks : 0;
    auto stages_of = [&](const std::vector<int32_t>& seqs, const std::vector<int32_t>& slots) {
        std::vector<int32_t> st;
        for (size_t i = 0; i < seqs.size(); ++i)
            st.push_back(table[size_t(seqs[i] * max_blocks + slots[i] / bs)]);
        return st;
    };
    const std::vector<int32_t> w_stage = stages_of(w_seq, w_slot);
    std::vector<uint8_t> hk(
        size_t(n_blocks * sh.n_kv_head * kv_head_block_bytes(sh.k_type, KvRole::K, bs, hd)), 0);
    std::vector<uint8_t> hv(
        size_t(n_blocks * sh.n_kv_head * kv_head_block_bytes(sh.v_type, KvRole::V, bs, hd)), 0);
    std::vector<uint8_t> hks(size_t(n_stages * sh.n_kv_head * bs * hd * 2), 0), hvs(hks.size(), 0);
    KvLayerView hkv{sh.k_type, sh.v_type, hk.data(),  hv.data(),  n_blocks, sh.n_kv_head,
                    bs,        hd,        hks.data(), hvs.data(), n_stages};
    if (sh.v_is_k) {
        REQUIRE(sh.k_type == sh.v_type);
        hkv.v = hkv.k, hkv.v_stage = hkv.k_stage, hkv.v_is_k = true;
    }
    cpu::kv_write(hkv,
                  KvBatchView{w_seq.data(), w_slot.data(), table.data(), max_blocks, nw,
                              staged ? w_stage.data() : nullptr},
                  k.data(), v.data());

    DevBuf<uint8_t> dk(hk.size()), dv(hv.size()), dks(hks.size()), dvs(hvs.size());
    for (auto* b : {&dk, &dv, &dks, &dvs})
        if (b->size() > 0) b->zero();  // (no stage buffers without staging)
    DevBuf<int32_t> dtable(table), dwseq(w_seq), dwslot(w_slot), dwstage(w_stage);
    DevBuf<float> dkin(k), dvin(v);
    KvLayerView dkv = hkv;
    dkv.k = dk.get();
    dkv.v = sh.v_is_k ? dk.get() : dv.get();
    dkv.k_stage = staged ? dks.get() : nullptr;
    dkv.v_stage = !staged ? nullptr : sh.v_is_k ? dks.get() : dvs.get();
    cuda_kv_write(dkv,
                  KvBatchView{dwseq.get(), dwslot.get(), dtable.get(), max_blocks, nw,
                              staged ? dwstage.get() : nullptr},
                  dkin.get(), dvin.get(), nullptr);
    // The same bytes in the pools (sealed blocks included) and stages.
    CHECK(byte_mismatch(dk.download(), hk) == 0.0);
    CHECK(byte_mismatch(dv.download(), hv) == 0.0);  // (untouched when V reads K's rows)
    if (staged) {
        CHECK(byte_mismatch(dks.download(), hks) == 0.0);
        CHECK(byte_mismatch(dvs.download(), hvs) == 0.0);
    }

    // Attention for the batch tokens.
    std::vector<int32_t> t_seq, t_slot;
    for (auto [s, slot] : sc.tokens) t_seq.push_back(s), t_slot.push_back(slot);
    const std::vector<int32_t> t_stage = stages_of(t_seq, t_slot);
    const int64_t nt = int64_t(t_seq.size());
    const std::vector<float> q = random_floats(static_cast<size_t>(nt * n_head * hd), seed + 3);
    std::vector<float> ref(q.size());
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> sinks = random_floats(static_cast<size_t>(n_head), seed + 4);
    for (float& x : sinks) x *= 4.0f;  // from well below the scores to well above
    const float* hsinks = sc.sinks ? sinks.data() : nullptr;
    DevBuf<float> dsinks_buf(sinks);
    const float* dsinks = sc.sinks ? dsinks_buf.get() : nullptr;
    cpu::paged_attention(ref.data(), q.data(), hkv,
                         KvBatchView{t_seq.data(), t_slot.data(), table.data(), max_blocks, nt,
                                     staged ? t_stage.data() : nullptr},
                         n_head, scale, sc.softcap, sc.window, hsinks);

    DevBuf<int32_t> dtseq(t_seq), dtslot(t_slot), dtstage(t_stage);
    DevBuf<float> dq(q), dout(q.size());
    const KvBatchView db{dtseq.get(), dtslot.get(), dtable.get(),
                         max_blocks,  nt,           staged ? dtstage.get() : nullptr};
    CudaScratch scratch;
    cuda_paged_attention_decode(dout.get(), dq.get(), dkv, db, n_head, scale, scratch, nullptr,
                                sc.softcap, sc.window, dsinks);
    const std::vector<float> batched = dout.download();
    CHECK(nmse(batched, ref) < kAttnBound);
    if (nt <= 16) {
        // Batch invariance (what keeps speculative decoding lossless on the GPU): each token
        // alone, with a block table only as wide as its own context, gets the same bits as
        // in the batch (whose widest context may split where its own does not).
        const int64_t row = n_head * hd;
        for (int64_t i = 0; i < nt; ++i) {
            CAPTURE(i);
            const int64_t width = t_slot[size_t(i)] / bs + 1;
            std::vector<int32_t> own(table.begin() + t_seq[size_t(i)] * max_blocks,
                                     table.begin() + t_seq[size_t(i)] * max_blocks + width);
            const std::vector<float> qi(q.begin() + i * row, q.begin() + (i + 1) * row);
            DevBuf<int32_t> d_own(own), d_seq(std::vector<int32_t>{0}),
                d_slot(std::vector<int32_t>{t_slot[size_t(i)]}),
                d_stage(std::vector<int32_t>{t_stage[size_t(i)]});
            DevBuf<float> d_q(qi), d_out(qi.size());
            cuda_paged_attention_decode(d_out.get(), d_q.get(), dkv,
                                        KvBatchView{d_seq.get(), d_slot.get(), d_own.get(), width,
                                                    1, staged ? d_stage.get() : nullptr},
                                        n_head, scale, scratch, nullptr, sc.softcap, sc.window,
                                        dsinks);
            const std::vector<float> alone = d_out.download();
            CHECK(std::memcmp(alone.data(), batched.data() + i * row,
                              alone.size() * sizeof(float)) == 0);
        }
    }
    dout.zero();
    cuda_paged_attention_tiled(dout.get(), dq.get(), dkv, db, n_head, scale, nullptr, sc.softcap,
                               sc.window, dsinks);
    const std::vector<float> tiled = dout.download();
    CHECK(nmse(tiled, ref) < kAttnBound);
    const bool flash = cuda_flash_attention_supports(dkv);
    std::vector<float> flashed;
    if (flash) {
        dout.zero();
        cuda_paged_attention_flash(dout.get(), dq.get(), dkv, db, n_head, scale, nullptr,
                                   sc.softcap, sc.window, dsinks);
        flashed = dout.download();
        const double err = nmse(flashed, ref);
        CAPTURE(err);
        CHECK(err < kFlashBound);
    }
    if (sc.window != 0) {
        // The blocks wholly before the window (or chunk) of every batch token of their sequence are
        // never read (a paged cache may drop them): -1 there changes no bit in either kernel.
        std::vector<int32_t> dropped = table;
        std::vector<int64_t> first(table.size() / size_t(max_blocks), INT64_MAX);
        for (int64_t i = 0; i < nt; ++i) {
            int64_t& f = first[size_t(t_seq[size_t(i)])];
            f = std::min(f, attn_first_slot(t_slot[size_t(i)], sc.window));
        }
        int64_t n_dropped = 0;
        for (size_t sq = 0; sq < first.size(); ++sq)
            for (int64_t j = 0; first[sq] != INT64_MAX && j < first[sq] / bs; ++j, ++n_dropped)
                dropped[sq * size_t(max_blocks) + size_t(j)] = -1;
        if (n_dropped > 0) {
            DevBuf<int32_t> ddropped(dropped);
            const KvBatchView dbd{dtseq.get(), dtslot.get(), ddropped.get(),
                                  max_blocks,  nt,           staged ? dtstage.get() : nullptr};
            dout.zero();
            cuda_paged_attention_decode(dout.get(), dq.get(), dkv, dbd, n_head, scale, scratch,
                                        nullptr, sc.softcap, sc.window, dsinks);
            CHECK(dout.download() == batched);
            dout.zero();
            cuda_paged_attention_tiled(dout.get(), dq.get(), dkv, dbd, n_head, scale, nullptr,
                                       sc.softcap, sc.window, dsinks);
            CHECK(dout.download() == tiled);
            if (flash) {
                dout.zero();
                cuda_paged_attention_flash(dout.get(), dq.get(), dkv, dbd, n_head, scale, nullptr,
                                           sc.softcap, sc.window, dsinks);
                CHECK(dout.download() == flashed);
            }
        }
    }
    dout.zero();
    cuda_paged_attention(dout.get(), dq.get(), dkv, db, n_head, scale, scratch, nullptr, sc.softcap,
                         sc.window, dsinks);
    // More than 16 tokens take the prefill path: the flash kernel where it applies.
    const std::vector<float> plain = dout.download();
    CHECK(nmse(plain, ref) < (flash && nt > 16 ? kFlashBound : kAttnBound));
    // With xq (the decode step's output projection on the integer GEMV), the same output and
    // its rows quantized as cuda_quantize_x does: in the decode kernel or its merge (head_dim
    // % 32 == 0), else by a launch after.
    if ((n_head * hd) % 32 == 0) {
        const int elt = seed % 2 ? 2 : 1;
        const size_t n = q.size();
        DevBuf<int8_t> fq(n * size_t(elt)), pq(n * size_t(elt));
        DevBuf<float> fd(n / 32), pd(n / 32);
        dout.zero();
        const CudaXq xq{dout.get(), fq.get(), fd.get(), elt};
        cuda_paged_attention(dout.get(), dq.get(), dkv, db, n_head, scale, scratch, nullptr,
                             sc.softcap, sc.window, dsinks, &xq);
        CHECK(same_bits(dout.download(), plain));
        cuda_quantize_x(dout.get(), nt, n_head * hd, CudaXq{dout.get(), pq.get(), pd.get(), elt},
                        nullptr);
        CHECK(fq.download() == pq.download());
        CHECK(same_bits(fd.download(), pd.download()));
    }
}

Scenario decode_scenario() {
    Scenario sc;
    for (int64_t l : {1, 17, 300, 2100}) {
        sc.tokens.emplace_back(int32_t(sc.history.size()), int32_t(l - 1));
        sc.history.push_back(l - 1);
    }
    return sc;
}

Scenario prefill_scenario() {
    // seq 0: a fresh 70-token prompt; seq 1: 40 cached + 50 new; seq 2: one decode token.
    // Order interleaves sequences so tiles mix them (and seq 0 appears twice).
    Scenario sc;
    sc.history = {0, 40, 500};
    for (int32_t j = 0; j < 30; ++j) sc.tokens.emplace_back(0, j);
    for (int32_t j = 40; j < 60; ++j) sc.tokens.emplace_back(1, j);
    for (int32_t j = 30; j < 70; ++j) sc.tokens.emplace_back(0, j);
    sc.tokens.emplace_back(2, 500);
    for (int32_t j = 60; j < 90; ++j) sc.tokens.emplace_back(1, j);
    return sc;
}

Scenario verify_scenario() {
    // Speculative verification: 9 consecutive tokens of one sequence after 1000 cached.
    Scenario sc;
    sc.history = {1000};
    for (int32_t j = 1000; j < 1009; ++j) sc.tokens.emplace_back(0, j);
    return sc;
}

}  // namespace

TEST_CASE("cuda paged attention matches the CPU across block sizes, GQA ratios and KV types") {
    uint32_t seed = 1;
    for (int64_t bs : {1, 16, 64})
        for (int64_t group : {1, 4, 8})
            for (auto [hd, type] :
                 {std::pair{int64_t(64), KvType::F16}, std::pair{int64_t(128), KvType::F32},
                  std::pair{int64_t(128), KvType::F16}}) {
                CAPTURE(bs);
                CAPTURE(group);
                CAPTURE(hd);
                const AttnShape sh{bs, 2, group, hd, type, type};
                run_scenario(sh, decode_scenario(), seed++);
                run_scenario(sh, prefill_scenario(), seed++);
                run_scenario(sh, verify_scenario(), seed++);
            }
}

TEST_CASE("cuda paged attention handles odd head sizes, big groups and mixed pool types") {
    const AttnShape shapes[] = {
        {16, 4, 2, 8, KvType::F16, KvType::F16},      // stories260K: head_dim 8
        {16, 2, 4, 80, KvType::F16, KvType::F32},     // head_dim not a multiple of 32
        {16, 2, 3, 96, KvType::F16, KvType::F16},     // flash kernel, 64 rows not all used
        {16, 2, 8, 256, KvType::F16, KvType::F16},    // largest head_dim (> 48 KiB smem)
        {7, 1, 12, 64, KvType::F32, KvType::F16},     // 12 heads per KV head, odd block size
        {256, 1, 32, 128, KvType::F16, KvType::F16},  // MQA, largest block size
    };
    uint32_t seed = 100;
    for (const AttnShape& sh : shapes) {
        CAPTURE(sh.block_size);
        CAPTURE(sh.group);
        CAPTURE(sh.head_dim);
        run_scenario(sh, decode_scenario(), seed++);
        run_scenario(sh, prefill_scenario(), seed++);
    }
}

TEST_CASE("cuda decode attention: every rows x lanes instantiation, empty rows and idle lanes") {
    // Groups 1, 2, 3, 6 give blocks of 1, 2, 4, 8 query rows (3 and 6 leave rows empty);
    // head sizes 24, 48, 96, 200 give key groups of 4, 8, 16, 32 lanes (none a power of two
    // times 8, so the last lanes of each group have no channels). Each group and each head
    // size meets every KV format pair and block size. head_dim 20 (not a multiple of 8) takes
    // the tiled kernel.
    const int64_t groups[] = {1, 2, 3, 6}, head_dims[] = {24, 48, 96, 200};
    const int64_t block_sizes[] = {16, 1, 64, 5};
    const KvType k_types[] = {KvType::F16, KvType::Q8, KvType::F32, KvType::Q4};
    const KvType v_types[] = {KvType::F16, KvType::Q4, KvType::Q8, KvType::F16};
    uint32_t seed = 800;
    for (int g = 0; g < 4; ++g)
        for (int h = 0; h < 4; ++h) {
            const int f = (g + h) % 4, b = (h + 3 * g) % 4;
            const AttnShape sh{block_sizes[b], 2, groups[g], head_dims[h], k_types[f], v_types[f]};
            CAPTURE(sh.block_size);
            CAPTURE(sh.group);
            CAPTURE(sh.head_dim);
            const std::string k_name = kv_type_name(sh.k_type), v_name = kv_type_name(sh.v_type);
            CAPTURE(k_name);
            CAPTURE(v_name);
            run_scenario(sh, decode_scenario(), seed++);
        }
    run_scenario({16, 2, 3, 20, KvType::F16, KvType::F32}, decode_scenario(), seed++);
}

TEST_CASE("cuda decode attention: long splits (several tiles per warp) in a large pool") {
    // 4200 blocks of 64 slots: splits of 288 slots, 9 tiles, so warps 0 and 1 rescale their
    // running sums across tiles. An extra token at slot 287 fills split 0: the third tile of
    // its warp 0 is its own block, read from the stage when the cache is quantized.
    Scenario sc = decode_scenario();
    sc.tokens.emplace_back(int32_t(sc.history.size()), 287);
    sc.history.push_back(287);
    sc.min_pool_blocks = 4200;
    const AttnShape shapes[] = {
        {64, 1, 1, 32, KvType::F16, KvType::F16},
        {64, 1, 4, 128, KvType::Q8, KvType::Q4},
    };
    uint32_t seed = 900;
    for (const AttnShape& sh : shapes) {
        CAPTURE(sh.group);
        CAPTURE(sh.head_dim);
        run_scenario(sh, sc, seed++);
    }
}

TEST_CASE("cuda paged attention matches the CPU on quantized caches (q8/q4, staged)") {
    const AttnShape shapes[] = {
        {16, 2, 4, 64, KvType::Q8, KvType::Q8},    {16, 2, 4, 128, KvType::Q4, KvType::Q4},
        {64, 2, 8, 128, KvType::Q8, KvType::Q4},   {1, 2, 1, 64, KvType::Q4, KvType::Q8},
        {16, 1, 12, 128, KvType::F16, KvType::Q4},  // only V quantized, 12 heads per KV head
        {48, 2, 4, 64, KvType::Q4, KvType::F32},    // block size not a power of two
        {7, 1, 4, 80, KvType::Q8, KvType::Q8},      // odd block size: 2-byte aligned V codes
        {16, 4, 2, 8, KvType::Q4, KvType::Q4},      // stories260K heads
        {16, 2, 2, 36, KvType::Q4, KvType::Q8},     // head_dim not a multiple of 8
        {16, 1, 8, 256, KvType::Q8, KvType::Q4},    // largest head_dim
    };
    uint32_t seed = 500;
    for (const AttnShape& sh : shapes) {
        CAPTURE(sh.block_size);
        CAPTURE(sh.group);
        CAPTURE(sh.head_dim);
        const std::string k_name = kv_type_name(sh.k_type), v_name = kv_type_name(sh.v_type);
        CAPTURE(k_name);
        CAPTURE(v_name);
        run_scenario(sh, decode_scenario(), seed++);
        run_scenario(sh, prefill_scenario(), seed++);
        run_scenario(sh, verify_scenario(), seed++);
    }
}

TEST_CASE("cuda paged attention on DeepSeek's latent rows: 576 wide, V reading K's rows") {
    // The cached row [k_pe | latent] is K, and V is the same row (one pool, K's per-channel
    // format when quantized): every query head of the one KV head reads it. 576-wide heads
    // take the wide instantiation of the tiled kernel for decode and prefill; narrow heads
    // with V reading K's rows the narrow one; a 576-wide V of its own (K and V types differ)
    // two tiles.
    const AttnShape shapes[] = {
        {16, 1, 16, 576, KvType::F16, KvType::F16, true},  // DeepSeek V2-Lite: 16 heads
        {16, 1, 5, 576, KvType::Q8, KvType::Q8, true},
        {64, 1, 4, 576, KvType::Q4, KvType::Q4, true},
        {16, 1, 3, 576, KvType::Q8, KvType::F16},        // K q8, V f16: a V pool of its own
        {16, 1, 4, 40, KvType::F16, KvType::F16, true},  // the tests' small MLA models
        {5, 1, 6, 40, KvType::Q8, KvType::Q8, true},
    };
    uint32_t seed = 1700;
    for (const AttnShape& sh : shapes) {
        CAPTURE(sh.block_size);
        CAPTURE(sh.group);
        CAPTURE(sh.head_dim);
        CAPTURE(sh.v_is_k);
        const std::string k_name = kv_type_name(sh.k_type);
        CAPTURE(k_name);
        run_scenario(sh, decode_scenario(), seed++);
        run_scenario(sh, prefill_scenario(), seed++);
        run_scenario(sh, verify_scenario(), seed++);
    }
}

TEST_CASE("cuda paged attention with Gemma's soft cap and sliding window matches the CPU") {
    // Windows shorter than a tile, than a block, than a decode split and longer than every
    // context (no effect), with and without a soft cap; Llama 4's chunks (negative windows) of
    // the same lengths; decode (both kernels: head_dim 36 takes the tiled one), prefill and
    // verification batches; f16 and staged q8/q4 caches.
    const AttnShape shapes[] = {
        {16, 2, 4, 64, KvType::F16, KvType::F16},
        {16, 1, 4, 256, KvType::Q8, KvType::Q4},   // Gemma's head size, quantized
        {16, 2, 2, 36, KvType::F16, KvType::F16},  // tiled decode kernel
    };
    uint32_t seed = 1200;
    for (const AttnShape& sh : shapes)
        for (int64_t window : {int64_t(1), int64_t(7), int64_t(40), int64_t(300), int64_t(5000),
                               int64_t(-7), int64_t(-40), int64_t(-300)})
            for (float softcap : {0.0f, 2.0f}) {
                CAPTURE(sh.head_dim);
                CAPTURE(window);
                CAPTURE(softcap);
                for (Scenario sc : {decode_scenario(), prefill_scenario(), verify_scenario()}) {
                    sc.window = window, sc.softcap = softcap;
                    run_scenario(sh, sc, seed++);
                }
            }
}

TEST_CASE("cuda paged attention with gpt-oss's attention sinks matches the CPU") {
    // Both decode kernels (head_dim 64: the warp-per-key-group one, 36: the tiled one), split
    // and unsplit contexts, prefill and verification batches, with and without a window.
    const AttnShape shapes[] = {
        {16, 2, 4, 64, KvType::F16, KvType::F16},
        {16, 2, 2, 36, KvType::F16, KvType::F16},
        {16, 1, 8, 64, KvType::Q8, KvType::Q8},
    };
    uint32_t seed = 1500;
    for (const AttnShape& sh : shapes)
        for (int64_t window : {int64_t(0), int64_t(7)}) {
            CAPTURE(sh.head_dim);
            CAPTURE(window);
            for (Scenario sc : {decode_scenario(), prefill_scenario(), verify_scenario()}) {
                sc.window = window, sc.sinks = true;
                run_scenario(sh, sc, seed++);
            }
        }
}

TEST_CASE("cuda paged attention rejects shapes it cannot run") {
    DevBuf<uint8_t> pool(1 << 16);
    DevBuf<int32_t> ids(std::vector<int32_t>{0});
    DevBuf<float> q(1024), out(1024);
    CudaScratch scratch;
    KvLayerView kv{KvType::F16, KvType::F16, pool.get(), pool.get(), 1, 1, 16, 640};
    const KvBatchView b{ids.get(), ids.get(), ids.get(), 1, 1};
    CHECK_THROWS_AS(cuda_paged_attention(out.get(), q.get(), kv, b, 1, 1.0f, scratch, nullptr),
                    Error);  // head_dim 640
    kv.head_dim = 64;
    kv.v_is_k = true;
    kv.v_type = KvType::F32;
    CHECK_THROWS_AS(cuda_paged_attention(out.get(), q.get(), kv, b, 1, 1.0f, scratch, nullptr),
                    Error);  // V reading K's rows in another format
    kv.v_is_k = false;
    kv.v_type = KvType::F16;
    kv.head_dim = 64;
    kv.n_kv_head = 2;
    CHECK_THROWS_AS(cuda_paged_attention(out.get(), q.get(), kv, b, 3, 1.0f, scratch, nullptr),
                    Error);  // 3 query heads do not divide into 2 KV heads
    kv.n_kv_head = 1;
    kv.k_type = KvType::Q8;
    CHECK_THROWS_AS(cuda_paged_attention(out.get(), q.get(), kv, b, 1, 1.0f, scratch, nullptr),
                    Error);
}

#endif  // KVRUN_HAS_CUDA
