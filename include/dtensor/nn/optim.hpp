#pragma once
// Optimizers over a model's parameters (anything with for_each_parameter(f), f
// called with each nn::Parameter in a fixed order). Each rank updates its own block
// of every parameter: after the gradient reductions a gradient is placed like its
// parameter, so an update needs no communication. Replicated parameters stay equal
// on every rank because every rank applies the same update to the same values.
// The update runs where the block lives (compute/optimizer_update.hpp: Eigen on the
// host, one fused kernel per parameter on a GPU), and so does the optimizer's state.
#include <cmath>
#include <concepts>
#include <string>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/compute/optimizer_update.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::nn {

namespace detail {

// One state buffer per parameter (SGD's momentum, AdamW's moments), kept where the
// parameter's block lives (host or GPU memory). A checkpoint saves and restores them
// (io/training_state.hpp, through the optimizers' for_each_state): from a GPU
// through host staging, like any device block.
class StateBuffers {
 public:
  // Buffer k for a block of n elements of T on `dev`. `fresh`: made by this call
  // (its contents undefined); an existing buffer must have the block's size.
  template <class T>
  T* get(std::size_t k, Device dev, int64_t n, const std::string& param, const char* who, bool& fresh) {
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
    fresh = !has(k);
    unsigned char* p = make(k, dev, bytes);
    DTENSOR_CHECK(buffers_[k].numel() == static_cast<int64_t>(bytes), InvalidArgument, who, ": parameter ", param,
                  " changed size between steps (state of ", buffers_[k].numel(), " bytes for a block of ", bytes,
                  ")");
    return reinterpret_cast<T*>(p);
  }

  // --- for checkpoints ---
  // How many parameters have a buffer (0 before the first step), and whether k has.
  std::size_t size() const { return buffers_.size(); }
  bool has(std::size_t k) const { return k < buffers_.size() && buffers_[k].numel() > 0; }
  // Buffer k, made with `bytes` bytes on `dev` where it does not exist (contents
  // undefined): what a load writes into.
  unsigned char* make(std::size_t k, Device dev, std::size_t bytes) {
    if (k >= buffers_.size()) buffers_.resize(k + 1);
    if (buffers_[k].numel() == 0)
      buffers_[k] = Tensor<unsigned char, 1>::uninitialized({static_cast<int64_t>(bytes)}, dev);
    return buffers_[k].data();
  }
  // Forgets every buffer (a checkpoint without state: the next step starts afresh).
  void clear() { buffers_.clear(); }
  // The bytes this rank's buffers hold (what the state costs in memory).
  int64_t bytes() const {
    int64_t b = 0;
    for (const auto& t : buffers_) b += t.numel();
    return b;
  }

 private:
  std::vector<Tensor<unsigned char, 1>> buffers_;
};

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
  // The momentum buffer per parameter (the memory plan counts it whether or not
  // momentum is on: never under).
  static constexpr int kStatesPerParameter = 1;
  explicit SGD(SGDOptions o) : o_(o) {}

  template <class Model>
  void step(Model& model) {
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      using T = typename std::decay_t<decltype(p)>::value_type;
      auto& w = p.value().local();
      const Device dev = w.device();
      SgdStep s{.lr = o_.lr, .momentum = o_.momentum, .weight_decay = o_.weight_decay, .nesterov = o_.nesterov};
      T* buf = nullptr;
      if (o_.momentum != 0) buf = buf_.template get<T>(k, dev, w.numel(), p.name(), "SGD", s.first);
      compute::sgd_update(dev, w.data(), p.grad().data(), buf, w.numel(), s);
      ++k;
    });
  }

  // The state a checkpoint saves and restores (io/training_state.hpp): f(name,
  // buffers), buffer k the bytes of parameter k's local block (for_each_parameter
  // order), where the block lives; none before the first step with momentum.
  template <class F>
  void for_each_state(F&& f) {
    f("momentum_buffer", buf_);
  }

 private:
  SGDOptions o_;
  detail::StateBuffers buf_;  // momentum buffers, one per parameter
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
  // The two moments per parameter, in its element type (the memory plan's count).
  static constexpr int kStatesPerParameter = 2;
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
    const AdamWStep s{.lr = o_.lr,
                      .beta1 = o_.beta1,
                      .beta2 = o_.beta2,
                      .eps = o_.eps,
                      .weight_decay = o_.weight_decay,
                      .bias_correction1 = 1 - std::pow(o_.beta1, t_),
                      .bias_correction2 = 1 - std::pow(o_.beta2, t_)};
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      using T = typename std::decay_t<decltype(p)>::value_type;
      auto& w = p.value().local();
      const Device dev = w.device();
      const int64_t n = w.numel();
      bool fresh_m = false, fresh_v = false;
      T* m = m_.template get<T>(k, dev, n, p.name(), "AdamW", fresh_m);
      T* v = v_.template get<T>(k, dev, n, p.name(), "AdamW", fresh_v);
      if (fresh_m) movement::fill(dev, m, n, T(0));
      if (fresh_v) movement::fill(dev, v, n, T(0));
      compute::adamw_update(dev, w.data(), p.grad().data(), m, v, n, s);
      ++k;
    });
  }

 private:
  AdamWOptions o_;
  int t_ = 0;
  detail::StateBuffers m_, v_;
};

// The ranks a decision over the whole model runs on (a gradient norm, GradScaler's
// skip): a model's own where its parameters live on several meshes (a pipeline's
// stages: model.comm()), else its parameters' mesh; nullptr for a model without any.
template <class Model>
Comm* model_comm(Model& model) {
  if constexpr (requires { { model.comm() } -> std::same_as<Comm&>; }) {
    return &model.comm();
  } else {
    Comm* world = nullptr;
    model.for_each_parameter([&](auto& p) { world = &p.value().mesh().comm(); });
    return world;
  }
}

// Scales every gradient so that their global 2-norm is at most max_norm, and returns
// the norm before scaling. Exact whatever the placements: each rank adds the squares
// of its blocks, counting a replicated block once (on the ranks at coordinate 0 of
// every mesh dim that replicates it), and one all-reduce over the mesh sums them.
// Call it after the gradient reductions (gradients placed like their parameters).
template <class Model>
double clip_grad_norm(Model& model, double max_norm) {
  double local = 0;
  Comm* world = model_comm(model);
  model.for_each_parameter([&](auto& p) {
    const auto& mesh = p.value().mesh();
    bool owner = true;
    for (int m = 0; m < static_cast<int>(p.placement_state.size()); ++m)
      if (!p.placement_state[m].is_shard()) owner = owner && mesh.coord(m) == 0;
    if (owner) local += detail::sum_of_squares(p.grad());
  });
  if (!world) return 0;
  double total = local;
  all_reduce_values(*world, &total, 1, ReduceOp::Sum);
  CommCounter::record(StepKind::AllReduce, -1, sizeof(double));
  const double norm = std::sqrt(total);
  if (norm > max_norm && norm > 0) {
    const double scale = max_norm / (norm + 1e-6);
    model.for_each_parameter([&](auto& p) {
      using T = typename std::decay_t<decltype(p)>::value_type;
      compute::binary_scalar(BinaryOp::Mul, p.grad(), static_cast<T>(scale), p.grad());
    });
  }
  return norm;
}

}  // namespace dtensor::nn
