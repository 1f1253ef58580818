// hostcheck.cpp builds reduce.cu as plain C++ (FG_HOST_TEST) and runs every
// reduce kernel on the CPU, one emulated thread at a time over small grids,
// against an independent reference: _Float16 for half conversions, a
// nearest-value search for bfloat16, plain loops for the ops. It checks the
// kernels' logic (vector and scalar paths, tails, rounding, NaN rules,
// wrapping integers) on machines without a GPU; `make cuda-build` runs it.
//
//   g++ -std=c++17 -O1 -o /tmp/hostcheck cuda/kernels/hostcheck.cpp && /tmp/hostcheck
#define FG_HOST_TEST
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <random>
#include <string>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
struct uint4 { unsigned x, y, z, w; };
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, blockDim, gridDim, threadIdx;
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
#include "reduce.cu"

typedef void (*kfn)(void*, const void*, i64, i64, i64, i64);
template <typename F> void launch(int G, int B, F f) {
  gridDim.x = G; blockDim.x = B;
  for (int b = 0; b < G; b++) for (int t = 0; t < B; t++) { blockIdx.x = b; threadIdx.x = t; f(); }
}

// independent references
static float h2f_ref(u16 h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static u16 f2h_ref(float f) { _Float16 x = (_Float16)f; u16 h; memcpy(&h, &x, 2); return h; }
static float b2f_ref(u16 b) { u32 u = (u32)b << 16; float f; memcpy(&f, &u, 4); return f; }
static u16 f2b_ref(float f) {
  if (std::isnan(f)) return 0x7fc0;
  u32 u; memcpy(&u, &f, 4);
  u16 lo = u >> 16, hi = lo + 1;
  double dl = std::fabs((double)b2f_ref(lo) - f), dh = std::fabs((double)b2f_ref(hi) - f);
  if (std::isinf(b2f_ref(hi)) && !std::isinf(f)) {
    // overflow boundary: round to inf if f >= max + half ulp
    double mx = (double)b2f_ref(lo);
    double halfulp = std::ldexp(1.0, std::ilogb(mx) - 8);
    if (std::fabs((double)f) >= std::fabs(mx) + halfulp) return hi;  // hi is inf with sign
    return lo;
  }
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

int fails = 0;
#define CHECK(c, ...) do { if (!(c)) { if (fails++ < 30) { printf(__VA_ARGS__); printf("\n"); } } } while (0)

void test_conversions() {
  for (u32 h = 0; h < 65536; h++) {
    float a = half_to_float((u16)h), b = h2f_ref((u16)h);
    CHECK((std::isnan(a) && std::isnan(b)) || memcmp(&a, &b, 4) == 0, "h2f %04x: %g vs %g", h, a, b);
  }
  std::mt19937_64 rng(1);
  std::vector<float> probes;
  for (u32 h = 0; h < 65536; h++) {  // every half, its neighbours and the midpoints
    float a = h2f_ref((u16)h), b = h2f_ref((u16)(h + 1));
    if (std::isnan(a) || std::isnan(b) || std::isinf(a)) continue;
    probes.push_back(a);
    if (((h + 1) & 0x7fff) != 0) { float m = (float)(((double)a + (double)b) / 2); probes.push_back(m);
      u32 mu; memcpy(&mu, &m, 4); float m1, m2; u32 t = mu + 1; memcpy(&m1, &t, 4); t = mu - 1; memcpy(&m2, &t, 4);
      probes.push_back(m1); probes.push_back(m2); }
  }
  for (int i = 0; i < 2000000; i++) { u32 u = (u32)rng(); float f; memcpy(&f, &u, 4); probes.push_back(f); }
  probes.push_back(65520.f); probes.push_back(65519.99f); probes.push_back(-65520.f); probes.push_back(INFINITY);
  probes.push_back(ldexpf(1, -25)); probes.push_back(ldexpf(1.0000001f, -25)); probes.push_back(ldexpf(1, -24)); probes.push_back(ldexpf(1.5f, -24));
  for (float f : probes) {
    u16 a = float_to_half(f), b = f2h_ref(f);
    if (std::isnan(f)) { CHECK((a & 0x7c00) == 0x7c00 && (a & 0x3ff), "f2h nan %a -> %04x", f, a); continue; }
    CHECK(a == b, "f2h %a (%.9g): %04x vs ref %04x", f, f, a, b);
    u16 c = float_to_bf16(f), d = f2b_ref(f);
    CHECK(c == d, "f2b %a: %04x vs ref %04x", f, c, d);
  }
  printf("conversions: %zu probes\n", probes.size());
}

enum { SUM, AVG, MAX, MIN, PROD };
const char* opnames[] = {"sum", "avg", "max", "min", "prod"};

template <typename T> struct Ref;
// acc type and conversion for the reference
template <typename T> struct RefAcc { typedef T A; static A ld(T v) { return v; } static T st(A a) { return a; } };
template <> struct RefAcc<half_t> { typedef float A; static A ld(half_t v) { return h2f_ref(v.bits); } static half_t st(A a) { half_t h; h.bits = f2h_ref(a); return h; } };
template <> struct RefAcc<bf16_t> { typedef float A; static A ld(bf16_t v) { return b2f_ref(v.bits); } static bf16_t st(A a) { bf16_t h; h.bits = f2b_ref(a); return h; } };

template <typename A> A rcombine(int op, A a, A b) {
  if constexpr (std::is_floating_point<A>::value) {
    switch (op) {
      case SUM: case AVG: return a + b;
      case PROD: return a * b;
      case MAX: if (std::isnan(a) || std::isnan(b)) return NAN; return a > b ? a : b;
      default: if (std::isnan(a) || std::isnan(b)) return NAN; return a < b ? a : b;
    }
  } else {
    typedef typename std::make_unsigned<A>::type U;
    switch (op) {
      case SUM: case AVG: return (A)(U)((U)a + (U)b);
      case PROD: return (A)(U)((U)a * (U)b);
      case MAX: return a > b ? a : b;
      default: return a < b ? a : b;
    }
  }
}
// avg of floats: every term times 1/d before the sum (rterm), nothing after.
template <typename A> A rterm(int op, A x, i64 d) {
  if constexpr (std::is_floating_point<A>::value) { if (op == AVG) return x * ((A)1 / (A)d); }
  return x;
}
template <typename A> A rfinish(int op, A a, i64 d) {
  if (op != AVG) return a;
  if constexpr (std::is_floating_point<A>::value) return a;
  else if constexpr (std::is_signed<A>::value) return (A)((i64)a / d);
  else return (A)((u64)a / (u64)d);
}

template <typename T> bool same(T a, T b) {
  if constexpr (std::is_same<T, half_t>::value) { float x = h2f_ref(a.bits), y = h2f_ref(b.bits); return (std::isnan(x) && std::isnan(y)) || x == y; }
  else if constexpr (std::is_same<T, bf16_t>::value) { float x = b2f_ref(a.bits), y = b2f_ref(b.bits); return (std::isnan(x) && std::isnan(y)) || x == y; }
  else if constexpr (std::is_floating_point<T>::value) return (std::isnan(a) && std::isnan(b)) || a == b;
  else return a == b;
}

template <typename T> T gen(std::mt19937_64& rng, i64 i, int k) {
  if constexpr (std::is_same<T, half_t>::value) { half_t h; float f = (float)((int)(rng() % 2000) - 1000) / 128.f; if (k == 1 && i % 997 == 5) f = NAN; h.bits = f2h_ref(f); return h; }
  else if constexpr (std::is_same<T, bf16_t>::value) { bf16_t h; float f = (float)((int)(rng() % 2000) - 1000) / 64.f; if (k == 1 && i % 997 == 5) f = NAN; h.bits = f2b_ref(f); return h; }
  else if constexpr (std::is_floating_point<T>::value) { T f = (T)((double)(rng() % 1000000) / 1000.0 - 500.0); if (k == 1 && i % 997 == 5) f = NAN; return f; }
  else { u64 r = rng(); T t; memcpy(&t, &r, sizeof t); return t; }
}

template <typename T> void run(const char* tname, kfn* fns) {
  std::mt19937_64 rng(42);
  const i64 counts[] = {0, 1, 7, 8, 15, 16, 17, 4097, 100003};
  const int ns[] = {1, 2, 3, 5};
  int cases = 0;
  for (int op = 0; op < 5; op++)
    for (i64 count : counts)
      for (int n : ns)
        for (int layout = 0; layout < 3; layout++) {
          // layout 0: aligned stride; 1: odd stride; 2: src and dst offset by one element
          i64 V = 16 / sizeof(T);
          i64 stride = layout == 1 ? count + 1 : ((count + V - 1) / V) * V + V;
          i64 off = layout == 2 ? 1 : 0;
          std::vector<T> src((size_t)(n * stride + V + 1)), dst((size_t)(count + V + 1)), want((size_t)count);
          T* s = (T*)((char*)aligned_alloc(64, (n * stride + 2 * V + 1) * sizeof(T) + 64));
          T* d = (T*)((char*)aligned_alloc(64, (count + 2 * V + 1) * sizeof(T) + 64));
          s += off; d += off;
          for (int k = 0; k < n; k++) for (i64 i = 0; i < count; i++) s[k * stride + i] = gen<T>(rng, i, k);
          i64 divisor = n + 1;
          for (i64 i = 0; i < count; i++) {
            typedef typename RefAcc<T>::A A;
            A a = rterm<A>(op, RefAcc<T>::ld(s[i]), divisor);
            for (int k = 1; k < n; k++) a = rcombine<A>(op, a, rterm<A>(op, RefAcc<T>::ld(s[k * stride + i]), divisor));
            want[i] = RefAcc<T>::st(rfinish<A>(op, a, divisor));
          }
          int G = 1 + (int)(rng() % 3), B = 1 + (int)(rng() % 5);
          launch(G, B, [&] { fns[op](d, s, n, stride, count, divisor); });
          for (i64 i = 0; i < count; i++) {
            if (!same(d[i], want[i])) { CHECK(false, "%s %s count=%lld n=%d layout=%d: element %lld differs", opnames[op], tname, (long long)count, n, layout, (long long)i); break; }
          }
          free(s - off); free(d - off);
          cases++;
        }
  printf("%s: %d cases\n", tname, cases);
}

#define FNS(t) kfn fns_##t[5] = {(kfn)fg_reduce_sum_##t, (kfn)fg_reduce_avg_##t, (kfn)fg_reduce_max_##t, (kfn)fg_reduce_min_##t, (kfn)fg_reduce_prod_##t};
FNS(float16) FNS(bfloat16) FNS(float32) FNS(float64) FNS(int8) FNS(uint8) FNS(int32) FNS(uint32) FNS(int64) FNS(uint64)

int main() {
  test_conversions();
  run<half_t>("float16", fns_float16);
  run<bf16_t>("bfloat16", fns_bfloat16);
  run<float>("float32", fns_float32);
  run<double>("float64", fns_float64);
  run<i8>("int8", fns_int8);
  run<u8>("uint8", fns_uint8);
  run<int>("int32", fns_int32);
  run<u32>("uint32", fns_uint32);
  run<i64>("int64", fns_int64);
  run<u64>("uint64", fns_uint64);
  // avg near the top of the range: the terms are scaled before they sum
  {
    float big[2] = {3.0e38f, 3.2e38f}, out = 0;
    launch(1, 1, [&] { fg_reduce_avg_float32(&out, big, 2, 1, 1, 2); });
    CHECK(std::isfinite(out) && out == 3.0e38f * 0.5f + 3.2e38f * 0.5f, "avg float32 near the maximum: %g", out);
    bf16_t b[2], bo; b[0].bits = f2b_ref(3.0e38f); b[1].bits = f2b_ref(3.3e38f);
    launch(1, 1, [&] { fg_reduce_avg_bfloat16(&bo, b, 2, 1, 1, 2); });
    CHECK(std::isfinite(b2f_ref(bo.bits)), "avg bfloat16 near the maximum: %g", b2f_ref(bo.bits));
  }
  // fill
  std::vector<half_t> h(100); launch(2, 3, [&] { fg_fill_float16(h.data(), 100, -1.0, 0.5, 7); });
  for (int i = 0; i < 100; i++) CHECK(h2f_ref(h[i].bits) == (float)(-1.0 + 0.5 * (i % 7)), "fill %d", i);
  std::vector<u8> u(50); launch(1, 4, [&] { fg_fill_uint8(u.data(), 50, -3, 1, 50); });
  for (int i = 0; i < 50; i++) CHECK(u[i] == (u8)(i - 3), "fill u8 %d", i);
  // copy pair: every width's path, offsets that defeat the wider ones,
  // and nothing written outside the two destinations
  {
    alignas(16) u8 a[512], b[512], c[64], d[64];
    const u64 offs[] = {0, 1, 2, 4, 8}, lens[] = {0, 1, 2, 6, 16, 40, 48, 200};
    for (u64 o : offs) for (u64 n1 : lens) for (u64 n2 : lens) {
      if (n2 > 48) continue;
      for (int i = 0; i < 512; i++) { a[i] = (u8)(i * 7 + 1); b[i] = 0xee; }
      for (int i = 0; i < 64; i++) { c[i] = (u8)(i * 13 + 5); d[i] = 0xdd; }
      launch(3, 5, [&] { fg_copy_pair(b + o, a + o, n1, d + o, c + o, n2); });
      for (u64 i = 0; i < 512; i++)
        CHECK(b[i] == (i >= o && i < o + n1 ? a[i] : 0xee), "copy pair: off %llu n1 %llu byte %llu",
              (unsigned long long)o, (unsigned long long)n1, (unsigned long long)i);
      for (u64 i = 0; i < 64; i++)
        CHECK(d[i] == (i >= o && i < o + n2 ? c[i] : 0xdd), "copy pair: off %llu n2 %llu byte %llu",
              (unsigned long long)o, (unsigned long long)n2, (unsigned long long)i);
    }
  }
  printf("%s: %d failures\n", fails ? "FAIL" : "PASS", fails);
  return fails != 0;
}
