// CUDA quantized KV cache vs the CPU twins: one KvBlockTable drives a CPU and a GPU copy of
// a layer's cache through prefill, decode, fork (copy-on-write of a stage), rollback across
// sealed blocks (stage restored from the pool, in place or as the copy-on-write of a shared
// block), stage reclaiming and a long context (split-K decode); after every pass the sealed
// pools and stages must hold the same bytes and cuda_paged_attention (decode kernel, prefill
// kernel, dispatcher) must match cpu::paged_attention. Also cuda_rope_kv_write (RoPE fused
// with the KV write) against the unfused calls, byte for byte, and cuda_hadamard.
// Exits 77 (skipped) without a GPU (see cuda_test_util.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common.h"
#include "cpu_ops.h"
#include "cuda_test_util.h"
#include "kv_block_table.h"
#include "kv_format.h"

#ifdef KVRUN_HAS_CUDA

using namespace kvrun;
using namespace kvrun::test;

namespace {

// Both sides read the same bytes and compute in f32: only summation order differs.
constexpr double kAttnBound = 1e-8;
// The prefill path's flash kernel (head_dim 64/96/128) rounds q, the decoded K/V and the
// softmax weights to f16 for its tensor-core products (as in test_cuda_attention).
constexpr double kFlashBound = 1e-6;

struct Shape {
    int64_t block_size, n_kv_head, group, head_dim;
    KvType k_type, v_type;
    int32_t n_stages;
};

// Block copies a scenario queued, by kind (to check it reached the paths it is meant for).
struct CopyCounts {
    int64_t pool = 0;         // pool block -> pool block
    int64_t stage = 0;        // stage -> stage (copy-on-write of a partly filled block)
    int64_t restore = 0;      // decoded from a sealed pool block into a stage (src_stage -1)
    int64_t restore_cow = 0;  // ... of those, into another block's stage (src != dst)
};

// Fraction of differing bytes (0 when equal).
double byte_mismatch(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    if (a.size() != b.size()) return 1.0;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return a.empty() ? 0.0 : double(n) / double(a.size());
}

// One layer's K / V pools and stages (zeroed) in device memory, shaped by sh.
struct DevCache {
    DevBuf<uint8_t> k, v, k_stage, v_stage;
    KvLayerView view;
    DevCache(const Shape& sh, int64_t n_blocks) {
        const int64_t bs = sh.block_size, hd = sh.head_dim;
        k = DevBuf<uint8_t>(
            size_t(n_blocks * sh.n_kv_head * kv_head_block_bytes(sh.k_type, KvRole::K, bs, hd)));
        v = DevBuf<uint8_t>(
            size_t(n_blocks * sh.n_kv_head * kv_head_block_bytes(sh.v_type, KvRole::V, bs, hd)));
        k_stage = DevBuf<uint8_t>(size_t(sh.n_stages * sh.n_kv_head * bs * hd * 2));
        v_stage = DevBuf<uint8_t>(k_stage.size());
        for (auto* b : {&k, &v, &k_stage, &v_stage}) b->zero();
        view = {sh.k_type, sh.v_type, k.get(),       v.get(),       n_blocks,   sh.n_kv_head,
                bs,        hd,        k_stage.get(), v_stage.get(), sh.n_stages};
    }
    void copy(const BlockCopy& c) const {
        cuda_kv_copy(view, c.src, c.dst, c.src_stage, c.dst_stage, c.n_rows, nullptr);
    }
};

// The host arrays of a KvBatchView for a pass that appended n_new[i] tokens to seqs[i]:
// token i of the batch belongs to batch sequence seq[i] (an index into seqs).
struct HostBatch {
    std::vector<int32_t> table, seq, slot, stage;  // stage: -1 without staging
    int64_t max_blocks = 1;
    int64_t n_tokens() const { return int64_t(seq.size()); }
    KvBatchView view() const {
        return {seq.data(), slot.data(), table.data(), max_blocks, n_tokens(), stage.data()};
    }
};

// A HostBatch in device memory. with_stages false: no token_stage (an unstaged cache).
struct DevBatch {
    DevBuf<int32_t> seq, slot, stage, table;
    KvBatchView view;
    explicit DevBatch(const HostBatch& b, bool with_stages = true)
        : seq(b.seq), slot(b.slot), stage(b.stage), table(b.table) {
        view = {seq.get(),    slot.get(),   table.get(),
                b.max_blocks, b.n_tokens(), with_stages ? stage.get() : nullptr};
    }
};

HostBatch make_batch(const KvBlockTable& t, const std::vector<SeqId>& seqs,
                     const std::vector<int32_t>& n_new) {
    HostBatch b;
    for (SeqId s : seqs) b.max_blocks = std::max<int64_t>(b.max_blocks, t.block_ids(s).size());
    b.table.assign(seqs.size() * size_t(b.max_blocks), -1);
    for (size_t i = 0; i < seqs.size(); ++i) {
        const auto& ids = t.block_ids(seqs[i]);
        std::copy(ids.begin(), ids.end(), b.table.begin() + int64_t(i) * b.max_blocks);
        const int32_t len = t.n_tokens(seqs[i]);
        for (int32_t j = len - n_new[i]; j < len; ++j) {
            b.seq.push_back(int32_t(i));
            b.slot.push_back(j);
            b.stage.push_back(t.stage_of_slot(seqs[i], j));
        }
    }
    return b;
}

// Appends n_new[i] tokens to seqs[i]; false when the table refused one (some may have been
// appended then: the callers give up on the scenario).
bool append_all(KvBlockTable& t, const std::vector<SeqId>& seqs, const std::vector<int32_t>& n_new,
                uint32_t seed) {
    for (size_t i = 0; i < seqs.size(); ++i) {
        std::vector<TokenId> ids(size_t(n_new[i]), TokenId(seed % 97));
        if (!t.append(seqs[i], ids)) return false;
    }
    return true;
}

class Mirror {
  public:
    Mirror(const Shape& sh, int64_t n_blocks)
        : sh_(sh),
          table_(int32_t(n_blocks), int32_t(sh.block_size), sh.n_stages),
          dev_(sh, n_blocks) {
        const int64_t bs = sh.block_size, hd = sh.head_dim;
        hk_.assign(dev_.k.size(), 0);
        hv_.assign(dev_.v.size(), 0);
        hks_.assign(dev_.k_stage.size(), 0);
        hvs_.assign(hks_.size(), 0);
        hkv_ = {sh.k_type, sh.v_type, hk_.data(),  hv_.data(),  n_blocks,   sh.n_kv_head,
                bs,        hd,        hks_.data(), hvs_.data(), sh.n_stages};
    }
    KvBlockTable& table() { return table_; }
    const CopyCounts& copies() const { return copies_; }

    // One pass: appends n_new[i] tokens to seqs[i], runs the queued copies, writes random
    // K/V on both sides and compares caches and attention. Returns false when the table
    // refused an append.
    bool pass(const std::vector<SeqId>& seqs, const std::vector<int32_t>& n_new, uint32_t seed) {
        if (!append_all(table_, seqs, n_new, seed)) return false;
        for (const BlockCopy& c : table_.take_pending_copies()) {
            if (c.dst_stage < 0) {
                ++copies_.pool;
            } else if (c.src_stage >= 0) {
                ++copies_.stage;
            } else {
                ++copies_.restore;
                copies_.restore_cow += c.src != c.dst;
            }
            cpu::kv_copy(hkv_, c.src, c.dst, c.src_stage, c.dst_stage, c.n_rows);
            dev_.copy(c);
        }
        const HostBatch b = make_batch(table_, seqs, n_new);
        const int64_t nt = b.n_tokens();
        const int64_t rows = nt * sh_.n_kv_head * sh_.head_dim;
        const auto k = random_floats(size_t(rows), seed * 3 + 1);
        const auto v = random_floats(size_t(rows), seed * 3 + 2);
        const int64_t n_head = sh_.n_kv_head * sh_.group;
        const auto q = random_floats(size_t(nt * n_head * sh_.head_dim), seed * 3 + 3);
        const KvBatchView hb = b.view();
        cpu::kv_write(hkv_, hb, k.data(), v.data());
        std::vector<float> ref(q.size());
        const float scale = 1.0f / std::sqrt(float(sh_.head_dim));
        cpu::paged_attention(ref.data(), q.data(), hkv_, hb, n_head, scale);

        const DevBatch d(b);
        const KvBatchView& db = d.view;
        const KvLayerView& dkv = dev_.view;
        DevBuf<float> dkin(k), dvin(v), dq(q), dout(q.size());
        cuda_kv_write(dkv, db, dkin.get(), dvin.get(), nullptr);
        // Sealed pools and stages: the same bytes (the codec rounds identically).
        CHECK(byte_mismatch(dev_.k.download(), hk_) == 0.0);
        CHECK(byte_mismatch(dev_.v.download(), hv_) == 0.0);
        CHECK(byte_mismatch(dev_.k_stage.download(), hks_) == 0.0);
        CHECK(byte_mismatch(dev_.v_stage.download(), hvs_) == 0.0);
        CudaScratch scratch;
        cuda_paged_attention_decode(dout.get(), dq.get(), dkv, db, n_head, scale, scratch, nullptr);
        CHECK(nmse(dout.download(), ref) < kAttnBound);
        dout.zero();
        cuda_paged_attention_tiled(dout.get(), dq.get(), dkv, db, n_head, scale, nullptr);
        CHECK(nmse(dout.download(), ref) < kAttnBound);
        const bool flash = cuda_flash_attention_supports(dkv);
        dout.zero();
        cuda_paged_attention_prefill(dout.get(), dq.get(), dkv, db, n_head, scale, nullptr);
        CHECK(nmse(dout.download(), ref) < (flash ? kFlashBound : kAttnBound));
        dout.zero();
        cuda_paged_attention(dout.get(), dq.get(), dkv, db, n_head, scale, scratch, nullptr);
        // More than 16 tokens take the prefill path.
        CHECK(nmse(dout.download(), ref) < (flash && nt > 16 ? kFlashBound : kAttnBound));
        return true;
    }

  private:
    Shape sh_;
    KvBlockTable table_;
    DevCache dev_;
    std::vector<uint8_t> hk_, hv_, hks_, hvs_;
    KvLayerView hkv_;
    CopyCounts copies_;
};

// A cache shape for the fused RoPE + KV write, with its rotation.
struct RopeShape {
    Shape cache;
    int64_t n_rot;
    bool neox;
    float freq_base, freq_scale;
    bool factors = false;  // per-pair frequency factors (Llama 3.1 style)
    bool yarn = false;     // YaRN ramp and attention factor
};

// Two device caches of one shape driven by one block table: `ref` gets cuda_rope on q and
// on k, then cuda_kv_write; `fused` gets cuda_rope_kv_write. After every pass q, k and every
// byte of the pools and stages must be the same.
class RopeTwin {
  public:
    RopeTwin(const RopeShape& rs, int64_t n_blocks)
        : rs_(rs),
          table_(int32_t(n_blocks), int32_t(rs.cache.block_size), rs.cache.n_stages),
          ref_(rs.cache, n_blocks),
          fused_(rs.cache, n_blocks) {}
    KvBlockTable& table() { return table_; }
    int64_t completed_blocks() const { return completed_; }
    const DevCache& fused() const { return fused_; }

    bool pass(const std::vector<SeqId>& seqs, const std::vector<int32_t>& n_new, uint32_t seed) {
        const Shape& sh = rs_.cache;
        if (!append_all(table_, seqs, n_new, seed)) return false;
        for (const BlockCopy& c : table_.take_pending_copies()) {
            ref_.copy(c);
            fused_.copy(c);
        }
        const HostBatch b = make_batch(table_, seqs, n_new);
        const DevBatch d(b, sh.n_stages > 0);
        const int64_t nt = b.n_tokens(), n_head = sh.n_kv_head * sh.group, hd = sh.head_dim;
        // Positions: the slot plus a per-sequence offset, up to near INT32_MAX.
        const int32_t offsets[] = {0, 100000, 1000003, 2147483000};
        std::vector<int32_t> pos(b.seq.size());
        for (int64_t t = 0; t < nt; ++t) {
            pos[size_t(t)] = b.slot[size_t(t)] + offsets[b.seq[size_t(t)] % 4];
            completed_ += b.slot[size_t(t)] % sh.block_size == sh.block_size - 1;
        }
        const auto q = random_floats(size_t(nt * n_head * hd), seed * 3 + 1);
        const auto k = random_floats(size_t(nt * sh.n_kv_head * hd), seed * 3 + 2);
        const auto v = random_floats(k.size(), seed * 3 + 3);
        DevBuf<int32_t> dpos(pos);
        DevBuf<float> dv(v), rq(q), rk(k), fq(q), fk(k);
        std::vector<float> ff(size_t(rs_.n_rot / 2));
        for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.5f * float(i % 7);
        DevBuf<float> dff(ff);
        RopeParams rope = RopeParams::plain(rs_.n_rot, rs_.freq_base, rs_.freq_scale, rs_.neox);
        if (rs_.factors) rope.freq_factors = dff.get();
        if (rs_.yarn) {
            rope.ext_factor = 1.0f;
            rope.corr_low = 2.0f;
            rope.corr_high = float(rs_.n_rot / 2 - 3);
            rope.mscale = 1.2f;
        }

        cuda_rope(rq.get(), dpos.get(), nt, n_head, hd, rope, nullptr);
        cuda_rope(rk.get(), dpos.get(), nt, sh.n_kv_head, hd, rope, nullptr);
        cuda_kv_write(ref_.view, d.view, rk.get(), dv.get(), nullptr);

        cuda_rope_kv_write(fq.get(), fk.get(), dv.get(), dpos.get(), fused_.view, d.view, n_head,
                           rope, nullptr);

        CHECK(same_bits(fq.download(), rq.download()));
        CHECK(same_bits(fk.download(), rk.download()));
        CHECK(same_bits(fused_.k.download(), ref_.k.download()));
        CHECK(same_bits(fused_.v.download(), ref_.v.download()));
        CHECK(same_bits(fused_.k_stage.download(), ref_.k_stage.download()));
        CHECK(same_bits(fused_.v_stage.download(), ref_.v_stage.download()));
        return true;
    }

  private:
    RopeShape rs_;
    KvBlockTable table_;
    DevCache ref_, fused_;
    int64_t completed_ = 0;  // tokens that wrote the last row of their block
};

CopyCounts run_shape(const Shape& sh, uint32_t seed) {
    CAPTURE(sh.block_size);
    CAPTURE(sh.head_dim);
    CAPTURE(sh.group);
    const std::string k_name = kv_type_name(sh.k_type), v_name = kv_type_name(sh.v_type);
    CAPTURE(k_name);
    CAPTURE(v_name);
    // Enough blocks for the ~560 tokens the scenario keeps plus the rollback's filler.
    Mirror m(sh, 640 / sh.block_size + 48 + 4 * sh.n_stages);
    KvBlockTable& t = m.table();
    SeqId a = t.create_sequence(), b = t.create_sequence(), c = t.create_sequence();
    // Prefill of three prompts in one pass (a decode-sized third one), then decode steps.
    REQUIRE(m.pass({a, b, c}, {40, 23, 1}, seed++));
    for (int i = 0; i < 12; ++i) REQUIRE(m.pass({a, b, c}, {1, 1, 1}, seed++));
    // Fork a mid-block: both continue, the fork copies a's stage (copy-on-write).
    SeqId f = t.fork(a);
    REQUIRE(m.pass({a, f}, {3, 2}, seed++));
    // Roll b back across sealed blocks and continue (a speculative rejection); with few
    // stages the rolled-into block's stage was reclaimed and comes back from the pool.
    for (int i = 0; i < 6; ++i) REQUIRE(m.pass({a, c, f}, {1, 1, 1}, seed++));
    t.truncate(b, 5);
    REQUIRE(m.pass({b}, {9}, seed++));
    // A long chunked prefill for a new sequence next to decode steps.
    SeqId d = t.create_sequence();
    REQUIRE(m.pass({d, a}, {70, 1}, seed++));
    REQUIRE(m.pass({d, b, c}, {33, 1, 1}, seed++));
    // A long context: chunked prefill, then decode steps next to others (the decode kernel
    // splits long contexts across thread blocks and merges the parts).
    SeqId e = t.create_sequence();
    REQUIRE(m.pass({e}, {150}, seed++));
    REQUIRE(m.pass({e, c}, {150, 1}, seed++));
    for (int i = 0; i < 3; ++i) REQUIRE(m.pass({e, a, c}, {1, 1, 1}, seed++));
    if (sh.block_size == 1) return m.copies();  // no partly filled block to roll back into
    // Roll back into first blocks sealed long ago, once their stages are reclaimed (a new
    // sequence h grows until the table has taken them): d owns its first block (the kept
    // rows are decoded from the pool into a new stage of the same block); e's is shared with
    // the fork g (the copy-on-write decodes the pool block into the new block's stage).
    const SeqId g = t.fork(e), h = t.create_sequence();
    const BlockId d0 = t.block_ids(d)[0], e0 = t.block_ids(e)[0];
    const int32_t chunk = int32_t(sh.block_size) * std::max(1, sh.n_stages / 3);
    for (int i = 0; i < 12 && (t.stage_of(d0) >= 0 || t.stage_of(e0) >= 0); ++i)
        REQUIRE(m.pass({h}, {chunk}, seed++));
    REQUIRE(t.stage_of(d0) < 0);
    REQUIRE(t.stage_of(e0) < 0);
    const int32_t mid = int32_t(sh.block_size / 2 + 1);
    t.truncate(d, mid);
    t.truncate(g, mid);
    REQUIRE(m.pass({d, g, e}, {2, int32_t(sh.block_size), 1}, seed++));
    REQUIRE(m.pass({d, g, e, a}, {1, 1, 1, 1}, seed++));
    return m.copies();
}

}  // namespace

TEST_CASE("cuda quantized KV cache matches the CPU: sealed bytes, stages, attention") {
    // n_stages: enough for the scenario's biggest pass (150 new tokens of one sequence plus
    // the partly filled blocks of five others); fewer stages mean more reclaiming.
    const Shape shapes[] = {
        {16, 2, 4, 64, KvType::Q8, KvType::Q8, 24},
        {16, 2, 4, 64, KvType::Q4, KvType::Q4, 16},   // few stages: reclaim early
        {16, 2, 4, 128, KvType::Q8, KvType::Q4, 24},  // Llama head size, mixed formats
        {16, 2, 4, 128, KvType::Q4, KvType::Q8, 24},
        {16, 2, 4, 64, KvType::F16, KvType::Q4, 24},  // only V quantized
        {7, 1, 8, 128, KvType::Q4, KvType::Q8, 36},   // odd block size (2-byte aligned V codes)
        {48, 2, 4, 96, KvType::Q8, KvType::Q4, 12},   // 3 V groups, blocks longer than a tile
        {16, 4, 2, 8, KvType::Q4, KvType::F16, 24},   // stories260K heads, mixed formats
        {1, 2, 2, 64, KvType::Q8, KvType::Q4, 160},   // block size 1: every row seals
        {64, 1, 8, 256, KvType::Q4, KvType::Q4, 10},  // largest head_dim
        {16, 2, 2, 80, KvType::Q8, KvType::F32, 24},  // head_dim not a multiple of 32
        {5, 2, 3, 36, KvType::Q4, KvType::Q8, 48},    // head_dim not a multiple of 8
        {16, 1, 2, 33, KvType::Q8, KvType::Q8, 24},   // odd head_dim (q8 only)
    };
    uint32_t seed = 1;
    for (const Shape& sh : shapes) {
        const CopyCounts c = run_shape(sh, seed += 100);
        CAPTURE(sh.block_size);
        CAPTURE(sh.head_dim);
        // Every path of cuda_kv_copy ran (blocks of one row are never partly filled, so they
        // are neither copied on write nor restored).
        if (sh.block_size > 1) {
            CHECK(c.stage > 0);
            CHECK(c.restore > c.restore_cow);
            CHECK(c.restore_cow > 0);
        }
    }
}

TEST_CASE("cuda rope_kv_write gives the bits of cuda_rope on q and k, then cuda_kv_write") {
    using enum KvType;
    // {block_size, n_kv_head, group, head_dim, K type, V type, n_stages}, n_rot, neox, base,
    // scale. n_stages 0: unstaged f32 / f16 pools, else staged (sealed when a block fills).
    const RopeShape shapes[] = {
        {{16, 2, 4, 64, F16, F16, 0}, 64, false, 10000.0f, 1.0f},  // GQA, llama pairs
        {{16, 4, 1, 64, F32, F16, 0}, 32, true, 500000.0f, 1.0f},  // MHA, partial neox
        {{64, 2, 1, 128, F32, F32, 0}, 64, false, 10000.0f, 0.25f},
        {{1, 2, 2, 64, F16, F32, 0}, 64, true, 10000.0f, 1.0f},
        {{16, 1, 1, 33, F32, F16, 0}, 8, false, 10000.0f, 1.0f},   // odd head_dim
        {{16, 1, 10, 64, F16, F16, 0}, 64, true, 10000.0f, 1.0f},  // groups over 8 heads
        {{16, 2, 4, 128, Q8, Q4, 24}, 128, false, 500000.0f, 1.0f},
        {{16, 2, 4, 64, Q4, Q8, 24}, 32, true, 10000.0f, 1.0f},
        {{1, 2, 2, 64, Q8, Q4, 160}, 64, true, 10000.0f, 1.0f},  // every row seals
        {{64, 1, 8, 128, Q4, Q4, 10}, 64, false, 1000000.0f, 1.0f},
        {{16, 2, 4, 64, F16, Q4, 24}, 64, true, 10000.0f, 1.0f},            // only V quantized
        {{16, 1, 2, 33, Q8, Q8, 24}, 32, true, 10000.0f, 1.0f},             // odd head_dim, staged
        {{16, 2, 4, 128, F16, F16, 0}, 128, false, 500000.0f, 1.0f, true},  // Llama 3.1 factors
        {{16, 2, 2, 64, Q8, Q4, 24}, 64, true, 10000.0f, 0.25f, false, true},  // YaRN
        {{16, 1, 4, 64, F32, F16, 0}, 48, false, 10000.0f, 0.5f, true, true},  // both, partial
        {{7, 2, 3, 80, Q8, F32, 48}, 48, false, 10000.0f, 0.5f},               // odd block size
        {{16, 1, 17, 64, Q8, Q8, 24}, 64, false, 10000.0f, 1.0f},
    };
    uint32_t seed = 7;
    for (const RopeShape& rs : shapes) {
        const Shape& sh = rs.cache;
        CAPTURE(sh.block_size);
        CAPTURE(sh.n_kv_head);
        CAPTURE(sh.group);
        CAPTURE(sh.head_dim);
        const std::string k_name = kv_type_name(sh.k_type), v_name = kv_type_name(sh.v_type);
        CAPTURE(k_name);
        CAPTURE(v_name);
        CAPTURE(rs.n_rot);
        CAPTURE(rs.neox);
        RopeTwin m(rs, 320 / sh.block_size + 24);
        KvBlockTable& t = m.table();
        // Prompts of three sequences in one pass, decode steps, a fork that copies a partly
        // filled block, a rollback, and a chunk long enough to fill a 64-row block.
        const SeqId a = t.create_sequence(), b = t.create_sequence(), c = t.create_sequence();
        REQUIRE(m.pass({a, b, c}, {40, 23, 1}, seed++));
        for (int i = 0; i < 5; ++i) REQUIRE(m.pass({a, b, c}, {1, 1, 1}, seed++));
        const SeqId f = t.fork(a);
        REQUIRE(m.pass({a, f}, {3, 2}, seed++));
        t.truncate(b, 5);
        REQUIRE(m.pass({b}, {9}, seed++));
        const SeqId d = t.create_sequence();
        REQUIRE(m.pass({d, a, c}, {70, 1, 1}, seed++));
        CHECK(m.completed_blocks() > 0);  // sealing ran (staged shapes)
        const std::vector<uint8_t> k = m.fused().k.download(), v = m.fused().v.download();
        CHECK(std::any_of(k.begin(), k.end(), [](uint8_t x) { return x != 0; }));
        CHECK(std::any_of(v.begin(), v.end(), [](uint8_t x) { return x != 0; }));
    }
}

TEST_CASE("cuda rope_kv_write refuses what it cannot do") {
    const Shape sh{16, 2, 2, 64, KvType::Q8, KvType::Q8, 4};
    DevCache cache(sh, 4);
    DevBuf<int32_t> zeros(std::vector<int32_t>{0, 0, 0, 0});
    DevBuf<float> q(4 * 64), k(2 * 64), v(2 * 64);
    KvBatchView b{zeros.get(), zeros.get(), zeros.get(), 1, 1, zeros.get()};
    auto call = [&](const KvLayerView& kv, int64_t n_head, int64_t n_rot) {
        cuda_rope_kv_write(q.get(), k.get(), v.get(), zeros.get(), kv, b, n_head,
                           RopeParams::plain(n_rot, 1e4f, 1.0f, false), nullptr);
    };
    call(cache.view, 4, 64);  // fine
    CHECK_THROWS_WITH_AS(call(cache.view, 3, 64), doctest::Contains("multiple of n_kv_head"),
                         Error);
    CHECK_THROWS_WITH_AS(call(cache.view, 4, 66), doctest::Contains("n_rot"), Error);
    CHECK_THROWS_WITH_AS(call(cache.view, 4, 7), doctest::Contains("n_rot"), Error);
    KvLayerView unstaged = cache.view;
    unstaged.n_stages = 0;
    CHECK_THROWS_WITH_AS(call(unstaged, 4, 64), doctest::Contains("needs stage slots"), Error);
    b.token_stage = nullptr;
    CHECK_THROWS_WITH_AS(call(cache.view, 4, 64), doctest::Contains("token stages"), Error);
}

TEST_CASE("cuda_hadamard matches hadamard_rows") {
    for (int64_t n : {1, 8, 64, 128, 256}) {
        CAPTURE(n);
        auto x = random_floats(size_t(5 * n), uint32_t(n));
        DevBuf<float> d(x);
        cuda_hadamard(d.get(), 5, n, nullptr);
        hadamard_rows(x.data(), 5, n);
        CHECK(nmse(d.download(), x) < 1e-12);
    }
    DevBuf<float> d(16);
    CHECK_THROWS_AS(cuda_hadamard(d.get(), 1, 12, nullptr), Error);
}

#endif  // KVRUN_HAS_CUDA
