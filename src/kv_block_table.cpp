// KvBlockTable: block allocation, reference counts, copy-on-write, truncation and the
// prefix-cache registry with LRU eviction (see kv_block_table.h for the contract).
#include "kv_block_table.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

namespace {

constexpr int32_t kMaxBlocks = 1 << 24;
constexpr int32_t kMaxBlockSize = 256;

// splitmix64's finalizer: a bijective 64-bit mixer with full avalanche.
uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

}  // namespace

std::string KvAppendResult::reason() const {
    if (ok) return {};
    if (n_blocks_needed > n_blocks_available)
        return fmt::format("out of KV blocks: needed {} new block(s), {} available",
                           n_blocks_needed, n_blocks_available);
    if (n_window_needed > n_window_available)
        return fmt::format("out of sliding-window KV blocks: needed {}, {} available",
                           n_window_needed, n_window_available);
    return fmt::format("out of KV stage slots: needed {}, {} available", n_stages_needed,
                       n_stages_available);
}

double KvBlockStats::waste_fraction() const {
    int64_t slots = static_cast<int64_t>(used_blocks) * block_size;
    return slots > 0 ? static_cast<double>(unfilled_slots) / static_cast<double>(slots) : 0.0;
}

uint64_t KvBlockTable::hash_block(uint64_t parent, std::span<const TokenId> tokens) {
    uint64_t h = mix64(parent ^ 0x6b76'7275'6e5f'6b76ULL);
    for (TokenId t : tokens) {
        h = mix64(h + 0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(t));
    }
    return mix64(h ^ static_cast<uint64_t>(tokens.size()));
}

KvBlockTable::KvBlockTable(int32_t n_blocks, int32_t block_size, int32_t n_stages,
                           KvWindowPool window)
    : n_blocks_(n_blocks), block_size_(block_size), window_(window) {
    if (block_size < 1 || block_size > kMaxBlockSize) {
        fail("KV block size {} is out of range (1..{})", block_size, kMaxBlockSize);
    }
    if (n_blocks < 1 || n_blocks > kMaxBlocks) {
        fail("KV block count {} is out of range (1..{})", n_blocks, kMaxBlocks);
    }
    blocks_.resize(static_cast<size_t>(n_blocks));
    free_.reserve(static_cast<size_t>(n_blocks));
    // A stack popped from the back: block 0 is handed out first.
    for (BlockId b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
    if (n_stages < 0 || n_stages > kMaxBlocks) {
        fail("KV stage slot count {} is out of range (0..{})", n_stages, kMaxBlocks);
    }
    stages_.resize(static_cast<size_t>(n_stages));
    for (int32_t i = n_stages - 1; i >= 0; --i) free_stages_.push_back(i);
    if (window_.n_blocks != 0) {
        if (window_.n_blocks < 1 || window_.n_blocks > kMaxBlocks)
            fail("KV window pool size {} is out of range (1..{})", window_.n_blocks, kMaxBlocks);
        if (window_.window < 1 || window_.margin < 0)
            fail("KV window pool: window {} and margin {} must be positive", window_.window,
                 window_.margin);
        // A margin of at least a block lets a new sequence adopt the whole blocks of a
        // finished one whose partners it kept (the finished one may have been a block longer).
        window_.margin = std::max(window_.margin, block_size_);
        for (BlockId b = window_.n_blocks - 1; b >= 0; --b) wfree_.push_back(b);
    }
}

// ---- internals ----

KvBlockTable::Sequence& KvBlockTable::seq_ref(SeqId seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) fail("KV block table: unknown sequence {}", seq);
    return it->second;
}

const KvBlockTable::Sequence& KvBlockTable::seq_ref(SeqId seq) const {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) fail("KV block table: unknown sequence {}", seq);
    return it->second;
}

void KvBlockTable::check_block(BlockId block) const {
    if (block < 0 || block >= n_blocks_) {
        fail("KV block id {} is out of range (0..{})", block, n_blocks_ - 1);
    }
}

BlockId KvBlockTable::allocate_block() {
    BlockId b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else {
        // Evict the least recently released cached block.
        b = lru_.front();
        drop_partner(b);
        lru_.pop_front();
        blocks_[b].in_lru = false;
        uncache_block(b);
    }
    blocks_[b].refcount = 1;
    blocks_[b].sealed = false;
    ++n_used_;
    peak_used_ = std::max(peak_used_, n_used_);
    return b;
}

void KvBlockTable::retain_block(BlockId b) {
    Block& blk = blocks_[b];
    if (blk.refcount == 0) {
        // Only cached blocks can be revived (prefix adoption): leave the LRU.
        if (blk.in_lru) {
            lru_.erase(blk.lru_it);
            blk.in_lru = false;
            if (blk.wpart >= 0) --n_lru_partners_;
        }
        ++n_used_;
        peak_used_ = std::max(peak_used_, n_used_);
    }
    ++blk.refcount;
}

void KvBlockTable::release_block(BlockId b) {
    Block& blk = blocks_[b];
    if (--blk.refcount > 0) return;
    --n_used_;
    // Only a full (sealed) block can be cached, and nobody appends to a free one: the stage
    // is not needed any more. (A copy queued from it still runs before any new write.)
    release_stage(b);
    if (blk.cached) {
        // It keeps its window partner (if any) while the window pool has room, so a new
        // sequence can adopt it with the window the next query needs.
        blk.lru_it = lru_.insert(lru_.end(), b);
        blk.in_lru = true;
        if (blk.wpart >= 0) ++n_lru_partners_;
    } else {
        drop_partner(b);
        free_.push_back(b);
    }
}

void KvBlockTable::uncache_block(BlockId b) {
    Block& blk = blocks_[b];
    if (!blk.cached) return;
    auto it = registry_.find(blk.hash);
    if (it != registry_.end() && it->second == b) registry_.erase(it);
    blk.cached = false;
    blk.tokens.clear();
    blk.tokens.shrink_to_fit();
}

void KvBlockTable::register_full_block(BlockId b, uint64_t hash, uint64_t parent_hash,
                                       std::span<const TokenId> tokens) {
    // An identical block already cached keeps its entry; this one stays private.
    if (registry_.count(hash) != 0) return;
    Block& blk = blocks_[b];
    if (blk.cached) uncache_block(b);
    registry_.emplace(hash, b);
    blk.cached = true;
    blk.hash = hash;
    blk.parent_hash = parent_hash;
    blk.tokens.assign(tokens.begin(), tokens.end());
}

std::vector<BlockId> KvBlockTable::cached_prefix_blocks(std::span<const TokenId> tokens) const {
    std::vector<BlockId> out;
    find_prefix(tokens, out);
    return out;
}

BlockId KvBlockTable::import_cached_block(uint64_t parent_hash, std::span<const TokenId> tokens,
                                          bool with_window) {
    if (static_cast<int32_t>(tokens.size()) != block_size_)
        fail("import_cached_block: {} tokens for a block of {}", tokens.size(), block_size_);
    const uint64_t h = hash_block(parent_hash, tokens);
    if (registry_.count(h) != 0 || free_.empty()) return -1;
    const BlockId b = free_.back();
    free_.pop_back();
    Block& blk = blocks_[b];
    blk.refcount = 0;
    blk.sealed = true;  // the caller fills the whole block in the pool
    register_full_block(b, h, parent_hash, tokens);
    blk.lru_it = lru_.insert(lru_.end(), b);
    blk.in_lru = true;
    if (with_window && windowed() && !wfree_.empty()) {
        give_partner(b);
        ++n_lru_partners_;
    }
    return b;
}

uint64_t KvBlockTable::cached_hash(BlockId block) const {
    check_block(block);
    return blocks_[block].cached ? blocks_[block].hash : 0;
}

uint64_t KvBlockTable::cached_parent_hash(BlockId block) const {
    check_block(block);
    return blocks_[block].cached ? blocks_[block].parent_hash : 0;
}

void KvBlockTable::find_prefix(std::span<const TokenId> tokens, std::vector<BlockId>& out,
                               uint64_t salt) const {
    out.clear();
    const size_t bs = static_cast<size_t>(block_size_);
    uint64_t parent = salt;
    for (size_t i = 0; (i + 1) * bs <= tokens.size(); ++i) {
        auto chunk = tokens.subspan(i * bs, bs);
        uint64_t h = hash_block(parent, chunk);
        auto it = registry_.find(h);
        if (it == registry_.end()) break;
        const Block& blk = blocks_[it->second];
        // Guard against hash collisions: the stored block must really hold these tokens
        // after the same parent.
        if (blk.parent_hash != parent ||
            !std::equal(chunk.begin(), chunk.end(), blk.tokens.begin(), blk.tokens.end())) {
            break;
        }
        out.push_back(it->second);
        parent = h;
    }
}

// ---- staging ----

bool KvBlockTable::stage_reclaimable(const Stage& st) const {
    return st.block >= 0 && blocks_[st.block].sealed && st.epoch < epoch_;
}

int32_t KvBlockTable::n_available_stages() const {
    int32_t n = static_cast<int32_t>(free_stages_.size());
    for (const Stage& st : stages_)
        if (stage_reclaimable(st)) ++n;
    return n;
}

int32_t KvBlockTable::acquire_stage(BlockId block) {
    int32_t s = -1;
    if (!free_stages_.empty()) {
        s = free_stages_.back();
        free_stages_.pop_back();
    } else {
        // Reclaim the stage of the sealed block that was used longest ago.
        for (int32_t i = 0; i < n_stages(); ++i)
            if (stage_reclaimable(stages_[i]) && (s < 0 || stages_[i].epoch < stages_[s].epoch))
                s = i;
        if (s < 0) fail("KV block table: no stage slot available (internal error)");
        blocks_[stages_[s].block].stage = -1;
    }
    stages_[s] = {block, epoch_};
    blocks_[block].stage = s;
    return s;
}

void KvBlockTable::release_stage(BlockId block) {
    const int32_t s = blocks_[block].stage;
    if (s < 0) return;
    stages_[s] = {};
    free_stages_.push_back(s);
    blocks_[block].stage = -1;
}

void KvBlockTable::touch_stage(BlockId block) {
    const int32_t s = blocks_[block].stage;
    if (s >= 0) stages_[s].epoch = epoch_;
}

// ---- window pool ----

int32_t KvBlockTable::window_first(int64_t n_tokens, int32_t margin) const {
    if (!windowed()) return 0;
    const int64_t lo = n_tokens - window_.window + 1 - margin;
    return lo <= 0 ? 0 : static_cast<int32_t>(lo / block_size_);
}

void KvBlockTable::need_window(BlockId b) {
    if (blocks_[b].wpart < 0) fail("KV block table: block {} has no window partner (internal)", b);
    ++blocks_[b].wneed;
}

void KvBlockTable::unneed_window(BlockId b) {
    Block& blk = blocks_[b];
    if (--blk.wneed == 0 && blk.refcount > 0) drop_partner(b);
}

void KvBlockTable::give_partner(BlockId b) {
    BlockId w = -1;
    if (!wfree_.empty()) {
        w = wfree_.back();
        wfree_.pop_back();
    } else {
        // Take the partner of the evictable block released longest ago.
        for (BlockId o : lru_)
            if (blocks_[o].wpart >= 0) {
                w = blocks_[o].wpart;
                blocks_[o].wpart = -1;
                --n_lru_partners_;
                break;
            }
        if (w < 0) fail("KV block table: no window block available (internal error)");
    }
    blocks_[b].wpart = w;
    window_peak_ = std::max(window_peak_, window_.n_blocks - static_cast<int32_t>(wfree_.size()));
}

void KvBlockTable::drop_partner(BlockId b) {
    Block& blk = blocks_[b];
    if (blk.wpart < 0) return;
    if (blk.in_lru) --n_lru_partners_;
    wfree_.push_back(blk.wpart);
    blk.wpart = -1;
}

int32_t KvBlockTable::live_window_from(const std::vector<BlockId>& blocks, int32_t lo,
                                       int32_t hi) const {
    int32_t i = hi;
    while (i > lo && blocks_[blocks[static_cast<size_t>(i - 1)]].wpart >= 0) --i;
    return i;
}

BlockId KvBlockTable::window_of(BlockId block) const {
    check_block(block);
    return blocks_[block].wpart;
}

std::vector<BlockId> KvBlockTable::window_ids(SeqId seq) const {
    const Sequence& s = seq_ref(seq);
    std::vector<BlockId> out;
    if (!windowed()) return out;
    out.reserve(s.blocks.size());
    for (BlockId b : s.blocks) out.push_back(blocks_[b].wpart);
    return out;
}

int32_t KvBlockTable::stages_needed(SeqId seq, int32_t n_tokens) const {
    const Sequence& s = seq_ref(seq);
    const int32_t blocks = blocks_needed(seq, n_tokens);  // validates n_tokens
    if (!staging() || n_tokens == 0) return 0;
    // New blocks (a copy-on-write target included) each need a stage; a sole owner's partly
    // filled block whose stage was reclaimed needs one to decode its rows into.
    const bool partial = s.tokens.size() % static_cast<size_t>(block_size_) != 0;
    const bool restage =
        partial && blocks_[s.blocks.back()].refcount == 1 && blocks_[s.blocks.back()].stage < 0;
    return blocks + (restage ? 1 : 0);
}

// ---- sequences ----

SeqId KvBlockTable::create_sequence(uint64_t salt) {
    if (next_seq_ == INT32_MAX) fail("KV block table: sequence ids exhausted");
    SeqId id = next_seq_++;
    Sequence s;
    s.salt = salt;
    seqs_.emplace(id, std::move(s));
    return id;
}

uint64_t KvBlockTable::salt(SeqId seq) const {
    return seq_ref(seq).salt;
}

SeqId KvBlockTable::create_sequence_with_prefix(std::span<const TokenId> tokens, uint64_t salt) {
    SeqId id = create_sequence(salt);
    adopt_prefix(id, tokens);
    return id;
}

int32_t KvBlockTable::adopt_prefix(SeqId seq, std::span<const TokenId> tokens) {
    Sequence& s = seq_ref(seq);
    if (!s.tokens.empty()) {
        fail("KV block table: adopt_prefix needs an empty sequence ({} holds {} tokens)", seq,
             s.tokens.size());
    }
    std::vector<BlockId> found;
    find_prefix(tokens, found, s.salt);
    int32_t w_from = 0;
    if (windowed()) {
        // The longest prefix whose blocks the next query sees still have their partners.
        int32_t k = static_cast<int32_t>(found.size());
        for (; k > 0; --k) {
            const int64_t n_k = static_cast<int64_t>(k) * block_size_;
            w_from = live_window_from(found, window_first(n_k, window_.margin), k);
            if (w_from <= window_first(n_k, 0)) break;
        }
        found.resize(static_cast<size_t>(k));
        if (k == 0) w_from = 0;
    }
    const size_t n = found.size() * static_cast<size_t>(block_size_);
    for (BlockId b : found) {
        retain_block(b);
        s.blocks.push_back(b);
        s.hashes.push_back(blocks_[b].hash);
    }
    if (windowed()) {
        s.w_first = w_from;
        for (size_t i = static_cast<size_t>(w_from); i < found.size(); ++i) need_window(found[i]);
        // A used block no sequence needs the partner of keeps none (as unneed_window does).
        for (size_t i = 0; i < static_cast<size_t>(w_from); ++i)
            if (blocks_[found[i]].wneed == 0) drop_partner(found[i]);
    }
    s.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
    prefix_hit_tokens_ += static_cast<int64_t>(n);
    return static_cast<int32_t>(n);
}

void KvBlockTable::free_sequence(SeqId seq) {
    Sequence& s = seq_ref(seq);
    // Release the tail first so its blocks are the first evicted (a cached block is only
    // reachable through its parents).
    for (size_t i = s.blocks.size(); i-- > 0;) {
        release_block(s.blocks[i]);
        if (windowed() && static_cast<int32_t>(i) >= s.w_first) unneed_window(s.blocks[i]);
    }
    seqs_.erase(seq);
}

void KvBlockTable::advance_window(Sequence& s) {
    if (!windowed() || s.w_epoch == epoch_) return;
    const int32_t target = window_first(static_cast<int64_t>(s.tokens.size()), window_.margin);
    for (int32_t i = s.w_first; i < target; ++i) unneed_window(s.blocks[size_t(i)]);
    s.w_first = std::max(s.w_first, target);
}

SeqId KvBlockTable::fork(SeqId seq) {
    advance_window(seq_ref(seq));  // the fork need not hold what neither will read
    Sequence copy = seq_ref(seq);
    SeqId id = create_sequence();
    for (BlockId b : copy.blocks) retain_block(b);
    if (windowed())
        for (size_t i = static_cast<size_t>(copy.w_first); i < copy.blocks.size(); ++i)
            need_window(copy.blocks[i]);
    seqs_[id] = std::move(copy);
    return id;
}

bool KvBlockTable::has_sequence(SeqId seq) const {
    return seqs_.count(seq) != 0;
}

int32_t KvBlockTable::blocks_needed(SeqId seq, int32_t n_tokens) const {
    const Sequence& s = seq_ref(seq);
    if (n_tokens < 0) fail("KV block table: cannot append {} tokens", n_tokens);
    const int64_t cur = static_cast<int64_t>(s.tokens.size());
    const int64_t after = cur + n_tokens;
    if (after > INT32_MAX) fail("KV block table: sequence {} would exceed 2^31 tokens", seq);
    const int64_t total = (after + block_size_ - 1) / block_size_;
    int64_t need = total - static_cast<int64_t>(s.blocks.size());
    // Writing into a shared, partly filled last block copies it first.
    if (n_tokens > 0 && cur % block_size_ != 0 && blocks_[s.blocks.back()].refcount > 1) ++need;
    return static_cast<int32_t>(std::min<int64_t>(need, INT32_MAX));
}

KvAppendResult KvBlockTable::append(SeqId seq, int32_t n_tokens, const TokenId* tokens) {
    KvAppendResult result;
    result.n_blocks_needed = blocks_needed(seq, n_tokens);  // validates seq and n_tokens
    result.n_blocks_available = n_available_blocks();
    if (n_tokens == 0) return result;
    if (tokens == nullptr) fail("KV block table: append of {} tokens without token ids", n_tokens);
    Sequence& s = seq_ref(seq);
    const size_t bs = static_cast<size_t>(block_size_);
    const size_t cur = s.tokens.size();
    if (windowed()) {
        // At the first append of a pass, drop the partners of the blocks no query of this
        // sequence will see again (keeping the rollback margin). Not a visible change:
        // nothing reads those rows any more, so this holds even when the append fails.
        advance_window(s);
        // Every new block (a copy-on-write target included) gets a partner.
        result.n_window_needed = result.n_blocks_needed;
        result.n_window_available = n_available_window();
    }
    if (staging()) {
        // The partly filled last block's stage is read (copy-on-write) or written by this
        // pass: it must not be reclaimed for the blocks allocated below.
        if (cur % bs != 0) touch_stage(s.blocks.back());
        result.n_stages_needed = stages_needed(seq, n_tokens);
        result.n_stages_available = n_available_stages();
    }
    if (result.n_blocks_needed > result.n_blocks_available ||
        result.n_stages_needed > result.n_stages_available ||
        result.n_window_needed > result.n_window_available) {
        result.ok = false;
        return result;
    }

    const bool stg = staging();
    const bool win = windowed();
    s.w_epoch = epoch_;
    if (cur % bs != 0) {
        BlockId last = s.blocks.back();
        const int32_t rows = static_cast<int32_t>(cur % bs);
        if (blocks_[last].refcount > 1) {
            // Copy-on-write: this sequence gets a private copy of the valid rows.
            BlockId dst = allocate_block();
            const int32_t dst_stage = stg ? acquire_stage(dst) : -1;
            if (win) {
                give_partner(dst);
                need_window(dst);
            }
            pending_copies_.push_back({last, dst, rows, stg ? blocks_[last].stage : -1, dst_stage,
                                       blocks_[last].wpart, blocks_[dst].wpart});
            ++n_copies_;
            release_block(last);
            if (win) unneed_window(last);
            s.blocks.back() = dst;
        } else {
            // Sole owner of a block that was full once (then truncated): its cached content
            // is about to be overwritten.
            uncache_block(last);
            if (stg && blocks_[last].stage < 0) {  // its stage was reclaimed: decode the rows
                const BlockId w = blocks_[last].wpart;
                pending_copies_.push_back({last, last, rows, -1, acquire_stage(last), w, w});
            }
        }
    }
    const size_t after = cur + static_cast<size_t>(n_tokens);
    while (s.blocks.size() * bs < after) {
        s.blocks.push_back(allocate_block());
        if (stg) acquire_stage(s.blocks.back());
        if (win) {
            give_partner(s.blocks.back());
            need_window(s.blocks.back());
        }
    }
    s.tokens.insert(s.tokens.end(), tokens, tokens + n_tokens);
    if (stg) {
        // Blocks this append writes: their stages serve the coming pass; a block whose last
        // row arrives is sealed (quantized into the pool) by that pass.
        for (size_t i = cur / bs; i * bs < after; ++i) {
            touch_stage(s.blocks[i]);
            blocks_[s.blocks[i]].sealed = (i + 1) * bs <= after;
        }
    }

    // Hash and register every block this append completed.
    for (size_t i = s.hashes.size(); (i + 1) * bs <= after; ++i) {
        const uint64_t parent = i > 0 ? s.hashes[i - 1] : s.salt;
        auto chunk = std::span<const TokenId>(s.tokens).subspan(i * bs, bs);
        const uint64_t h = hash_block(parent, chunk);
        s.hashes.push_back(h);
        register_full_block(s.blocks[i], h, parent, chunk);
    }
    return result;
}

bool KvBlockTable::can_truncate(SeqId seq, int32_t n_tokens) const {
    const Sequence& s = seq_ref(seq);
    if (n_tokens < 0 || static_cast<size_t>(n_tokens) > s.tokens.size()) {
        fail("KV block table: cannot truncate sequence {} of {} tokens to {}", seq, s.tokens.size(),
             n_tokens);
    }
    if (!windowed()) return true;
    const int32_t keep = (n_tokens + block_size_ - 1) / block_size_;
    const int32_t from = live_window_from(s.blocks, window_first(n_tokens, window_.margin),
                                          std::min(s.w_first, keep));
    return from <= window_first(n_tokens, 0);
}

void KvBlockTable::truncate(SeqId seq, int32_t n_tokens) {
    if (!can_truncate(seq, n_tokens))
        fail(
            "KV block table: sequence {} cannot roll back to {} tokens: the sliding-window "
            "layers' K/V before it was dropped",
            seq, n_tokens);
    Sequence& s = seq_ref(seq);
    const size_t bs = static_cast<size_t>(block_size_);
    const size_t keep = (static_cast<size_t>(n_tokens) + bs - 1) / bs;
    while (s.blocks.size() > keep) {
        release_block(s.blocks.back());
        if (windowed() && static_cast<int32_t>(s.blocks.size()) - 1 >= s.w_first)
            unneed_window(s.blocks.back());
        s.blocks.pop_back();
    }
    s.tokens.resize(static_cast<size_t>(n_tokens));
    s.hashes.resize(static_cast<size_t>(n_tokens) / bs);
    if (windowed()) {
        // Take back the partners (still held for other sequences) the rollback margin covers.
        s.w_first = std::min(s.w_first, static_cast<int32_t>(keep));
        const int32_t from =
            live_window_from(s.blocks, window_first(n_tokens, window_.margin), s.w_first);
        for (int32_t i = from; i < s.w_first; ++i) need_window(s.blocks[size_t(i)]);
        s.w_first = from;
    }
}

int32_t KvBlockTable::rollback(SeqId seq, int32_t n_tokens) {
    if (!can_truncate(seq, n_tokens)) n_tokens = 0;
    truncate(seq, n_tokens);
    return n_tokens;
}

std::vector<BlockCopy> KvBlockTable::take_pending_copies() {
    std::vector<BlockCopy> out;
    out.swap(pending_copies_);
    ++epoch_;
    return out;
}

// ---- queries ----

const std::vector<BlockId>& KvBlockTable::block_ids(SeqId seq) const {
    return seq_ref(seq).blocks;
}

const std::vector<TokenId>& KvBlockTable::tokens(SeqId seq) const {
    return seq_ref(seq).tokens;
}

int32_t KvBlockTable::n_tokens(SeqId seq) const {
    return static_cast<int32_t>(seq_ref(seq).tokens.size());
}

KvSlot KvBlockTable::slot(SeqId seq, int32_t pos) const {
    const Sequence& s = seq_ref(seq);
    if (pos < 0 || static_cast<size_t>(pos) >= s.tokens.size()) {
        fail("KV block table: position {} outside sequence {} of {} tokens", pos, seq,
             s.tokens.size());
    }
    return {s.blocks[static_cast<size_t>(pos / block_size_)], pos % block_size_};
}

int32_t KvBlockTable::refcount(BlockId block) const {
    check_block(block);
    return blocks_[block].refcount;
}

bool KvBlockTable::is_cached(BlockId block) const {
    check_block(block);
    return blocks_[block].cached;
}

int32_t KvBlockTable::stage_of(BlockId block) const {
    check_block(block);
    return blocks_[block].stage;
}

int32_t KvBlockTable::stage_of_slot(SeqId seq, int32_t pos) const {
    return stage_of(slot(seq, pos).block);
}

int32_t KvBlockTable::match_prefix(std::span<const TokenId> tokens, uint64_t salt) const {
    std::vector<BlockId> found;
    find_prefix(tokens, found, salt);
    return static_cast<int32_t>(found.size()) * block_size_;
}

void KvBlockTable::clear_cache() {
    while (!lru_.empty()) {
        BlockId b = lru_.front();
        drop_partner(b);
        lru_.pop_front();
        blocks_[b].in_lru = false;
        uncache_block(b);
        free_.push_back(b);
    }
}

KvBlockStats KvBlockTable::stats() const {
    KvBlockStats st;
    st.n_blocks = n_blocks_;
    st.block_size = block_size_;
    st.n_sequences = n_sequences();
    st.used_blocks = n_used_;
    st.peak_used_blocks = peak_used_;
    st.free_blocks = n_free_blocks();
    st.evictable_blocks = n_evictable_blocks();
    st.cached_blocks = static_cast<int32_t>(registry_.size());
    st.prefix_hit_tokens = prefix_hit_tokens_;
    st.copies = n_copies_;
    st.n_stages = n_stages();
    st.stages_in_use = n_stages() - static_cast<int32_t>(free_stages_.size());
    st.n_window_blocks = window_.n_blocks;
    st.window_in_use = window_.n_blocks - static_cast<int32_t>(wfree_.size());
    st.window_peak = window_peak_;
    // A used block is filled up to the furthest row any of its sequences uses.
    std::vector<int32_t> fill(static_cast<size_t>(n_blocks_), 0);
    for (const auto& [id, s] : seqs_) {
        const int64_t n = static_cast<int64_t>(s.tokens.size());
        for (size_t i = 0; i < s.blocks.size(); ++i) {
            int64_t rows =
                std::min<int64_t>(block_size_, n - static_cast<int64_t>(i) * block_size_);
            int32_t& f = fill[static_cast<size_t>(s.blocks[i])];
            f = std::max(f, static_cast<int32_t>(rows));
        }
    }
    for (BlockId b = 0; b < n_blocks_; ++b) {
        if (blocks_[b].refcount > 0)
            st.unfilled_slots += block_size_ - fill[static_cast<size_t>(b)];
    }
    return st;
}

}  // namespace kvrun
