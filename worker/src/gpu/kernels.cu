// zerolayer's CUDA kernels for the Llama-family forward pass (the `cuda` feature of zl-worker).
//
// Every output element is computed by one thread, and every reduction it needs (a dot product, a norm's sum of
// squares, a softmax) runs sequentially in a fixed order that depends only on the element's own row: a row's
// result is the same bits whatever else is in the batch, which is what batch-invariant sampling needs. cuBLAS
// chooses its reduction split by matrix shape, so it is not used. Weights and the KV cache are IEEE half precision
// (`unsigned short` bits), activations and accumulators f32.

#include <cuda_fp16.h>

__device__ __forceinline__ float h2f(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ unsigned short f2h(float v) { return __half_as_ushort(__float2half_rn(v)); }

// out[r, :] = x[src[r], :] * rsqrt(mean(x[src[r], :]^2) + eps) * weight. `src` selects input rows (NULL: r).
extern "C" __global__ void rms_norm(const float* x, const int* src, const float* weight, float eps, float* out,
                                    int rows, int width) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)(src ? src[r] : r) * width;
    float sum = 0.0f;
    for (int i = 0; i < width; i++) sum = fmaf(xr[i], xr[i], sum);
    float scale = rsqrtf(sum / (float)width + eps);
    float* o = out + (size_t)r * width;
    for (int i = 0; i < width; i++) o[i] = xr[i] * scale * weight[i];
}

// out[r, c] = sum_k x[r, k] * w[c, k] (+ bias[c]); w is half precision, row-major [cols_out, k].
extern "C" __global__ void matmul(const float* x, const unsigned short* w, const float* bias, float* out, int rows,
                                  int k, int cols_out) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * cols_out) return;
    int r = (int)(idx / cols_out), c = (int)(idx % cols_out);
    const float* xr = x + (size_t)r * k;
    const unsigned short* wc = w + (size_t)c * k;
    float acc = 0.0f;
    for (int i = 0; i < k; i++) acc = fmaf(xr[i], h2f(wc[i]), acc);
    out[idx] = bias ? acc + bias[c] : acc;
}

// Rotary position embedding of each row's query and key heads at the row's position, then the key and value as
// half precision into the KV cache at the row's slot (an element offset into one layer's cache).
extern "C" __global__ void rope_store(float* q, float* k, const float* v, const int* pos, const long long* slot,
                                      const float* cos_table, const float* sin_table, unsigned short* k_cache,
                                      unsigned short* v_cache, int rows, int heads, int kv_heads, int head_dim,
                                      int rotary, int interleaved) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    // Only the leading `rotary` dimensions of each head turn (all of them but for partial rotary).
    int half_dim = rotary / 2;
    const float* c = cos_table + (size_t)pos[r] * half_dim;
    const float* s = sin_table + (size_t)pos[r] * half_dim;
    for (int h = 0; h < heads + kv_heads; h++) {
        float* x = h < heads ? q + ((size_t)r * heads + h) * head_dim : k + ((size_t)r * kv_heads + h - heads) * head_dim;
        for (int i = 0; i < half_dim; i++) {
            int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half_dim;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c[i] - x1 * s[i];
            x[b] = x0 * s[i] + x1 * c[i];
        }
    }
    int kvd = kv_heads * head_dim;
    for (int i = 0; i < kvd; i++) {
        k_cache[slot[r] + i] = f2h(k[(size_t)r * kvd + i]);
        v_cache[slot[r] + i] = f2h(v[(size_t)r * kvd + i]);
    }
}

// Attention of each row's query heads over its positions: row r attends over the `len[r]` slots starting at
// `slots + start[r]` (element offsets into one layer's cache). One thread per (row, head); scores go to `scratch`
// (`max_len` per thread), then a softmax and the weighted sum of values, each in position order.
extern "C" __global__ void attention(const float* q, const unsigned short* k_cache, const unsigned short* v_cache,
                                     const long long* slots, const int* start, const int* len, float* scratch,
                                     float* out, int rows, int heads, int kv_heads, int head_dim, int max_len,
                                     float scale) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * heads) return;
    int r = idx / heads, h = idx % heads;
    int g = h / (heads / kv_heads);
    const float* qh = q + ((size_t)r * heads + h) * head_dim;
    const long long* sl = slots + start[r];
    int n = len[r];
    float* w = scratch + (size_t)idx * max_len;
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) {
        const unsigned short* kt = k_cache + sl[t] + (size_t)g * head_dim;
        float acc = 0.0f;
        for (int i = 0; i < head_dim; i++) acc = fmaf(qh[i], h2f(kt[i]), acc);
        w[t] = acc * scale;
        mx = fmaxf(mx, w[t]);
    }
    float sum = 0.0f;
    for (int t = 0; t < n; t++) {
        w[t] = __expf(w[t] - mx);
        sum += w[t];
    }
    float inv = 1.0f / sum;
    float* o = out + ((size_t)r * heads + h) * head_dim;
    for (int i = 0; i < head_dim; i++) o[i] = 0.0f;
    for (int t = 0; t < n; t++) {
        const unsigned short* vt = v_cache + sl[t] + (size_t)g * head_dim;
        float p = w[t] * inv;
        for (int i = 0; i < head_dim; i++) o[i] = fmaf(p, h2f(vt[i]), o[i]);
    }
}

// x += y, element by element.
extern "C" __global__ void add(float* x, const float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// gate = gelu(gate) * up, element by element (GELU's tanh approximation, Gemma's GeGLU).
extern "C" __global__ void gelu_mul(float* gate, const float* up, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * up[i];
    }
}

// gate = silu(gate) * up, element by element.
extern "C" __global__ void silu_mul(float* gate, const float* up, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gate[i] = gate[i] / (1.0f + __expf(-gate[i])) * up[i];
}
