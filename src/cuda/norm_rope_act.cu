// Small dense ops of the forward pass: RMSNorm, residual add + RMSNorm, LayerNorm (with the
// add), softmax (one block per row), RoPE (one thread per rotated pair), SwiGLU, GeGLU, soft cap,
// scale, residual add, bias add and row gather (one thread per element).
#include <algorithm>
#include <cstdint>

#include "attn_window.h"
#include "cuda/common.cuh"
#include "cuda/ops.h"
#include "cuda/rope.cuh"

namespace kvrun {
namespace {

constexpr int kRowThreads = 256;
constexpr int kEltThreads = 256;

unsigned elt_blocks(int64_t n) {
    return unsigned(cu::ceil_div(n, kEltThreads));
}

// Row kernels keep kRowUnroll loads in flight per thread: a row of a decode step sits in L2
// at best, and a loop that waits for each load before the next (the compiler cannot hoist
// loads above stores that might alias them) took ~16 us per 4096-wide row on an H100
// (ncu, 2026-11-27), a fifth of a 7B decode step. Each thread still visits its elements
// i = t, t + blockDim, ... in order and sums them in that order, so the bits are unchanged.
constexpr int kRowUnroll = 8;

// outr[i] = xr[i] * inv * w[i] over the row, this thread's elements (read before written,
// so outr may alias xr).
__device__ __forceinline__ void scale_row(float* outr, const float* xr, const float* __restrict__ w,
                                          int64_t dim, float inv) {
    const int64_t step = blockDim.x;
    for (int64_t i0 = threadIdx.x; i0 < dim; i0 += kRowUnroll * step) {
        float v[kRowUnroll], g[kRowUnroll];
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
            const int64_t i = i0 + u * step;
            v[u] = i < dim ? xr[i] : 0.0f;
            g[u] = i < dim ? w[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
            const int64_t i = i0 + u * step;
            if (i < dim) outr[i] = v[u] * inv * g[u];
        }
    }
}

// out, x: [n_rows][dim], w: [dim]; one block per row. out may alias x (each thread reads
// its elements before writing them).
__global__ void rmsnorm_kernel(float* out, const float* x, const float* __restrict__ w, int64_t dim,
                               float eps) {
    cu::pdl_begin();
    __shared__ float scratch[32];
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* outr = out + int64_t(blockIdx.x) * dim;
    const int64_t step = blockDim.x;
    float ss = 0.0f;
    for (int64_t i0 = threadIdx.x; i0 < dim; i0 += kRowUnroll * step) {
        float v[kRowUnroll];
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
            const int64_t i = i0 + u * step;
            v[u] = i < dim ? xr[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
            if (i0 + u * step < dim) ss += v[u] * v[u];
    }
    ss = cu::block_sum(ss, scratch);
    scale_row(outr, xr, w, dim, rsqrtf(ss / float(dim) + eps));
}

// x += y, then out = rmsnorm(x) * w (x, y, out: [n_rows][dim], w: [dim]); one block per
// row. The sum of squares runs in rmsnorm_kernel's order (same block size, thread
// striding and block_sum, each term an FMA of the stored x) so x and out get the bits of
// add_kernel followed by rmsnorm_kernel. out may equal y (a thread writes only the out
// elements whose y it has read, before the block_sum barrier), not x.
__global__ void add_rmsnorm_kernel(float* x, const float* y, float* out,
                                   const float* __restrict__ w, int64_t dim, float eps) {
    cu::pdl_begin();
    __shared__ float scratch[32];
    float* xr = x + int64_t(blockIdx.x) * dim;
    const float* yr = y + int64_t(blockIdx.x) * dim;
    float* outr = out + int64_t(blockIdx.x) * dim;
    const int64_t step = blockDim.x;
    float ss = 0.0f;
    for (int64_t i0 = threadIdx.x; i0 < dim; i0 += kRowUnroll * step) {
        float a[kRowUnroll], b[kRowUnroll];
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
            const int64_t i = i0 + u * step;
            a[u] = i < dim ? xr[i] : 0.0f;
            b[u] = i < dim ? yr[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
            const int64_t i = i0 + u * step;
            if (i < dim) {
                const float v = a[u] + b[u];
                xr[i] = v;
                ss += v * v;
            }
        }
    }
    ss = cu::block_sum(ss, scratch);
    scale_row(outr, xr, w, dim, rsqrtf(ss / float(dim) + eps));
}

// With y: x += y first (stored). Then out = (x - mean) / sqrt(var + eps) * w (+ b when b is not
// null) over each row (x, y, out: [n_rows][dim]); one block per row, the mean and the centred
// sum of squares each a block sum. A thread touches only its own elements, so out may equal y
// (add) or x (no add).
__global__ void layernorm_kernel(float* x, const float* y, float* out, const float* __restrict__ w,
                                 const float* __restrict__ b, int64_t dim, float eps) {
    cu::pdl_begin();
    __shared__ float scratch[32];
    float* xr = x + int64_t(blockIdx.x) * dim;
    float* outr = out + int64_t(blockIdx.x) * dim;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (y) {
            v += y[int64_t(blockIdx.x) * dim + i];
            xr[i] = v;
        }
        sum += v;
    }
    const float mean = cu::block_sum(sum, scratch) / float(dim);
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] - mean;
        sq += v * v;
    }
    const float inv = rsqrtf(cu::block_sum(sq, scratch) / float(dim) + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = (xr[i] - mean) * inv * w[i];
        outr[i] = b ? v + b[i] : v;
    }
}

// Rows of up to kRegPer * 1024 elements (every decode-step norm of the supported models):
// each thread keeps its per = ceil(dim / blockDim) elements (t, t + blockDim, ...) in
// registers, loads its w with them, before waiting for the previous kernel (w is a weight),
// and reads x (and y) once: one memory round trip before the block sum instead of the loops
// above (two or more for a 4096-wide row). The block size is a function of dim alone
// (reg_row_threads), so a row's bits do not depend on the number of rows. With kAdd: x += y
// first (stored), then out = rmsnorm(x) * w, as add_rmsnorm_kernel. out may alias x (no add)
// or y (add). With kQBytes (1 or 2; dim % 32 == 0) out is also quantized for the integer GEMV
// into xq / xd: for each k a warp holds 32 consecutive elements of one 32-element block (the
// block size is a multiple of 32): cu::quantize_x_store.
constexpr int kRegPer = 8;
template <bool kAdd, int kQBytes>
__global__ void rmsnorm_reg_kernel(float* x, const float* y, float* out,
                                   const float* __restrict__ w, int64_t dim, float eps, int per,
                                   int8_t* __restrict__ xq, float* __restrict__ xd) {
    __shared__ float scratch[32];
    float v[kRegPer], g[kRegPer];
    const int64_t step = blockDim.x;
#pragma unroll
    for (int k = 0; k < kRegPer; ++k) {
        const int64_t i = threadIdx.x + k * step;
        g[k] = k < per && i < dim ? w[i] : 0.0f;
    }
    cu::pdl_begin();
    float* xr = x + int64_t(blockIdx.x) * dim;
    float* outr = out + int64_t(blockIdx.x) * dim;
#pragma unroll
    for (int k = 0; k < kRegPer; ++k) {
        const int64_t i = threadIdx.x + k * step;
        v[k] = k < per && i < dim ? xr[i] : 0.0f;
        if constexpr (kAdd) {
            if (k < per && i < dim) v[k] += y[int64_t(blockIdx.x) * dim + i];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kRegPer; ++k) {
        const int64_t i = threadIdx.x + k * step;
        if (k < per && i < dim) {
            if constexpr (kAdd) xr[i] = v[k];
            ss += v[k] * v[k];
        }
    }
    ss = cu::block_sum(ss, scratch);
    const float inv = rsqrtf(ss / float(dim) + eps);
#pragma unroll
    for (int k = 0; k < kRegPer; ++k) {
        const int64_t i = threadIdx.x + k * step;
        const float o = v[k] * inv * g[k];
        if (k < per && i < dim) outr[i] = o;
        if constexpr (kQBytes > 0) {
            if (k < per && i - threadIdx.x % 32 < dim)  // whole warps (dim % 32 == 0)
                cu::quantize_x_store(o, int64_t(blockIdx.x) * dim + i, xq, xd, kQBytes);
        }
    }
}

// rmsnorm_reg_kernel's block size for rows of dim: ~4 elements per thread, whole warps, at
// most 1024 threads; 0 when a row needs more than kRegPer per thread (the loop kernels).
int reg_row_threads(int64_t dim) {
    const int64_t t = std::min<int64_t>(1024, cu::ceil_div(cu::ceil_div(dim, 4), 32) * 32);
    return cu::ceil_div(dim, t) <= kRegPer ? int(t) : 0;
}

// x: [n_rows][n] softmax in place; one block per row.
__global__ void softmax_kernel(float* __restrict__ x, int64_t n) {
    cu::pdl_begin();
    __shared__ float scratch[32];
    float* xr = x + int64_t(blockIdx.x) * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i]);
    mx = cu::block_max(mx, scratch);
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(xr[i] - mx);
        xr[i] = e;
        sum += e;
    }
    sum = cu::block_sum(sum, scratch);
    const float inv = 1.0f / sum;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

// x: [n_tokens][n_heads][head_dim]; one thread per rotated pair (t, h, i), i < n_rot / 2.
// The math is rope.cuh's (shared with the fused RoPE + KV write of kv_write.cu).
__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos,
                            int64_t n_tokens, int64_t n_heads, int64_t head_dim, RopeParams p) {
    cu::pdl_begin();
    const int64_t half = p.n_rot / 2;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_heads * half) return;
    const int64_t i = idx % half, th = idx / half, t = th / n_heads;
    const float2 cs = cu::rope_cos_sin(p, pos[t], i);
    float* head = x + th * head_dim;
    const int2 ab = cu::rope_pair(int(i), p.n_rot, p.neox);
    const float2 y = cu::rope_rotate(head[ab.x], head[ab.y], cs);
    head[ab.x] = y.x;
    head[ab.y] = y.y;
}

// out may alias gate or up (elementwise).
__global__ void swiglu_kernel(float* out, const float* gate, const float* up, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = cu::silu_mul(gate[i], up[i]);
}

// cpu::swiglu_oai's arithmetic: x = min(gate, limit), y = clamp(up, -limit, limit),
// x / (1 + exp(-alpha x)) * (y + 1). out may alias gate or up.
__global__ void swiglu_oai_kernel(float* out, const float* gate, const float* up, int64_t n,
                                  float alpha, float limit) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = fminf(gate[i], limit), y = fminf(fmaxf(up[i], -limit), limit);
    out[i] = x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
}

__global__ void geglu_kernel(float* out, const float* gate, const float* up, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = cu::gelu_mul(gate[i], up[i]);
}

// out may alias x (elementwise).
__global__ void gelu_kernel(float* out, const float* x, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = cu::gelu_mul(x[i], 1.0f);
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void scale_kernel(float* x, int64_t n, float f) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}

__global__ void attn_temperature_kernel(float* x, const int32_t* __restrict__ pos, int64_t n,
                                        int64_t width, float scale, int64_t floor_len) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= attn_temperature(pos[i / width], scale, floor_len);
}

__global__ void add_scaled_rows_kernel(float* __restrict__ out, const float* __restrict__ y,
                                       const float* __restrict__ user, int64_t n_rows, int64_t n,
                                       double per_unit) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * n) return;
    const float s = static_cast<float>(double(user[i / n]) * per_unit);  // lora_row_scale
    out[i] += __fmul_rn(s, y[i]);  // rounded before the sum, as on the host
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x: [n_rows][n] += sigmoid(g[row]) * y (cpu::add_sigmoid_gated; expf, rounded like std::exp
// to within an ulp or two)
__global__ void add_sigmoid_gated_kernel(float* __restrict__ x, const float* __restrict__ y,
                                         const float* __restrict__ g, int64_t n_rows, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * n) return;
    const float s = 1.0f / (1.0f + expf(-g[i / n]));
    x[i] += __fmul_rn(s, y[i]);
}

// x: [n_rows][n] += bias[n]
__global__ void add_bias_kernel(float* __restrict__ x, const float* __restrict__ bias,
                                int64_t n_rows, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n_rows * n) x[i] += bias[i % n];
}

// x: [n_rows][n] += bias[ids[r]][n] for row r (expert biases by the router's choice).
__global__ void add_bias_rows_kernel(float* __restrict__ x, const float* __restrict__ bias,
                                     const int32_t* __restrict__ ids, int64_t n_rows, int64_t n) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n_rows * n) x[i] += bias[int64_t(ids[i / n]) * n + i % n];
}

// out[r][:] = x[rows[r]][:]; out: [n_rows][dim], one thread per element.
__global__ void gather_rows_kernel(float* __restrict__ out, const float* __restrict__ x,
                                   const int32_t* __restrict__ rows, int64_t n_rows, int64_t dim) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n_rows * dim) out[i] = x[int64_t(rows[i / dim]) * dim + i % dim];
}

// out row r (out + r * out_stride)[0, width) = x row r (x + r * x_stride)[0, width); one
// thread per element.
__global__ void copy_rows_kernel(float* __restrict__ out, int64_t out_stride,
                                 const float* __restrict__ x, int64_t x_stride, int64_t n_rows,
                                 int64_t width) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * width) return;
    const int64_t r = i / width, c = i % width;
    out[r * out_stride + c] = x[r * x_stride + c];
}

// DeepSeek's cached row of each token, one block per token: kv_a row [rank + n_rot] (the
// compressed KV c, then k_pe) -> k row [n_rot + rank] = [k_pe | rmsnorm(c) * w], the norm
// summed as rmsnorm_kernel sums it.
__global__ void mla_kv_rows_kernel(float* __restrict__ k, const float* __restrict__ kv_a,
                                   const float* __restrict__ w, int64_t rank, int64_t n_rot,
                                   float eps) {
    cu::pdl_begin();
    __shared__ float scratch[32];
    const float* src = kv_a + int64_t(blockIdx.x) * (rank + n_rot);
    float* dst = k + int64_t(blockIdx.x) * (rank + n_rot);
    for (int64_t i = threadIdx.x; i < n_rot; i += blockDim.x) dst[i] = src[rank + i];
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < rank; i += blockDim.x) ss += src[i] * src[i];
    ss = cu::block_sum(ss, scratch);
    scale_row(dst + n_rot, src, w, rank, rsqrtf(ss / float(rank) + eps));
}

// One block per row of x: [n_rows][n], n a power of two <= 1024: the butterflies of a fast
// Walsh-Hadamard transform in shared memory (in hadamard_rows' order), then 1 / sqrt(n).
__global__ void hadamard_kernel(float* __restrict__ x, int64_t n) {
    cu::pdl_begin();
    extern __shared__ float buf[];  // [n]
    float* row = x + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) buf[i] = row[i];
    __syncthreads();
    for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t i = threadIdx.x; i < n / 2; i += blockDim.x) {
            const int64_t j = i / h * 2 * h + i % h;
            const float a = buf[j], b = buf[j + h];
            buf[j] = a + b;
            buf[j + h] = a - b;
        }
        __syncthreads();
    }
    const float norm = 1.0f / sqrtf(float(n));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] = buf[i] * norm;
}

}  // namespace

void cuda_hadamard(float* x, int64_t n_rows, int64_t n, cudaStream_t s) {
    CUDA_REQUIRE(n > 0 && n <= 1024 && (n & (n - 1)) == 0,
                 "cuda_hadamard: n must be a power of two <= 1024");
    CUDA_REQUIRE(n_rows >= 0 && n_rows <= INT32_MAX, "cuda_hadamard: bad row count");
    if (n_rows == 0) return;
    cu::launch_pdl(hadamard_kernel, unsigned(n_rows), 128, size_t(n) * sizeof(float), s, x, n);
}

void cuda_gather_rows(float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t dim,
                      cudaStream_t s) {
    if (n_rows <= 0 || dim <= 0) return;
    cu::launch_pdl(gather_rows_kernel, elt_blocks(n_rows * dim), kEltThreads, 0, s, out, x, rows,
                   n_rows, dim);
}

void cuda_copy_rows(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                    int64_t n_rows, int64_t width, cudaStream_t s) {
    CUDA_REQUIRE(n_rows >= 0 && width >= 0 && out_stride >= width && x_stride >= width,
                 "cuda_copy_rows: bad shape");
    if (n_rows == 0 || width == 0) return;
    cu::launch_pdl(copy_rows_kernel, elt_blocks(n_rows * width), kEltThreads, 0, s, out, out_stride,
                   x, x_stride, n_rows, width);
}

void cuda_mla_kv_rows(float* k, const float* kv_a, const float* w, int64_t n_tokens, int64_t rank,
                      int64_t n_rot, float eps, cudaStream_t s) {
    CUDA_REQUIRE(n_tokens >= 0 && n_tokens <= INT32_MAX && rank > 0 && n_rot >= 0,
                 "cuda_mla_kv_rows: bad shape");
    CUDA_REQUIRE(k != kv_a, "cuda_mla_kv_rows: k must not alias kv_a");
    if (n_tokens == 0) return;
    cu::launch_pdl(mla_kv_rows_kernel, unsigned(n_tokens), kRowThreads, 0, s, k, kv_a, w, rank,
                   n_rot, eps);
}

void cuda_rmsnorm(float* out, const float* x, const float* w, int64_t n_rows, int64_t dim,
                  float eps, cudaStream_t s) {
    CUDA_REQUIRE(n_rows >= 0 && dim > 0, "cuda_rmsnorm: bad shape");
    if (n_rows == 0) return;
    CUDA_REQUIRE(n_rows <= INT32_MAX, "cuda_rmsnorm: too many rows");
    if (const int t = reg_row_threads(dim)) {
        cu::launch_pdl(rmsnorm_reg_kernel<false, 0>, unsigned(n_rows), t, 0, s,
                       const_cast<float*>(x), static_cast<const float*>(nullptr), out, w, dim, eps,
                       int(cu::ceil_div(dim, t)), static_cast<int8_t*>(nullptr),
                       static_cast<float*>(nullptr));
        return;
    }
    cu::launch_pdl(rmsnorm_kernel, unsigned(n_rows), kRowThreads, 0, s, out, x, w, dim, eps);
}

void cuda_add_rmsnorm(float* x, const float* y, float* out, const float* w, int64_t n_rows,
                      int64_t dim, float eps, cudaStream_t s) {
    CUDA_REQUIRE(n_rows >= 0 && dim > 0, "cuda_add_rmsnorm: bad shape");
    CUDA_REQUIRE(out != x && y != x, "cuda_add_rmsnorm: out and y must not alias x");
    if (n_rows == 0) return;
    CUDA_REQUIRE(n_rows <= INT32_MAX, "cuda_add_rmsnorm: too many rows");
    if (const int t = reg_row_threads(dim)) {
        cu::launch_pdl(rmsnorm_reg_kernel<true, 0>, unsigned(n_rows), t, 0, s, x, y, out, w, dim,
                       eps, int(cu::ceil_div(dim, t)), static_cast<int8_t*>(nullptr),
                       static_cast<float*>(nullptr));
        return;
    }
    cu::launch_pdl(add_rmsnorm_kernel, unsigned(n_rows), kRowThreads, 0, s, x, y, out, w, dim, eps);
}

void cuda_layernorm(float* out, const float* x, const float* w, const float* b, int64_t n_rows,
                    int64_t dim, float eps, cudaStream_t s) {
    CUDA_REQUIRE(n_rows >= 0 && n_rows <= INT32_MAX && dim > 0, "cuda_layernorm: bad shape");
    if (n_rows == 0) return;
    // (x is written only with an add.)
    cu::launch_pdl(layernorm_kernel, unsigned(n_rows), kRowThreads, 0, s, const_cast<float*>(x),
                   static_cast<const float*>(nullptr), out, w, b, dim, eps);
}

void cuda_add_layernorm(float* x, const float* y, float* out, const float* w, const float* b,
                        int64_t n_rows, int64_t dim, float eps, cudaStream_t s) {
    CUDA_REQUIRE(n_rows >= 0 && n_rows <= INT32_MAX && dim > 0, "cuda_add_layernorm: bad shape");
    CUDA_REQUIRE(out != x && y != x, "cuda_add_layernorm: out and y must not alias x");
    if (n_rows == 0) return;
    cu::launch_pdl(layernorm_kernel, unsigned(n_rows), kRowThreads, 0, s, x, y, out, w, b, dim,
                   eps);
}

namespace {

// The _xq forms: the register kernel with the quantization when the row fits it, else the
// plain op and cuda_quantize_x. x is null for cuda_rmsnorm_xq (no add).
void norm_xq(float* x, const float* y, float* out, const float* in, const float* w, int64_t n_rows,
             int64_t dim, float eps, const CudaXq& xq, cudaStream_t s) {
    CUDA_REQUIRE(xq.x == out && xq.q && xq.d && (xq.elt_bytes == 1 || xq.elt_bytes == 2),
                 "cuda_rmsnorm_xq: xq must be made from out");
    CUDA_REQUIRE(dim % 32 == 0, "cuda_rmsnorm_xq: dim must be a multiple of 32");
    CUDA_REQUIRE(n_rows >= 0 && n_rows <= INT32_MAX, "cuda_rmsnorm_xq: bad row count");
    if (n_rows == 0) return;
    const int t = reg_row_threads(dim);
    if (t == 0) {
        if (x)
            cuda_add_rmsnorm(x, y, out, w, n_rows, dim, eps, s);
        else
            cuda_rmsnorm(out, in, w, n_rows, dim, eps, s);
        cuda_quantize_x(out, n_rows, dim, xq, s);
        return;
    }
    float* xr = x ? x : const_cast<float*>(in);
    const int per = int(cu::ceil_div(dim, t));
    if (x && xq.elt_bytes == 1)
        cu::launch_pdl(rmsnorm_reg_kernel<true, 1>, unsigned(n_rows), t, 0, s, xr, y, out, w, dim,
                       eps, per, xq.q, xq.d);
    else if (x)
        cu::launch_pdl(rmsnorm_reg_kernel<true, 2>, unsigned(n_rows), t, 0, s, xr, y, out, w, dim,
                       eps, per, xq.q, xq.d);
    else if (xq.elt_bytes == 1)
        cu::launch_pdl(rmsnorm_reg_kernel<false, 1>, unsigned(n_rows), t, 0, s, xr, y, out, w, dim,
                       eps, per, xq.q, xq.d);
    else
        cu::launch_pdl(rmsnorm_reg_kernel<false, 2>, unsigned(n_rows), t, 0, s, xr, y, out, w, dim,
                       eps, per, xq.q, xq.d);
}

}  // namespace

void cuda_rmsnorm_xq(float* out, const float* x, const float* w, int64_t n_rows, int64_t dim,
                     float eps, const CudaXq& xq, cudaStream_t s) {
    norm_xq(nullptr, nullptr, out, x, w, n_rows, dim, eps, xq, s);
}

void cuda_add_rmsnorm_xq(float* x, const float* y, float* out, const float* w, int64_t n_rows,
                         int64_t dim, float eps, const CudaXq& xq, cudaStream_t s) {
    CUDA_REQUIRE(out != x && y != x, "cuda_add_rmsnorm: out and y must not alias x");
    norm_xq(x, y, out, nullptr, w, n_rows, dim, eps, xq, s);
}

void cuda_softmax(float* x, int64_t n_rows, int64_t n, cudaStream_t s) {
    CUDA_REQUIRE(n_rows >= 0 && n > 0, "cuda_softmax: bad shape");
    if (n_rows == 0) return;
    CUDA_REQUIRE(n_rows <= INT32_MAX, "cuda_softmax: too many rows");
    cu::launch_pdl(softmax_kernel, unsigned(n_rows), kRowThreads, 0, s, x, n);
}

void cuda_rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
               const RopeParams& p, cudaStream_t s) {
    CUDA_REQUIRE(n_tokens >= 0 && n_heads > 0 && head_dim > 0, "cuda_rope: bad shape");
    CUDA_REQUIRE(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= head_dim,
                 "cuda_rope: n_rot must be even and at most head_dim");
    const int64_t n = n_tokens * n_heads * (p.n_rot / 2);
    if (n == 0) return;
    cu::launch_pdl(rope_kernel, elt_blocks(n), kEltThreads, 0, s, x, pos, n_tokens, n_heads,
                   head_dim, p);
}

void cuda_swiglu(float* out, const float* gate, const float* up, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    cu::launch_pdl(swiglu_kernel, elt_blocks(n), kEltThreads, 0, s, out, gate, up, n);
}

void cuda_swiglu_oai(float* out, const float* gate, const float* up, int64_t n, float alpha,
                     float limit, cudaStream_t s) {
    if (n <= 0) return;
    cu::launch_pdl(swiglu_oai_kernel, elt_blocks(n), kEltThreads, 0, s, out, gate, up, n, alpha,
                   limit);
}

void cuda_geglu(float* out, const float* gate, const float* up, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    cu::launch_pdl(geglu_kernel, elt_blocks(n), kEltThreads, 0, s, out, gate, up, n);
}

void cuda_gelu(float* out, const float* x, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    cu::launch_pdl(gelu_kernel, elt_blocks(n), kEltThreads, 0, s, out, x, n);
}

void cuda_softcap(float* x, int64_t n, float cap, cudaStream_t s) {
    CUDA_REQUIRE(cap > 0, "cuda_softcap: the cap must be positive");
    if (n <= 0) return;
    cu::launch_pdl(softcap_kernel, elt_blocks(n), kEltThreads, 0, s, x, n, cap);
}

void cuda_scale(float* x, int64_t n, float f, cudaStream_t s) {
    if (n <= 0) return;
    cu::launch_pdl(scale_kernel, elt_blocks(n), kEltThreads, 0, s, x, n, f);
}

void cuda_attn_temperature(float* q, const int32_t* pos, int64_t n_tokens, int64_t width,
                           float scale, int64_t floor_len, cudaStream_t s) {
    CUDA_REQUIRE(floor_len > 0, "cuda_attn_temperature: the floor length must be positive");
    const int64_t n = n_tokens * width;
    if (n <= 0) return;
    cu::launch_pdl(attn_temperature_kernel, elt_blocks(n), kEltThreads, 0, s, q, pos, n, width,
                   scale, floor_len);
}

void cuda_add_scaled_rows(float* out, const float* y, const float* user, int64_t n_rows, int64_t n,
                          double per_unit, cudaStream_t s) {
    if (n_rows <= 0 || n <= 0) return;
    cu::launch_pdl(add_scaled_rows_kernel, elt_blocks(n_rows * n), kEltThreads, 0, s, out, y, user,
                   n_rows, n, per_unit);
}

void cuda_add(float* x, const float* y, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    cu::launch_pdl(add_kernel, elt_blocks(n), kEltThreads, 0, s, x, y, n);
}

void cuda_add_sigmoid_gated(float* x, const float* y, const float* g, int64_t n_rows, int64_t n,
                            cudaStream_t s) {
    if (n_rows <= 0 || n <= 0) return;
    cu::launch_pdl(add_sigmoid_gated_kernel, elt_blocks(n_rows * n), kEltThreads, 0, s, x, y, g,
                   n_rows, n);
}

void cuda_add_bias(float* x, const float* bias, int64_t n_rows, int64_t n, cudaStream_t s) {
    if (n_rows <= 0 || n <= 0) return;
    cu::launch_pdl(add_bias_kernel, elt_blocks(n_rows * n), kEltThreads, 0, s, x, bias, n_rows, n);
}

void cuda_add_bias_rows(float* x, const float* bias, const int32_t* ids, int64_t n_rows, int64_t n,
                        cudaStream_t s) {
    if (n_rows <= 0 || n <= 0) return;
    cu::launch_pdl(add_bias_rows_kernel, elt_blocks(n_rows * n), kEltThreads, 0, s, x, bias, ids,
                   n_rows, n);
}

}  // namespace kvrun
