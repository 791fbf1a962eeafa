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

// a / b and a % b of indices (never negative): in 32 bits when both fit,
// since a 64-bit division is a long routine on a GPU.
__device__ __forceinline__ i64 qdiv(i64 a, i64 b) {
  return ((unsigned long long)(a | b) >> 32) == 0 ? (i64)((unsigned)a / (unsigned)b) : a / b;
}
__device__ __forceinline__ i64 qmod(i64 a, i64 b) {
  return ((unsigned long long)(a | b) >> 32) == 0 ? (i64)((unsigned)a % (unsigned)b) : a % b;
}

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
// so a tensor's quads are 4-, 8- or 16-byte aligned): one vector load for
// float32, float16, bfloat16 and bytes, as bandwidth-bound kernels need.
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
  } else if (t == 8) {
    uchar4 u = ((const uchar4 *)p)[q];
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
  } else {
    for (int k = 0; k < 4; k++) v[k] = ld(p, t, 4 * q + k);
  }
}

// Whether `p` can be read and written four elements at a time.
__device__ __forceinline__ bool quads(const void *p, int t) {
  unsigned long long a = (unsigned long long)p;
  return t == 0 ? a % 16 == 0 : (t == 1 || t == 2) ? a % 8 == 0 : t == 8 ? a % 4 == 0 : true;
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

// An element type known when the kernel is compiled (`Ty<T>`, T a type
// code), or only when it runs (`Ty<-1>`): `typed` calls `f` with the
// first for float32 and bfloat16, so a loop that reads through
// `ldt` has no branch on the type and can have many loads in flight.
template <int T> struct Ty {
  static constexpr int code = T;
};

template <int T> __device__ __forceinline__ float ldt(Ty<T>, const void *p, int t, i64 i) {
  return ld(p, T >= 0 ? T : t, i);
}

template <typename F> __device__ __forceinline__ void typed(int t, F f) {
  if (t == 0) f(Ty<0>{});
  else if (t == 2) f(Ty<2>{});
  else f(Ty<-1>{});
}

// The sum (the maximum) of every thread's `v` in the block, given to all
// of them: each warp's by shuffles, then the warps' in `shared`.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ float block_sum(float v, float *shared) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_sum(threadIdx.x % 32 < THREADS / 32 ? shared[threadIdx.x % 32] : 0.0f);
  __syncthreads();
  return v;
}

__device__ float block_max(float v, float *shared) {
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_max(threadIdx.x % 32 < THREADS / 32 ? shared[threadIdx.x % 32]
                                                : -__int_as_float(0x7f800000));
  __syncthreads();
  return v;
}

// A map over elements: out[i] = f(x[i]) (`map1`), or f(a[i], b[i]) with
// `b` (nb elements) repeated over `a` (`map2`), four at a time where the
// tensors allow it (the last n % 4 one by one).
template <typename F>
__device__ __forceinline__ void map1(void *out, int to, const void *x, int tx, i64 n, F f) {
  if (quads(out, to) && quads(x, tx)) {
    EACH(q, n / 4) {
      float v[4];
      ld4(x, tx, q, v);
      for (int k = 0; k < 4; k++) v[k] = f(v[k], 4 * q + k);
      st4(out, to, q, v);
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {
      i64 i = n - n % 4 + threadIdx.x;
      st(out, to, i, f(ld(x, tx, i), i));
    }
  } else {
    EACH(i, n) st(out, to, i, f(ld(x, tx, i), i));
  }
}

// out[i] = f(i), writing four at a time where `out` allows it.
template <typename F>
__device__ __forceinline__ void gen(void *out, int to, i64 n, F f) {
  if (quads(out, to)) {
    EACH(q, n / 4) {
      float v[4];
      for (int k = 0; k < 4; k++) v[k] = f(4 * q + k);
      st4(out, to, q, v);
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {
      i64 i = n - n % 4 + threadIdx.x;
      st(out, to, i, f(i));
    }
  } else {
    EACH(i, n) st(out, to, i, f(i));
  }
}

template <typename F>
__device__ __forceinline__ void map2(void *out, int to, const void *a, int ta, const void *b,
                                     int tb, i64 n, i64 nb, F f) {
  if (nb % 4 == 0 && quads(out, to) && quads(a, ta) && quads(b, tb)) {
    EACH(q, n / 4) {
      float u[4], v[4];
      ld4(a, ta, q, u);
      ld4(b, tb, nb == n ? q : qmod(q, nb / 4), v);
      for (int k = 0; k < 4; k++) u[k] = f(u[k], v[k]);
      st4(out, to, q, u);
    }
  } else {
    EACH(i, n) st(out, to, i, f(ld(a, ta, i), ld(b, tb, nb == n ? i : qmod(i, nb))));
  }
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


// ones, zeros, a kernel's buffer: every element `value`.
extern "C" __global__ void fill(void *out, int to, i64 n, float value) {
  gen(out, to, n, [=](i64) { return value; });
}

extern "C" __global__ void arange(void *out, int to, i64 n) {
  gen(out, to, n, [](i64 i) { return (float)i; });
}

// clone, an autocast cast: each element in the output's type.
extern "C" __global__ void copy(void *out, int to, const void *x, int tx, i64 n) {
  map1(out, to, x, tx, n, [](float v, i64) { return v; });
}

extern "C" __global__ void scale(void *out, int to, const void *x, int tx, i64 n, float factor) {
  map1(out, to, x, tx, n, [=](float v, i64) { return v * factor; });
}

extern "C" __global__ void sqrt_(void *out, int to, const void *x, int tx, i64 n) {
  map1(out, to, x, tx, n, [](float v, i64) { return sqrtf(v); });
}

// `~x` of a boolean tensor.
extern "C" __global__ void not_(void *out, int to, const void *x, int tx, i64 n) {
  map1(out, to, x, tx, n, [](float v, i64) { return 1.0f - v; });
}

extern "C" __global__ void relu(void *out, int to, const void *x, int tx, i64 n) {
  map1(out, to, x, tx, n, [](float v, i64) { return fmaxf(v, 0.0f); });
}

// threshold_backward: the gradient where the output is positive.
extern "C" __global__ void relu_backward(void *out, int to, const void *g, int tg, const void *y, int ty,
                              i64 n) {
  map2(out, to, g, tg, y, ty, n, n, [](float gv, float yv) { return yv > 0.0f ? gv : 0.0f; });
}

extern "C" __global__ void gelu_(void *out, int to, const void *x, int tx, i64 n) {
  map1(out, to, x, tx, n, [](float v, i64) { return gelu(v); });
}

extern "C" __global__ void gelu_backward(void *out, int to, const void *g, int tg, const void *x, int tx,
                              i64 n) {
  map2(out, to, g, tg, x, tx, n, n, [](float gv, float v) {
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = expf(-0.5f * v * v) * 0.3989423f;
    return gv * (cdf + v * pdf);
  });
}

// `a + b`, `b` (nb elements) repeated over `a`'s leading dimensions.
extern "C" __global__ void add(void *out, int to, const void *a, int ta, const void *b, int tb, i64 n,
                    i64 nb) {
  map2(out, to, a, ta, b, tb, n, nb, [](float u, float v) { return u + v; });
}

// Each row of `out` (cols wide) a copy of `bias`: addmm's C before the
// product is added into it.
extern "C" __global__ void bias_rows(void *out, int to, const void *bias, int tb, i64 n, i64 cols) {
  gen(out, to, n, [=](i64 i) { return ld(bias, tb, qmod(i, cols)); });
}

// Column sums: each block takes COLS columns, its GROUPS groups of
// threads interleaving the rows, DEPTH rows read before any is added (a
// thread's loads in flight), the groups' partial sums added in shared
// memory, in a fixed order.
#define COLS 8
#define GROUPS (THREADS / COLS)
#define DEPTH 8

// `x` summed over its leading dimensions down to `n` elements (a bias's
// gradient).
extern "C" __global__ void sum_rows(void *out, int to, const void *x, int tx, i64 n, i64 rows) {
  __shared__ float shared[THREADS];
  i64 j = (i64)blockIdx.x * COLS + threadIdx.x % COLS;
  int group = threadIdx.x / COLS;
  float s = 0.0f;
  if (j < n)
    typed(tx, [&](auto X) {
      for (i64 r0 = group; r0 < rows; r0 += (i64)GROUPS * DEPTH) {
        float v[DEPTH];
#pragma unroll
        for (int u = 0; u < DEPTH; u++) {
          i64 r = r0 + (i64)u * GROUPS;
          v[u] = r < rows ? ldt(X, x, tx, r * n + j) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < DEPTH; u++) s += v[u];
      }
    });
  shared[threadIdx.x] = s;
  __syncthreads();
  if (group == 0 && j < n) {
    for (int k = 1; k < GROUPS; k++) s += shared[k * COLS + threadIdx.x];
    st(out, to, j, s);
  }
}

// The lower triangle (diagonal included) of a square's ones.
extern "C" __global__ void tril(void *out, int to, i64 n, i64 cols) {
  gen(out, to, n, [=](i64 i) {
    return qmod(i, cols) <= qmod(qdiv(i, cols), cols) ? 1.0f : 0.0f;
  });
}

// `x` where the mask (nm elements, repeated) is false, `value` where true.
extern "C" __global__ void masked_fill(void *out, int to, const void *x, int tx, const void *mask, int tm,
                            i64 n, i64 nm, float value) {
  map2(out, to, x, tx, mask, tm, n, nm, [=](float v, float m) { return m != 0.0f ? value : v; });
}

// Rows of `weight` (cols wide) picked by `ids`.
extern "C" __global__ void embedding(void *out, int to, const void *weight, int tw, const void *ids, int ti,
                          i64 n, i64 cols, i64 rows) {
  EACH(i, n) {
    i64 id = (i64)ld(ids, ti, qdiv(i, cols));
    float v = id >= 0 && id < rows ? ld(weight, tw, id * cols + qmod(i, cols))
                                   : __int_as_float(0x7fc00000);
    st(out, to, i, v);
  }
}

// embedding_dense_backward into a float32 table the caller zeroed: each
// row of `grad` added into the row its id picks.
extern "C" __global__ void embedding_backward(float *out, const void *grad, int tg, const void *ids, int ti,
                                   i64 n, i64 cols, i64 rows) {
  EACH(i, n) {
    i64 id = (i64)ld(ids, ti, qdiv(i, cols));
    if (id >= 0 && id < rows) atomicAdd(out + id * cols + qmod(i, cols), ld(grad, tg, i));
  }
}

// Softmax and log-softmax over each row, one block a row: a row of at
// most ROW_HELD · THREADS elements is read once and held in registers; a
// longer one is read twice, its maximum and sum found in one pass (each
// thread's sum rescaled when its maximum grows).
#define ROW_HELD 8

extern "C" __global__ void softmax(void *out, int to, const void *x, int tx, i64 cols,
                                   int log) {
  __shared__ float shared[THREADS / 32];
  const float inf = __int_as_float(0x7f800000);
  i64 row = (i64)blockIdx.x * cols;
  if (cols <= ROW_HELD * THREADS) {
    float v[ROW_HELD];
    float m = -inf;
    for (int k = 0; k < ROW_HELD; k++) {
      i64 j = threadIdx.x + k * THREADS;
      v[k] = j < cols ? ld(x, tx, row + j) : -inf;
      m = fmaxf(m, v[k]);
    }
    m = block_max(m, shared);
    float s = 0.0f;
    for (int k = 0; k < ROW_HELD; k++)
      if (threadIdx.x + k * THREADS < cols) s += expf(v[k] - m);
    s = block_sum(s, shared);
    float log_sum = logf(s) + m;
    for (int k = 0; k < ROW_HELD; k++) {
      i64 j = threadIdx.x + k * THREADS;
      if (j < cols) st(out, to, row + j, log ? v[k] - log_sum : expf(v[k] - m) / s);
    }
    return;
  }
  float m = -inf, s = 0.0f;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float v = ld(x, tx, row + j);
    if (v > m) {
      s = (m == -inf ? 0.0f : s * expf(m - v)) + 1.0f;
      m = v;
    } else if (v != -inf) {
      s += expf(v - m);
    }
  }
  float row_max = block_max(m, shared);
  s = block_sum(m == -inf ? 0.0f : s * expf(m - row_max), shared);
  m = row_max;
  float log_sum = logf(s) + m;
  for (i64 j = threadIdx.x; j < cols; j += THREADS) {
    float v = ld(x, tx, row + j);
    st(out, to, row + j, log ? v - log_sum : expf(v - m) / s);
  }
}

// Softmax's backward, y · (g - Σ g·y); log-softmax's, g - exp(y) · Σ g;
// one block a row.
extern "C" __global__ void softmax_backward(void *out, int to, const void *g, int tg,
                                            const void *y, int ty, i64 cols, int log) {
  __shared__ float shared[THREADS / 32];
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

// The same over rows of at most WARP_ROW elements, every tensor float32
// or bfloat16 (`kernels::softmax_calls` picks these then): one warp a
// row, WARP_ROWS rows a block, WARP_ROW / 32 elements a lane held in
// registers.
#define WARP_ROW 1024
#define WARP_ROWS (THREADS / 32)
#define LANE_HELD (WARP_ROW / 32)

// Calls f(Ty<A>, Ty<B>, Ty<C>) for the types' codes, each float32 or
// bfloat16.
template <typename F> __device__ __forceinline__ void fast3(int a, int b, int c, F f) {
  auto last = [&](auto A, auto B) {
    if (c == 0) f(A, B, Ty<0>{});
    else f(A, B, Ty<2>{});
  };
  auto second = [&](auto A) {
    if (b == 0) last(A, Ty<0>{});
    else last(A, Ty<2>{});
  };
  if (a == 0) second(Ty<0>{});
  else second(Ty<2>{});
}

template <int TX, int TO>
__device__ __forceinline__ void softmax_warp(void *out, const void *x, i64 row, i64 cols,
                                             int log) {
  const float inf = __int_as_float(0x7f800000);
  int lane = threadIdx.x % 32;
  float v[LANE_HELD];
  float m = -inf;
#pragma unroll
  for (int k = 0; k < LANE_HELD; k++) {
    i64 j = lane + k * 32;
    v[k] = j < cols ? ld(x, TX, row + j) : -inf;
    m = fmaxf(m, v[k]);
  }
  m = warp_max(m);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < LANE_HELD; k++)
    if (lane + k * 32 < cols) {
      float e = expf(v[k] - m);
      s += e;
      if (!log) v[k] = e;
    }
  s = warp_sum(s);
  float log_sum = logf(s) + m;
#pragma unroll
  for (int k = 0; k < LANE_HELD; k++) {
    i64 j = lane + k * 32;
    if (j < cols) st(out, TO, row + j, log ? v[k] - log_sum : v[k] / s);
  }
}

extern "C" __global__ void softmax_warps(void *out, int to, const void *x, int tx, i64 cols,
                                         i64 rows, int log) {
  i64 r = (i64)blockIdx.x * WARP_ROWS + threadIdx.x / 32;
  if (r >= rows) return;
  fast3(tx, to, 0, [&](auto X, auto O, auto) {
    softmax_warp<decltype(X)::code, decltype(O)::code>(out, x, r * cols, cols, log);
  });
}

template <int TG, int TY, int TO>
__device__ __forceinline__ void softmax_backward_warp(void *out, const void *g, const void *y,
                                                      i64 row, i64 cols, int log) {
  int lane = threadIdx.x % 32;
  float gv[LANE_HELD], yv[LANE_HELD];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < LANE_HELD; k++) {
    i64 j = lane + k * 32;
    gv[k] = j < cols ? ld(g, TG, row + j) : 0.0f;
    yv[k] = j < cols ? ld(y, TY, row + j) : 0.0f;
    s += log ? gv[k] : gv[k] * yv[k];
  }
  s = warp_sum(s);
#pragma unroll
  for (int k = 0; k < LANE_HELD; k++) {
    i64 j = lane + k * 32;
    if (j < cols) st(out, TO, row + j, log ? gv[k] - expf(yv[k]) * s : yv[k] * (gv[k] - s));
  }
}

extern "C" __global__ void softmax_backward_warps(void *out, int to, const void *g, int tg,
                                                  const void *y, int ty, i64 cols, i64 rows,
                                                  int log) {
  i64 r = (i64)blockIdx.x * WARP_ROWS + threadIdx.x / 32;
  if (r >= rows) return;
  fast3(tg, ty, to, [&](auto G, auto Y, auto O) {
    softmax_backward_warp<decltype(G)::code, decltype(Y)::code, decltype(O)::code>(
        out, g, y, r * cols, cols, log);
  });
}

// NLL's mean over the rows of `lp` (classes wide), and its total weight.
// A label outside the classes makes the loss NaN.
extern "C" __global__ void nll(void *out, int to, void *total, int tt, const void *lp, int tl,
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
extern "C" __global__ void nll_backward(void *out, int to, const void *grad, int tgr, const void *targets,
                             int tg, const void *weight, int tw, i64 n, i64 classes) {
  float v = -ld(grad, tgr, 0) / ld(weight, tw, 0);
  gen(out, to, n, [=](i64 i) {
    i64 r = qdiv(i, classes);
    return (i64)ld(targets, tg, r) == i - r * classes ? v : 0.0f;
  });
}

// out[dst] = x[src] for each element i, `at(i, dst, src)`; four at a
// time when `by4` says that elements 4k..4k+3 go from four neighbours
// (src a multiple of 4) to four neighbours (dst a multiple of 4).
template <typename F>
__device__ __forceinline__ void relayout(void *out, int to, const void *x, int tx, i64 n,
                                         bool by4, F at) {
  if (by4 && n % 4 == 0 && quads(out, to) && quads(x, tx)) {
    EACH(q, n / 4) {
      i64 dst, src;
      at(4 * q, dst, src);
      float v[4];
      ld4(x, tx, src / 4, v);
      st4(out, to, dst / 4, v);
    }
  } else {
    EACH(i, n) {
      i64 dst, src;
      at(i, dst, src);
      st(out, to, dst, ld(x, tx, src));
    }
  }
}

// Head `part` of a B x S x row projection (q, k, v side by side, each
// H · D wide) as B x H x S x D.
extern "C" __global__ void heads(void *out, int to, const void *x, int tx, i64 n, i64 s, i64 h,
                                 i64 d, i64 row, i64 part) {
  relayout(out, to, x, tx, n, d % 4 == 0 && row % 4 == 0, [=](i64 i, i64 &dst, i64 &src) {
    i64 t = qdiv(i, d), dd = i - t * d, bh = qdiv(t, s), ss = t - bh * s, b = qdiv(bh, h),
        hh = bh - b * h;
    dst = i;
    src = (b * s + ss) * row + part * h * d + hh * d + dd;
  });
}

// Part `p` of the q/k/v gradients (B x S x H · D, or heads: B x H x S x D
// when `h` > 0) into its third of each B x S x row token.
extern "C" __global__ void cat_part(void *out, int to, const void *x, int tx, i64 n, i64 s,
                                    i64 h, i64 d, i64 row, i64 p) {
  i64 width = row / 3;
  bool by4 = width % 4 == 0 && (h == 0 || d % 4 == 0);
  relayout(out, to, x, tx, n, by4, [=](i64 i, i64 &dst, i64 &src) {
    i64 t = qdiv(i, width), c = i - t * width;
    src = i;
    if (h > 0) {
      i64 b = qdiv(t, s), hh = qdiv(c, d);
      src = ((b * h + hh) * s + (t - b * s)) * d + (c - hh * d);
    }
    dst = t * row + p * width + c;
  });
}

// B x H x S x D heads back as B x S x (H · D).
extern "C" __global__ void merge_heads(void *out, int to, const void *x, int tx, i64 n, i64 s,
                                       i64 h, i64 d) {
  relayout(out, to, x, tx, n, d % 4 == 0, [=](i64 i, i64 &dst, i64 &src) {
    i64 t = qdiv(i, d), dd = i - t * d, bs = qdiv(t, h), hh = t - bs * h, b = qdiv(bs, s),
        ss = bs - b * s;
    dst = i;
    src = ((b * h + hh) * s + ss) * d + dd;
  });
}

// LayerNorm (with a bias) or RMSNorm over rows `cols` wide, one block a
// row: the output, and (LayerNorm) the mean, then the inverse deviation.
extern "C" __global__ void norm_rows(void *out, int to, void *mean, int tm, void *rstd, int tr, const void *x,
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
extern "C" __global__ void norm_backward_input(void *out, int to, const void *g, int tg, const void *x,
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

// One thread's share of a norm's parameter gradients: Σ g · xhat and
// Σ g over its rows of column j (TG, TX, TS: the types of g, x and the
// saved statistics, -1 where known only at run time).
template <int TG, int TX, int TS>
__device__ __forceinline__ void norm_params_part(float &w, float &b, const void *g, int tg,
                                                 const void *x, int tx, const void *mean,
                                                 int tm, const void *rstd, int tr, i64 j,
                                                 i64 cols, i64 rows, int layer) {
  int group = threadIdx.x / COLS;
  for (i64 r0 = group; r0 < rows; r0 += (i64)GROUPS * DEPTH) {
    float gv[DEPTH], xhat[DEPTH];
#pragma unroll
    for (int u = 0; u < DEPTH; u++) {
      i64 r = r0 + (i64)u * GROUPS;
      bool in = r < rows;
      gv[u] = in ? ld(g, TG >= 0 ? TG : tg, r * cols + j) : 0.0f;
      float mu = in && layer ? ld(mean, TS >= 0 ? TS : tm, r) : 0.0f;
      float inv = in ? ld(rstd, TS >= 0 ? TS : tr, r) : 0.0f;
      xhat[u] = in ? (ld(x, TX >= 0 ? TX : tx, r * cols + j) - mu) * inv : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < DEPTH; u++) {
      w += gv[u] * xhat[u];
      b += gv[u];
    }
  }
}

// Its weight's gradient, Σ g · xhat over the rows, and (when `layer`)
// its bias's, Σ g: COLS columns a block, as `sum_rows`.
extern "C" __global__ void norm_backward_params(void *dw, int tdw, void *db, int tdb,
                                                const void *g, int tg, const void *x, int tx,
                                                const void *mean, int tm, const void *rstd,
                                                int tr, i64 cols, i64 rows, int layer) {
  __shared__ float sw[THREADS], sb[THREADS];
  i64 j = (i64)blockIdx.x * COLS + threadIdx.x % COLS;
  int group = threadIdx.x / COLS;
  float w = 0.0f, b = 0.0f;
  if (j < cols) {
    bool stats32 = tr == 0 && (tm == 0 || !layer);
    bool fast = stats32 && (tg == 0 || tg == 2) && (tx == 0 || tx == 2);
    if (fast)
      fast3(tg, tx, 0, [&](auto G, auto X, auto) {
        norm_params_part<decltype(G)::code, decltype(X)::code, 0>(w, b, g, tg, x, tx, mean, tm,
                                                                  rstd, tr, j, cols, rows, layer);
      });
    else
      norm_params_part<-1, -1, -1>(w, b, g, tg, x, tx, mean, tm, rstd, tr, j, cols, rows, layer);
  }
  sw[threadIdx.x] = w;
  sb[threadIdx.x] = b;
  __syncthreads();
  if (group == 0 && j < cols) {
    for (int k = 1; k < GROUPS; k++) {
      w += sw[k * COLS + threadIdx.x];
      b += sb[k * COLS + threadIdx.x];
    }
    st(dw, tdw, j, w);
    if (layer) st(db, tdb, j, b);
  }
}

// The CNN's 3x3 convolution, padding 1 (`cpu::conv`): each output element
// the bias plus, input channel by input channel, the sum of its nine taps.
extern "C" __global__ void conv3x3(void *out, int to, const void *x, int tx, const void *weight,
                                   int tw, const void *bias, int tb, i64 n, i64 ci, i64 co, i64 h,
                                   i64 w) {
  i64 plane = h * w;
  EACH(i, n * co * plane) {
    i64 p = qmod(i, plane), bo = qdiv(i, plane), o = qmod(bo, co), b = qdiv(bo, co);
    i64 y = qdiv(p, w), xx = p - y * w;
    float acc = ld(bias, tb, o);
    for (i64 c = 0; c < ci; c++) {
      i64 src = (b * ci + c) * plane, k = (o * ci + c) * 9;
      float s = 0.0f;
      for (int t = 0; t < 9; t++) {
        i64 yy = y + t / 3 - 1, x2 = xx + t % 3 - 1;
        if (yy >= 0 && yy < h && x2 >= 0 && x2 < w)
          s += ld(weight, tw, k + t) * ld(x, tx, src + yy * w + x2);
      }
      acc += s;
    }
    st(out, to, i, acc);
  }
}

// Its input's gradient: each input element gathers, output channel by
// output channel, the gradients of the outputs whose taps read it (in the
// order the CPU adds them: nearest output last).
extern "C" __global__ void conv3x3_backward_input(void *out, int to, const void *g, int tg,
                                                  const void *weight, int tw, i64 n, i64 ci,
                                                  i64 co, i64 h, i64 w) {
  i64 plane = h * w;
  EACH(i, n * ci * plane) {
    i64 q = qmod(i, plane), bc = qdiv(i, plane), c = qmod(bc, ci), b = qdiv(bc, ci);
    i64 y = qdiv(q, w), xx = q - y * w;
    float acc = 0.0f;
    for (i64 o = 0; o < co; o++) {
      i64 go = (b * co + o) * plane, k = (o * ci + c) * 9;
      for (int t = 8; t >= 0; t--) {
        i64 py = y + 1 - t / 3, px = xx + 1 - t % 3;
        if (py >= 0 && py < h && px >= 0 && px < w)
          acc += ld(g, tg, go + py * w + px) * ld(weight, tw, k + t);
      }
    }
    st(out, to, i, acc);
  }
}

// Its weight's gradient, one block a tap of one (output, input) channel
// pair, summed over the batch and the plane; the blocks of tap 0 of input
// channel 0 sum the bias's gradient too.
extern "C" __global__ void conv3x3_backward_params(void *dw, int tdw, void *db, int tdb,
                                                   const void *g, int tg, const void *x, int tx,
                                                   i64 n, i64 ci, i64 co, i64 h, i64 w) {
  __shared__ float shared[THREADS];
  i64 plane = h * w, k = blockIdx.x, t = qmod(k, 9), c = qmod(qdiv(k, 9), ci), o = qdiv(k, ci * 9);
  i64 dy = t / 3 - 1, dx = t % 3 - 1;
  float s = 0.0f, sb = 0.0f;
  for (i64 e = threadIdx.x; e < n * plane; e += THREADS) {
    i64 b = qdiv(e, plane), p = e - b * plane, y = qdiv(p, w), xx = p - y * w;
    float gv = ld(g, tg, (b * co + o) * plane + p);
    sb += gv;
    i64 yy = y + dy, x2 = xx + dx;
    if (yy >= 0 && yy < h && x2 >= 0 && x2 < w)
      s += gv * ld(x, tx, (b * ci + c) * plane + yy * w + x2);
  }
  s = block_sum(s, shared);
  bool bias = c == 0 && t == 0;
  if (bias) sb = block_sum(sb, shared);
  if (threadIdx.x == 0) {
    st(dw, tdw, k, s);
    if (bias) st(db, tdb, o, sb);
  }
}

// Batch norm with the batch's statistics (`cpu::batch_norm`), one block a
// channel: the output, the mean and the inverse deviation of the biased
// variance.
extern "C" __global__ void batch_norm(void *out, int to, void *mean, int tm, void *invstd, int ti,
                                      const void *x, int tx, const void *weight, int tw,
                                      const void *bias, int tb, i64 n, i64 c, i64 plane,
                                      float eps) {
  __shared__ float shared[THREADS];
  i64 ch = blockIdx.x, count = n * plane;
  float s = 0.0f;
  for (i64 e = threadIdx.x; e < count; e += THREADS) {
    i64 b = qdiv(e, plane);
    s += ld(x, tx, (b * c + ch) * plane + e - b * plane);
  }
  float mu = block_sum(s, shared) / (float)count;
  float q = 0.0f;
  for (i64 e = threadIdx.x; e < count; e += THREADS) {
    i64 b = qdiv(e, plane);
    float d = ld(x, tx, (b * c + ch) * plane + e - b * plane) - mu;
    q += d * d;
  }
  float inv = 1.0f / sqrtf(block_sum(q, shared) / (float)count + eps);
  float wv = ld(weight, tw, ch), bv = ld(bias, tb, ch);
  for (i64 e = threadIdx.x; e < count; e += THREADS) {
    i64 b = qdiv(e, plane), at = (b * c + ch) * plane + e - b * plane;
    st(out, to, at, (ld(x, tx, at) - mu) * inv * wv + bv);
  }
  if (threadIdx.x == 0) {
    st(mean, tm, ch, mu);
    st(invstd, ti, ch, inv);
  }
}

// Its backward, one block a channel: the input's, the weight's and the
// bias's gradients.
extern "C" __global__ void batch_norm_backward(void *dx, int tdx, void *dw, int tdw, void *db,
                                               int tdb, const void *g, int tg, const void *x,
                                               int tx, const void *weight, int tw,
                                               const void *mean, int tm, const void *invstd,
                                               int ti, i64 n, i64 c, i64 plane) {
  __shared__ float shared[THREADS];
  i64 ch = blockIdx.x, count = n * plane;
  float mu = ld(mean, tm, ch), inv = ld(invstd, ti, ch);
  float sg = 0.0f, sgx = 0.0f;
  for (i64 e = threadIdx.x; e < count; e += THREADS) {
    i64 b = qdiv(e, plane), at = (b * c + ch) * plane + e - b * plane;
    float gv = ld(g, tg, at);
    sg += gv;
    sgx += gv * (ld(x, tx, at) - mu) * inv;
  }
  sg = block_sum(sg, shared);
  sgx = block_sum(sgx, shared);
  float scale = ld(weight, tw, ch) * inv / (float)count;
  for (i64 e = threadIdx.x; e < count; e += THREADS) {
    i64 b = qdiv(e, plane), at = (b * c + ch) * plane + e - b * plane;
    float xhat = (ld(x, tx, at) - mu) * inv;
    st(dx, tdx, at, scale * ((float)count * ld(g, tg, at) - sg - xhat * sgx));
  }
  if (threadIdx.x == 0) {
    st(dw, tdw, ch, sgx);
    st(db, tdb, ch, sg);
  }
}

// 2x2 max pooling, stride 2 (`cpu::max_pool`): the first maximum of a
// window wins (a NaN always), its index counted within its input plane.
extern "C" __global__ void max_pool2(void *out, int to, void *indices, int ti, const void *x,
                                     int tx, i64 planes, i64 h, i64 w) {
  i64 oh = h / 2, ow = w / 2, per = oh * ow;
  EACH(i, planes * per) {
    i64 p = qdiv(i, per), r = i - p * per, y = qdiv(r, ow), xx = r - y * ow;
    i64 base = p * h * w, first = 2 * y * w + 2 * xx;
    i64 window[4] = {first, first + 1, first + w, first + w + 1};
    i64 best = window[0];
    float bv = ld(x, tx, base + best);
    for (int k = 1; k < 4; k++) {
      float v = ld(x, tx, base + window[k]);
      if (v > bv || v != v) best = window[k], bv = v;
    }
    st(out, to, i, bv);
    st(indices, ti, i, (float)best);
  }
}

// Its backward: each input element takes its window's gradient where it
// was the maximum (windows do not overlap), zero elsewhere.
extern "C" __global__ void max_pool2_backward(void *out, int to, const void *g, int tg,
                                              const void *indices, int ti, i64 planes, i64 h,
                                              i64 w) {
  i64 oh = h / 2, ow = w / 2, plane = h * w;
  EACH(i, planes * plane) {
    i64 p = qdiv(i, plane), q = i - p * plane, y = qdiv(q, w), xx = q - y * w;
    i64 oy = y / 2, ox = xx / 2, k = p * oh * ow + oy * ow + ox;
    bool mine = oy < oh && ox < ow && (i64)ld(indices, ti, k) == q;
    st(out, to, i, mine ? ld(g, tg, k) : 0.0f);
  }
}

// Fused causal attention (`cpu::attention`): a query row of one head a
// block, its scores (or, backward, its probabilities and their
// gradients) held in shared memory, at most ATTN_ROW of them: a longer
// sequence is computed on the host. `scale` is 1 / sqrt(d) as the host
// rounds it.
#define ATTN_ROW 2048

// Element t of row i of head hi of part p (q, k, v: 0, 1, 2) of the
// B x S x 3 x H x D projection.
__device__ __forceinline__ i64 qkv_at(i64 bi, i64 i, int p, i64 hi, i64 t, i64 s, i64 h, i64 d) {
  return ((bi * s + i) * 3 + p) * h * d + hi * d + t;
}

// Where a gradient's element goes: B x H x S x D heads, or (packed) the
// projection's own layout.
__device__ __forceinline__ i64 grad_at(int packed, int p, i64 bi, i64 hi, i64 i, i64 t, i64 s,
                                       i64 h, i64 d) {
  return packed ? qkv_at(bi, i, p, hi, t, s, h, d) : ((bi * h + hi) * s + i) * d + t;
}

__device__ __forceinline__ float row_dot(const void *a, int ta, i64 x, const void *b, int tb,
                                         i64 y, i64 d) {
  float acc = 0.0f;
  for (i64 t = 0; t < d; t++) acc += ld(a, ta, x + t) * ld(b, tb, y + t);
  return acc;
}

// The output (tokens' layout, B x S x H·D) and the log-sum-exp (B x H x
// rows, S of each used).
extern "C" __global__ void sdpa_forward(void *out, int to, void *lse, int tl, const void *qkv, int tq,
                                        i64 h, i64 s, i64 d, i64 rows, float scale) {
  __shared__ float scores[ATTN_ROW];
  __shared__ float shared[THREADS];
  i64 r = blockIdx.x, i = qmod(r, s), bh = qdiv(r, s), hi = qmod(bh, h), bi = qdiv(bh, h);
  i64 q = qkv_at(bi, i, 0, hi, 0, s, h, d);
  float m = -__int_as_float(0x7f800000);
  for (i64 j = threadIdx.x; j <= i; j += THREADS) {
    float sc = row_dot(qkv, tq, q, qkv, tq, qkv_at(bi, j, 1, hi, 0, s, h, d), d) * scale;
    scores[j] = sc;
    m = fmaxf(m, sc);
  }
  m = block_max(m, shared);
  float sum = 0.0f;
  for (i64 j = threadIdx.x; j <= i; j += THREADS) sum += expf(scores[j] - m);
  float log_sum = logf(block_sum(sum, shared)) + m;
  if (threadIdx.x == 0) st(lse, tl, bh * rows + i, log_sum);
  // The padded rows of the log-sum-exp, as the CPU has them: zeros.
  if (i == s - 1)
    for (i64 p = s + threadIdx.x; p < rows; p += THREADS) st(lse, tl, bh * rows + p, 0.0f);
  // Each key's probability, once: exp(score - log-sum-exp).
  for (i64 j = threadIdx.x; j <= i; j += THREADS) scores[j] = expf(scores[j] - log_sum);
  __syncthreads();
  for (i64 t = threadIdx.x; t < d; t += THREADS) {
    float acc = 0.0f;
    for (i64 j = 0; j <= i; j++) acc += scores[j] * ld(qkv, tq, qkv_at(bi, j, 2, hi, t, s, h, d));
    st(out, to, (bi * s + i) * h * d + hi * d + t, acc);
  }
}

// The query's gradient, a query row a block: each key's
// p · (g · v - g · o) · scale, then their sum over the keys' rows.
extern "C" __global__ void sdpa_backward_q(void *dq, int tdq, const void *g, int tg,
                                           const void *qkv, int tq, const void *out, int to,
                                           const void *lse, int tl, i64 h, i64 s, i64 d,
                                           i64 rows, float scale, int packed) {
  __shared__ float ds[ATTN_ROW];
  i64 r = blockIdx.x, i = qmod(r, s), bh = qdiv(r, s), hi = qmod(bh, h), bi = qdiv(bh, h);
  i64 tok = (bi * s + i) * h * d + hi * d, q = qkv_at(bi, i, 0, hi, 0, s, h, d);
  float delta = row_dot(g, tg, tok, out, to, tok, d), log_sum = ld(lse, tl, bh * rows + i);
  for (i64 j = threadIdx.x; j <= i; j += THREADS) {
    float p = expf(row_dot(qkv, tq, q, qkv, tq, qkv_at(bi, j, 1, hi, 0, s, h, d), d) * scale -
                   log_sum);
    float gv = row_dot(g, tg, tok, qkv, tq, qkv_at(bi, j, 2, hi, 0, s, h, d), d);
    ds[j] = p * (gv - delta) * scale;
  }
  __syncthreads();
  for (i64 t = threadIdx.x; t < d; t += THREADS) {
    float acc = 0.0f;
    for (i64 j = 0; j <= i; j++) acc += ds[j] * ld(qkv, tq, qkv_at(bi, j, 1, hi, t, s, h, d));
    st(dq, tdq, grad_at(packed, 0, bi, hi, i, t, s, h, d), acc);
  }
}

// The key's and the value's gradients, a key row a block: over the
// queries at or after it, Σ ds · q and Σ p · g.
extern "C" __global__ void sdpa_backward_kv(void *dk, int tdk, void *dv, int tdv, const void *g,
                                            int tg, const void *qkv, int tq, const void *out,
                                            int to, const void *lse, int tl, i64 h, i64 s, i64 d,
                                            i64 rows, float scale, int packed) {
  __shared__ float ps[ATTN_ROW], dss[ATTN_ROW];
  i64 r = blockIdx.x, j = qmod(r, s), bh = qdiv(r, s), hi = qmod(bh, h), bi = qdiv(bh, h);
  i64 k = qkv_at(bi, j, 1, hi, 0, s, h, d), v = qkv_at(bi, j, 2, hi, 0, s, h, d);
  for (i64 i = j + threadIdx.x; i < s; i += THREADS) {
    i64 tok = (bi * s + i) * h * d + hi * d;
    float delta = row_dot(g, tg, tok, out, to, tok, d);
    float p = expf(row_dot(qkv, tq, qkv_at(bi, i, 0, hi, 0, s, h, d), qkv, tq, k, d) * scale -
                   ld(lse, tl, bh * rows + i));
    ps[i - j] = p;
    dss[i - j] = p * (row_dot(g, tg, tok, qkv, tq, v, d) - delta) * scale;
  }
  __syncthreads();
  for (i64 t = threadIdx.x; t < d; t += THREADS) {
    float dkv = 0.0f, dvv = 0.0f;
    for (i64 i = j; i < s; i++) {
      dvv += ps[i - j] * ld(g, tg, (bi * s + i) * h * d + hi * d + t);
      dkv += dss[i - j] * ld(qkv, tq, qkv_at(bi, i, 0, hi, t, s, h, d));
    }
    st(dk, tdk, grad_at(packed, 1, bi, hi, j, t, s, h, d), dkv);
    st(dv, tdv, grad_at(packed, 2, bi, hi, j, t, s, h, d), dvv);
  }
}

// The synthetic set's rows (`train::data::Synthetic::batch`): each
// sample's features around its class's mean, and its label.
extern "C" __global__ void synthetic_batch(void *x, int tx, void *y, int ty, i64 start, i64 batch,
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
extern "C" __global__ void synthetic_sequences(void *x, int tx, void *y, int ty, i64 start, i64 batch,
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
extern "C" __global__ void init_param(void *out, int to, i64 n, int rule, float bound, i64 seed,
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
extern "C" __global__ void sgd_update(void *p, int tp, const void *g, int tg, void *buf, int tb, i64 n,
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

extern "C" __global__ void adam_update(void *p, int tp, const void *g, int tg, void *m, int tm, void *v,
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
