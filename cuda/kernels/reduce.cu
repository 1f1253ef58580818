// fairgo's device kernels: the add stage's reduction of n strided sources,
// a fill kernel for tests and examples, and a delay kernel for tests.
//
// Compiled to PTX by `make ptx` (nvcc -ptx -arch=compute_70); the PTX is
// committed and embedded in the Go package, so users need no nvcc. Only
// plain C++, bit operations and two cvt instructions are used (no
// cuda_fp16.h), so compute_70 is enough and the driver JIT-compiles it for newer GPUs.
//
// reduce:  dst[i] = op over k in [0, n) of src[k*stride + i], i in [0, count)
//          avg of floats multiplies every term by 1/divisor before it sums
//          (so a sum of large values cannot overflow where their average
//          would not, as NCCL's pre-multiplied average); avg of integers
//          divides the wrapping sum by divisor, truncating toward zero.
//          float16 and bfloat16 accumulate in float32 and round once, to
//          nearest even.
//          max/min propagate NaN.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// ---- 16-bit floats, by bits -------------------------------------------------

struct half_t { u16 bits; };
struct bf16_t { u16 bits; };

// On the GPU the conversions are single PTX instructions (cvt, sm_53+, so
// compute_70 has them); the bit versions below them are the same function and
// serve the CPU build of the host check (FG_HOST_TEST), which tests the rest
// of the kernel logic against them.
__device__ __forceinline__ float half_to_float(u16 h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  u32 sign = (u32)(h & 0x8000u) << 16;
  u32 e = (h >> 10) & 0x1fu;
  u32 m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));  // inf, nan
  if (e == 0) {
    // zero or subnormal: m * 2^-24, exact in float
    float v = (float)m * 5.9604644775390625e-8f;
    return __uint_as_float(sign | __float_as_uint(v));
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

__device__ __forceinline__ u16 float_to_half(float f) {
#if defined(__CUDA_ARCH__)
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  u32 x = __float_as_uint(f);
  u32 sign = (x >> 16) & 0x8000u;
  u32 ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan (nan stays quiet nan, keeps top payload bits)
    return (u16)(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // rounds to inf (>= 65520)
  if (ax >= 0x38800000u) {  // normal half
    u32 r = (ax - 0x38000000u) >> 13;
    u32 rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (u16)(sign | r);
  }
  if (ax < 0x33000000u) return (u16)sign;  // below 2^-25 (ties to even zero at 2^-25)
  u32 e = ax >> 23;                          // 102 .. 112
  u32 m = (ax & 0x7fffffu) | 0x800000u;
  u32 shift = 126u - e;                      // 14 .. 24
  u32 r = m >> shift;
  u32 rem = m & ((1u << shift) - 1u);
  u32 halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (r & 1u))) r++;
  return (u16)(sign | r);
#endif
}

__device__ __forceinline__ float bf16_to_float(u16 b) { return __uint_as_float((u32)b << 16); }

__device__ __forceinline__ u16 float_to_bf16(float f) {
  u32 x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return (u16)(x >> 16);
}

// ---- element traits: storage type, accumulator, conversions -----------------

template <typename T> struct Traits {
  typedef T acc;
  static __device__ __forceinline__ acc load(T v) { return v; }
  static __device__ __forceinline__ T store(acc a) { return a; }
  static __device__ __forceinline__ T from_double(double v) { return (T)(i64)v; }
};
template <> struct Traits<half_t> {
  typedef float acc;
  static __device__ __forceinline__ acc load(half_t v) { return half_to_float(v.bits); }
  static __device__ __forceinline__ half_t store(acc a) { half_t h; h.bits = float_to_half(a); return h; }
  static __device__ __forceinline__ half_t from_double(double v) { return store((float)v); }
};
template <> struct Traits<bf16_t> {
  typedef float acc;
  static __device__ __forceinline__ acc load(bf16_t v) { return bf16_to_float(v.bits); }
  static __device__ __forceinline__ bf16_t store(acc a) { bf16_t h; h.bits = float_to_bf16(a); return h; }
  static __device__ __forceinline__ bf16_t from_double(double v) { return store((float)v); }
};
template <> struct Traits<float> {
  typedef float acc;
  static __device__ __forceinline__ acc load(float v) { return v; }
  static __device__ __forceinline__ float store(acc a) { return a; }
  static __device__ __forceinline__ float from_double(double v) { return (float)v; }
};
template <> struct Traits<double> {
  typedef double acc;
  static __device__ __forceinline__ acc load(double v) { return v; }
  static __device__ __forceinline__ double store(acc a) { return a; }
  static __device__ __forceinline__ double from_double(double v) { return v; }
};

// Wrapping integer arithmetic: signed types go through their unsigned twin.
template <typename T> struct Unsigned { typedef T type; };
template <> struct Unsigned<i8> { typedef u8 type; };
template <> struct Unsigned<int> { typedef u32 type; };
template <> struct Unsigned<i64> { typedef u64 type; };

template <typename T> struct IsSigned { enum { value = 0 }; };
template <> struct IsSigned<i8> { enum { value = 1 }; };
template <> struct IsSigned<int> { enum { value = 1 }; };
template <> struct IsSigned<i64> { enum { value = 1 }; };

template <typename T> struct IsFloat { enum { value = 0 }; };
template <> struct IsFloat<float> { enum { value = 1 }; };
template <> struct IsFloat<double> { enum { value = 1 }; };

// A product that the compiler may not contract into a fused multiply-add
// with the sum that follows: the avg's scaled terms round as on the host.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
#else
__device__ __forceinline__ float mul_rn(float a, float b) { return a * b; }
__device__ __forceinline__ double mul_rn(double a, double b) { return a * b; }
#endif

template <typename A, int F> struct Arith;
template <typename A> struct Arith<A, 1> {
  static __device__ __forceinline__ A add(A a, A b) { return a + b; }
  static __device__ __forceinline__ A mul(A a, A b) { return a * b; }
  static __device__ __forceinline__ A div(A a, i64 d) { return a / (A)d; }
  // avg: every term scaled by 1/d before the sum, nothing after.
  static __device__ __forceinline__ A avg_scale(i64 d) { return (A)1 / (A)d; }
  static __device__ __forceinline__ A avg_term(A x, A s) { return mul_rn(x, s); }
  static __device__ __forceinline__ A avg_finish(A a, i64) { return a; }
  // NaN-propagating: a NaN on either side wins; ties keep b.
  static __device__ __forceinline__ A max(A a, A b) { return (a > b || a != a) ? a : b; }
  static __device__ __forceinline__ A min(A a, A b) { return (a < b || a != a) ? a : b; }
};
template <typename A> struct Arith<A, 0> {
  typedef typename Unsigned<A>::type U;
  static __device__ __forceinline__ A add(A a, A b) { return (A)(U)((U)a + (U)b); }
  static __device__ __forceinline__ A mul(A a, A b) { return (A)(U)((U)a * (U)b); }
  // In 64 bits, so that a divisor wider than A is not truncated.
  static __device__ __forceinline__ A div(A a, i64 d) {
    return IsSigned<A>::value ? (A)((i64)a / d) : (A)((u64)a / (u64)d);
  }
  // avg: the wrapping sum, divided once.
  static __device__ __forceinline__ A avg_scale(i64) { return (A)1; }
  static __device__ __forceinline__ A avg_term(A x, A) { return x; }
  static __device__ __forceinline__ A avg_finish(A a, i64 d) { return div(a, d); }
  static __device__ __forceinline__ A max(A a, A b) { return a > b ? a : b; }
  static __device__ __forceinline__ A min(A a, A b) { return a < b ? a : b; }
};

// Each operator: scale (computed once from the divisor), term (applied to
// every loaded value), combine, finish.
struct OpPlain {
  template <typename A> static __device__ __forceinline__ A scale(i64) { return (A)1; }
  template <typename A> static __device__ __forceinline__ A term(A x, A) { return x; }
  template <typename A> static __device__ __forceinline__ A finish(A a, i64) { return a; }
};
struct OpSum : OpPlain {
  template <typename A> static __device__ __forceinline__ A combine(A a, A b) { return Arith<A, IsFloat<A>::value>::add(a, b); }
};
struct OpAvg {
  template <typename A> static __device__ __forceinline__ A scale(i64 d) { return Arith<A, IsFloat<A>::value>::avg_scale(d); }
  template <typename A> static __device__ __forceinline__ A term(A x, A s) { return Arith<A, IsFloat<A>::value>::avg_term(x, s); }
  template <typename A> static __device__ __forceinline__ A combine(A a, A b) { return Arith<A, IsFloat<A>::value>::add(a, b); }
  template <typename A> static __device__ __forceinline__ A finish(A a, i64 d) { return Arith<A, IsFloat<A>::value>::avg_finish(a, d); }
};
struct OpMax : OpPlain {
  template <typename A> static __device__ __forceinline__ A combine(A a, A b) { return Arith<A, IsFloat<A>::value>::max(a, b); }
};
struct OpMin : OpPlain {
  template <typename A> static __device__ __forceinline__ A combine(A a, A b) { return Arith<A, IsFloat<A>::value>::min(a, b); }
};
struct OpProd : OpPlain {
  template <typename A> static __device__ __forceinline__ A combine(A a, A b) { return Arith<A, IsFloat<A>::value>::mul(a, b); }
};

// ---- the reduction ----------------------------------------------------------

template <typename T> union Pack {
  enum { N = 16 / sizeof(T) };
  uint4 u;
  T e[N];
};

template <typename T, typename Op>
__device__ __forceinline__ void reduce_kernel(T* __restrict__ dst, const T* __restrict__ src, i64 n, i64 stride,
                                              i64 count, i64 divisor) {
  typedef Traits<T> Tr;
  typedef typename Tr::acc A;
  enum { V = Pack<T>::N };
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nthreads = (i64)gridDim.x * blockDim.x;
  const A sc = Op::template scale<A>(divisor);
  i64 done = 0;
  // Vector path: 16-byte loads and stores when both pointers and the stride
  // allow; the tail (fewer than V elements) goes through the scalar loop.
  if ((((u64)dst | (u64)src) & 15u) == 0 && ((u64)(stride * (i64)sizeof(T)) & 15u) == 0) {
    const i64 nvec = count / V;
    const uint4* __restrict__ s4 = reinterpret_cast<const uint4*>(src);
    uint4* __restrict__ d4 = reinterpret_cast<uint4*>(dst);
    const i64 stride4 = stride / V;
    for (i64 i = tid; i < nvec; i += nthreads) {
      Pack<T> p;
      A acc[V];
      p.u = s4[i];
#pragma unroll
      for (int j = 0; j < V; j++) acc[j] = Op::term(Tr::load(p.e[j]), sc);
      i64 k = 1;
      for (; k + 1 < n; k += 2) {  // two loads in flight per step
        Pack<T> q, r;
        q.u = s4[k * stride4 + i];
        r.u = s4[(k + 1) * stride4 + i];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = Op::combine(acc[j], Op::term(Tr::load(q.e[j]), sc));
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = Op::combine(acc[j], Op::term(Tr::load(r.e[j]), sc));
      }
      if (k < n) {
        Pack<T> q;
        q.u = s4[k * stride4 + i];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = Op::combine(acc[j], Op::term(Tr::load(q.e[j]), sc));
      }
#pragma unroll
      for (int j = 0; j < V; j++) p.e[j] = Tr::store(Op::finish(acc[j], divisor));
      d4[i] = p.u;
    }
    done = nvec * V;
  }
  for (i64 i = done + tid; i < count; i += nthreads) {
    A acc = Op::term(Tr::load(src[i]), sc);
    for (i64 k = 1; k < n; k++) acc = Op::combine(acc, Op::term(Tr::load(src[k * stride + i]), sc));
    dst[i] = Tr::store(Op::finish(acc, divisor));
  }
}

template <typename T>
__device__ __forceinline__ void fill_kernel(T* __restrict__ dst, i64 count, double offset, double scale, i64 modulus) {
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nthreads = (i64)gridDim.x * blockDim.x;
  for (i64 i = tid; i < count; i += nthreads) {
    dst[i] = Traits<T>::from_double(offset + scale * (double)(i % modulus));
  }
}

#define FG_REDUCE(opname, Op, tname, T)                                                              \
  extern "C" __global__ void fg_reduce_##opname##_##tname(T* __restrict__ dst, const T* __restrict__ src, \
                                                          i64 n, i64 stride, i64 count, i64 divisor) { \
    reduce_kernel<T, Op>(dst, src, n, stride, count, divisor);                                       \
  }

#define FG_TYPE(tname, T)                                                                            \
  FG_REDUCE(sum, OpSum, tname, T)                                                                    \
  FG_REDUCE(avg, OpAvg, tname, T)                                                                    \
  FG_REDUCE(max, OpMax, tname, T)                                                                    \
  FG_REDUCE(min, OpMin, tname, T)                                                                    \
  FG_REDUCE(prod, OpProd, tname, T)                                                                  \
  extern "C" __global__ void fg_fill_##tname(T* __restrict__ dst, i64 count, double offset, double scale, \
                                             i64 modulus) {                                          \
    fill_kernel<T>(dst, count, offset, scale, modulus);                                              \
  }

FG_TYPE(float16, half_t)
FG_TYPE(bfloat16, bf16_t)
FG_TYPE(float32, float)
FG_TYPE(float64, double)
FG_TYPE(int8, i8)
FG_TYPE(uint8, u8)
FG_TYPE(int32, int)
FG_TYPE(uint32, u32)
FG_TYPE(int64, i64)
FG_TYPE(uint64, u64)

// copy_part copies n bytes from src to dst over the grid, in the widest
// words (16, 8, 4, 2 or 1 bytes) that both addresses and n allow. Either
// side may be page-locked host memory mapped into the device's address
// space: a few hundred bytes cross PCIe in one kernel instead of a copy of
// their own.
__device__ __forceinline__ void copy_part(u8* __restrict__ dst, const u8* __restrict__ src, u64 n) {
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nthreads = (i64)gridDim.x * blockDim.x;
  const u64 align = (u64)dst | (u64)src | n;
  if ((align & 15) == 0) {
    struct v16 { u64 a, b; };
    v16* d = (v16*)dst;
    const v16* s = (const v16*)src;
    for (i64 i = tid; i < (i64)(n / 16); i += nthreads) d[i] = s[i];
  } else if ((align & 7) == 0) {
    for (i64 i = tid; i < (i64)(n / 8); i += nthreads) ((u64*)dst)[i] = ((const u64*)src)[i];
  } else if ((align & 3) == 0) {
    for (i64 i = tid; i < (i64)(n / 4); i += nthreads) ((u32*)dst)[i] = ((const u32*)src)[i];
  } else if ((align & 1) == 0) {
    for (i64 i = tid; i < (i64)(n / 2); i += nthreads) ((u16*)dst)[i] = ((const u16*)src)[i];
  } else {
    for (i64 i = tid; i < (i64)n; i += nthreads) dst[i] = src[i];
  }
}

// fg_copy_pair copies n1 bytes from s1 to d1 and n2 bytes from s2 to d2 in
// one launch (a fingerprinted call's staging: its data and its
// fingerprint's host bytes in, and out again). The two copies must not
// overlap.
extern "C" __global__ void fg_copy_pair(u8* __restrict__ d1, const u8* __restrict__ s1, u64 n1, u8* __restrict__ d2,
                                        const u8* __restrict__ s2, u64 n2) {
  copy_part(d1, s1, n1);
  copy_part(d2, s2, n2);
}

// fg_delay busy-waits for ns nanoseconds on the GPU's global timer (tests
// use it to hold a stream back).
// (FG_HOST_TEST builds the file as plain C++ to check the kernels on a CPU.)
#ifndef FG_HOST_TEST
extern "C" __global__ void fg_delay(u64 ns) {
  u64 start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
#endif
