// The paged KV cache's bookkeeping (pure host code, no K/V storage): which physical blocks
// hold which sequence's token slots. Blocks are allocated on demand and reference-counted so
// sequences can share them (fork, prefix caching); writing into a shared, partly filled block
// triggers copy-on-write, reported to the caller as a BlockCopy to execute on the storage.
// Full blocks are hashed (the block's tokens chained with the parent block's hash) and kept
// in a registry so a new sequence with the same prefix can adopt them; a cached block whose
// last user leaves stays cached (evictable, LRU) until the allocator runs out of free blocks.
//
// Staging (quantized KV storage, n_stages > 0): a quantized block is written once, when it
// is full (K is quantized per channel over the block's rows). Until then its rows live in an
// f16 "stage" slot. Every block an append writes into gets a stage; the backend writes the
// new rows there and seals (quantizes) a block into the pool when its last row arrives.
// A sealed block keeps its stage while there is room, so a rollback (truncate) into it stays
// exact; under pressure the oldest stages of sealed blocks are reclaimed (a later append into
// such a block first decodes the kept rows back into a stage: exact up to quantization).
//
// Window pool (models with sliding-window layers, KvWindowPool::n_blocks > 0): the windowed
// layers' rows live in a second, smaller pool. Every block gets a *window partner* there
// when allocated; a sequence keeps the partners of its blocks from w_first on (the blocks
// its next query can see, plus `margin` tokens of rollback) and drops the rest, so a long
// sequence holds only about window + margin tokens of the windowed layers. A cached block
// whose last user leaves keeps its partner while the window pool has room (prefix reuse).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer.h"

namespace kvrun {

using SeqId = int32_t;
using BlockId = int32_t;

// A copy the storage must perform before the next write into `dst`: rows [0, n_rows) of
// physical block `src` (every layer, K and V) into block `dst`. With staging, the rows go to
// stage `dst_stage`: from stage `src_stage`, or, when src_stage is -1, decoded from the
// sealed pool block `src` (src may then equal dst). With a window pool, the windowed layers
// copy window block `wsrc` to `wdst` instead (both -1 without one).
struct BlockCopy {
    BlockId src = -1;
    BlockId dst = -1;
    int32_t n_rows = 0;
    int32_t src_stage = -1;
    int32_t dst_stage = -1;
    BlockId wsrc = -1;
    BlockId wdst = -1;
    bool operator==(const BlockCopy&) const = default;
};

// The sliding-window layers' own pool (see the header comment). n_blocks 0: none, every
// layer lives in the main pool.
struct KvWindowPool {
    int32_t n_blocks = 0;  // window pool size in blocks
    int32_t window = 0;    // tokens a query sees, itself included (ModelConfig::n_swa)
    int32_t margin = 0;    // tokens a sequence can always be rolled back by (truncate)
    bool operator==(const KvWindowPool&) const = default;
};

// The pool a block id names: the main pool (every layer; with a window pool, the layers
// outside it) or the window pool (the sliding-window layers, ids from window_of()).
enum class KvPool : uint8_t { Main, Window };

// Outcome of append(): running out of blocks is an expected condition the caller handles
// (preempt, wait); the table is then unchanged.
struct [[nodiscard]] KvAppendResult {
    bool ok = true;
    int32_t n_blocks_needed = 0;     // new blocks the append needed (incl. copy-on-write)
    int32_t n_blocks_available = 0;  // free + evictable blocks at the time of the call
    int32_t n_stages_needed = 0;     // stage slots it needed (staging tables only)
    int32_t n_stages_available = 0;  // free + reclaimable stage slots
    int32_t n_window_needed = 0;     // window partners it needed (window pool only)
    int32_t n_window_available = 0;  // free window blocks + those of evictable blocks
    explicit operator bool() const { return ok; }
    std::string reason() const;  // "" when ok
};

// Where one token's K/V row lives: row `row` of physical block `block`.
struct KvSlot {
    BlockId block = -1;
    int32_t row = 0;
};

struct KvBlockStats {
    int32_t n_blocks = 0;
    int32_t block_size = 0;
    int32_t n_sequences = 0;
    int32_t used_blocks = 0;        // referenced by at least one sequence
    int32_t peak_used_blocks = 0;   // max of used_blocks since construction
    int32_t free_blocks = 0;        // never used or released uncached
    int32_t evictable_blocks = 0;   // refcount 0 but still cached (prefix reuse)
    int32_t cached_blocks = 0;      // in the prefix registry (in use or evictable)
    int64_t unfilled_slots = 0;     // slots of used blocks no sequence has filled
    int64_t prefix_hit_tokens = 0;  // tokens adopted from the prefix cache, cumulative
    int64_t copies = 0;             // copy-on-write block copies, cumulative
    int32_t n_stages = 0;           // stage slots (0: no staging)
    int32_t stages_in_use = 0;      // held by a block (partly filled, or sealed and kept)
    int32_t n_window_blocks = 0;    // window pool size (0: none)
    int32_t window_in_use = 0;      // window blocks that are some block's partner
    int32_t window_peak = 0;        // max of window_in_use since construction
    // Share of the used blocks' slots that hold no token (the "KV waste").
    double waste_fraction() const;
};

class KvBlockTable {
  public:
    // n_blocks: pool size (1 .. 2^24); block_size: tokens per block (1 .. 256); n_stages:
    // f16 stage slots for quantized storage (0: none); window: the sliding-window layers'
    // pool (n_blocks 0: none). Throws Error.
    KvBlockTable(int32_t n_blocks, int32_t block_size, int32_t n_stages = 0,
                 KvWindowPool window = {});

    // ---- sequences ----
    // `salt` seeds the chain of the sequence's block hashes: sequences whose K/V differ for
    // the same tokens (a request's own LoRA scales) use different salts and never share
    // cached blocks. 0: the plain chain (prompt cache files hold only these).
    SeqId create_sequence(uint64_t salt = 0);
    // Creates a sequence holding the longest cached prefix of `tokens` (whole blocks); its
    // n_tokens() says how many were adopted. Pass the prompt minus its last token when the
    // last position's logits must be computed anyway.
    SeqId create_sequence_with_prefix(std::span<const TokenId> tokens, uint64_t salt = 0);
    uint64_t salt(SeqId seq) const;
    // Like create_sequence_with_prefix for an existing, empty sequence; returns tokens adopted.
    int32_t adopt_prefix(SeqId seq, std::span<const TokenId> tokens);
    void free_sequence(SeqId seq);
    // A new sequence sharing every block of `seq` (refcounts +1); never needs a block.
    SeqId fork(SeqId seq);
    bool has_sequence(SeqId seq) const;
    int32_t n_sequences() const { return static_cast<int32_t>(seqs_.size()); }

    // Reserves slots for n_tokens new tokens (tokens: [n_tokens], may be null only when
    // n_tokens == 0), allocating blocks on demand. Atomic: on failure nothing changes.
    // A copy-on-write it performs is queued for take_pending_copies().
    KvAppendResult append(SeqId seq, int32_t n_tokens, const TokenId* tokens);
    KvAppendResult append(SeqId seq, std::span<const TokenId> tokens) {
        return append(seq, static_cast<int32_t>(tokens.size()), tokens.data());
    }
    // New blocks append(seq, n_tokens, ...) would need right now (incl. copy-on-write).
    int32_t blocks_needed(SeqId seq, int32_t n_tokens) const;
    // Rolls `seq` back to its first n_tokens tokens (0 .. n_tokens(seq)), releasing blocks
    // it no longer needs. With a window pool, throws Error when the window partners the
    // tokens before n_tokens need are gone (check can_truncate first).
    void truncate(SeqId seq, int32_t n_tokens);
    // Whether truncate(seq, n_tokens) can keep the windowed layers' K/V the next query needs
    // (always true without a window pool, or when rolling back by at most the margin). When
    // false, the caller recomputes: free the sequence, or truncate further (to 0 always works).
    bool can_truncate(SeqId seq, int32_t n_tokens) const;
    // truncate(seq, n_tokens) when can_truncate, else truncate(seq, 0): the tokens kept.
    int32_t rollback(SeqId seq, int32_t n_tokens);

    // Stage slots append(seq, n_tokens, ...) would need right now (0 without staging).
    int32_t stages_needed(SeqId seq, int32_t n_tokens) const;

    // Copies queued by append(); the caller must execute them on the K/V storage before it
    // writes the appended tokens' rows (and before any other append that could reuse a
    // source block). Empties the queue. Call it once before every forward pass, also when
    // there is nothing to copy: it marks the end of the appends that pass writes (stages
    // those appends touched cannot be reclaimed before the next pass).
    std::vector<BlockCopy> take_pending_copies();
    bool has_pending_copies() const { return !pending_copies_.empty(); }

    // ---- queries (references stay valid until the next call that changes `seq`) ----
    const std::vector<BlockId>& block_ids(SeqId seq) const;  // [ceil(n_tokens / block_size)]
    const std::vector<TokenId>& tokens(SeqId seq) const;     // [n_tokens]
    int32_t n_tokens(SeqId seq) const;
    KvSlot slot(SeqId seq, int32_t pos) const;  // pos in [0, n_tokens(seq))
    int32_t refcount(BlockId block) const;
    bool is_cached(BlockId block) const;  // in the prefix registry
    // Stage slot of a block, -1 when it has none (always -1 without staging).
    int32_t stage_of(BlockId block) const;
    // Stage slot of the block holding position pos of seq.
    int32_t stage_of_slot(SeqId seq, int32_t pos) const;
    // Window partner of a block, -1 when it has none (always -1 without a window pool).
    BlockId window_of(BlockId block) const;
    // The window partners of block_ids(seq), -1 where dropped (empty without a window pool).
    std::vector<BlockId> window_ids(SeqId seq) const;

    // ---- prefix cache ----
    // Number of leading tokens (a multiple of block_size) whose full blocks are cached.
    int32_t match_prefix(std::span<const TokenId> tokens, uint64_t salt = 0) const;
    // Drops every evictable block from the cache (they become free).
    void clear_cache();
    // The cached full blocks holding the longest cached prefix of `tokens`, in order (what
    // a prompt cache file saves; see prompt_cache.h).
    std::vector<BlockId> cached_prefix_blocks(std::span<const TokenId> tokens) const;
    // Registers a full block (block_size tokens after the chain whose hash is parent_hash)
    // as cached and evictable in a free block, as if a sequence had filled it and left; the
    // caller then writes its K/V rows into the returned block. Returns -1 when an identical
    // block is cached already or no block is free (cached blocks are never evicted for it).
    // With a window pool and `with_window`, the block also gets a partner from the free
    // window blocks when one is left (window_of() then names it; the caller writes it too).
    BlockId import_cached_block(uint64_t parent_hash, std::span<const TokenId> tokens,
                                bool with_window = false);
    // Chained hash of cached block b (0 when b is not cached).
    uint64_t cached_hash(BlockId block) const;
    uint64_t cached_parent_hash(BlockId block) const;

    // ---- pool ----
    int32_t n_blocks() const { return n_blocks_; }
    int32_t block_size() const { return block_size_; }
    int32_t n_free_blocks() const { return static_cast<int32_t>(free_.size()); }
    int32_t n_evictable_blocks() const { return static_cast<int32_t>(lru_.size()); }
    int32_t n_used_blocks() const { return n_used_; }
    // What an allocation can draw on: free blocks, then evictable ones.
    int32_t n_available_blocks() const { return n_free_blocks() + n_evictable_blocks(); }
    int32_t n_stages() const { return static_cast<int32_t>(stages_.size()); }
    bool staging() const { return !stages_.empty(); }
    // Stage slots an append can draw on: free ones plus reclaimable ones.
    int32_t n_available_stages() const;
    const KvWindowPool& window_pool() const { return window_; }
    bool windowed() const { return window_.n_blocks > 0; }
    // Window blocks an allocation can draw on: free ones plus evictable blocks' partners.
    int32_t n_available_window() const {
        return static_cast<int32_t>(wfree_.size()) + n_lru_partners_;
    }
    KvBlockStats stats() const;

    // Chained hash of one full block: `parent` is the previous block's hash (0 for the first).
    static uint64_t hash_block(uint64_t parent, std::span<const TokenId> tokens);

  private:
    struct Block {
        int32_t refcount = 0;
        bool cached = false;          // registered in registry_ under `hash`
        bool in_lru = false;          // evictable (refcount 0, cached)
        uint64_t hash = 0;            // valid when cached
        uint64_t parent_hash = 0;     // valid when cached
        std::vector<TokenId> tokens;  // [block_size] when cached (collision guard)
        std::list<BlockId>::iterator lru_it;
        int32_t stage = -1;   // stage slot holding the block's rows in f16, or -1
        bool sealed = false;  // the pool holds the whole block (its last row was written)
        BlockId wpart = -1;   // window partner, or -1 (none, or dropped)
        int32_t wneed = 0;    // sequences holding it at or after their w_first
    };
    struct Stage {
        BlockId block = -1;  // owner, -1 when free
        int64_t epoch = 0;   // pass (take_pending_copies count) that last wrote or read it
    };
    struct Sequence {
        std::vector<BlockId> blocks;   // [ceil(n_tokens / block_size)]
        std::vector<TokenId> tokens;   // [n_tokens]
        std::vector<uint64_t> hashes;  // [n_tokens / block_size] chained hashes of full blocks
        // Window pool: blocks [w_first, blocks.size()) count this sequence in their wneed
        // and have partners; w_epoch is the pass of the last append (w_first advances at the
        // first append of a pass, never under the rows the pass still reads).
        int32_t w_first = 0;
        int64_t w_epoch = -1;
        uint64_t salt = 0;  // the parent hash of block 0
    };

    Sequence& seq_ref(SeqId seq);
    const Sequence& seq_ref(SeqId seq) const;
    void check_block(BlockId block) const;
    BlockId allocate_block();  // caller checked availability
    void retain_block(BlockId block);
    void release_block(BlockId block);
    void uncache_block(BlockId block);
    void register_full_block(BlockId block, uint64_t hash, uint64_t parent_hash,
                             std::span<const TokenId> tokens);
    // Walks the registry along `tokens`; fills `out` with the cached blocks of the prefix.
    void find_prefix(std::span<const TokenId> tokens, std::vector<BlockId>& out,
                     uint64_t salt = 0) const;
    bool stage_reclaimable(const Stage& st) const;
    int32_t acquire_stage(BlockId block);  // caller checked availability
    void release_stage(BlockId block);
    void touch_stage(BlockId block);  // protects it from reclaiming until the next pass
    // Window pool: the first block a sequence of n tokens keeps partners for, with `margin`
    // tokens of rollback (0: just what the next query sees).
    int32_t window_first(int64_t n_tokens, int32_t margin) const;
    void need_window(BlockId block);    // wneed + 1 (the block has a partner)
    void unneed_window(BlockId block);  // wneed - 1; at 0 a used block's partner is dropped
    void give_partner(BlockId block);   // caller checked n_available_window()
    void drop_partner(BlockId block);
    // Unless `s` appended in this pass: drops its partners no later query reads (margin kept).
    void advance_window(Sequence& s);
    // Lowest index >= lo from which blocks[i .. hi) all have partners (hi when block hi-1
    // has none).
    int32_t live_window_from(const std::vector<BlockId>& blocks, int32_t lo, int32_t hi) const;

    int32_t n_blocks_ = 0;
    int32_t block_size_ = 0;
    std::vector<Block> blocks_;                       // [n_blocks]
    std::vector<BlockId> free_;                       // stack of free blocks
    std::list<BlockId> lru_;                          // evictable blocks, least recent first
    std::unordered_map<uint64_t, BlockId> registry_;  // chained hash -> cached full block
    std::unordered_map<SeqId, Sequence> seqs_;
    std::vector<BlockCopy> pending_copies_;
    std::vector<Stage> stages_;         // [n_stages]
    std::vector<int32_t> free_stages_;  // stack of free stage slots
    int64_t epoch_ = 0;                 // number of take_pending_copies() calls
    SeqId next_seq_ = 0;
    int32_t n_used_ = 0;
    int32_t peak_used_ = 0;
    int64_t prefix_hit_tokens_ = 0;
    int64_t n_copies_ = 0;
    KvWindowPool window_;
    std::vector<BlockId> wfree_;  // stack of free window blocks
    int32_t n_lru_partners_ = 0;  // evictable blocks that still hold a partner
    int32_t window_peak_ = 0;     // most window blocks in use at once
};

}  // namespace kvrun
