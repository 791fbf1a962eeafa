// vramlab's kernels: a step program's ops other than its matrix products
// (cuBLAS computes those), on the blocks the caching allocator placed each
// tensor in. Each kernel computes in float32 and reads and stores each
// tensor in its own type (`ld`, `st`: the type codes of
// `compute::type_code`), rounding to nearest as CUDA's conversions do, as
// the CPU interpreter (`train::cpu`) computes the same op. Compiled at run
// time by NVRTC, with no headers; blocks are 256 threads, and kernels over
// elements stride over what the grid does not cover.

typedef long long i64;
typedef unsigned short u16;

#define THREADS 256
#define EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                        i += (i64)blockDim.x * gridDim.x)

__device__ __forceinline__ float ld(const void *p, int t, i64 i) {
  switch (t) {
  case 0: return ((const float *)p)[i];
  case 1: {
    u16 h = ((const u16 *)p)[i];
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
  case 2: return __uint_as_float(((unsigned int)((const u16 *)p)[i]) << 16);
  case 3: return (float)((const double *)p)[i];
  case 4: return (float)((const i64 *)p)[i];
  case 5: return (float)((const int *)p)[i];
  case 6: return (float)((const short *)p)[i];
  case 7: return (float)((const signed char *)p)[i];
  default: return (float)((const unsigned char *)p)[i];
  }
}

// bfloat16 to nearest, ties to even (NaN kept).
__device__ __forceinline__ u16 to_bf16(float v) {
  unsigned int b = __float_as_uint(v);
  if (v != v) return (u16)(b >> 16);
  return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ void st(void *p, int t, i64 i, float v) {
  switch (t) {
  case 0: ((float *)p)[i] = v; break;
  case 1: {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    ((u16 *)p)[i] = h;
    break;
  }
  case 2: ((u16 *)p)[i] = to_bf16(v); break;
  case 3: ((double *)p)[i] = (double)v; break;
  case 4: ((i64 *)p)[i] = (i64)v; break;
  case 5: ((int *)p)[i] = (int)v; break;
  case 6: ((short *)p)[i] = (short)v; break;
  case 7: ((signed char *)p)[i] = (signed char)v; break;
  case 8: ((unsigned char *)p)[i] = (unsigned char)v; break;
  default: ((unsigned char *)p)[i] = v != 0.0f; break;
  }
}

// Four elements from element 4·q (a block's address is 512-byte aligned,
// so a tensor's quads are 8- or 16-byte aligned): one vector load for
// float32, float16 and bfloat16, as bandwidth-bound kernels need.
__device__ __forceinline__ void ld4(const void *p, int t, i64 q, float v[4]) {
  if (t == 0) {
    float4 f = ((const float4 *)p)[q];
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else if (t == 1 || t == 2) {
    uint2 u = ((const uint2 *)p)[q];
    unsigned int w[2] = {u.x, u.y};
    for (int k = 0; k < 4; k++) {
      u16 h = (u16)(w[k / 2] >> (16 * (k % 2)));
      if (t == 2) {
        v[k] = __uint_as_float((unsigned int)h << 16);
      } else {
        asm("cvt.f32.f16 %0, %1;" : "=f"(v[k]) : "h"(h));
      }
    }
  } else {
    for (int k = 0; k < 4; k++) v[k] = ld(p, t, 4 * q + k);
  }
}

// Whether `p` can be read and written four elements at a time.
__device__ __forceinline__ bool quads(const void *p, int t) {
  unsigned long long a = (unsigned long long)p;
  return t == 0 ? a % 16 == 0 : (t == 1 || t == 2) ? a % 8 == 0 : true;
}

__device__ __forceinline__ void st4(void *p, int t, i64 q, const float v[4]) {
  if (t == 0) {
    ((float4 *)p)[q] = make_float4(v[0], v[1], v[2], v[3]);
  } else if (t == 1 || t == 2) {
    unsigned int w[2] = {0, 0};
    for (int k = 0; k < 4; k++) {
      u16 h;
      if (t == 2) {
        h = to_bf16(v[k]);
      } else {
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v[k]));
      }
      w[k / 2] |= (unsigned int)h << (16 * (k % 2));
    }
    ((uint2 *)p)[q] = make_uint2(w[0], w[1]);
  } else {
    for (int k = 0; k < 4; k++) st(p, t, 4 * q + k, v[k]);
  }
}

// The sum of every thread's `v` in the block, given to all of them.
__device__ float block_sum(float v, float *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  float total = shared[0];
  __syncthreads();
  return total;
}

__device__ float block_max(float v, float *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  float m = shared[0];
  __syncthreads();
  return m;
}

typedef unsigned long long u64;

// `train::data`'s hash: a splitmix of three words.
__device__ u64 mix(u64 a, u64 b, u64 c) {
  u64 z = a * 0x9e3779b97f4a7c15ull + b * 0xbf58476d1ce4e5b9ull + c * 0x94d049bb133111ebull +
          0x2545f4914f6cdd1dull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// `train::data::gaussian`: Marsaglia's polar method on the hash's bits.
__device__ float gaussian(u64 a, u64 b, u64 c) {
  u64 h = mix(a, b, c);
  for (;;) {
    float u = (float)((h >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    float v = (float)((h >> 16) & 0xffffff) / 8388608.0f - 1.0f;
    float s = u * u + v * v;
    if (s > 0.0f && s < 1.0f) return u * sqrtf(-2.0f * logf(s) / s);
    h = mix(h, c, b);
  }
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

extern "C" {

// ones, zeros, a kernel's buffer: every element `value`.
__global__ void fill(void *out, int to, i64 n, float value) {
  EACH(i, n) st(out, to, i, value);
}

__global__ void arange(void *out, int to, i64 n) {
  EACH(i, n) st(out, to, i, (float)i);
}

// clone, an autocast cast: each element in the output's type.
__global__ void copy(void *out, int to, const void *x, int tx, i64 n) {
  EACH(i, n) st(out, to, i, ld(x, tx, i));
}

__global__ void scale(void *out, int to, const void *x, int tx, i64 n, float factor) {
  EACH(i, n) st(out, to, i, ld(x, tx, i) * factor);
}

__global__ void sqrt_(void *out, int to, const void *x, int tx, i64 n) {
  if (!(quads(out, to) && quads(x, tx))) {
    EACH(i, n) st(out, to, i, sqrtf(ld(x, tx, i)));
    return;
  }
  EACH(q, n / 4) {
    float v[4];
    ld4(x, tx, q, v);
    for (int k = 0; k < 4; k++) v[k] = sqrtf(v[k]);
    st4(out, to, q, v);
  }
  if (blockIdx.x == 0 && threadIdx.x < n % 4) {
    i64 i = n - n % 4 + threadIdx.x;
    st(out, to, i, sqrtf(ld(x, tx, i)));
  }
}

// `~x` of a boolean tensor.
__global__ void not_(void *out, int to, const void *x, int tx, i64 n) {
  EACH(i, n) st(out, to, i, 1.0f - ld(x, tx, i));
}

__global__ void relu(void *out, int to, const void *x, int tx, i64 n) {
  EACH(i, n) st(out, to, i, fmaxf(ld(x, tx, i), 0.0f));
}

// threshold_backward: the gradient where the output is positive.
__global__ void relu_backward(void *out, int to, const void *g, int tg, const void *y, int ty,
                              i64 n) {
  EACH(i, n) st(out, to, i, ld(y, ty, i) > 0.0f ? ld(g, tg, i) : 0.0f);
}

__global__ void gelu_(void *out, int to, const void *x, int tx, i64 n) {
  EACH(i, n) st(out, to, i, gelu(ld(x, tx, i)));
}

__global__ void gelu_backward(void *out, int to, const void *g, int tg, const void *x, int tx,
                              i64 n) {
  EACH(i, n) {
    float v = ld(x, tx, i);
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = expf(-0.5f * v * v) * 0.3989423f;
    st(out, to, i, ld(g, tg, i) * (cdf + v * pdf));
  }
}

// `a + b`, `b` (nb elements) repeated over `a`'s leading dimensions.
__global__ void add(void *out, int to, const void *a, int ta, const void *b, int tb, i64 n,
                    i64 nb) {
  EACH(i, n) st(out, to, i, ld(a, ta, i) + ld(b, tb, i % nb));
}

// Each row of `out` (cols wide) a copy of `bias`: addmm's C before the
// product is added into it.
__global__ void bias_rows(void *out, int to, const void *bias, int tb, i64 n, i64 cols) {
  EACH(i, n) st(out, to, i, ld(bias, tb, i % cols));
}

// `x` summed over its leading dimensions down to `n` elements (a bias's
// gradient): each block takes 32 columns, its 8 warps' rows interleaved,
// their partial sums added in shared memory.
__global__ void sum_rows(void *out, int to, const void *x, int tx, i64 n, i64 rows) {
  __shared__ float shared[THREADS];
  i64 j = (i64)blockIdx.x * 32 + threadIdx.x % 32;
  int group = threadIdx.x / 32;
  float s = 0.0f;
  if (j < n)
    for (i64 r = group; r < rows; r += THREADS / 32) s += ld(x, tx, r * n + j);
  shared[threadIdx.x] = s;
  __syncthreads();
  if (group == 0 && j < n) {
    for (int k = 1; k < THREADS / 32; k++) s += shared[k * 32 + threadIdx.x];
    st(out, to, j, s);
  }
}

// The lower triangle (diagonal included) of a square's ones.
__global__ void tril(void *out, int to, i64 n, i64 cols) {
  EACH(i, n) st(out, to, i, (i % cols) <= (i / cols) % cols ? 1.0f : 0.0f);
}

// `x` where the mask (nm elements, repeated) is false, `value` where true.
__global__ void masked_fill(void *out, int to, const void *x, int tx, const void *mask, int tm,
                            i64 n, i64 nm, float value) {
  EACH(i, n) st(out, to, i, ld(mask, tm, i % nm) != 0.0f ? value : ld(x, tx, i));
}

// Rows of `weight` (cols wide) picked by `ids`.
__global__ void embedding(void *out, int to, const void *weight, int tw, const void *ids, int ti,
                          i64 n, i64 cols, i64 rows) {
  EACH(i, n) {
    i64 id = (i64)ld(ids, ti, i / cols);
    float v = id >= 0 && id < rows ? ld(weight, tw, id * cols + i % cols) : __int_as_float(0x7fc00000);
    st(out, to, i, v);
  }
}

// embedding_dense_backward into a float32 table the caller zeroed: each
// row of `grad` added into the row its id picks.
__global__ void embedding_backward(float *out, const void *grad, int tg, const void *ids, int ti,
                                   i64 n, i64 cols, i64 rows) {
  EACH(i, n) {
    i64 id = (i64)ld(ids, ti, i / cols);
    if (id >= 0 && id < rows) atomicAdd(out + id * cols + i % cols, ld(grad, tg, i));
  }
}

// Softmax and log-softmax over each row (one block a row).
__global__ void softmax(void *out, int to, const void *x, int tx, i64 cols, int log) {
  __shared__ float shared[THREADS];
  i64 row = (i64)blockIdx.x * cols;
  float m = -__int_as_float(0x7f800000);
  for (i64 j = threadIdx.x; j < cols; j += THREADS) m = fmaxf(m, ld(x, tx, row + j));
  m = block_max(m, shared);
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) s += expf(ld(x, tx, row + j) - m);
  s = block_sum(s, shared);
  float log_sum = logf(s) + m;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float v = ld(x, tx, row + j);
    st(out, to, row + j, log ? v - log_sum : expf(v - m) / s);
  }
}

// Softmax's backward, y · (g - Σ g·y); log-softmax's, g - exp(y) · Σ g.
__global__ void softmax_backward(void *out, int to, const void *g, int tg, const void *y, int ty,
                                 i64 cols, int log) {
  __shared__ float shared[THREADS];
  i64 row = (i64)blockIdx.x * cols;
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < cols; j += THREADS)
    s += log ? ld(g, tg, row + j) : ld(g, tg, row + j) * ld(y, ty, row + j);
  s = block_sum(s, shared);
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float gv = ld(g, tg, row + j), yv = ld(y, ty, row + j);
    st(out, to, row + j, log ? gv - expf(yv) * s : yv * (gv - s));
  }
}

// NLL's mean over the rows of `lp` (classes wide), and its total weight.
// A label outside the classes makes the loss NaN.
__global__ void nll(void *out, int to, void *total, int tt, const void *lp, int tl,
                    const void *targets, int tg, i64 rows, i64 classes) {
  __shared__ float shared[THREADS];
  float s = 0.0f;
  for (i64 r = threadIdx.x; r < rows; r += THREADS) {
    i64 t = (i64)ld(targets, tg, r);
    s -= t >= 0 && t < classes ? ld(lp, tl, r * classes + t) : __int_as_float(0x7fc00000);
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    st(out, to, 0, s / (float)rows);
    st(total, tt, 0, (float)rows);
  }
}

// NLL's backward: -grad / total_weight at each row's label, else zero.
__global__ void nll_backward(void *out, int to, const void *grad, int tgr, const void *targets,
                             int tg, const void *weight, int tw, i64 n, i64 classes) {
  float v = -ld(grad, tgr, 0) / ld(weight, tw, 0);
  EACH(i, n) st(out, to, i, (i64)ld(targets, tg, i / classes) == i % classes ? v : 0.0f);
}

// Head `part` of a B x S x row projection (q, k, v side by side, each
// H · D wide) as B x H x S x D.
__global__ void heads(void *out, int to, const void *x, int tx, i64 n, i64 s, i64 h, i64 d,
                      i64 row, i64 part) {
  EACH(i, n) {
    i64 dd = i % d, ss = (i / d) % s, hh = (i / (d * s)) % h, b = i / (d * s * h);
    st(out, to, i, ld(x, tx, (b * s + ss) * row + part * h * d + hh * d + dd));
  }
}

// Part `p` of the q/k/v gradients (B x S x H · D, or heads: B x H x S x D
// when `h` > 0) into its third of each B x S x row token.
__global__ void cat_part(void *out, int to, const void *x, int tx, i64 n, i64 s, i64 h, i64 d,
                         i64 row, i64 p) {
  EACH(i, n) {
    i64 width = row / 3, t = i / width, c = i % width;
    i64 from = i;
    if (h > 0) from = (((t / s) * h + c / d) * s + t % s) * d + c % d;
    st(out, to, t * row + p * width + c, ld(x, tx, from));
  }
}

// B x H x S x D heads back as B x S x (H · D).
__global__ void merge_heads(void *out, int to, const void *x, int tx, i64 n, i64 s, i64 h,
                            i64 d) {
  EACH(i, n) {
    i64 dd = i % d, hh = (i / d) % h, ss = (i / (d * h)) % s, b = i / (d * h * s);
    st(out, to, i, ld(x, tx, ((b * h + hh) * s + ss) * d + dd));
  }
}

// LayerNorm (with a bias) or RMSNorm over rows `cols` wide, one block a
// row: the output, and (LayerNorm) the mean, then the inverse deviation.
__global__ void norm_rows(void *out, int to, void *mean, int tm, void *rstd, int tr, const void *x,
                     int tx, const void *weight, int tw, const void *bias, int tb, i64 cols,
                     int layer, float eps) {
  __shared__ float shared[THREADS];
  i64 r = blockIdx.x, row = r * cols;
  float s = 0.0f;
  if (layer) {
    for (i64 j = threadIdx.x; j < cols; j += THREADS) s += ld(x, tx, row + j);
    s = block_sum(s, shared);
  }
  float mu = layer ? s / (float)cols : 0.0f;
  float q = 0.0f;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float c = ld(x, tx, row + j) - mu;
    q += c * c;
  }
  q = block_sum(q, shared);
  float inv = 1.0f / sqrtf(q / (float)cols + eps);
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float v = (ld(x, tx, row + j) - mu) * inv * ld(weight, tw, j);
    st(out, to, row + j, layer ? v + ld(bias, tb, j) : v);
  }
  if (threadIdx.x == 0) {
    if (layer) st(mean, tm, r, mu);
    st(rstd, tr, r, inv);
  }
}

// A norm's backward, the input's gradient (one block a row):
// rstd · (dxhat - mean(dxhat) - xhat · mean(dxhat · xhat)), dxhat = g · w.
__global__ void norm_backward_input(void *out, int to, const void *g, int tg, const void *x,
                                    int tx, const void *mean, int tm, const void *rstd, int tr,
                                    const void *weight, int tw, i64 cols, int layer) {
  __shared__ float shared[THREADS];
  i64 r = blockIdx.x, row = r * cols;
  float mu = layer ? ld(mean, tm, r) : 0.0f, inv = ld(rstd, tr, r);
  float sd = 0.0f, sdx = 0.0f;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float dxhat = ld(g, tg, row + j) * ld(weight, tw, j);
    sd += dxhat;
    sdx += dxhat * (ld(x, tx, row + j) - mu) * inv;
  }
  sd = layer ? block_sum(sd, shared) / (float)cols : 0.0f;
  sdx = block_sum(sdx, shared) / (float)cols;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float dxhat = ld(g, tg, row + j) * ld(weight, tw, j);
    float xhat = (ld(x, tx, row + j) - mu) * inv;
    st(out, to, row + j, inv * (dxhat - sd - xhat * sdx));
  }
}

// Its weight's gradient, Σ g · xhat over the rows, and (when `layer`)
// its bias's, Σ g: 32 columns a block, as `sum_rows`.
__global__ void norm_backward_params(void *dw, int tdw, void *db, int tdb, const void *g, int tg,
                                     const void *x, int tx, const void *mean, int tm,
                                     const void *rstd, int tr, i64 cols, i64 rows, int layer) {
  __shared__ float sw[THREADS], sb[THREADS];
  i64 j = (i64)blockIdx.x * 32 + threadIdx.x % 32;
  int group = threadIdx.x / 32;
  float w = 0.0f, b = 0.0f;
  if (j < cols)
    for (i64 r = group; r < rows; r += THREADS / 32) {
      float gv = ld(g, tg, r * cols + j);
      float mu = layer ? ld(mean, tm, r) : 0.0f;
      w += gv * (ld(x, tx, r * cols + j) - mu) * ld(rstd, tr, r);
      b += gv;
    }
  sw[threadIdx.x] = w;
  sb[threadIdx.x] = b;
  __syncthreads();
  if (group == 0 && j < cols) {
    for (int k = 1; k < THREADS / 32; k++) {
      w += sw[k * 32 + threadIdx.x];
      b += sb[k * 32 + threadIdx.x];
    }
    st(dw, tdw, j, w);
    if (layer) st(db, tdb, j, b);
  }
}

// The synthetic set's rows (`train::data::Synthetic::batch`): each
// sample's features around its class's mean, and its label.
__global__ void synthetic_batch(void *x, int tx, void *y, int ty, i64 start, i64 batch,
                                i64 samples, i64 features, i64 classes, i64 seed) {
  EACH(e, batch * features) {
    i64 k = e / features, j = e % features, i = (start + k) % samples;
    u64 c = mix(seed, i, 7) % (u64)classes;
    float v = gaussian(seed ^ 0xc1a55, c, j) + 0.8f * gaussian(seed, i, j);
    st(x, tx, e, v);
    if (j == 0) st(y, ty, k, (float)c);
  }
}

// Its token sequences (`Synthetic::sequences`): each sample counts from a
// first token by a stride; the targets are the next tokens.
__global__ void synthetic_sequences(void *x, int tx, void *y, int ty, i64 start, i64 batch,
                                    i64 samples, i64 len, i64 vocab, i64 seed) {
  EACH(e, batch * len) {
    i64 k = e / len, j = e % len, i = (start + k) % samples;
    u64 first = mix(seed, i, 13) % (u64)vocab, stride = 1 + mix(seed, i, 17) % 4;
    st(x, tx, e, (float)((first + j * stride) % vocab));
    st(y, ty, e, (float)((first + (j + 1) * stride) % vocab));
  }
}

// Parameter `index`'s first values as `train::init` draws them: `rule` 0
// uniform in [-bound, bound], 1 normal, 2 ones, 3 zeros.
__global__ void init_param(void *out, int to, i64 n, int rule, float bound, i64 seed,
                           i64 index) {
  EACH(j, n) {
    float v = rule == 2 ? 1.0f : 0.0f;
    if (rule == 0) v = (2.0f * ((tanhf(gaussian(seed, index, j)) + 1.0f) / 2.0f) - 1.0f) * bound;
    if (rule == 1) v = gaussian(seed, index, j);
    st(out, to, j, v);
  }
}

// torch.optim's updates in place (`train::update`): SGD, and SGD with
// momentum (its buffer the gradient at the first step).
__global__ void sgd_update(void *p, int tp, const void *g, int tg, void *buf, int tb, i64 n,
                           float lr, float momentum, int first) {
  EACH(i, n) {
    float d = ld(g, tg, i);
    if (momentum > 0.0f) {
      d = first ? d : momentum * ld(buf, tb, i) + d;
      st(buf, tb, i, d);
    }
    st(p, tp, i, ld(p, tp, i) - lr * d);
  }
}

// Adam (and AdamW's decoupled weight decay `decay`), four elements at a
// time (the last n % 4 one by one).
__device__ __forceinline__ void adam_one(float &x, float g, float &m, float &v, float lr,
                                         float beta1, float beta2, float eps, float bc1,
                                         float bc2_sqrt, float decay) {
  x *= 1.0f - lr * decay;
  m += (g - m) * (1.0f - beta1);
  v = v * beta2 + (1.0f - beta2) * g * g;
  x -= (lr / bc1) * m / (sqrtf(v) / bc2_sqrt + eps);
}

__global__ void adam_update(void *p, int tp, const void *g, int tg, void *m, int tm, void *v,
                            int tv, i64 n, float lr, float beta1, float beta2, float eps,
                            float bc1, float bc2_sqrt, float decay) {
  if (!(quads(p, tp) && quads(g, tg) && quads(m, tm) && quads(v, tv))) {
    EACH(i, n) {
      float x = ld(p, tp, i), mv = ld(m, tm, i), vv = ld(v, tv, i);
      adam_one(x, ld(g, tg, i), mv, vv, lr, beta1, beta2, eps, bc1, bc2_sqrt, decay);
      st(m, tm, i, mv);
      st(v, tv, i, vv);
      st(p, tp, i, x);
    }
    return;
  }
  EACH(q, n / 4) {
    float x[4], gv[4], mv[4], vv[4];
    ld4(p, tp, q, x);
    ld4(g, tg, q, gv);
    ld4(m, tm, q, mv);
    ld4(v, tv, q, vv);
    for (int k = 0; k < 4; k++)
      adam_one(x[k], gv[k], mv[k], vv[k], lr, beta1, beta2, eps, bc1, bc2_sqrt, decay);
    st4(m, tm, q, mv);
    st4(v, tv, q, vv);
    st4(p, tp, q, x);
  }
  if (blockIdx.x == 0 && threadIdx.x < n % 4) {
    i64 i = n - n % 4 + threadIdx.x;
    float x = ld(p, tp, i), mv = ld(m, tm, i), vv = ld(v, tv, i);
    adam_one(x, ld(g, tg, i), mv, vv, lr, beta1, beta2, eps, bc1, bc2_sqrt, decay);
    st(m, tm, i, mv);
    st(v, tv, i, vv);
    st(p, tp, i, x);
  }
}
}
