// Prompt cache files (llama.cpp's --prompt-cache): the K/V of full KV blocks saved to disk so
// a later process with the same model and KV format skips prefilling the prompt prefix they
// cover. A file holds blocks of the prefix cache (KvBlockTable's registry): each block's
// chain hash parent, its block_size tokens and its pool bytes over all layers. Loading puts
// them back as cached, evictable blocks, so any request whose prompt starts with those tokens
// adopts them through the ordinary prefix cache, and memory pressure can still evict them.
//
// With a window pool (sliding-window layers, kv_block_table.h) a block's bytes are split: the
// main pool's layers always, the windowed layers' only when the block had them (its partner
// was alive at save time, or PromptCacheWindows kept them when its prompt was computed).
// Adoption needs them only for the last window of a prefix, which is what a prompt leaves.
//
// Layout (little-endian): "KVRUNPC1", u32 version, u64 model hash, u32 block size,
// u64 block bytes (main pool), u64 window block bytes (0 without a window pool), u32 format
// length + the KV format text, u32 block count, then per block u64 parent hash,
// i32 tokens[block_size], the main pool bytes, u8 1 when the window bytes follow (else 0),
// the window bytes; then a u64 checksum of everything before it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "gguf.h"
#include "kv_block_table.h"

namespace kvrun {

// What must agree for saved K/V to be valid: the model (weights, RoPE as run), the KV
// storage (types, rotation) and the block geometry.
struct PromptCacheKey {
    uint64_t model_hash = 0;
    std::string kv_format;  // e.g. "k=q8 v=f16 rotate=off"
    int32_t block_size = 0;
    int64_t block_bytes = 0;         // Backend::kv_block_io_bytes(KvPool::Main)
    int64_t window_block_bytes = 0;  // Backend::kv_block_io_bytes(KvPool::Window)
};

// Hash of the model as the backend runs it: file size, every tensor's name, type, shape and
// offset, the first 4 KiB of every tensor's data, and the hyperparameters after overrides
// (the RoPE values change the stored K).
uint64_t prompt_cache_model_hash(const GgufFile& file, const ModelConfig& config);

// The key of `file` run by `backend` with that KV format; `lora`, the adapters the backend
// applies, are part of the model (each file hashed like a model, with its scale).
PromptCacheKey prompt_cache_key(const GgufFile& file, const Backend& backend, KvType k, KvType v,
                                bool rotate, const std::vector<LoraSpec>& lora = {},
                                const ControlVectorOptions& cvec = {});

struct PromptCacheLoad {
    bool found = false;          // the file exists
    std::string ignored;         // non-empty: why its blocks do not apply (other model, ...)
    int64_t blocks_in_file = 0;  // blocks the file holds
    int64_t blocks_loaded = 0;   // blocks put into the table (not already cached, room left)
    int64_t windows_loaded = 0;  // of those, blocks given their windowed layers' K/V
    // The file's first chain: the tokens of its first block and of each later block that
    // continues the chain (a file saved from one sequence holds just that chain), and how many
    // of its blocks, from the start, are in the table afterwards (loaded or cached already).
    std::vector<TokenId> chain;
    int64_t chain_blocks_present = 0;
};

// Loads `path` into free blocks of `table` and the backend's pool. A missing file is not an
// error (found false); one made for another key is ignored with a reason. Throws Error for a
// file that is not a prompt cache, is truncated or corrupt (checksum), or holds token ids
// outside [0, n_vocab).
PromptCacheLoad prompt_cache_load(const std::string& path, const PromptCacheKey& key,
                                  KvBlockTable& table, Backend& backend, int64_t n_vocab);

// The windowed layers' K/V of blocks (models with a window pool), kept on the host: a block's
// partner lives only while some sequence's window covers it, and a prompt's last window is
// dropped as soon as generation moves past it. keep() reads those of a sequence's full cached
// blocks that still have partners (call it from Engine::on_prompt_computed); save uses them
// for blocks whose partner is gone by then. Holds at most max_bytes, dropping the oldest.
class PromptCacheWindows {
  public:
    explicit PromptCacheWindows(int64_t max_bytes) : max_bytes_(max_bytes) {}
    void keep(const KvBlockTable& table, Backend& backend, SeqId seq);
    // The kept bytes of the cached block with this chain hash, or null.
    const std::vector<uint8_t>* find(uint64_t hash) const;
    int64_t bytes() const { return bytes_; }

  private:
    int64_t max_bytes_ = 0;
    int64_t bytes_ = 0;
    std::unordered_map<uint64_t, std::vector<uint8_t>> parts_;
    std::deque<uint64_t> order_;  // hashes, oldest first
};

// Writes the cached blocks covering the longest cached prefix of each token sequence (each
// block once, parents first) to `path`, replacing it atomically, with their window bytes
// where the table or `kept` has them. Returns the blocks written. Throws Error when the file
// cannot be written.
int64_t prompt_cache_save(const std::string& path, const PromptCacheKey& key,
                          const KvBlockTable& table, Backend& backend,
                          const std::vector<std::vector<TokenId>>& sequences,
                          const PromptCacheWindows* kept = nullptr);

}  // namespace kvrun
