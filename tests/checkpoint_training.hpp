#pragma once
// The model both checkpoint tests train and resume (test_checkpoint on host blocks,
// tests/gpu/test_device_checkpoint on device blocks): a two-layer MLP, colwise then
// rowwise, on a DP x TP mesh, trained on batches whose values depend on the step and
// the element index only, so that every mesh sees the same data.
#include <cmath>
#include <cstdint>

#include <dtensor/io.hpp>
#include <dtensor/nn.hpp>

namespace dtensor::test::checkpoint {

inline constexpr int64_t kIn = 5, kHidden = 7, kOut = 3, kBatch = 6;
using Cfg2 = nn::Config<double, 2, nn::Axes<2, 0, 1>>;  // DP x TP
template <class Cfg>
using MLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden, nn::Colwise>, nn::GELU<Cfg>,
                           nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>>;

template <class Cfg, int M>
MLP<Cfg> make_mlp(const DeviceMesh<M>& mesh, uint64_t seed) {
  return MLP<Cfg>(nn::Linear<Cfg, kIn, kHidden, nn::Colwise>(mesh, {seed}), nn::GELU<Cfg>(),
                  nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>(mesh, {seed + 1}));
}

// One step of training on batch `step` for a model of the MLP's shape (the MLP, or one
// fully sharded); returns the loss.
template <class Cfg, class Model, int M, class Opt>
double train_model_step(Model& model, Opt& opt, const DeviceMesh<M>& mesh, int64_t step) {
  auto x = dtensor::detail::generate<typename Model::InputT>(
      {kBatch, kIn}, mesh, {}, [&](uint64_t i) { return dtensor::detail::normal_value<double>(100 + step, i); });
  auto t = dtensor::detail::generate<typename Model::OutputT>({kBatch, kOut}, mesh, {}, [&](uint64_t i) {
    return std::sin(dtensor::detail::normal_value<double>(500 + step, i));
  });
  nn::MSELoss<Cfg> loss;
  model.zero_grad();
  auto y = model.forward(x);
  const double l = loss.forward(y, t);
  model.backward(loss.backward(y));
  opt.step(model);
  return l;
}

template <class Cfg, int M, class Opt>
double train_step(MLP<Cfg>& model, Opt& opt, const DeviceMesh<M>& mesh, int64_t step) {
  return train_model_step<Cfg>(model, opt, mesh, step);
}

// The model, the optimizer's state and the step count, as a run saves and resumes them.
template <class Cfg, class Opt>
void add_training(io::StateDict& sd, MLP<Cfg>& model, Opt& opt, int64_t& step) {
  io::add_model(sd, model);
  io::add_optimizer(sd, opt, model);
  sd.add("step", step);
}

}  // namespace dtensor::test::checkpoint
