// The compute backend interface the engine drives (CPU reference in cpu_backend.cpp, CUDA in
// src/cuda/): one forward pass over a batch of tokens from several sequences on a paged KV
// cache, plus block copies for copy-on-write, and the KV pool sizing helpers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_ops.h"
#include "gguf.h"
#include "model_config.h"

namespace kvrun {

// One forward pass: token i of the batch is tokens[i] at RoPE position positions[i],
// belonging to sequence seq_index[i] (a row of block_tables), stored at cache slot slots[i]
// (slot s lives in block block_tables[seq][s / block_size], row s % block_size) and
// attending to slots 0..slots[i] of its sequence. All K/V of a sequence's earlier slots
// must already be in the cache or in this batch.
struct ForwardBatch {
    std::vector<int32_t> tokens;                     // [n_tokens]
    std::vector<int32_t> positions;                  // [n_tokens] RoPE position
    std::vector<int32_t> seq_index;                  // [n_tokens] row into block_tables
    std::vector<int32_t> slots;                      // [n_tokens] cache slot
    std::vector<std::vector<int32_t>> block_tables;  // [n_seqs][n_blocks of seq] physical ids
    std::vector<int32_t> logit_rows;                 // tokens that need logits, output order
};

class Backend {
  public:
    virtual ~Backend();
    virtual const ModelConfig& config() const = 0;
    // Runs the batch; writes logits: [logit_rows.size()][n_vocab]. Throws Error for an
    // inconsistent batch (sizes, ids, slots outside the block table) before touching the cache.
    virtual void forward(const ForwardBatch& batch, float* logits) = 0;
    // Copy-on-write support: for each (src, dst), copies all layers' K and V of block src
    // into block dst.
    virtual void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) = 0;
    virtual int64_t n_kv_blocks() const = 0;
    virtual int32_t kv_block_size() const = 0;
    virtual std::string name() const = 0;
};

struct BackendOptions {
    int32_t kv_block_size = 16;   // tokens per KV block
    int64_t n_kv_blocks = 0;      // pool size in blocks; 0: derive from kv_memory_mib
    int64_t kv_memory_mib = 256;  // KV pool budget (all layers, K and V) when n_kv_blocks = 0
    KvType kv_type_k = KvType::F16;
    KvType kv_type_v = KvType::F16;
    int n_threads = 0;  // CPU threads; 0 = hardware concurrency
    // CPU only, for validation: round activations like llama.cpp (cpu::set_llamacpp_rounding).
    bool llamacpp_rounding = false;
};

// Bytes of one layer's K (or V) pool block of `block_size` tokens. Hook for quantized KV:
// Q8/Q4 throw "not implemented" until their layouts land.
int64_t kv_layer_block_bytes(KvType t, int64_t n_kv_head, int64_t block_size, int64_t head_dim);
// Bytes of one block across all layers, K and V.
int64_t kv_block_bytes(const ModelConfig& c, const BackendOptions& o);
// Average KV bytes per token (all layers, K and V) for the given storage types.
double kv_bytes_per_token(const ModelConfig& c, KvType k, KvType v);
// The number of blocks: o.n_kv_blocks when set, else as many as fit in o.kv_memory_mib.
// Throws Error when that is less than one block.
int64_t kv_blocks_for(const ModelConfig& c, const BackendOptions& o);

// The CPU reference backend. `file` must outlive it (weights stay in the file's mapping).
std::unique_ptr<Backend> make_cpu_backend(const GgufFile& file, const BackendOptions& options);

}  // namespace kvrun
