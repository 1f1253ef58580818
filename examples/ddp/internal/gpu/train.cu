// fairgo's training kernels for examples/ddp: the float32 pieces of a small
// MLP with a softmax cross-entropy loss, SGD with momentum, and a synthetic
// data generator, so that a data-parallel training step runs entirely on the
// GPU with no host-to-device copy.
//
// Compiled to PTX by `make ptx` (nvcc -ptx -arch=compute_70), committed and
// embedded in examples/ddp/internal/gpu (kernels.go). Matrices are
// row-major. Every kernel is deterministic (no atomics; every sum has a
// fixed order), so replicas that start equal and see equal gradients stay
// bit-identical.

typedef unsigned long long u64;
typedef long long i64;

#define TILE 16

// C (M×N) = op(A)·op(B), op(A) M×K, op(B) K×N. ta: A is stored K×M
// (C = Aᵀ·B); tb: B is stored N×K (C = A·Bᵀ). Launch with TILE×TILE blocks
// and a ceil(N/TILE) × ceil(M/TILE) grid.
extern "C" __global__ void fg_t_matmul(float* __restrict__ c, const float* __restrict__ a,
                                       const float* __restrict__ b, int m, int n, int k, int ta, int tb) {
  __shared__ float as[TILE][TILE + 1];
  __shared__ float bs[TILE][TILE + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < k; k0 += TILE) {
    int ka = k0 + tx;
    as[ty][tx] = (row < m && ka < k) ? (ta ? a[(i64)ka * m + row] : a[(i64)row * k + ka]) : 0.0f;
    int kb = k0 + ty;
    bs[ty][tx] = (kb < k && col < n) ? (tb ? b[(i64)col * k + kb] : b[(i64)kb * n + col]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TILE; i++) acc += as[ty][i] * bs[i][tx];
    __syncthreads();
  }
  if (row < m && col < n) c[(i64)row * n + col] = acc;
}

// z[r][c] += bias[c], then max(z, 0) when relu != 0. z is rows × cols.
extern "C" __global__ void fg_t_bias_act(float* z, const float* bias, int rows, int cols, int relu) {
  i64 total = (i64)rows * cols;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    float v = z[i] + bias[i % cols];
    z[i] = (relu && v < 0.0f) ? 0.0f : v;
  }
}

// ReLU backward: da[i] = 0 where the ReLU's output a[i] is not positive.
extern "C" __global__ void fg_t_relu_mask(float* da, const float* a, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    if (!(a[i] > 0.0f)) da[i] = 0.0f;
  }
}

// out[c] = sum over r of m[r][c] (the bias gradient), one thread per column,
// rows summed in order.
extern "C" __global__ void fg_t_colsum(float* out, const float* m, int rows, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; r++) s += m[(i64)r * cols + c];
  out[c] = s;
}

// Softmax cross-entropy of rows × classes logits with int32 labels, one
// thread per row, in double: loss[r] = logsumexp(z) - z[y], correct[r] = 1
// when the first arg max is y, and (dz not null) dz[r][k] = (softmax(z)[k] -
// [k == y])·scale, scale being 1/batch for the gradient of the mean loss.
extern "C" __global__ void fg_t_softmax_xent(const float* logits, const int* labels, float* loss, float* correct,
                                             float* dz, int rows, int classes, float scale) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* z = logits + (i64)r * classes;
  int y = labels[r];
  int best = 0;
  for (int k = 1; k < classes; k++)
    if (z[k] > z[best]) best = k;
  double top = z[best], sum = 0.0;
  for (int k = 0; k < classes; k++) sum += exp((double)z[k] - top);
  loss[r] = (float)(top + log(sum) - (double)z[y]);
  correct[r] = best == y ? 1.0f : 0.0f;
  if (dz != 0) {
    float* d = dz + (i64)r * classes;
    for (int k = 0; k < classes; k++) {
      double p = exp((double)z[k] - top) / sum;
      if (k == y) p -= 1.0;
      d[k] = (float)(p * (double)scale);
    }
  }
}

// stats[0] += mean of loss[0..rows), stats[1] += sum of correct[0..rows),
// in double, by one thread (rows is a batch).
extern "C" __global__ void fg_t_stats(double* stats, const float* loss, const float* correct, int rows) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double l = 0.0, c = 0.0;
  for (int r = 0; r < rows; r++) {
    l += loss[r];
    c += correct[r];
  }
  stats[0] += l / rows;
  stats[1] += c;
}

// SGD with momentum, PyTorch's (dampening 0, no Nesterov):
// v = mu·v + g; p -= lr·v.
extern "C" __global__ void fg_t_sgd(float* p, float* v, const float* g, i64 n, float lr, float mu) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    float vi = mu * v[i] + g[i];
    v[i] = vi;
    p[i] -= lr * vi;
  }
}

__device__ __forceinline__ u64 fg_mix(u64 z) {  // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// x[i] = a standard normal draw (Box–Muller in double, rounded to float)
// from the hash of (seed, rank, step, i): h = mix(mix(mix(mix(seed) ^ rank) ^
// step) ^ i); u1 = ((h >> 40) + 1)·2⁻²⁴, u2 = ((h >> 16) & 0xffffff)·2⁻²⁴;
// x = sqrt(-2 ln u1)·cos(2π u2).
extern "C" __global__ void fg_t_gen_inputs(float* x, i64 n, u64 seed, u64 rank, u64 step) {
  u64 base = fg_mix(fg_mix(fg_mix(seed) ^ rank) ^ step);
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    u64 h = fg_mix(base ^ (u64)i);
    double u1 = (double)((h >> 40) + 1) * (1.0 / 16777216.0);
    double u2 = (double)((h >> 16) & 0xffffffULL) * (1.0 / 16777216.0);
    x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

// y[r] = the first arg max over k of teacher[k]·x[r] (teacher classes × in,
// x rows × in), one thread per row, sums in order.
extern "C" __global__ void fg_t_gen_labels(int* y, const float* x, const float* teacher, int rows, int in, int classes) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xs = x + (i64)r * in;
  int best = 0;
  float bestScore = 0.0f;
  for (int k = 0; k < classes; k++) {
    const float* w = teacher + (i64)k * in;
    float s = 0.0f;
    for (int i = 0; i < in; i++) s += w[i] * xs[i];
    if (k == 0 || s > bestScore) {
      best = k;
      bestScore = s;
    }
  }
  y[r] = best;
}
