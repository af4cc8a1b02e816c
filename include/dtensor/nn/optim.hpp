#pragma once
// Optimizers over a model's parameters (anything with for_each_parameter(f), f
// called with each nn::Parameter in a fixed order). Each rank updates its own block
// of every parameter: after the gradient reductions a gradient is placed like its
// parameter, so an update needs no communication. Replicated parameters stay equal
// on every rank because every rank applies the same update to the same values.
#include <cmath>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/tensor/eigen.hpp"

namespace dtensor::nn {

namespace detail {
// A parameter's local value and gradient as host Eigen arrays. Optimizer state lives
// beside the parameter, where the parameter lives.
template <class P>
void require_host(P& p, const char* who) {
  DTENSOR_CHECK(p.grad().device().is_host(), InvalidArgument, who, ": parameter ", p.name(),
                " lives on ", dtensor::to_string(p.grad().device()), "; this optimizer updates host blocks only");
}
}  // namespace detail

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double weight_decay = 0;  // L2, added to the gradient (PyTorch's SGD)
  bool nesterov = false;
};

// PyTorch's SGD: g = grad + wd * w; b = momentum * b + g (b = g at the first step);
// w -= lr * (nesterov ? g + momentum * b : b).
class SGD {
 public:
  explicit SGD(SGDOptions o) : o_(o) {}

  template <class Model>
  void step(Model& model) {
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      detail::require_host(p, "SGD");
      using T = typename std::decay_t<decltype(p)>::value_type;
      auto w = as_eigen_array(p.value().local());
      auto g0 = as_eigen_array(p.grad());
      const T lr = static_cast<T>(o_.lr), mom = static_cast<T>(o_.momentum), wd = static_cast<T>(o_.weight_decay);
      // No temporaries: g = grad + wd * w is folded into each expression.
      if (o_.momentum != 0) {
        if (k == buf_.size()) buf_.emplace_back();
        auto& b = buf_[k];
        const bool first = b.empty();
        b.resize(static_cast<std::size_t>(g0.size()) * sizeof(T));
        Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> bm(reinterpret_cast<T*>(b.data()), g0.size());
        if (first) bm = g0 + wd * w;
        else bm = mom * bm + g0 + wd * w;
        if (o_.nesterov) w -= lr * (g0 + wd * w + mom * bm);
        else w -= lr * bm;
      } else {
        w -= lr * (g0 + wd * w);
      }
      ++k;
    });
  }

  // The state a checkpoint saves and restores (io/training_state.hpp): f(name,
  // buffers), buffers[k] the bytes of parameter k's local block (for_each_parameter
  // order); none before the first step with momentum.
  template <class F>
  void for_each_state(F&& f) {
    f("momentum_buffer", buf_);
  }

 private:
  SGDOptions o_;
  std::vector<std::vector<unsigned char>> buf_;  // momentum buffers, one per parameter
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: w -= lr * wd * w
};

// AdamW (Loshchilov and Hutter; PyTorch's update order and bias corrections).
class AdamW {
 public:
  explicit AdamW(AdamWOptions o) : o_(o) {}

  int steps() const { return t_; }
  // Restoring a checkpoint (io/training_state.hpp): the bias corrections depend on it.
  void set_steps(int t) { t_ = t; }
  // The moments, as SGD::for_each_state.
  template <class F>
  void for_each_state(F&& f) {
    f("exp_avg", m_);
    f("exp_avg_sq", v_);
  }

  template <class Model>
  void step(Model& model) {
    ++t_;
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      detail::require_host(p, "AdamW");
      using T = typename std::decay_t<decltype(p)>::value_type;
      auto w = as_eigen_array(p.value().local());
      auto g = as_eigen_array(p.grad());
      if (k == m_.size()) m_.emplace_back(), v_.emplace_back();
      auto& mb = m_[k];
      auto& vb = v_[k];
      const auto n = g.size();
      if (mb.empty()) mb.assign(static_cast<std::size_t>(n) * sizeof(T), 0), vb.assign(mb.size(), 0);
      DTENSOR_CHECK(mb.size() == static_cast<std::size_t>(n) * sizeof(T), InvalidArgument,
                    "AdamW: parameter ", p.name(), " changed size between steps");
      Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> m(reinterpret_cast<T*>(mb.data()), n);
      Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> v(reinterpret_cast<T*>(vb.data()), n);
      const T lr = static_cast<T>(o_.lr), b1 = static_cast<T>(o_.beta1), b2 = static_cast<T>(o_.beta2);
      const T eps = static_cast<T>(o_.eps), wd = static_cast<T>(o_.weight_decay);
      w *= T(1) - lr * wd;
      m = b1 * m + (T(1) - b1) * g;
      v = b2 * v + (T(1) - b2) * g.square();
      const T bc1 = T(1) - static_cast<T>(std::pow(o_.beta1, t_));
      const T bc2 = T(1) - static_cast<T>(std::pow(o_.beta2, t_));
      w -= (lr / bc1) * m / ((v / bc2).sqrt() + eps);
      ++k;
    });
  }

 private:
  AdamWOptions o_;
  int t_ = 0;
  std::vector<std::vector<unsigned char>> m_, v_;
};

// Scales every gradient so that their global 2-norm is at most max_norm, and returns
// the norm before scaling. Exact whatever the placements: each rank adds the squares
// of its blocks, counting a replicated block once (on the ranks at coordinate 0 of
// every mesh dim that replicates it), and one all-reduce over the mesh sums them.
// Call it after the gradient reductions (gradients placed like their parameters).
template <class Model>
double clip_grad_norm(Model& model, double max_norm) {
  double local = 0;
  Comm* world = nullptr;
  model.for_each_parameter([&](auto& p) {
    detail::require_host(p, "clip_grad_norm");
    const auto& mesh = p.value().mesh();
    world = &mesh.comm();
    bool owner = true;
    for (int m = 0; m < static_cast<int>(p.placement_state.size()); ++m)
      if (!p.placement_state[m].is_shard()) owner = owner && mesh.coord(m) == 0;
    if (owner) local += static_cast<double>(as_eigen_array(p.grad()).template cast<double>().square().sum());
  });
  if (!world) return 0;
  double total = local;
  world->all_reduce(&total, &total, 1, DType::Float64, ReduceOp::Sum);
  CommCounter::record(StepKind::AllReduce, -1, sizeof(double));
  const double norm = std::sqrt(total);
  if (norm > max_norm && norm > 0) {
    const double scale = max_norm / (norm + 1e-6);
    model.for_each_parameter([&](auto& p) {
      using T = typename std::decay_t<decltype(p)>::value_type;
      as_eigen_array(p.grad()) *= static_cast<T>(scale);
    });
  }
  return norm;
}

}  // namespace dtensor::nn
