// Backend interface plumbing shared by the CPU and CUDA backends: building a forward batch
// from the block table, executing its queued copies, and KV pool sizing (blocks, stages).
#include "backend.h"

#include <algorithm>
#include <cmath>

#include "common.h"
#include "kv_format.h"

namespace kvrun {

namespace {
constexpr int64_t kMaxKvBlocks = int64_t(1) << 24;  // KvBlockTable's limit
}

Backend::~Backend() = default;

void Backend::forward_sample(const ForwardBatch& batch, const std::vector<RowSampling>& rows,
                             int32_t* tokens) {
    if (rows.size() != batch.logit_rows.size())
        fail("forward_sample: {} sampling rows for {} logit rows", rows.size(),
             batch.logit_rows.size());
    const int n_vocab = static_cast<int>(config().n_vocab);
    std::vector<float> logits(rows.size() * size_t(n_vocab));
    forward(batch, logits.data());
    for (size_t r = 0; r < rows.size(); ++r) {
        Sampler sampler(rows[r].params);
        tokens[r] = sampler.sample_with(logits.data() + r * size_t(n_vocab), n_vocab,
                                        rows[r].recent, rows[r].u);
    }
}

int32_t ForwardBatch::add_sequence(const KvBlockTable& table, SeqId seq, int32_t start, int32_t n) {
    const std::vector<TokenId>& toks = table.tokens(seq);
    if (start < 0 || n < 0 || int64_t(start) + n > int64_t(toks.size()))
        fail("forward batch: tokens [{}, {}) outside sequence {} of {} tokens", start,
             int64_t(start) + n, seq, toks.size());
    const int32_t first = static_cast<int32_t>(tokens.size());
    const int32_t index = static_cast<int32_t>(block_tables.size());
    block_tables.push_back(table.block_ids(seq));
    if (table.windowed()) window_tables.push_back(table.window_ids(seq));
    for (int32_t i = start; i < start + n; ++i) {
        tokens.push_back(toks[static_cast<size_t>(i)]);
        positions.push_back(i);
        seq_index.push_back(index);
        slots.push_back(i);
        if (table.staging()) stages.push_back(table.stage_of_slot(seq, i));
    }
    return first;
}

void ForwardBatch::validate(int64_t n_vocab, int64_t n_blocks, int64_t block_size, int64_t n_stages,
                            const KvWindowPool& window) const {
    const size_t n = tokens.size();
    if (positions.size() != n || seq_index.size() != n || slots.size() != n)
        fail("forward batch: {} tokens but {} positions, {} sequence indices, {} slots", n,
             positions.size(), seq_index.size(), slots.size());
    for (const auto& table : block_tables)
        for (int32_t id : table)
            if (id < 0 || id >= n_blocks)
                fail("forward batch: block id {} outside the pool of {} blocks", id, n_blocks);
    for (size_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            fail("forward batch: token id {} out of range (vocabulary of {})", tokens[i], n_vocab);
        if (positions[i] < 0) fail("forward batch: negative position {}", positions[i]);
        if (seq_index[i] < 0 || size_t(seq_index[i]) >= block_tables.size())
            fail("forward batch: sequence index {} but {} block tables", seq_index[i],
                 block_tables.size());
        const auto& table = block_tables[size_t(seq_index[i])];
        if (slots[i] < 0 || slots[i] / block_size >= int64_t(table.size()))
            fail("forward batch: slot {} of sequence {} is outside its {} blocks of {} tokens",
                 slots[i], seq_index[i], table.size(), block_size);
    }
    for (int32_t r : logit_rows)
        if (r < 0 || size_t(r) >= n)
            fail("forward batch: logit row {} outside the batch of {} tokens", r, n);
    if (window.n_blocks > 0) {
        if (window_tables.size() != block_tables.size())
            fail("forward batch: {} block tables but {} window tables", block_tables.size(),
                 window_tables.size());
        for (size_t s = 0; s < block_tables.size(); ++s) {
            if (window_tables[s].size() != block_tables[s].size())
                fail("forward batch: sequence {} has {} blocks but {} window blocks", s,
                     block_tables[s].size(), window_tables[s].size());
            for (int32_t id : window_tables[s])
                if (id < -1 || id >= window.n_blocks)
                    fail("forward batch: window block id {} outside the window pool of {} blocks",
                         id, window.n_blocks);
        }
        // Every block a token's window reaches has its window block (checked per sequence
        // from the batch's earliest token).
        std::vector<int64_t> lowest(block_tables.size(), INT64_MAX);
        for (size_t i = 0; i < n; ++i) {
            int64_t& lo = lowest[size_t(seq_index[i])];
            lo = std::min<int64_t>(lo, slots[i]);
        }
        for (size_t s = 0; s < block_tables.size(); ++s) {
            if (lowest[s] == INT64_MAX) continue;
            const int64_t first = std::max<int64_t>(0, lowest[s] - window.window + 1) / block_size;
            for (size_t b = size_t(first); b < window_tables[s].size(); ++b)
                if (window_tables[s][b] < 0)
                    fail(
                        "forward batch: sequence {} has no window block for block {} its "
                        "sliding-window layers read",
                        s, b);
        }
    }
    if (n_stages > 0) {
        if (stages.size() != n)
            fail(
                "forward batch: {} tokens but {} stage slots (the quantized KV cache needs one "
                "per token)",
                n, stages.size());
        for (int32_t st : stages)
            if (st < 0 || st >= n_stages)
                fail("forward batch: stage slot {} outside the {} stage slots", st, n_stages);
    }
}

void ForwardBatch::set_lora_scales(int32_t seq_index, std::vector<float> scales) {
    if (seq_index < 0 || size_t(seq_index) >= block_tables.size())
        fail("forward batch: LoRA scales for sequence {} of {}", seq_index, block_tables.size());
    if (lora_scales.size() <= size_t(seq_index)) lora_scales.resize(size_t(seq_index) + 1);
    lora_scales[size_t(seq_index)] = std::move(scales);
}

std::vector<std::vector<float>> ForwardBatch::token_lora_scales(
    const std::vector<float>& loaded) const {
    if (lora_scales.size() > block_tables.size())
        fail("forward batch: LoRA scales for {} sequences but {} block tables", lora_scales.size(),
             block_tables.size());
    for (const auto& row : lora_scales) {
        if (row.empty()) continue;
        if (row.size() != loaded.size())
            fail("forward batch: {} LoRA scales for {} loaded adapters", row.size(), loaded.size());
        for (float s : row)
            if (!std::isfinite(s)) fail("forward batch: LoRA scale {} is not finite", s);
    }
    std::vector<std::vector<float>> out(loaded.size(), std::vector<float>(tokens.size()));
    for (size_t t = 0; t < tokens.size(); ++t) {
        const size_t s = size_t(seq_index[t]);
        const bool own = s < lora_scales.size() && !lora_scales[s].empty();
        for (size_t i = 0; i < loaded.size(); ++i) out[i][t] = own ? lora_scales[s][i] : loaded[i];
    }
    return out;
}

void kv_copies_validate(const std::vector<BlockCopy>& copies, int64_t n_blocks, int64_t n_stages,
                        int64_t n_window_blocks) {
    for (const BlockCopy& c : copies) {
        if (n_window_blocks > 0 &&
            (c.wsrc < 0 || c.wsrc >= n_window_blocks || c.wdst < 0 || c.wdst >= n_window_blocks))
            fail("copy_blocks: window block pair ({}, {}) outside the window pool of {} blocks",
                 c.wsrc, c.wdst, n_window_blocks);
        if (c.src < 0 || c.src >= n_blocks || c.dst < 0 || c.dst >= n_blocks)
            fail("copy_blocks: block pair ({}, {}) outside the pool of {} blocks", c.src, c.dst,
                 n_blocks);
        if (c.dst_stage >= n_stages || c.src_stage >= n_stages || (n_stages > 0 && c.dst_stage < 0))
            fail("copy_blocks: stage pair ({}, {}) does not fit {} stage slots", c.src_stage,
                 c.dst_stage, n_stages);
    }
}

void kv_apply_pending(KvBlockTable& table, Backend& backend) {
    std::vector<BlockCopy> copies = table.take_pending_copies();
    if (!copies.empty()) backend.copy_blocks(copies);
}

int64_t kv_pool_block_bytes(const ModelConfig& c, const BackendOptions& o, const KvWindowPool& w,
                            KvPool pool) {
    if (w.n_blocks > 0) return kv_block_bytes(c, o, pool == KvPool::Window);
    return pool == KvPool::Main ? kv_block_bytes(c, o) : 0;
}

void kv_block_io_check(const char* what, KvPool pool, int64_t block, int64_t n_main,
                       const KvWindowPool& w) {
    const int64_t n = pool == KvPool::Window ? w.n_blocks : n_main;
    if (block < 0 || block >= n)
        fail("{}: block {} is outside the {} pool (0..{})", what, block,
             pool == KvPool::Window ? "window" : "main", n - 1);
}

KvBlockTable kv_table_for(const Backend& backend) {
    return KvBlockTable(static_cast<int32_t>(backend.n_kv_blocks()), backend.kv_block_size(),
                        backend.n_kv_stages(), backend.kv_window_pool());
}

ModelConfig backend_model_config(const GgufFile& file, const BackendOptions& o) {
    ModelConfig c = model_config_from_gguf(file);
    select_rope_factors(c, o.n_ctx);
    apply_rope_overrides(c, o.rope);
    return c;
}

int64_t kv_layer_block_bytes(KvType t, KvRole role, int64_t n_kv_head, int64_t block_size,
                             int64_t head_dim) {
    return n_kv_head * kv_head_block_bytes(t, role, block_size, head_dim);
}

namespace {

int64_t kv_layer_pair_bytes(const ModelConfig& c, const BackendOptions& o) {
    if (o.kv_block_size <= 0 || o.kv_block_size > 4096)
        fail("KV block size {} is out of range (1..4096)", o.kv_block_size);
    int64_t k =
        kv_layer_block_bytes(o.kv_type_k, KvRole::K, c.n_kv_head, o.kv_block_size, c.head_dim);
    int64_t v =
        kv_layer_block_bytes(o.kv_type_v, KvRole::V, c.n_kv_head, o.kv_block_size, c.head_dim);
    return kv_v_shares_k(c, o.kv_type_k, o.kv_type_v) ? k : k + v;
}

int64_t n_windowed_layers(const ModelConfig& c) {
    int64_t n = 0;
    for (int64_t l = 0; l < c.n_layer; ++l) n += c.is_swa(l) ? 1 : 0;
    return n;
}

int64_t one_pool_blocks(const ModelConfig& c, const BackendOptions& o);

// Window pool blocks the options' sequences need (0: no window pool for this model).
int64_t window_pool_blocks(const ModelConfig& c, const BackendOptions& o) {
    if (o.swa_full || n_windowed_layers(c) == 0 || c.n_swa <= 0) return 0;
    const int64_t bs = o.kv_block_size;
    // From the first block the next query (minus the margin) sees to the last one a pass of
    // n_batch tokens writes, plus one block for each of the two partial ends.
    const int64_t per_seq =
        (c.n_swa + kKvWindowMargin + std::max<int64_t>(1, o.n_batch) + bs - 1) / bs + 2;
    return per_seq * std::max<int64_t>(1, o.n_parallel);
}

}  // namespace

int64_t kv_block_bytes(const ModelConfig& c, const BackendOptions& o) {
    return c.n_layer * kv_layer_pair_bytes(c, o);
}

int64_t kv_block_bytes(const ModelConfig& c, const BackendOptions& o, bool windowed) {
    const int64_t n_win = n_windowed_layers(c);
    return (windowed ? n_win : c.n_layer - n_win) * kv_layer_pair_bytes(c, o);
}

double kv_bytes_per_token(const ModelConfig& c, KvType k, KvType v, int64_t block_size) {
    return double(c.n_layer) * double(c.n_kv_head) * double(c.head_dim) *
           (kv_bytes_per_element(k, KvRole::K, c.head_dim, block_size) +
            (kv_v_shares_k(c, k, v) ? 0.0
                                    : kv_bytes_per_element(v, KvRole::V, c.head_dim, block_size)));
}

bool kv_v_shares_k(const ModelConfig& c, KvType k, KvType v) {
    return c.mla() && k == v;
}

int64_t kv_stages_for(const BackendOptions& o) {
    if (!kv_type_quantized(o.kv_type_k) && !kv_type_quantized(o.kv_type_v)) return 0;
    if (o.kv_stages > 0) return o.kv_stages;
    // One pass writes at most n_batch / block_size + 1 blocks of one sequence, plus a
    // partly filled block (and a copy-on-write target) per other sequence.
    const int64_t bs = std::max<int64_t>(1, o.kv_block_size);
    return (std::max<int64_t>(1, o.n_batch) + bs - 1) / bs +
           2 * std::max<int64_t>(1, o.n_parallel) + 4;
}

int64_t kv_stage_bytes(const ModelConfig& c, const BackendOptions& o, int64_t n_stages) {
    const int64_t pools = kv_v_shares_k(c, o.kv_type_k, o.kv_type_v) ? 1 : 2;  // K (and V)
    return n_stages * c.n_layer * c.n_kv_head * int64_t(o.kv_block_size) * c.head_dim * 2 * pools;
}

KvLayout kv_layout_for(const ModelConfig& c, const BackendOptions& o) {
    KvLayout out;
    out.n_blocks = one_pool_blocks(c, o);
    const int64_t w = window_pool_blocks(c, o);
    if (w <= 0 || w > kMaxKvBlocks) return out;
    int64_t split = o.n_kv_blocks;
    if (split <= 0) {  // the budget less the window pool, in blocks of the other layers
        const double left = o.kv_memory_mib * 1024.0 * 1024.0 -
                            double(kv_stage_bytes(c, o, kv_stages_for(o))) -
                            double(w * kv_block_bytes(c, o, true));
        split = left > 0 ? static_cast<int64_t>(left / double(kv_block_bytes(c, o, false))) : 0;
        split = std::min<int64_t>(split, kMaxKvBlocks);
        if (split <= out.n_blocks) return out;  // no more context than one pool: keep one
    }
    if (w >= split) return out;  // the window pool would not be smaller than the main one
    out.n_blocks = split;
    out.window = {static_cast<int32_t>(w), static_cast<int32_t>(c.n_swa), kKvWindowMargin};
    return out;
}

int64_t kv_blocks_for(const ModelConfig& c, const BackendOptions& o) {
    return kv_layout_for(c, o).n_blocks;
}

namespace {

// Blocks of one pool holding every layer: o.n_kv_blocks, or what the budget holds.
int64_t one_pool_blocks(const ModelConfig& c, const BackendOptions& o) {
    int64_t per_block = kv_block_bytes(c, o);
    int64_t n = o.n_kv_blocks;
    if (n <= 0) {
        if (!(o.kv_memory_mib > 0))
            fail("KV memory budget must be positive (got {} MiB)", o.kv_memory_mib);
        const double budget = o.kv_memory_mib * 1024.0 * 1024.0;
        const double stages = double(kv_stage_bytes(c, o, kv_stages_for(o)));
        n = budget > stages ? static_cast<int64_t>((budget - stages) / double(per_block)) : 0;
        if (n < 1)
            throw Error(fmt::format("a KV budget of {} MiB holds no block of {} tokens ({} bytes "
                                    "per block, {} bytes of f16 stage slots)",
                                    o.kv_memory_mib, o.kv_block_size, per_block, int64_t(stages)),
                        "raise --kv-memory or lower --kv-block-size");
        n = std::min<int64_t>(n, kMaxKvBlocks);  // a huge budget for a tiny model
    }
    if (n > kMaxKvBlocks) fail("KV pool of {} blocks is too large (at most {})", n, kMaxKvBlocks);
    return n;
}

}  // namespace

std::string cuda_unsupported(const ModelConfig& c) {
    // (The limits of cuda_moe_topk, kCudaMoeMaxGroups, and of the attention kernels,
    // cu::kAttnMaxDimWide.)
    if (c.n_group > 32) return fmt::format("{} expert groups (at most 32)", c.n_group);
    if (c.head_dim > 576) return fmt::format("heads of {} dims (at most 576)", c.head_dim);
    return "";
}

bool kv_rotation_enabled(const ModelConfig& c, const BackendOptions& o) {
    if (!o.kv_rotate) return false;
    if (!is_power_of_two(c.head_dim))
        throw Error(
            fmt::format("--kv-rotate needs a power-of-two head_dim (the model has {})", c.head_dim),
            "use --kv-rotate off");
    return true;
}

}  // namespace kvrun
