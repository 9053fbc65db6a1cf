// A C++ program that owns its device buffers and stream, runs flashcore's attention on them
// through the public C++ API, and checks the output and logsumexp against a float64 host
// reference, once through attention_forward, then through a plan run per "layer" on fresh
// inputs, then through a CUDA graph that recorded a plan run; and the gradients through
// attention_backward against a float64 reference of the backward pass. Exit status 0 only when
// every check passes.
//
//   flashcore_example            # f16 and bf16, GQA 4:1, causal (bottom-right), seq_q != seq_k
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashcore/flashcore.h"

namespace {

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));          \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

struct Problem {
  int64_t batch = 2, seq_q = 200, seq_k = 333, heads_q = 8, heads_kv = 2, head_dim = 128;
};

float to_float(__half x) { return __half2float(x); }
float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
float to_float(float x) { return x; }
template <typename T> T from_float(float x);
template <> __half from_float<__half>(float x) { return __float2half(x); }
template <> __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// Dense BSHD host tensor [b, s, h, d] of random normals (rounded to T).
template <typename T>
std::vector<T> randn(std::mt19937& rng, int64_t b, int64_t s, int64_t h, int64_t d) {
  std::normal_distribution<float> normal;
  std::vector<T> x(static_cast<size_t>(b * s * h * d));
  for (T& e : x) e = from_float<T>(normal(rng));
  return x;
}

// Row i of head h of sequence b in float64 under bottom-right causal masking: the softmax
// probabilities of its visible keys into `prob`; returns how many keys it sees and its logsumexp.
template <typename T>
std::pair<int64_t, double> probabilities(const Problem& p, const std::vector<T>& q,
                                         const std::vector<T>& k, float scale, int64_t b,
                                         int64_t h, int64_t i, std::vector<double>& prob) {
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  const int64_t visible = std::min(p.seq_k, i + 1 + p.seq_k - p.seq_q);
  prob.resize(static_cast<size_t>(p.seq_k));
  const T* qi = &q[static_cast<size_t>(((b * p.seq_q + i) * p.heads_q + h) * d)];
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < visible; ++j) {
    const T* kj = &k[static_cast<size_t>(((b * p.seq_k + j) * p.heads_kv + h / group) * d)];
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += double(to_float(qi[c])) * double(to_float(kj[c]));
    prob[j] = dot * scale;
    m = std::max(m, prob[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) sum += (prob[j] = std::exp(prob[j] - m));
  for (int64_t j = 0; j < visible; ++j) prob[j] /= sum;
  return {visible, m + std::log(sum)};
}

// Float64 reference with bottom-right causal masking: out (BSHD) and lse ([b, h, s_q]).
template <typename T>
void reference(const Problem& p, const std::vector<T>& q, const std::vector<T>& k,
               const std::vector<T>& v, float scale, std::vector<double>& out,
               std::vector<double>& lse) {
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  out.assign(static_cast<size_t>(p.batch * p.seq_q * p.heads_q * d), 0.0);
  lse.assign(static_cast<size_t>(p.batch * p.heads_q * p.seq_q), 0.0);
  std::vector<double> prob;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const auto [visible, row_lse] = probabilities(p, q, k, scale, b, h, i, prob);
        double* o = &out[static_cast<size_t>(((b * p.seq_q + i) * p.heads_q + h) * d)];
        for (int64_t j = 0; j < visible; ++j) {
          const T* vj = &v[static_cast<size_t>(((b * p.seq_k + j) * p.heads_kv + h / group) * d)];
          for (int64_t c = 0; c < d; ++c) o[c] += prob[j] * double(to_float(vj[c]));
        }
        lse[static_cast<size_t>((b * p.heads_q + h) * p.seq_q + i)] = row_lse;
      }
}

// Float64 gradients of the same attention for the output gradient `gout`: gq (like q), gk and
// gv (like k; a kv head sums its query heads'). Each row's D_i = gout_i . out_i takes the call's
// rounded output `out`, as flashcore and FlashAttention define it.
template <typename T>
void reference_gradients(const Problem& p, const std::vector<T>& q, const std::vector<T>& k,
                         const std::vector<T>& v, const std::vector<T>& out,
                         const std::vector<T>& gout, float scale, std::vector<double>& gq,
                         std::vector<double>& gk, std::vector<double>& gv) {
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  gq.assign(q.size(), 0.0);
  gk.assign(k.size(), 0.0);
  gv.assign(v.size(), 0.0);
  std::vector<double> prob;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const int64_t visible = probabilities(p, q, k, scale, b, h, i, prob).first;
        const size_t row = static_cast<size_t>(((b * p.seq_q + i) * p.heads_q + h) * d);
        double dsum = 0;
        for (int64_t c = 0; c < d; ++c) {
          dsum += double(to_float(gout[row + c])) * to_float(out[row + c]);
        }
        for (int64_t j = 0; j < visible; ++j) {
          const size_t key = static_cast<size_t>(((b * p.seq_k + j) * p.heads_kv + h / group) * d);
          double dp = 0;
          for (int64_t c = 0; c < d; ++c) {
            dp += double(to_float(gout[row + c])) * to_float(v[key + c]);
          }
          const double ds = prob[j] * (dp - dsum) * scale;
          for (int64_t c = 0; c < d; ++c) {
            gq[row + c] += ds * to_float(k[key + c]);
            gk[key + c] += ds * to_float(q[row + c]);
            gv[key + c] += prob[j] * to_float(gout[row + c]);
          }
        }
      }
}

template <typename X>
double rel_l2(const std::vector<X>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = double(to_float(got[i]));
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);  // NaN anywhere makes this NaN, which fails every check
}

template <typename T>
T* upload(const std::vector<T>& host) {
  void* raw = nullptr;
  CHECK_CUDA(cudaMalloc(&raw, host.size() * sizeof(T)));
  T* dev = static_cast<T*>(raw);
  CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

template <typename Ref>
Ref bshd(void* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  Ref r;
  r.data = static_cast<decltype(r.data)>(data);
  const int64_t shape[4] = {b, s, h, d};
  for (int i = 0; i < 4; ++i) r.shape[i] = shape[i];
  flashcore::bshd_strides(r.shape, r.stride);
  return r;
}

// The call on device buffers of `p`'s shapes (BSHD; lse [b, h, s_q]), bottom-right causal.
flashcore::AttentionArgs forward_args(const Problem& p, flashcore::DType dtype, void* q, void* k,
                                      void* v, void* out, float* lse) {
  flashcore::AttentionArgs a;
  a.dtype = dtype;
  a.q = bshd<flashcore::TensorRef>(q, p.batch, p.seq_q, p.heads_q, p.head_dim);
  a.k = bshd<flashcore::TensorRef>(k, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  a.v = bshd<flashcore::TensorRef>(v, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  a.out = bshd<flashcore::OutputRef>(out, p.batch, p.seq_q, p.heads_q, p.head_dim);
  flashcore::OutputRef l;
  l.data = lse;
  const int64_t lse_shape[4] = {p.batch, p.seq_q, p.heads_q, 1};
  for (int i = 0; i < 4; ++i) l.shape[i] = lse_shape[i];
  flashcore::bhsd_strides(l.shape, l.stride);
  a.lse = l;
  a.options.causal = flashcore::Causal::BottomRight;
  return a;
}

// The gradients through attention_backward, after attention_forward with the logsumexp, into
// NaN-poisoned buffers, against the float64 reference; then a gradient of the wrong shape,
// refused with its own operand and nothing written.
template <typename T>
bool backward(flashcore::DType dtype, const char* name, double tolerance, cudaStream_t stream) {
  const Problem p;
  std::mt19937 rng(std::random_device{}());  // fresh inputs every run
  const auto q = randn<T>(rng, p.batch, p.seq_q, p.heads_q, p.head_dim);
  const auto k = randn<T>(rng, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  const auto v = randn<T>(rng, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  const auto gout = randn<T>(rng, p.batch, p.seq_q, p.heads_q, p.head_dim);
  const T nan = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  const std::vector<T> nan_q(q.size(), nan), nan_k(k.size(), nan);
  T *dq = upload(q), *dk = upload(k), *dv = upload(v), *dgout = upload(gout);
  T *dout = upload(nan_q), *gq = upload(nan_q), *gk = upload(nan_k), *gv = upload(nan_k);
  float* dlse = upload(std::vector<float>(static_cast<size_t>(p.batch * p.heads_q * p.seq_q)));

  flashcore::BackwardArgs g;
  g.forward = forward_args(p, dtype, dq, dk, dv, dout, dlse);
  g.dout = bshd<flashcore::TensorRef>(dgout, p.batch, p.seq_q, p.heads_q, p.head_dim);
  g.dq = bshd<flashcore::OutputRef>(gq, p.batch, p.seq_q, p.heads_q, p.head_dim);
  g.dk = bshd<flashcore::OutputRef>(gk, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  g.dv = bshd<flashcore::OutputRef>(gv, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  const flashcore::Status f = flashcore::attention_forward(g.forward, stream);
  flashcore::BackwardTileRow row{};  // the row of backward_tile_table() that runs
  const flashcore::Status s = f.ok() ? flashcore::attention_backward(g, stream, &row) : f;
  bool ok = s.ok();
  if (!ok) {
    std::printf("%s backward: %s: %s\n", name, flashcore::name(s.code), s.message.c_str());
  } else {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto download = [](const T* dev, size_t n) {
      std::vector<T> host(n);
      CHECK_CUDA(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
      return host;
    };
    const auto out = download(dout, q.size());
    const float scale = 1.0f / std::sqrt(float(p.head_dim));
    std::vector<double> want_q, want_k, want_v;
    reference_gradients(p, q, k, v, out, gout, scale, want_q, want_k, want_v);
    const double eq = rel_l2(download(gq, q.size()), want_q);
    const double ek = rel_l2(download(gk, k.size()), want_k);
    const double ev = rel_l2(download(gv, v.size()), want_v);
    ok = eq < tolerance && ek < tolerance && ev < tolerance &&  // false for NaN
         row.max_head_dim >= p.head_dim;
    std::printf("%s attention_backward %ldx%ldx%ld(kv %ld)x%ld causal: rel L2 dq %.2e, dk %.2e, "
                "dv %.2e (< %.0e), %s kernel, %d keys x %d rows: %s\n",
                name, long(p.batch), long(p.heads_q), long(p.seq_q), long(p.heads_kv),
                long(p.head_dim), eq, ek, ev, tolerance,
                row.kernel == flashcore::BackwardKernel::Hopper ? "hopper"
                : row.kernel == flashcore::BackwardKernel::Wide ? "wide"
                                                                : "narrow",
                int(row.keys_per_block), int(row.rows_per_step), ok ? "ok" : "FAILED");
  }

  // dk shaped like q: refused with its operand, and the poisoned dv is left as it was.
  CHECK_CUDA(cudaMemcpy(gv, nan_k.data(), nan_k.size() * sizeof(T), cudaMemcpyHostToDevice));
  flashcore::BackwardArgs bad = g;
  bad.dk = bshd<flashcore::OutputRef>(gk, p.batch, p.seq_k, p.heads_q, p.head_dim);
  const flashcore::Status e = flashcore::attention_backward(bad, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<T> after(nan_k.size());
  CHECK_CUDA(cudaMemcpy(after.data(), gv, after.size() * sizeof(T), cudaMemcpyDeviceToHost));
  const bool untouched =
      std::all_of(after.begin(), after.end(), [](T x) { return std::isnan(to_float(x)); });
  const bool refused = e.code == flashcore::Code::ShapeMismatch &&
                       e.operand == flashcore::Operand::DK && untouched;
  std::printf("%s backward with dk shaped like q: %s (%s), dv untouched: %s\n", name,
              flashcore::name(e.code), e.message.c_str(), refused ? "ok" : "FAILED");
  for (void* ptr : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                    static_cast<void*>(dgout), static_cast<void*>(dout), static_cast<void*>(gq),
                    static_cast<void*>(gk), static_cast<void*>(gv), static_cast<void*>(dlse)}) {
    CHECK_CUDA(cudaFree(ptr));
  }
  return ok && refused;
}

template <typename T>
bool run(flashcore::DType dtype, const char* name, double tolerance, cudaStream_t stream) {
  const Problem p;
  std::mt19937 rng(std::random_device{}());  // fresh inputs every run
  auto q = randn<T>(rng, p.batch, p.seq_q, p.heads_q, p.head_dim);
  auto k = randn<T>(rng, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  auto v = randn<T>(rng, p.batch, p.seq_k, p.heads_kv, p.head_dim);
  std::vector<T> out(q.size(), from_float<T>(std::numeric_limits<float>::quiet_NaN()));
  std::vector<float> lse(static_cast<size_t>(p.batch * p.heads_q * p.seq_q),
                         std::numeric_limits<float>::quiet_NaN());
  T *dq = upload(q), *dk = upload(k), *dv = upload(v), *dout = upload(out);  // out poisoned
  float* dlse = upload(lse);

  const flashcore::AttentionArgs a = forward_args(p, dtype, dq, dk, dv, dout, dlse);

  const float scale = 1.0f / std::sqrt(float(p.head_dim));
  // Copies the output and logsumexp back and compares them with the f64 reference.
  const auto matches = [&](const char* what, const flashcore::LaunchInfo& info) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(out.data(), dout, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lse.data(), dlse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> want, want_lse;
    reference(p, q, k, v, scale, want, want_lse);
    const double err = rel_l2(out, want), lse_err = rel_l2(lse, want_lse);
    const bool ok = err < tolerance && lse_err < 1e-4;  // false for NaN
    std::printf("%s %s %ldx%ldx%ld(kv %ld)x%ld causal: kernel %s tile q%d_k%d_d%d, rel L2 %.2e "
                "(< %.0e), lse %.2e: %s\n",
                name, what, long(p.batch), long(p.heads_q), long(p.seq_q), long(p.heads_kv),
                long(p.head_dim), flashcore::name(info.kernel), info.row.tile.queries_per_block,
                info.row.tile.keys_per_block, info.row.tile.max_head_dim, err, tolerance, lse_err,
                ok ? "ok" : "FAILED");
    return ok;
  };

  flashcore::LaunchInfo info{};
  const flashcore::Status s = flashcore::attention_forward(a, stream, &info);
  bool ok = s.ok();
  if (!ok) {
    std::printf("%s: attention_forward failed: %s: %s\n", name, flashcore::name(s.code),
                s.message.c_str());
  } else {
    ok = matches("attention_forward", info);
  }

  // Plan once, run per layer: each "layer" gets fresh inputs in the same buffers, and the output
  // is poisoned again before its run.
  flashcore::AttentionPlan plan;
  const flashcore::Status planned = flashcore::AttentionPlan::create(a, &plan);
  ok = ok && planned.ok() && bool(plan);
  // Fresh inputs in the same buffers, and the outputs poisoned again.
  const auto refill = [&] {
    q = randn<T>(rng, p.batch, p.seq_q, p.heads_q, p.head_dim);
    k = randn<T>(rng, p.batch, p.seq_k, p.heads_kv, p.head_dim);
    v = randn<T>(rng, p.batch, p.seq_k, p.heads_kv, p.head_dim);
    std::fill(out.begin(), out.end(), from_float<T>(std::numeric_limits<float>::quiet_NaN()));
    for (const auto& [dst, src, bytes] :
         {std::tuple{static_cast<void*>(dq), static_cast<const void*>(q.data()), q.size()},
          std::tuple{static_cast<void*>(dk), static_cast<const void*>(k.data()), k.size()},
          std::tuple{static_cast<void*>(dv), static_cast<const void*>(v.data()), v.size()},
          std::tuple{static_cast<void*>(dout), static_cast<const void*>(out.data()), out.size()}}) {
      CHECK_CUDA(cudaMemcpy(dst, src, bytes * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
    CHECK_CUDA(cudaMemcpy(dlse, lse.data(), lse.size() * sizeof(float), cudaMemcpyHostToDevice));
    // Copies from pageable memory may still be in flight, and `stream` does not wait for the
    // legacy stream they ran on.
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  for (int layer = 0; ok && layer < 2; ++layer) {
    refill();
    const flashcore::Status r = plan.run({dq, dk, dv, dout, dlse}, stream);
    if (!r.ok()) {
      std::printf("%s: AttentionPlan::run failed: %s: %s\n", name, flashcore::name(r.code),
                  r.message.c_str());
    }
    ok = r.ok() && matches(layer == 0 ? "plan run, layer 0" : "plan run, layer 1", plan.info());
  }

  // A plan's run recorded into a CUDA graph (global capture mode, the strictest), then the
  // graph launched on fresh inputs in the same buffers, twice: Auto's plan, then a plan forcing
  // each family that runs on this device (their first launch in this process is the captured
  // one, for the families Auto did not pick).
  const auto graph_runs = [&](const flashcore::AttentionPlan& graph_plan, const char* label) {
    refill();
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const flashcore::Status r = graph_plan.run({dq, dk, dv, dout, dlse}, stream);
    cudaGraph_t recorded = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(stream, &recorded));
    cudaGraphExec_t graph = nullptr;
    CHECK_CUDA(cudaGraphInstantiate(&graph, recorded, 0));
    CHECK_CUDA(cudaGraphDestroy(recorded));
    std::vector<T> after(out.size());
    CHECK_CUDA(cudaMemcpy(after.data(), dout, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
    const bool nothing_ran = std::all_of(after.begin(), after.end(),
                                         [](T x) { return std::isnan(to_float(x)); });
    std::printf("%s %s: plan run captured: %s, nothing ran while recording: %s\n", name, label,
                flashcore::name(r.code), nothing_ran ? "ok" : "FAILED");
    bool good = r.ok() && nothing_ran;
    for (int launch = 0; good && launch < 2; ++launch) {
      refill();
      CHECK_CUDA(cudaGraphLaunch(graph, stream));
      const std::string what = std::string(label) + ", graph launch " + std::to_string(launch);
      good = matches(what.c_str(), graph_plan.info());
    }
    CHECK_CUDA(cudaGraphExecDestroy(graph));
    return good;
  };
  ok = ok && graph_runs(plan, "auto");
  for (const flashcore::Backend backend : {flashcore::Backend::CutlassSm80, flashcore::Backend::Wmma,
                                           flashcore::Backend::CutlassSm90}) {
    flashcore::AttentionArgs forced = a;
    forced.options.backend = backend;
    flashcore::AttentionPlan forced_plan;
    const flashcore::Status c = flashcore::AttentionPlan::create(forced, &forced_plan);
    const auto family = flashcore::name(*flashcore::kernel_of(backend));
    if (!c.ok()) {  // not on this device (or not built): its own code, nothing to record
      std::printf("%s %s: not planned here: %s\n", name, family, flashcore::name(c.code));
      continue;
    }
    ok = ok && graph_runs(forced_plan, family);
  }

  // A run's bad arguments: each its own code, nothing launched.
  const flashcore::Code no_lse = plan.run({dq, dk, dv, dout, nullptr}, stream).code;
  const flashcore::Code null_q = plan.run({nullptr, dk, dv, dout, dlse}, stream).code;
  const flashcore::Code shifted = plan.run({dq, dk, dv, dout + 1, dlse}, stream).code;
  const flashcore::Code empty = flashcore::AttentionPlan{}.run({dq, dk, dv, dout, dlse}, stream).code;
  const bool plan_refused = no_lse == flashcore::Code::PlanMismatch &&
                            null_q == flashcore::Code::DeviceMismatch &&
                            shifted == flashcore::Code::MisalignedPointer &&
                            empty == flashcore::Code::PlanMismatch;
  std::printf("%s plan run without lse: %s, null q: %s, misaligned out: %s, empty plan: %s: %s\n",
              name, flashcore::name(no_lse), flashcore::name(null_q), flashcore::name(shifted),
              flashcore::name(empty), plan_refused ? "ok" : "FAILED");
  ok = ok && plan_refused;

  // A bad argument comes back as its own code, and nothing is launched.
  flashcore::AttentionArgs bad = a;
  bad.k.shape[3] = bad.v.shape[3] = 96;  // head dims disagree
  const flashcore::Status e = flashcore::attention_forward(bad, stream);
  const bool refused = e.code == flashcore::Code::ShapeMismatch && e.operand == flashcore::Operand::K;
  std::printf("%s mismatched head dim: %s (%s): %s\n", name, flashcore::name(e.code),
              e.message.c_str(), refused ? "ok" : "FAILED");
  for (void* ptr : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                    static_cast<void*>(dout), static_cast<void*>(dlse)}) {
    CHECK_CUDA(cudaFree(ptr));
  }
  return ok && refused;
}

}  // namespace

int main() {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "flashcore_example needs a CUDA device\n");
    return 2;
  }
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const bool f16 = run<__half>(flashcore::DType::F16, "f16", 2e-3, stream);
  const bool bf16 = run<__nv_bfloat16>(flashcore::DType::BF16, "bf16", 1e-2, stream);
  const bool f16_grads = backward<__half>(flashcore::DType::F16, "f16", 2e-3, stream);
  const bool bf16_grads = backward<__nv_bfloat16>(flashcore::DType::BF16, "bf16", 1e-2, stream);
  CHECK_CUDA(cudaStreamDestroy(stream));
  const bool passed = f16 && bf16 && f16_grads && bf16_grads;
  std::printf("flashcore_example: %s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}
