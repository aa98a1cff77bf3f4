// The compute backend interface the engine drives (CPU reference in cpu_backend.cpp, CUDA in
// src/cuda/): one forward pass over a batch of tokens from several sequences on a paged KV
// cache, plus block copies for copy-on-write, and the KV pool sizing helpers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "control_vector.h"
#include "cpu_ops.h"
#include "gguf.h"
#include "kv_block_table.h"
#include "kv_format.h"
#include "lora.h"
#include "model_config.h"
#include "sampler.h"

namespace kvrun {

// One forward pass: token i of the batch is tokens[i] at RoPE position positions[i],
// belonging to sequence seq_index[i] (a row of block_tables), stored at cache slot slots[i]
// (slot s lives in block block_tables[seq][s / block_size], row s % block_size) and
// attending to slots 0..slots[i] of its sequence. All K/V of a sequence's earlier slots
// must already be in the cache or in this batch.
// With staging (quantized KV, Backend::n_kv_stages() > 0) every token also names the f16
// stage slot of its block: its K/V row is written there, the block is sealed (quantized into
// the pool) when its last row is written, and attention reads a token's own block from the
// stage and every earlier block from the pool.
// With a window pool (Backend::kv_window_pool()), the sliding-window layers store and read a
// token's rows through window_tables instead: the window partners of block_tables' blocks,
// -1 for the ones dropped (before every window of the batch; never read).
struct ForwardBatch {
    std::vector<int32_t> tokens;                     // [n_tokens]
    std::vector<int32_t> positions;                  // [n_tokens] RoPE position
    std::vector<int32_t> seq_index;                  // [n_tokens] row into block_tables
    std::vector<int32_t> slots;                      // [n_tokens] cache slot
    std::vector<std::vector<int32_t>> block_tables;  // [n_seqs][n_blocks of seq] physical ids
    std::vector<int32_t> logit_rows;                 // tokens that need logits, output order
    std::vector<int32_t> stages;  // [n_tokens] stage slot of the token's block (staging only)
    std::vector<std::vector<int32_t>> window_tables;  // [n_seqs][n_blocks of seq] (window pool)
    // Per-sequence LoRA scales (a request's "lora"): row s holds one user scale per loaded
    // adapter for sequence s, or is empty (or missing) for the loaded scales (--lora-scaled).
    std::vector<std::vector<float>> lora_scales;

    // Adds tokens [start, start + n) of `seq`, already appended to `table`, as one more
    // sequence of the batch (RoPE position = cache slot). Returns the batch index of the first.
    int32_t add_sequence(const KvBlockTable& table, SeqId seq, int32_t start, int32_t n);
    // Throws Error for an inconsistent batch (sizes, ids, slots outside the block tables,
    // missing or out-of-range stages when n_stages > 0, window tables that miss or name a
    // window block outside the pool where a token's window reaches).
    void validate(int64_t n_vocab, int64_t n_blocks, int64_t block_size, int64_t n_stages,
                  const KvWindowPool& window = {}) const;
    // Sets sequence `seq_index`'s LoRA scales (empty: the loaded ones).
    void set_lora_scales(int32_t seq_index, std::vector<float> scales);
    // Each token's user scale for every adapter: [n_adapters][n_tokens], from lora_scales or
    // `loaded`. Throws Error for rows that do not have one finite scale per adapter.
    std::vector<std::vector<float>> token_lora_scales(const std::vector<float>& loaded) const;
};

// Throws Error for copies naming blocks or stages outside the pool (or window blocks outside
// the window pool, when there is one).
void kv_copies_validate(const std::vector<BlockCopy>& copies, int64_t n_blocks, int64_t n_stages,
                        int64_t n_window_blocks = 0);

// How Backend::forward_sample samples one logit row.
struct RowSampling {
    SamplingParams params;        // temperature <= 0: argmax, lowest id on ties
    double u = 0;                 // uniform number in [0, 1) from the sequence's Sampler
    std::vector<TokenId> recent;  // tokens the repetition penalty looks at (already cut)
};

// Sees the input rows x[n_rows][n_in] of each weight matrix a forward pass multiplies, before
// the product; `weight` is the matrix's first byte in the model file's tensor data (an
// expert's or a fused matrix's part points inside its tensor). Importance matrices.
using MatmulObserver =
    std::function<void(const void* weight, int64_t n_in, const float* x, int64_t n_rows)>;

// Sees each layer's output x[n_rows][n_embd] (the residual stream after the layer: what a
// control vector steers) as a forward pass computes it. Control vector generation.
using LayerObserver = std::function<void(int32_t layer, const float* x, int64_t n_rows)>;

class Backend {
  public:
    virtual ~Backend();
    virtual const ModelConfig& config() const = 0;
    // Runs the batch; writes logits: [logit_rows.size()][n_vocab]. Throws Error for an
    // inconsistent batch (sizes, ids, slots outside the block table) before touching the cache.
    virtual void forward(const ForwardBatch& batch, float* logits) = 0;
    // forward() that stops before the output projection: writes the logit rows' final hidden
    // states after the output norm (llama.cpp's embeddings): [logit_rows.size()][n_embd].
    virtual void forward_embeddings(const ForwardBatch& batch, float* out) = 0;
    // Installs (or, empty, removes) an observer of every weight product; false when the
    // backend cannot (the CUDA backend).
    virtual bool set_matmul_observer(MatmulObserver observer) { return !observer; }
    // The same for layer outputs (false: a backend that cannot; the CPU and CUDA ones can).
    virtual bool set_layer_observer(LayerObserver observer) { return !observer; }
    // Executes the block table's queued copies (copy-on-write, stage restores; see
    // BlockCopy) on every layer's K and V. Throws Error for ids outside the pool.
    virtual void copy_blocks(const std::vector<BlockCopy>& copies) = 0;
    virtual int64_t n_kv_blocks() const = 0;
    virtual int32_t kv_block_size() const = 0;
    // f16 stage slots of a quantized cache (0: the cache is f16/f32 and needs none). Block
    // tables for this backend must be made with this many stages.
    virtual int32_t n_kv_stages() const { return 0; }
    // The sliding-window layers' own pool (n_blocks 0: none, every layer in the main pool).
    // Block tables for this backend must be made with it (kv_table_for).
    virtual KvWindowPool kv_window_pool() const { return {}; }
    // The LoRA adapters' loaded user scales (--lora: 1, --lora-scaled), one per adapter; a
    // batch's lora_scales rows replace them per sequence.
    virtual std::vector<float> lora_scales() const { return {}; }
    // Whether forward_sample samples where the logits live (the CUDA backend: only token ids
    // travel back, not [rows][n_vocab] logits). The engine then uses it for plain steps.
    virtual bool samples_on_device() const { return false; }
    // forward() plus one sampled token per logit row: tokens [logit_rows.size()], row r
    // sampled with rows[r] by Sampler's rules (Sampler::sample_with(u): the device sampler
    // cuts ties at a top-k / top-p threshold by token id, as the host does). The default
    // samples host logits.
    virtual void forward_sample(const ForwardBatch& batch, const std::vector<RowSampling>& rows,
                                int32_t* tokens);
    virtual std::string name() const = 0;
    // Bytes of one block of `pool` (its layers, K and V: kv_block_bytes); read_kv_block
    // writes them to dst as, per layer of the pool in order, the K block then the V block;
    // write_kv_block stores them back (prompt caches, prompt_cache.h). Stages are not
    // included: only a sealed (full) block's pool bytes are whole. Without a window pool the
    // main pool holds every layer and the window pool none (0 bytes). Throw Error for an id
    // outside the pool.
    virtual int64_t kv_block_io_bytes(KvPool pool) const = 0;
    virtual void read_kv_block(KvPool pool, int64_t block, uint8_t* dst) = 0;
    virtual void write_kv_block(KvPool pool, int64_t block, const uint8_t* src) = 0;
};

struct BackendOptions {
    int32_t kv_block_size = 16;  // tokens per KV block
    int64_t n_kv_blocks = 0;     // pool size in blocks; 0: derive from kv_memory_mib
    double kv_memory_mib = 256;  // KV budget (all layers, K and V, stages included) when
                                 // n_kv_blocks = 0
    KvType kv_type_k = KvType::F16;
    KvType kv_type_v = KvType::F16;
    // Stage slots when K or V is quantized; 0: enough for one pass of n_batch tokens over
    // n_parallel sequences (kv_stages_for).
    int64_t kv_stages = 0;
    int32_t n_batch = 512;
    int32_t n_parallel = 1;
    // Hadamard rotation of Q and K before K is stored (head_dim must be a power of two).
    // Off by default: with per-channel K scales it spreads outlier channels into every
    // channel and measured worse (docs/kv-cache.md).
    bool kv_rotate = false;
    int n_threads = 0;  // CPU threads; 0 = hardware concurrency
    // CPU threads for passes of more than one token (prefill, llama.cpp's -tb); 0: n_threads.
    int n_threads_batch = 0;
    // CPU only, for validation: reproduce llama.cpp's arithmetic bit for bit
    // (cpu::set_llamacpp_rounding, docs/llamacpp-fidelity.md).
    bool llamacpp_rounding = false;
    // --rope-* / --yarn-* overrides of the model's RoPE (none by default).
    RopeOverrides rope;
    // The run's context per sequence (-c; 0: the model's training context). Only Phi-3's
    // LongRoPE reads it, to pick its long or short factors (select_rope_factors).
    int64_t n_ctx = 0;
    // LoRA adapters applied on top of the weights (--lora, --lora-scaled; lora.h).
    std::vector<LoraSpec> lora;
    // Keep the sliding-window layers' K/V for the whole context in the main pool (llama.cpp's
    // --swa-full) instead of a window pool holding only the window of each sequence.
    bool swa_full = false;
    // Control vectors added to the residual stream after each steered layer (--control-vector;
    // control_vector.h).
    ControlVectorOptions control_vectors;
};

// Tokens a sequence can always roll back by on a model with a window pool (speculative
// rejection, a stop string's cut); the engine caps --draft-n below it.
constexpr int32_t kKvWindowMargin = 64;

// The model's hyperparameters with the options' RoPE overrides applied (what a backend runs).
ModelConfig backend_model_config(const GgufFile& file, const BackendOptions& o);

// Bytes of one layer's K (role K) or V pool block of `block_size` tokens in format t.
int64_t kv_layer_block_bytes(KvType t, KvRole role, int64_t n_kv_head, int64_t block_size,
                             int64_t head_dim);
// Whether V has no pool of its own and reads K's rows, in K's layout (DeepSeek's latent
// attention with the same type for K and V: the latent row serves as both, so it is stored
// once).
bool kv_v_shares_k(const ModelConfig& c, KvType k, KvType v);
// Bytes of one block across all layers, K and V.
int64_t kv_block_bytes(const ModelConfig& c, const BackendOptions& o);
// Bytes of one block of the sliding-window layers only (windowed) or of the others.
int64_t kv_block_bytes(const ModelConfig& c, const BackendOptions& o, bool windowed);
// The KV layout for these options: the main pool's blocks and the window pool. A window pool is
// used for models with sliding-window layers, unless o.swa_full, when it gives more tokens of
// context than one pool would: it holds, per sequence, the window plus the rollback margin plus one
// pass of n_batch tokens; the main pool then holds only the other layers.
struct KvLayout {
    int64_t n_blocks = 0;
    KvWindowPool window;
};
KvLayout kv_layout_for(const ModelConfig& c, const BackendOptions& o);
// Average KV bytes per token (all layers, K and V) for the given storage types and blocks of
// block_size tokens (quantized K carries one scale per channel and block).
double kv_bytes_per_token(const ModelConfig& c, KvType k, KvType v, int64_t block_size = 16);
// Stage slots for these options: 0 unless K or V is quantized.
int64_t kv_stages_for(const BackendOptions& o);
// Bytes of `n_stages` f16 stage slots across all layers, K and V.
int64_t kv_stage_bytes(const ModelConfig& c, const BackendOptions& o, int64_t n_stages);
// The main pool's blocks (kv_layout_for): o.n_kv_blocks when set, else as many as fit in
// o.kv_memory_mib after the stage slots (and the window pool). Throws Error when that is less than
// one block.
int64_t kv_blocks_for(const ModelConfig& c, const BackendOptions& o);
// Whether Q and K are Hadamard-rotated; throws Error when rotation is asked for a head_dim
// that is not a power of two.
bool kv_rotation_enabled(const ModelConfig& c, const BackendOptions& o);
// What of the model the CUDA backend has no kernels for yet ("40 expert groups (at most 32)",
// "heads of 640 dims (at most 576)"), or "" when it runs the whole model.
// The CUDA backend refuses such a model with it; --device auto runs it on the CPU.
std::string cuda_unsupported(const ModelConfig& c);

// Executes the table's pending copies on the backend (call before every forward pass: it
// also closes the pass for the table's stage bookkeeping).
void kv_apply_pending(KvBlockTable& table, Backend& backend);

// Whether layer l's K/V lives in the window pool `w` (a sliding-window layer, and a pool).
inline bool kv_layer_in_window_pool(const ModelConfig& c, const KvWindowPool& w, int64_t l) {
    return w.n_blocks > 0 && c.is_swa(l);
}

// A block table for the backend's pool: its blocks, stage slots and window pool.
KvBlockTable kv_table_for(const Backend& backend);
// Bytes of one block of `pool` for a backend whose window pool is `w` (kv_block_io_bytes).
int64_t kv_pool_block_bytes(const ModelConfig& c, const BackendOptions& o, const KvWindowPool& w,
                            KvPool pool);
// Throws Error naming `what` (read_kv_block, ...) when `block` is outside `pool` (n_main blocks
// in the main pool, w.n_blocks in the window pool).
void kv_block_io_check(const char* what, KvPool pool, int64_t block, int64_t n_main,
                       const KvWindowPool& w);

// Whether layer l's K/V lives in `pool` of a backend whose window pool is `w`.
inline bool kv_layer_in_pool(const ModelConfig& c, const KvWindowPool& w, int64_t l, KvPool pool) {
    return kv_layer_in_window_pool(c, w, l) == (pool == KvPool::Window);
}

// The CPU reference backend. `file` must outlive it (weights stay in the file's mapping).
std::unique_ptr<Backend> make_cpu_backend(const GgufFile& file, const BackendOptions& options);

}  // namespace kvrun
