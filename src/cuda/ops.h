// Host-callable CUDA ops: the GPU twins of src/cpu_ops.h. Same arguments and shape
// contracts, but every pointer (including WeightView::data and the KvLayerView /
// KvBatchView arrays) is device memory, and each op is enqueued on stream `s` (no sync).
// Preconditions are checked on the host (CUDA_REQUIRE: throws kvrun::Error with file:line).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_ops.h"

namespace kvrun {

struct SamplingParams;  // sampler.h

// Per-stream working memory of the CUDA ops plus the cuBLAS handle. get() grows the buffer
// when needed (synchronizing the device); while the stream is being captured into a CUDA
// graph a buffer that is too small throws instead, so call reserve() before capture.
class CudaScratch {
  public:
    CudaScratch() = default;
    ~CudaScratch();
    CudaScratch(const CudaScratch&) = delete;
    CudaScratch& operator=(const CudaScratch&) = delete;

    void* get(size_t bytes, cudaStream_t s);  // device buffer of >= bytes (256-byte aligned)
    void reserve(size_t bytes);               // grow now (outside capture)
    size_t size() const { return size_; }
    void* cublas(cudaStream_t s);  // cublasHandle_t bound to stream s

  private:
    void* buf_ = nullptr;
    size_t size_ = 0;
    void* cublas_ = nullptr;     // cublasHandle_t
    void* cublas_ws_ = nullptr;  // cuBLAS workspace (so GEMMs can be graph-captured)
};

// ---- dense ops (norm_rope_act.cu) --------------------------------------------------------

// out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i];  x,out: [n_rows][dim], w: [dim].
// out may equal x (also for cuda_swiglu's out and gate).
void cuda_rmsnorm(float* out, const float* x, const float* w, int64_t n_rows, int64_t dim,
                  float eps, cudaStream_t s);
// Residual add fused with the next RMSNorm, one launch: x += y, then out = rmsnorm(x) * w
// (x, y, out: [n_rows][dim], w: [dim]). x and out get the same bits as cuda_add(x, y,
// n_rows * dim) followed by cuda_rmsnorm(out, x, w, ...). out may equal y (not x).
void cuda_add_rmsnorm(float* x, const float* y, float* out, const float* w, int64_t n_rows,
                      int64_t dim, float eps, cudaStream_t s);
// cpu::layernorm on the device (b may be null), and the residual add fused with it as
// cuda_add_rmsnorm fuses it: x += y, then out = layernorm(x) (out may equal y, not x).
void cuda_layernorm(float* out, const float* x, const float* w, const float* b, int64_t n_rows,
                    int64_t dim, float eps, cudaStream_t s);
void cuda_add_layernorm(float* x, const float* y, float* out, const float* w, const float* b,
                        int64_t n_rows, int64_t dim, float eps, cudaStream_t s);
// Rows of x as the integer GEMV (cuda_gemv_q8) reads them: elements of elt_bytes (1, or 2
// with cuda_gemv_q16) per 32 with one scale each, made from the f32 rows at x. A matmul given
// one for other rows, or for another element width, quantizes its x itself.
struct CudaXq {
    const float* x = nullptr;  // [n_rows][dim], the rows they were made from
    int8_t* q = nullptr;       // [n_rows][dim] elements
    float* d = nullptr;        // [n_rows][dim / 32] scales
    int elt_bytes = 1;
};
// cuda_rmsnorm / cuda_add_rmsnorm that also write out's rows quantized into xq (xq.x must be
// out; dim % 32 == 0), with the bits the GEMV's own quantization gives, in the same launch for
// rows up to 8192 wide: the decode step's x quantization without launches of its own.
void cuda_rmsnorm_xq(float* out, const float* x, const float* w, int64_t n_rows, int64_t dim,
                     float eps, const CudaXq& xq, cudaStream_t s);
void cuda_add_rmsnorm_xq(float* x, const float* y, float* out, const float* w, int64_t n_rows,
                         int64_t dim, float eps, const CudaXq& xq, cudaStream_t s);
// Adds bias[n] to every row of x: [n_rows][n]
void cuda_add_bias(float* x, const float* bias, int64_t n_rows, int64_t n, cudaStream_t s);
// Adds row ids[r] of bias ([*][n]) to row r of x ([n_rows][n]); ids: device (experts' biases).
void cuda_add_bias_rows(float* x, const float* bias, const int32_t* ids, int64_t n_rows, int64_t n,
                        cudaStream_t s);
// RoPE in place on x: [n_tokens][n_heads][head_dim]; pos: [n_tokens] and p.freq_factors
// (device). See cpu::rope.
void cuda_rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
               const RopeParams& p, cudaStream_t s);
// out[i] = silu(gate[i]) * up[i], n elements.
void cuda_swiglu(float* out, const float* gate, const float* up, int64_t n, cudaStream_t s);
// cpu::swiglu_oai on the device (gpt-oss's clamped SwiGLU).
void cuda_swiglu_oai(float* out, const float* gate, const float* up, int64_t n, float alpha,
                     float limit, cudaStream_t s);
// cpu::geglu, cpu::gelu, cpu::softcap (cap > 0) and cpu::scale on the device.
void cuda_geglu(float* out, const float* gate, const float* up, int64_t n, cudaStream_t s);
void cuda_gelu(float* out, const float* x, int64_t n, cudaStream_t s);
void cuda_softcap(float* x, int64_t n, float cap, cudaStream_t s);
void cuda_scale(float* x, int64_t n, float f, cudaStream_t s);
// Llama 4's attention temperature on q: [n_tokens][width] in place, row t times
// attn_temperature(pos[t], scale, floor_len) (attn_window.h; pos: device).
void cuda_attn_temperature(float* q, const int32_t* pos, int64_t n_tokens, int64_t width,
                           float scale, int64_t floor_len, cudaStream_t s);
// cpu::add_scaled_rows on the device (user: [n_rows] device scales).
void cuda_add_scaled_rows(float* out, const float* y, const float* user, int64_t n_rows, int64_t n,
                          double per_unit, cudaStream_t s);
// x[i] += y[i], n elements.
void cuda_add(float* x, const float* y, int64_t n, cudaStream_t s);
// cpu::add_sigmoid_gated on the device (g: [n_rows] device gate logits).
void cuda_add_sigmoid_gated(float* x, const float* y, const float* g, int64_t n_rows, int64_t n,
                            cudaStream_t s);
// Numerically stable softmax in place over each row of x: [n_rows][n]
void cuda_softmax(float* x, int64_t n_rows, int64_t n, cudaStream_t s);
// Strided row copy: (out + r * out_stride)[0, width) = (x + r * x_stride)[0, width) for
// r < n_rows (no overlap). DeepSeek's latent attention moves each head's slices with it.
void cuda_copy_rows(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                    int64_t n_rows, int64_t width, cudaStream_t s);
// DeepSeek's cached rows: kv_a [n_tokens][rank + n_rot] (the compressed KV c, then k_pe) ->
// k [n_tokens][n_rot + rank] = [k_pe | rmsnorm(c) * w] (w: [rank]; k must not alias kv_a).
void cuda_mla_kv_rows(float* k, const float* kv_a, const float* w, int64_t n_tokens, int64_t rank,
                      int64_t n_rot, float eps, cudaStream_t s);
// out[r][:] = x[rows[r]][:]; out: [n_rows][dim], rows: [n_rows] valid row ids (device).
void cuda_gather_rows(float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t dim,
                      cudaStream_t s);

// ---- weights (dequant.cu, gemv.cu, gemm.cu) ----------------------------------------------

// Weight types the CUDA kernels compute with: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0.
bool cuda_supports_weight_type(GgmlType t);

// out[t][:] = dequantized row tokens[t] of the table; out: [n_tokens][n_embd], tokens on
// the device. A token id outside [0, n_out) yields a zero row (validate ids on the host).
void cuda_embed(float* out, const WeightView& table, const int32_t* tokens, int64_t n_tokens,
                cudaStream_t s);
// Dequantizes rows [row0, row0 + n_rows) of w to half: out [n_rows][w.n_in] (__half bits).
void cuda_dequantize_f16(uint16_t* out, const WeightView& w, int64_t row0, int64_t n_rows,
                         cudaStream_t s);

// Largest n_rows for which cuda_matmul uses the fused dequantize x vector kernel. Each row
// is computed the same way whatever the number of rows, so a speculative verification pass
// of up to 16 tokens (--draft-n <= 15) gives the logits of single-token decode steps bit
// for bit; and at these sizes reading the quantized weights once beats dequantizing them
// to f16 for a GEMM (which writes and reads 2 bytes per weight).
constexpr int64_t kCudaGemvMaxRows = 16;
// out[r][o] = sum_i x[r][i] * W[o][i];  x: [n_rows][n_in], out: [n_rows][n_out].
// n_rows <= kCudaGemvMaxRows: fused GEMV (f32 accumulate, weights read once); larger:
// weights dequantized tile-wise to f16 and multiplied with cuBLAS on tensor cores (f32
// accumulate; F32 weights use f32 SGEMM).
// xq: x already quantized for the integer GEMV (CudaXq), when it runs.
void cuda_matmul(float* out, const float* x, const WeightView& w, int64_t n_rows,
                 CudaScratch& scratch, cudaStream_t s, const CudaXq* xq = nullptr);
// The two paths, callable directly (tests, benchmarks). cuda_gemv takes any n_rows.
void cuda_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s);
// cuda_gemv with the matmuls' scratch buffer, where the 8-bit activation path keeps x's bytes.
void cuda_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows,
               CudaScratch& scratch, cudaStream_t s, const CudaXq* xq = nullptr);
// The 8-bit activation GEMV (gemv.cu; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K
// and IQ4_XS weights; float types, Q2_K, Q3_K and MXFP4 keep the f32 kernel): x quantized per 32
// elements, integer dot products. Opt-in while it awaits its timing on a GPU: on with the
// environment variable KVRUN_GEMV=q8, or cuda_set_gemv_q8. Only the matmuls given a scratch buffer
// (cuda_matmul, _qkv, _swiglu, _geglu) take it.
void cuda_set_gemv_q8(bool on);
bool cuda_gemv_q8();  // the integer kernel (8- or 16-bit x) is on
// The same integer kernel with x as int16s per 32 elements (d = max|x| / 32767; dp2a, two
// instructions per 4 weights): x's rounding ~256x finer than the 8-bit path's, for a GEMV
// as close to the f32 path as its greedy tokens need. Opt-in until timed on a GPU:
// KVRUN_GEMV=q16, or cuda_set_gemv_q16 (which turns the 8-bit choice off, and back).
void cuda_set_gemv_q16(bool on);
bool cuda_gemv_q16();
// GEMV weight prefetch (gemv.cu): each warp asks L2 for its whole weight rows before the
// kernel waits for its predecessor (with KVRUN_PDL=on, while that one still runs) and walks
// them. Opt-in until timed on a GPU: KVRUN_GEMV_PREFETCH=on, or cuda_set_gemv_prefetch. Same
// bits either way.
void cuda_set_gemv_prefetch(bool on);
bool cuda_gemv_prefetch();
// GEMV split-K (gemv.cu): launches of few blocks (llama2-7b's output and down projections:
// 256) give each row pair to 2, 4 or 8 warps, each summing a share of the items, for more
// loads in flight. 1 (default, until timed on a GPU): off; 0: auto (up to 1024 blocks);
// 2/4/8: that split. KVRUN_GEMV_SPLIT=1|2|4|8|auto, or cuda_set_gemv_split. Changes the
// order of summation (not the row-count independence).
void cuda_set_gemv_split(int split);
int cuda_gemv_split();
// Whether the integer GEMV decodes weights of type t (else the f32 kernel runs for them).
bool cuda_gemv_int_type(GgmlType t);
// x ([n_rows][n_in], n_in % 32 == 0) quantized into xq as the integer GEMV does it.
void cuda_quantize_x(const float* x, int64_t n_rows, int64_t n_in, const CudaXq& xq,
                     cudaStream_t s);
void cuda_gemm(float* out, const float* x, const WeightView& w, int64_t n_rows,
               CudaScratch& scratch, cudaStream_t s);
// cuda_matmul of x with wq, wk and wv into q, k and v. Up to kCudaGemvMaxRows rows,
// matrices of one weight type and width share one GEMV launch (same bits as three calls).
// xq: x already quantized (cuda_add_rmsnorm_xq) for the integer GEMV, when it runs.
void cuda_matmul_qkv(float* q, float* k, float* v, const float* x, const WeightView& wq,
                     const WeightView& wk, const WeightView& wv, int64_t n_rows,
                     CudaScratch& scratch, cudaStream_t s, const CudaXq* xq = nullptr);
// Mixture of experts: n_jobs GEMVs of one activation row each. Job j multiplies x row
// j / x_div ([*][n_in]) by expert ids[j] (device memory, in [0, n_expert)) of the experts
// stacked expert_bytes apart from expert0 (expert 0's view, device memory) into out row j
// ([n_jobs][expert0.n_out]); the _swiglu form writes silu(x G^T) * (x U^T) for the gate
// and up experts (same shape and stacking). Capturable: the ids are read on the device.
// With a scratch buffer the 8-bit activation path (cuda_set_gemv_q8) may run there. Each
// product is times the view's scale, or with scales (device, [n_expert]: per-expert
// WeightView::scale) its expert's.
void cuda_gemv_experts(float* out, const float* x, const WeightView& expert0, size_t expert_bytes,
                       const int32_t* ids, int64_t n_jobs, int x_div, cudaStream_t s,
                       CudaScratch* scratch = nullptr, const float* scales = nullptr);
void cuda_gemv_experts_swiglu(float* out, const float* x, const WeightView& gate0,
                              const WeightView& up0, size_t expert_bytes, const int32_t* ids,
                              int64_t n_jobs, int x_div, cudaStream_t s,
                              CudaScratch* scratch = nullptr, const float* gate_scales = nullptr,
                              const float* up_scales = nullptr);
// How a router turns logits into choices and weights (ModelConfig's moe_*): a gate per expert,
// its softmax probability or (GLM 4.5) its sigmoid; the
// choice by gate + select_bias[e] (device, [n_expert], or null: ERNIE 4.5's and GLM's), the
// weights the gates over their sum when norm; then times scale. n_group > 1 (DeepSeek V3's
// expert groups, cpu::limit_expert_groups): the choice only among the experts of the
// n_group_used groups of n_expert / n_group whose two best choice values sum highest.
struct MoeRouting {
    bool sigmoid = false;
    const float* select_bias = nullptr;
    bool norm = true;
    float scale = 1.0f;
    int n_group = 0, n_group_used = 0;  // n_group <= kCudaMoeMaxGroups
};
constexpr int kCudaMoeMaxGroups = 32;
// The router's choice per token (logits [n_tokens][n_expert]): the k largest (ties: the
// lower id) into ids [n_tokens][k], in decreasing order, with weights [n_tokens][k] = their
// softmax probabilities renormalized to sum 1 (or as `r` says).
void cuda_moe_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, int32_t* ids,
                   float* weights, cudaStream_t s, const MoeRouting& r = {});
// out[t][:] = sum over j < k of weights[t][j] * rows[t * k + j][:] ([n_tokens][dim]); with
// row_of (device, [n_tokens * k]) the row is rows[row_of[t * k + j]] instead; weights null:
// all 1 (Llama 4, whose weights scaled the inputs).
void cuda_moe_combine(float* out, const float* rows, const float* weights, int64_t n_tokens,
                      int64_t k, int64_t dim, cudaStream_t s, const int32_t* row_of = nullptr);
// One layer's experts: expert 0 of each stacked tensor (device memory), the others
// expert_bytes (gate, up) and down_bytes (down) apart.
struct MoeExperts {
    WeightView gate0, up0, down0;  // [F][D], [F][D], [D][F]
    size_t expert_bytes = 0, down_bytes = 0;
    // gpt-oss: every expert's biases (device: [n_expert][F], [n_expert][F], [n_expert][D], or
    // all null) and the clamped SwiGLU (cuda_swiglu_oai with alpha, limit) instead of SiLU's.
    const float *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;
    bool swiglu_oai = false;
    float alpha = 1.702f, limit = 7.0f;
    // Per-expert factors (each expert's WeightView::scale, when they differ: NVFP4
    // checkpoints): device [n_expert] each, and their host copies for the grouped prefill;
    // null / empty: every expert has its view's scale.
    const float *gate_s = nullptr, *up_s = nullptr, *down_s = nullptr;
    std::vector<float> gate_s_host, up_s_host, down_s_host;
};
// Decode-sized batches of biased experts (ex.gate_b set): out row j ([n_jobs][D]) = expert
// ids[j]'s down(act(gate x + gate_b, up x + up_b)) + down_b for x row j / x_div, by
// expert-indexed GEMVs and id-indexed bias adds (capturable). h and up: [n_jobs][F].
void cuda_moe_experts_biased(float* out, float* h, float* up, const float* x, const int32_t* ids,
                             int64_t n_jobs, int x_div, const MoeExperts& ex, cudaStream_t s);
// Device working memory of cuda_moe_ffn_grouped for n_jobs = n_tokens * k.
struct MoeGroupedBuffers {
    float* xs = nullptr;     // [n_jobs][D]
    float* h = nullptr;      // [n_jobs][F]
    float* up = nullptr;     // [n_jobs][F]
    int32_t* map = nullptr;  // [2 * n_jobs]
};
// The experts' SwiGLU feed-forward for prefill-sized batches, with the router's choice ids /
// weights from cuda_moe_topk: out[t] = sum over j of weights[t][j] * down_e(silu(gate_e x[t])
// * up_e x[t]), e = ids[t][j] (biased experts: cuda_moe_experts_biased's expert outputs, from
// separate products, bias adds and activation). The tokens are grouped by expert on the host, so
// each expert runs one cuda_matmul_swiglu and one cuda_matmul over its tokens: its weights are read
// once (fused GEMV, same bits as the expert-indexed GEMVs, up to kCudaGemvMaxRows tokens) or
// dequantized once for a tensor-core GEMM (more tokens) instead of once per token.
// out may equal x. Synchronizes the stream (the ids are read on the host): not capturable.
// weight_inputs (Llama 4): each job's weight scales its gathered input row instead of its
// output (the sum is then unweighted).
void cuda_moe_ffn_grouped(float* out, const float* x, const int32_t* ids, const float* weights,
                          int64_t n_tokens, int64_t k, int64_t n_expert, const MoeExperts& ex,
                          const MoeGroupedBuffers& buf, CudaScratch& scratch, cudaStream_t s,
                          bool weight_inputs = false);
// Llama 4's weighted expert inputs: out[j][:] = weights[j] * x[j / k][:] for the n_jobs = n_tokens
// * k jobs (out: [n_jobs][dim], not x); with pos (device, [n_jobs]) instead row pos[j] of out
// is scaled by weights[j] in place (x unused: the grouped rows).
void cuda_moe_weight_rows(float* out, const float* x, const float* weights, int64_t n_jobs,
                          int64_t k, int64_t dim, cudaStream_t s, const int32_t* pos = nullptr);
// out = silu(x W_gate^T) * (x W_up^T): [n_rows][gate.n_out]. Up to kCudaGemvMaxRows rows with
// gate and up of one type and shape: one GEMV launch whose warps compute a gate row and the
// matching up row and write the product (same bits as two cuda_matmul calls and
// cuda_swiglu); otherwise exactly those, with up_buf ([n_rows][up.n_out]) for the up rows.
// xq as for cuda_matmul_qkv.
void cuda_matmul_swiglu(float* out, float* up_buf, const float* x, const WeightView& gate,
                        const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s,
                        const CudaXq* xq = nullptr);
// The same with gelu(x W_gate^T) * (x W_up^T) (Gemma's GeGLU; cuda_geglu's bits).
void cuda_matmul_geglu(float* out, float* up_buf, const float* x, const WeightView& gate,
                       const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s,
                       const CudaXq* xq = nullptr);

// ---- paged KV cache (kv_write.cu, attention_*.cu) ----------------------------------------

// cpu::kv_write's contract: unstaged f32/f16 pools get the rows directly; a staged
// (quantized) cache gets them in the tokens' f16 stages, and every block whose last row is
// written is sealed into the pool (same bytes as kv_encode_head_block). block_size <= 256.
// seal = false: the caller knows that no token of the batch writes the last row of its block
// (the CUDA backend checks its batch), and the seal launch is left out: a decode step of one
// sequence needs it once in block_size steps. kv.v_is_k: K alone is stored (v is ignored).
// cuda_kv_copy and cuda_rope_kv_write likewise leave V to K under kv.v_is_k.
void cuda_kv_write(const KvLayerView& kv, const KvBatchView& batch, const float* k, const float* v,
                   cudaStream_t s, bool seal = true);
// cuda_rope on q: [n_tokens][n_head][head_dim] and on k: [n_tokens][n_kv_head][head_dim]
// (in place, pos: [n_tokens]), then cuda_kv_write(kv, batch, k, v), fused: one launch for
// f32/f16 caches, two for staged ones (the rotated K and V rows into the stages, then the
// completed K and V blocks sealed together). q, k and the cache get the same bits as the
// three unfused calls. n_head a multiple of kv.n_kv_head. A Hadamard rotation of q and k
// between RoPE and the write (kv_rotation_enabled) needs the unfused calls.
// seal as for cuda_kv_write.
void cuda_rope_kv_write(float* q, float* k, const float* v, const int32_t* pos,
                        const KvLayerView& kv, const KvBatchView& batch, int64_t n_head,
                        const RopeParams& rope, cudaStream_t s, bool seal = true);
// cpu::kv_copy's contract (one queued BlockCopy on one layer).
void cuda_kv_copy(const KvLayerView& kv, int64_t src, int64_t dst, int64_t src_stage,
                  int64_t dst_stage, int64_t n_rows, cudaStream_t s);
// hadamard_rows (kv_format.h) in place on x: [n_rows][n]; n a power of two <= 1024.
void cuda_hadamard(float* x, int64_t n_rows, int64_t n, cudaStream_t s);
// Paged causal attention, cpu::paged_attention's contract (f32/f16/q8/q4 pools; with
// staging a token's own block comes from its stage). q, out: [n_tokens][n_head][head_dim].
// head_dim <= 576, any block_size >= 1. Few tokens: one thread block per (token, KV head,
// context split) with split-K merge; many tokens: flash-style query tiles. Heads wider than
// 256 and a V that reads K's rows (kv.v_is_k: DeepSeek's latent rows) take the tiled kernel,
// which then uses its K tile as the V tile. softcap > 0 and
// window > 0 as in cpu::paged_attention (Gemma); the kernels skip tiles before the window.
// sinks (device, [n_head], or null): gpt-oss's attention sinks, as in cpu::paged_attention.
// With xq (its x must be out), out is also quantized there for the integer GEMV of the
// output projection: by the decode kernel or its merge in the same launch (head_dim % 32 ==
// 0), else by cuda_quantize_x after.
void cuda_paged_attention(float* out, const float* q, const KvLayerView& kv,
                          const KvBatchView& batch, int64_t n_head, float scale,
                          CudaScratch& scratch, cudaStream_t s, float softcap = 0.0f,
                          int64_t window = 0, const float* sinks = nullptr,
                          const CudaXq* xq = nullptr);
// The kernels, callable directly (tests): each accepts any batch. _prefill picks _flash
// (tensor cores, f16 q and P: about 1e-7 NMSE from the f32 reference) where
// cuda_flash_attention_supports(kv) and KVRUN_PREFILL_ATTN is not 'f32', else _tiled (f32).
void cuda_paged_attention_decode(float* out, const float* q, const KvLayerView& kv,
                                 const KvBatchView& batch, int64_t n_head, float scale,
                                 CudaScratch& scratch, cudaStream_t s, float softcap = 0.0f,
                                 int64_t window = 0, const float* sinks = nullptr,
                                 const CudaXq* xq = nullptr);
void cuda_paged_attention_prefill(float* out, const float* q, const KvLayerView& kv,
                                  const KvBatchView& batch, int64_t n_head, float scale,
                                  cudaStream_t s, float softcap = 0.0f, int64_t window = 0,
                                  const float* sinks = nullptr);
void cuda_paged_attention_tiled(float* out, const float* q, const KvLayerView& kv,
                                const KvBatchView& batch, int64_t n_head, float scale,
                                cudaStream_t s, float softcap = 0.0f, int64_t window = 0,
                                const float* sinks = nullptr);
// head_dim 64, 96 or 128 and neither pool f32 (throws otherwise).
void cuda_paged_attention_flash(float* out, const float* q, const KvLayerView& kv,
                                const KvBatchView& batch, int64_t n_head, float scale,
                                cudaStream_t s, float softcap = 0.0f, int64_t window = 0,
                                const float* sinks = nullptr);
bool cuda_flash_attention_supports(const KvLayerView& kv);
// d: [16][8] f32 = a: [16][16] times b: [16][8] (row-major f16 bits) through the flash
// kernel's tensor-core helper (cu::mma_16816, mma.cuh): checks its fragment layout (tests).
void cuda_mma_16816_tile(float* d, const uint16_t* a, const uint16_t* b, cudaStream_t s);

// ---- sampling (sampling.cu) ---------------------------------------------------------------

// Filters follow llama.cpp's chain order: top-k, then top-p and min-p on the temperature-1
// distribution, then temperature. temperature <= 0 means greedy (argmax).
struct CudaSamplerConfig {
    float temperature = 1.0f;
    int32_t top_k = 0;   // <= 0: off
    float top_p = 1.0f;  // >= 1: off
    float min_p = 0.0f;  // <= 0: off
};

// out[r] = index of the largest logits[r][:] (lowest index on ties); logits: [n_rows][n_vocab]
void cuda_argmax(int32_t* out, const float* logits, int64_t n_rows, int64_t n_vocab,
                 cudaStream_t s);
// Samples one token per row given uniform numbers u[n_rows] in [0, 1) (device): the token
// Sampler::sample_with (sampler.h, without repetition penalty) picks for the same uniform
// number; cuda_sample_rows with one configuration for every row (see there).
void cuda_sample(int32_t* out, const float* logits, int64_t n_rows, int64_t n_vocab,
                 const CudaSamplerConfig& cfg, const float* u, cudaStream_t s);
// Repetition penalty (llama.cpp rule) on logits[n_vocab] for each distinct id in
// tokens[n_tokens] (device): logit > 0 ? logit / penalty : logit * penalty.
void cuda_repeat_penalty(float* logits, int64_t n_vocab, const int32_t* tokens, int64_t n_tokens,
                         float penalty, cudaStream_t s);

// One row of cuda_sample_rows: Sampler's parameters (sampler.h) and its uniform number.
struct CudaSampleRow {
    double u = 0.0;               // uniform number in [0, 1) (ignored when greedy)
    float temperature = 0.0f;     // <= 0: greedy
    int32_t top_k = 0;            // <= 0 or >= n_vocab: off
    float top_p = 1.0f;           // >= 1: off
    float min_p = 0.0f;           // <= 0: off
    float log_min_p = 0.0f;       // std::log(min_p) on the host, as Sampler computes it
    float repeat_penalty = 1.0f;  // applied to penalty_ids[penalty_begin, + penalty_count)
    // Then logit -= count * frequency_penalty + presence_penalty; when either is non-zero,
    // penalty_ids[penalty_begin + penalty_count + j] holds the count of the j-th id.
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int32_t penalty_begin = 0;
    int32_t penalty_count = 0;  // distinct ids (Sampler penalizes each id once)
    // Before the penalties: logit += bias for the distinct ids penalty_ids[bias_begin, +
    // bias_count), whose biases' float bits follow them (penalty_ids[bias_begin + bias_count
    // + j]).
    int32_t bias_begin = 0;
    int32_t bias_count = 0;
};

// One launch for all rows (a thread block per row): out[r] = the token Sampler::sample_with
// picks from logits[r][:] with rows[r]'s parameters and uniform number, or -1 when no logit
// of the row is finite (Sampler throws there). rows [n_rows] and penalty_ids are device
// arrays. The penalty is applied to logits in place. Semantics, as in Sampler: NaN counts as
// -inf and +inf as the largest float; greedy: argmax of the penalized logits, lowest id on
// ties; else the candidates are the finite logits, top-k keeps the k best (higher logit, then
// lower id first, so ties at the k-th are cut by id), top-p the shortest head of that order
// whose untempered probability mass reaches top_p, min-p the logits >= max + log(min_p), and
// the token is drawn by inverse CDF in vocabulary order over the float probabilities
// exp((logit - max) / temperature) / sum (computed in double, like Sampler).
void cuda_sample_rows(int32_t* out, float* logits, int64_t n_rows, int64_t n_vocab,
                      const CudaSampleRow* rows, const int32_t* penalty_ids, cudaStream_t s);

// Host side of cuda_sample_rows (device.cpp): the row for Sampler parameters p (checked by
// the caller: sampling_validate) and uniform number u. Logit biases go into penalty_ids
// (merged_logit_bias: ids, then float bits). When the repetition penalty is on,
// appends the distinct ids among the last repeat_last_n entries of recent[n_recent] (the ids
// Sampler penalizes) to penalty_ids, followed by their counts when a frequency or presence
// penalty is on, and points the row at them. Throws Error like Sampler for a penalized id
// outside [0, n_vocab).
CudaSampleRow cuda_sample_row(const SamplingParams& p, double u, const int32_t* recent,
                              size_t n_recent, int64_t n_vocab, std::vector<int32_t>& penalty_ids);

}  // namespace kvrun
