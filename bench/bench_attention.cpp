// The local attention core (compute/attention.hpp: tiles of 128 rows by default, online softmax)
// against the naive three products in the same process: S = q k^T (the whole [L, L]
// matrix per head), a row softmax, o = P v, and their backward (dP = do v^T, dS,
// dq = dS k, dk = dS^T q, dv = P^T do), all as Eigen matrix products on one core.
// float, batch 1, 4 heads of 64, non-causal, sequence 512-4096; forward + backward.
// The extra memory is what each keeps beside q, k, v, o and the gradients: the naive
// version the [L, L] weights and their gradient per head (one head at a time here),
// the tiled one a tile of scores and its row statistics.
//
//   bench_attention [tile]
#include <dtensor/compute/attention.hpp>
#include <dtensor/compute/counter_rng.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

constexpr int64_t kHeads = 4, kDim = 64;

// One head's forward and backward, the [L, L] matrices materialised.
void naive_head(const float* q, const float* k, const float* v, const float* dout, float* o, float* dq, float* dk,
                float* dv, int64_t L, Mat& p, Mat& dp) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const auto Q = Eigen::Map<const Mat>(q, L, kDim), K = Eigen::Map<const Mat>(k, L, kDim);
  const auto V = Eigen::Map<const Mat>(v, L, kDim), dO = Eigen::Map<const Mat>(dout, L, kDim);
  p.noalias() = Q * K.transpose();
  p *= scale;
  for (int64_t i = 0; i < L; ++i) {
    const float m = p.row(i).maxCoeff();
    p.row(i) = (p.row(i).array() - m).exp().matrix();
    p.row(i) /= p.row(i).sum();
  }
  Eigen::Map<Mat>(o, L, kDim).noalias() = p * V;
  Eigen::Map<Mat>(dv, L, kDim).noalias() = p.transpose() * dO;
  dp.noalias() = dO * V.transpose();
  const Eigen::ArrayXf rowdot = (p.array() * dp.array()).rowwise().sum();
  dp.array() = p.array() * (dp.array().colwise() - rowdot);
  Eigen::Map<Mat>(dq, L, kDim).noalias() = scale * (dp * K);
  Eigen::Map<Mat>(dk, L, kDim).noalias() = scale * (dp.transpose() * Q);
}

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tile = argc > 1 ? std::atoll(argv[1]) : 64;  // rows per tile (the core's default 64)
  std::printf("attention forward + backward, float, 1 core, %lld heads of %lld, non-causal (best of 3)\n",
              static_cast<long long>(kHeads), static_cast<long long>(kDim));
  std::printf("%6s %12s %12s %7s %16s %16s\n", "L", "naive ms", "tiled ms", "ratio", "naive extra MiB",
              "tiled extra KiB");
  for (int64_t L : {512, 1024, 2048, 4096}) {
    const int64_t n = kHeads * L * kDim;
    std::vector<float> q(n), k(n), v(n), dout(n), o(n), dq(n), dk(n), dv(n), lse(kHeads * L);
    for (int64_t i = 0; i < n; ++i) {
      q[i] = dtensor::detail::normal_value<float>(1, i), k[i] = dtensor::detail::normal_value<float>(2, i);
      v[i] = dtensor::detail::normal_value<float>(3, i), dout[i] = dtensor::detail::normal_value<float>(4, i);
    }
    Mat p(L, L), dp(L, L);
    const double naive = best_of(3, [&] {
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t off = h * L * kDim;
        naive_head(q.data() + off, k.data() + off, v.data() + off, dout.data() + off, o.data() + off,
                   dq.data() + off, dk.data() + off, dv.data() + off, L, p, dp);
      }
    });
    compute::AttentionDims d;
    d.heads = d.kv_heads = kHeads, d.q_len = d.kv_len = L, d.head_dim = kDim, d.tile = tile;
    const double tiled = best_of(3, [&] {
      compute::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr), o.data(),
                                 lse.data());
      compute::attention_backward(d, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr), o.data(),
                                  lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
    });
    // naive: P and dP, [L, L] each; tiled: a [tile, tile] score block, its gradient,
    // a [tile, D] accumulator and the row statistics
    const double naive_mib = 2.0 * L * L * sizeof(float) / (1 << 20);
    const double tiled_kib = (2.0 * tile * tile + tile * kDim + 4 * tile) * sizeof(float) / 1024;
    std::printf("%6lld %12.1f %12.1f %7.2f %16.1f %16.1f\n", static_cast<long long>(L), naive * 1e3, tiled * 1e3,
                tiled / naive, naive_mib, tiled_kib);
  }
  return 0;
}
