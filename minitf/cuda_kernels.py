"""Every custom CUDA kernel of minitf, as complete CUDA C source that the project owns.

The NumPy/CuPy code in the layers is the reference that a learner reads; a kernel here
only does the same arithmetic in fewer passes over GPU memory. Each entry of
:data:`SOURCES` names its NumPy reference. ``tests/test_cuda_sources.py`` compiles every
source with NVRTC for every architecture of :data:`ARCHITECTURES` on a machine without a
GPU (CI); ``tests/test_gpu.py`` (run by ``scripts/gpu_check.sh``) runs them on a GPU and
compares each with its reference.

Used today: ``adam`` (:meth:`minitf.optim.Adam.step` on the GPU). Compiled and compared,
not yet used by the layers: ``masked_softmax_forward`` / ``_backward``
(:func:`minitf.attention.scaled_dot_product_attention`), ``layer_norm_forward`` /
``_backward`` (:class:`minitf.layers.LayerNorm`), ``dropout_residual``
(``x + Dropout(s)`` of :class:`minitf.transformer.SublayerConnection`, pre-LN) and
``label_smoothed_loss`` (:class:`minitf.loss.LabelSmoothedCrossEntropy`, forward).
None has been run yet: no GPU was available while they were written.

Every kernel exists for float (suffix ``_f32``) and double (``_f64``); sizes are
``long long``. Row kernels take one block of 256 threads per row.
"""
#: The virtual architectures every source must compile for (V100, A100, H100/H200).
ARCHITECTURES = ("compute_70", "compute_80", "compute_90")

_PRELUDE = r"""
#define BLOCK 256
#define NEG_INF __int_as_float(0xff800000)   // -infinity (NVRTC has no math.h for INFINITY)
// sum / max over the threads of one block (BLOCK threads); every thread gets the result
template <typename T> __device__ T block_sum(T value, T* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
        __syncthreads();
    }
    T result = shared[0];
    __syncthreads();
    return result;
}
template <typename T> __device__ T block_max(T value, T* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) shared[threadIdx.x] = max(shared[threadIdx.x], shared[threadIdx.x + stride]);
        __syncthreads();
    }
    T result = shared[0];
    __syncthreads();
    return result;
}
"""

# Adam: the update of minitf.optim.Adam._update, one thread per element.
ADAM = r"""
template <typename T>
__device__ void adam(const T* g, T* p, T* m, T* v, T b1, T b2, T one_minus_b1, T one_minus_b2, T step_size,
                     T eps_hat, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    T mi = b1 * m[i] + one_minus_b1 * g[i];             // first moment
    T vi = b2 * v[i] + one_minus_b2 * g[i] * g[i];      // second moment
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (sqrt(vi) + eps_hat);
}
extern "C" __global__ void adam_f32(const float* g, float* p, float* m, float* v, float b1, float b2,
                                    float one_minus_b1, float one_minus_b2, float step_size, float eps_hat,
                                    long long n) {
    adam<float>(g, p, m, v, b1, b2, one_minus_b1, one_minus_b2, step_size, eps_hat, n);
}
extern "C" __global__ void adam_f64(const double* g, double* p, double* m, double* v, double b1, double b2,
                                    double one_minus_b1, double one_minus_b2, double step_size, double eps_hat,
                                    long long n) {
    adam<double>(g, p, m, v, b1, b2, one_minus_b1, one_minus_b2, step_size, eps_hat, n);
}
"""

# Masked softmax over the last axis: scaled_dot_product_attention's softmax with its keep
# mask (keep[row * cols + j], 1 = attend); an all-masked row gives zeros, never NaN.
MASKED_SOFTMAX = _PRELUDE + r"""
template <typename T>
__device__ void masked_softmax_forward(const T* scores, const unsigned char* keep, T* P, long long cols) {
    __shared__ T shared[BLOCK];
    const T* s = scores + blockIdx.x * cols;
    const unsigned char* k = keep + blockIdx.x * cols;
    T* out = P + blockIdx.x * cols;
    T row_max = NEG_INF;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) if (k[j]) row_max = max(row_max, s[j]);
    row_max = block_max(row_max, shared);
    T total = 0;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) {
        T e = k[j] ? exp(s[j] - row_max) : T(0);         // exact zeros where masked
        out[j] = e;
        total += e;
    }
    total = block_sum(total, shared);
    T inverse = total > 0 ? T(1) / total : T(0);          // all-masked row -> 0
    for (long long j = threadIdx.x; j < cols; j += BLOCK) out[j] *= inverse;
}
// dS = P * (dP - sum_j dP_j P_j)
template <typename T>
__device__ void masked_softmax_backward(const T* P, const T* dP, T* dS, long long cols) {
    __shared__ T shared[BLOCK];
    const T* p = P + blockIdx.x * cols;
    const T* dp = dP + blockIdx.x * cols;
    T* out = dS + blockIdx.x * cols;
    T dot = 0;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) dot += dp[j] * p[j];
    dot = block_sum(dot, shared);
    for (long long j = threadIdx.x; j < cols; j += BLOCK) out[j] = p[j] * (dp[j] - dot);
}
extern "C" __global__ void masked_softmax_forward_f32(const float* s, const unsigned char* k, float* P,
                                                      long long cols) { masked_softmax_forward<float>(s, k, P, cols); }
extern "C" __global__ void masked_softmax_forward_f64(const double* s, const unsigned char* k, double* P,
                                                      long long cols) { masked_softmax_forward<double>(s, k, P, cols); }
extern "C" __global__ void masked_softmax_backward_f32(const float* P, const float* dP, float* dS,
                                                       long long cols) { masked_softmax_backward<float>(P, dP, dS, cols); }
extern "C" __global__ void masked_softmax_backward_f64(const double* P, const double* dP, double* dS,
                                                       long long cols) { masked_softmax_backward<double>(P, dP, dS, cols); }
"""

# LayerNorm over the last axis (minitf.layers.LayerNorm): forward writes y, xhat and rstd;
# backward writes dx (the per-row part; dgamma, dbeta are column sums left to the caller).
LAYER_NORM = _PRELUDE + r"""
template <typename T>
__device__ void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, T* xhat, T* rstd,
                                   T eps, long long cols) {
    __shared__ T shared[BLOCK];
    const T* xr = x + blockIdx.x * cols;
    T sum = 0;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) sum += xr[j];
    T mean = block_sum(sum, shared) / cols;
    T sq = 0;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) { T c = xr[j] - mean; sq += c * c; }
    T r = T(1) / sqrt(block_sum(sq, shared) / cols + eps);   // 1 / sigma
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) {
        T h = (xr[j] - mean) * r;
        xhat[blockIdx.x * cols + j] = h;
        y[blockIdx.x * cols + j] = h * gamma[j] + beta[j];
    }
}
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dy * gamma
template <typename T>
__device__ void layer_norm_backward(const T* dy, const T* xhat, const T* rstd, const T* gamma, T* dx,
                                    long long cols) {
    __shared__ T shared[BLOCK];
    const T* d = dy + blockIdx.x * cols;
    const T* h = xhat + blockIdx.x * cols;
    T s1 = 0, s2 = 0;
    for (long long j = threadIdx.x; j < cols; j += BLOCK) { T g = d[j] * gamma[j]; s1 += g; s2 += g * h[j]; }
    T mean1 = block_sum(s1, shared) / cols;
    T mean2 = block_sum(s2, shared) / cols;
    T r = rstd[blockIdx.x];
    for (long long j = threadIdx.x; j < cols; j += BLOCK)
        dx[blockIdx.x * cols + j] = r * (d[j] * gamma[j] - mean1 - h[j] * mean2);
}
extern "C" __global__ void layer_norm_forward_f32(const float* x, const float* gamma, const float* beta, float* y,
        float* xhat, float* rstd, float eps, long long cols) {
    layer_norm_forward<float>(x, gamma, beta, y, xhat, rstd, eps, cols);
}
extern "C" __global__ void layer_norm_forward_f64(const double* x, const double* gamma, const double* beta,
        double* y, double* xhat, double* rstd, double eps, long long cols) {
    layer_norm_forward<double>(x, gamma, beta, y, xhat, rstd, eps, cols);
}
extern "C" __global__ void layer_norm_backward_f32(const float* dy, const float* xhat, const float* rstd,
        const float* gamma, float* dx, long long cols) { layer_norm_backward<float>(dy, xhat, rstd, gamma, dx, cols); }
extern "C" __global__ void layer_norm_backward_f64(const double* dy, const double* xhat, const double* rstd,
        const double* gamma, double* dx, long long cols) { layer_norm_backward<double>(dy, xhat, rstd, gamma, dx, cols); }
"""

# y = x + s * mask / (1 - p) with mask = (u >= p), u uniform in [0, 1) (minitf.layers.Dropout
# on s, then the residual sum of a pre-LN SublayerConnection); one thread per element.
DROPOUT_RESIDUAL = r"""
template <typename T>
__device__ void dropout_residual(const T* x, const T* s, const float* u, T* y, float p, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    T scale = T(1.0 / (1.0 - p));
    y[i] = x[i] + (u[i] >= p ? s[i] * scale : T(0));
}
extern "C" __global__ void dropout_residual_f32(const float* x, const float* s, const float* u, float* y, float p,
                                                long long n) { dropout_residual<float>(x, s, u, y, p, n); }
extern "C" __global__ void dropout_residual_f64(const double* x, const double* s, const float* u, double* y,
                                                float p, long long n) { dropout_residual<double>(x, s, u, y, p, n); }
"""

# Label-smoothed cross-entropy, forward, one block per row (token) of the logits (rows, V):
# per_token = (1 - eps) * (lse - s_y) + eps * (lse - mean(s)), s = z - max z, and
# p = softmax(z) (kept for backward), as minitf.loss.LabelSmoothedCrossEntropy.forward.
LOSS = _PRELUDE + r"""
template <typename T>
__device__ void label_smoothed_loss(const T* logits, const long long* target, T* p, T* per_token, T* nll,
                                    T eps, long long V) {
    __shared__ T shared[BLOCK];
    const T* z = logits + blockIdx.x * V;
    T* out = p + blockIdx.x * V;
    T zmax = NEG_INF;
    for (long long j = threadIdx.x; j < V; j += BLOCK) zmax = max(zmax, z[j]);
    zmax = block_max(zmax, shared);
    T total = 0, s_sum = 0;
    for (long long j = threadIdx.x; j < V; j += BLOCK) {
        T e = exp(z[j] - zmax);
        out[j] = e;
        total += e;
        s_sum += z[j] - zmax;
    }
    total = block_sum(total, shared);
    s_sum = block_sum(s_sum, shared);
    T lse = log(total);
    for (long long j = threadIdx.x; j < V; j += BLOCK) out[j] /= total;
    if (threadIdx.x == 0) {
        T token_nll = lse - (z[target[blockIdx.x]] - zmax);
        nll[blockIdx.x] = token_nll;
        per_token[blockIdx.x] = (1 - eps) * token_nll + eps * (lse - s_sum / V);
    }
}
extern "C" __global__ void label_smoothed_loss_f32(const float* logits, const long long* target, float* p,
        float* per_token, float* nll, float eps, long long V) {
    label_smoothed_loss<float>(logits, target, p, per_token, nll, eps, V);
}
extern "C" __global__ void label_smoothed_loss_f64(const double* logits, const long long* target, double* p,
        double* per_token, double* nll, double eps, long long V) {
    label_smoothed_loss<double>(logits, target, p, per_token, nll, eps, V);
}
"""

#: name -> (CUDA C source, the entry points it defines, its NumPy reference)
SOURCES = {
    "adam": (ADAM, ("adam_f32", "adam_f64"), "minitf.optim.Adam._update"),
    "masked_softmax": (MASKED_SOFTMAX, ("masked_softmax_forward_f32", "masked_softmax_forward_f64",
                                        "masked_softmax_backward_f32", "masked_softmax_backward_f64"),
                       "minitf.attention.scaled_dot_product_attention (softmax part) and its backward"),
    "layer_norm": (LAYER_NORM, ("layer_norm_forward_f32", "layer_norm_forward_f64",
                                "layer_norm_backward_f32", "layer_norm_backward_f64"),
                   "minitf.layers.LayerNorm.forward / backward"),
    "dropout_residual": (DROPOUT_RESIDUAL, ("dropout_residual_f32", "dropout_residual_f64"),
                         "x + minitf.layers.Dropout(s)"),
    "label_smoothed_loss": (LOSS, ("label_smoothed_loss_f32", "label_smoothed_loss_f64"),
                            "minitf.loss.LabelSmoothedCrossEntropy.forward"),
}

BLOCK = 256
_modules = {}


def function(source_name, entry):
    """The compiled kernel ``entry`` of ``SOURCES[source_name]`` (GPU only: CuPy's RawModule,
    compiled by NVRTC at the first call and cached)."""
    from minitf.backend import xp
    if source_name not in _modules:
        _modules[source_name] = xp.RawModule(code=SOURCES[source_name][0], options=("--std=c++14",))
    return _modules[source_name].get_function(entry)


def suffix(dtype):
    """``_f32`` or ``_f64`` for a float dtype (the kernels exist for those two)."""
    name = str(dtype)
    if name not in ("float32", "float64"):
        raise TypeError(f"the CUDA kernels exist for float32 and float64, got {name}")
    return "_f32" if name == "float32" else "_f64"
