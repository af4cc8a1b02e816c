// Training on device buffers: the token layers (embedding, layer and RMS norms,
// dropout, mean squared error), the cross-entropy loss (classes sharded over ranks and
// replicated, label smoothing, class weights, ignored targets, targets on the host or
// on the device), SGD with momentum and AdamW with clip_grad_norm, and a small CNN
// with BatchNorm and GroupNorm trained for a few steps, and a FullyShard model (its
// gathers, reduce-scatters and sharded AdamW), on the in-process runtime with
// RunOptions::device. Each result must equal the same run on host buffers, to
// rounding: test_nn_loss, test_nn_image_norm, test_nn_mlp and train_cnn check the host
// against independent references; this file checks the device paths (the loss's
// device steps, the normalizations' row statistics and affine maps, the fused
// optimizer updates, the copies of per-channel values) against them.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <cmath>
#include <string>
#include <vector>

#include <dtensor/cnn.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>

#include "compare.hpp"

using namespace dtensor;

namespace {

// The largest difference relative to max(1, |host|).
double worst(const std::vector<double>& host, const std::vector<double>& dev) {
  if (host.size() != dev.size()) return test::kInfinite;
  double w = 0;
  for (std::size_t i = 0; i < host.size(); ++i)
    w = test::worst_of(w, std::abs(host[i] - dev[i]) / std::max(1.0, std::abs(host[i])));
  return w;
}

template <int M>
int ranks_of(const std::array<int, M>& shape) {
  int n = 1;
  for (int s : shape) n *= s;
  return n;
}

template <std::size_t M>
constexpr bool nn_has_partial(const PlacementState<M>& s) {
  for (const auto& p : s)
    if (p.is_partial()) return true;
  return false;
}

// --- the loss ---

// Rank 0's loss and gathered dlogits.
template <class Loss, int M>
std::vector<double> loss_run(Device dev, const std::array<int, M>& shape, int64_t batch, int64_t classes,
                             nn::CrossEntropyOptions o, bool weighted, bool targets_on_device) {
  std::vector<double> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      ranks_of<M>(shape),
      [&](Comm& comm) {
        DeviceMesh<M> mesh(comm, shape);
        using Logits = typename Loss::Logits;
        const Logits z = dtensor::detail::generate<Logits>(
            {batch, classes}, mesh, {}, [](uint64_t i) { return 3 * dtensor::detail::normal_value<double>(1, i); });
        const int64_t r0 = z.local_offset()[0], rows = z.local().shape()[0];
        Tensor<int64_t, 1> y({rows});
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = (3 * (r0 + r) + 1) % (classes + 1);
          y(r) = t == classes ? o.ignore_index : t;  // some rows ignored
        }
        std::vector<double> w;
        if (weighted)
          for (int64_t c = 0; c < classes; ++c) w.push_back(0.5 + 0.25 * static_cast<double>(c));
        Loss loss(o, w);
        const double l = loss.forward(z, targets_on_device ? y.to(dev) : y);
        const auto dz = loss.backward();
        CHECK(dz.local().device() == dev);
        const auto g = gather_to(dz, 0);
        if (comm.rank() == 0) {
          out.push_back(l);
          out.insert(out.end(), g.data(), g.data() + g.numel());
        }
      },
      opt);
  return out;
}

template <class Loss, int M>
void loss_same_on_device(const std::array<int, M>& shape, int64_t batch, int64_t classes) {
  for (auto red : {nn::Reduction::Mean, nn::Reduction::Sum})
    for (double eps : {0.0, 0.2})
      for (bool weighted : {false, true}) {
        const nn::CrossEntropyOptions o{red, -100, eps};
        INFO("batch ", batch, ", classes ", classes, ", ", (red == nn::Reduction::Mean ? "mean" : "sum"),
             ", label smoothing ", eps, (weighted ? ", class weights" : ""));
        const auto host = loss_run<Loss, M>(Device::host(), shape, batch, classes, o, weighted, false);
        const auto dev = loss_run<Loss, M>(Device::cuda(0), shape, batch, classes, o, weighted, weighted);
        REQUIRE(host.size() == static_cast<std::size_t>(1 + batch * classes));
        CHECK(worst(host, dev) < 1e-13);
      }
}

using Cfg1 = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;
using Cfg2 = nn::Config<double, 2, nn::Axes<2, 0, 1>>;

// --- a small CNN ---

constexpr int64_t kBatch = 3, kChannels = 3, kH = 11, kW = 9, kClasses = 5;
constexpr int kSteps = 4;

template <class Img>
struct Net {
  using Head = typename nn::GlobalAvgPool<Img>::out_config;
  using Model = nn::Sequential<nn::Conv<Img, kChannels, 4, nn::ConvSpec<2>::square_same(3)>, nn::BatchNorm<Img, 4>,
                               nn::ReLU<Img>, nn::MaxPool<Img>, nn::GroupNorm<Img, 4, 2>, nn::GlobalAvgPool<Img>,
                               nn::Linear<Head, 4, kClasses>>;
  using Loss = nn::CrossEntropy<Head, nn::replicate()>;
  using Targets = dtensor_t<int64_t, 1, placements_t<Head::activation()>>;

  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, kChannels, 4, nn::ConvSpec<2>::square_same(3)>(mesh, {1}), nn::BatchNorm<Img, 4>(mesh),
                 nn::ReLU<Img>(), nn::MaxPool<Img>(nn::PoolOptions<2>::square(2)), nn::GroupNorm<Img, 4, 2>(mesh),
                 nn::GlobalAvgPool<Img>(), nn::Linear<Head, 4, kClasses>(mesh, {2}));
  }
};

// Rank 0's losses and clip norms per step, then every parameter's block after the
// last step (replicated ones whole), then the running statistics of the batch norm.
template <class Img>
std::vector<double> train_run(Device dev, bool adamw) {
  std::vector<double> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      4,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, {2, 2});
        using N = Net<Img>;
        auto model = N::make(mesh);
        typename N::Loss loss({.label_smoothing = 0.1}, {1.0, 0.5, 2.0, 1.5, 1.0});
        nn::SGD sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
        // eps 1e-4, not 1e-8: AdamW divides by sqrt(v) + eps, so a gradient that is
        // rounding noise on one side (1e-17 against 0, sums added in another order)
        // moves a weight by up to lr g / (|g| + eps), 1e-11 with eps 1e-8; here 1e-15.
        nn::AdamW adam({.lr = 0.01, .eps = 1e-4});
        std::vector<double> mine;
        for (int step = 0; step < kSteps; ++step) {
          const auto x = dtensor::detail::generate<typename N::Model::InputT>(
              {kBatch, kChannels, kH, kW}, mesh, {},
              [&](uint64_t i) { return dtensor::detail::normal_value<double>(10 + step, i) + 0.5; });
          const auto t = dtensor::detail::generate<typename N::Targets>(
              {kBatch}, mesh, {}, [&](uint64_t i) { return static_cast<int64_t>((i * 3 + step) % kClasses); });
          model.zero_grad();
          const auto y = model.forward(x);
          CHECK(y.local().device() == dev);
          mine.push_back(loss.forward(y, t));
          model.backward(loss.backward());
          if (adamw) {
            mine.push_back(nn::clip_grad_norm(model, 0.5));
            adam.step(model);
          } else {
            sgd.step(model);
          }
        }
        model.for_each_parameter([&](auto& p) {
          CHECK(p.value().local().device() == dev);
          const auto v = nn::detail::host_values(p.value().local());
          mine.insert(mine.end(), v.begin(), v.end());
        });
        auto& bn = model.template layer<1>();
        for (const auto* s : {&bn.running_mean(), &bn.running_var()}) {
          const auto v = nn::detail::host_values(s->local());
          mine.insert(mine.end(), v.begin(), v.end());
        }
        if (comm.rank() == 0) out = std::move(mine);
      },
      opt);
  return out;
}

// --- the token layers: embedding, layer and RMS norms, dropout, mean squared error ---

template <int M>
DeviceMesh<M> mesh_of(Comm& comm, const std::array<int, M>& shape) {
  return DeviceMesh<M>(comm, shape);
}

// One forward and backward of a one-layer model (made by make(mesh)) on input x_of(mesh)
// and gradient dy = randn: rank 0's gathered output, input gradient (when the layer has
// one) and every parameter's gathered gradient, then the MSE loss of y against a
// second randn tensor and its gradient.
template <int M, class Make, class Input>
std::vector<double> layer_run(Device dev, const std::array<int, M>& shape, Make make, Input x_of) {
  std::vector<double> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      ranks_of<M>(shape),
      [&](Comm& comm) {
        const auto mesh = mesh_of<M>(comm, shape);
        auto model = make(mesh);
        using Model = decltype(model);
        using Y = typename Model::OutputT;
        const auto x = x_of(mesh);
        model.zero_grad();
        const auto y = model.forward(x);
        CHECK(y.local().device() == dev);
        const auto dy = dtensor::detail::counter_fill<Y>(y.shape(), mesh, {}, {.kind = CounterDraw::Kind::Normal, .seed = 5});
        std::vector<double> mine;
        auto add = [&](const auto& t) {
          const auto v = nn::detail::host_values(t);
          mine.insert(mine.end(), v.begin(), v.end());
        };
        add(y.full_tensor());
        if constexpr (std::is_floating_point_v<typename std::decay_t<decltype(x)>::value_type>) {
          const auto dx = model.template backward<true>(dy);
          add(dx.full_tensor());
        } else {
          model.backward(dy);
        }
        model.for_each_parameter([&](auto& p) {
          using PT = typename std::decay_t<decltype(p)>::dtensor_type;
          add(PT(mesh, p.value().layout(), p.grad()).full_tensor());
        });
        using Cfg = typename Model::template layer_t<0>::config;
        nn::MSELoss<Cfg> mse;
        const auto target = dtensor::detail::counter_fill<Y>(y.shape(), mesh, {}, {.kind = CounterDraw::Kind::Normal, .seed = 6});
        if constexpr (!nn_has_partial(Y::placement_state)) {
          mine.push_back(mse.forward(y, target));
          add(mse.backward(y).full_tensor());
        }
        if (comm.rank() == 0) out = std::move(mine);
      },
      opt);
  return out;
}

template <int M, class Make, class Input>
void layer_same_on_device(const char* what, const std::array<int, M>& shape, Make make, Input x_of) {
  INFO(std::string(what));
  const auto host = layer_run<M>(Device::host(), shape, make, x_of);
  const auto dev = layer_run<M>(Device::cuda(0), shape, make, x_of);
  REQUIRE(!host.empty());
  CHECK(worst(host, dev) < 1e-13);
}

}  // namespace

TEST_CASE("cross-entropy on device buffers equals the host's: loss parallel and replicated classes") {
  loss_same_on_device<nn::CrossEntropy<Cfg1, nn::shard(1)>, 1>({3}, 5, 7);  // classes 3|3|1
  loss_same_on_device<nn::CrossEntropy<Cfg1, nn::shard(1)>, 1>({4}, 4, 3);  // a rank without classes
  loss_same_on_device<nn::CrossEntropy<Cfg1, nn::replicate()>, 1>({2}, 5, 7);
  loss_same_on_device<nn::CrossEntropy<Cfg2, nn::shard(1)>, 2>({2, 2}, 5, 7);  // batch over DP, classes over TP
}

TEST_CASE("a CNN with batch and group norm trains on device buffers as on the host: SGD, AdamW, clipping") {
  using Spatial = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using Hybrid = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  for (bool adamw : {false, true}) {
    INFO(std::string(adamw ? "AdamW with clip_grad_norm" : "SGD, Nesterov momentum, weight decay"));
    const auto host = train_run<Spatial>(Device::host(), adamw);
    const auto dev = train_run<Spatial>(Device::cuda(0), adamw);
    REQUIRE(host.size() > kSteps);
    CHECK(std::all_of(host.begin(), host.end(), [](double v) { return std::isfinite(v); }));
    CHECK(worst(host, dev) < 1e-12);
    const auto host_h = train_run<Hybrid>(Device::host(), adamw);
    const auto dev_h = train_run<Hybrid>(Device::cuda(0), adamw);
    CHECK(worst(host_h, dev_h) < 1e-12);
  }
}

TEST_CASE("embedding, layer and RMS norms, dropout and MSE on device buffers equal the host's") {
  using Tp1 = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;
  using DpTp = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
  using Seq = nn::Config<double, 3, nn::Axes<2, 0, 1>>;
  constexpr int64_t kVocab = 11, kDim = 7, kBatch = 5;
  layer_same_on_device<1>("embedding, vocabulary sharded (rowwise)", {3},
                          [](const DeviceMesh<1>& m) {
                            return nn::Sequential<nn::Embedding<Tp1, kVocab, kDim, nn::Rowwise>>{
                                nn::Embedding<Tp1, kVocab, kDim, nn::Rowwise>(m, 5)};
                          },
                          [](const DeviceMesh<1>& m) {
                            using Ids = nn::Embedding<Tp1, kVocab, kDim, nn::Rowwise>::input_type;
                            return dtensor::detail::generate<Ids>({kBatch}, m, {}, [](uint64_t i) {
                              return static_cast<int64_t>((i * 7 + 3) % kVocab);
                            });
                          });
  layer_same_on_device<2>("embedding, features sharded (colwise), batch over DP", {2, 2},
                          [](const DeviceMesh<2>& m) {
                            return nn::Sequential<nn::Embedding<DpTp, kVocab, kDim, nn::Colwise>>{
                                nn::Embedding<DpTp, kVocab, kDim, nn::Colwise>(m, 5)};
                          },
                          [](const DeviceMesh<2>& m) {
                            using Ids = nn::Embedding<DpTp, kVocab, kDim, nn::Colwise>::input_type;
                            return dtensor::detail::generate<Ids>({kBatch}, m, {}, [](uint64_t i) {
                              return static_cast<int64_t>((i * 5 + 1) % kVocab);
                            });
                          });
  auto x_of = []<class Model>(std::type_identity<Model>, auto shape) {
    return [shape](const auto& m) {
      return dtensor::detail::counter_fill<typename Model::InputT>(shape, m, {},
                                                                   {.kind = CounterDraw::Kind::Normal, .seed = 3});
    };
  };
  using LN = nn::Sequential<nn::LayerNorm<Tp1, kDim>>;
  layer_same_on_device<1>("layer norm, replicated", {3}, [](const DeviceMesh<1>& m) { return LN{nn::LayerNorm<Tp1, kDim>(m)}; },
                          x_of(std::type_identity<LN>{}, Shape<2>{kBatch, kDim}));
  using LNF = nn::Sequential<nn::LayerNorm<Tp1, kDim, nn::NormFeatureSharded>>;
  layer_same_on_device<1>("layer norm, features sharded 3|3|1", {3},
                          [](const DeviceMesh<1>& m) { return LNF{nn::LayerNorm<Tp1, kDim, nn::NormFeatureSharded>(m)}; },
                          x_of(std::type_identity<LNF>{}, Shape<2>{kBatch, kDim}));
  using RMSF = nn::Sequential<nn::RMSNorm<Tp1, kDim, nn::NormFeatureSharded>>;
  layer_same_on_device<1>("RMS norm, features sharded", {3},
                          [](const DeviceMesh<1>& m) { return RMSF{nn::RMSNorm<Tp1, kDim, nn::NormFeatureSharded>(m)}; },
                          x_of(std::type_identity<RMSF>{}, Shape<2>{kBatch, kDim}));
  using SP = nn::Sequential<nn::LayerNorm<Seq, kDim, nn::SequenceParallel>>;
  layer_same_on_device<2>("layer norm, sequence parallel, batch over DP", {2, 2},
                          [](const DeviceMesh<2>& m) { return SP{nn::LayerNorm<Seq, kDim, nn::SequenceParallel>(m)}; },
                          x_of(std::type_identity<SP>{}, Shape<3>{3, 5, kDim}));
  using Drop = nn::Sequential<nn::Dropout<DpTp>>;
  layer_same_on_device<2>("dropout p = 0.3", {2, 2}, [](const DeviceMesh<2>&) { return Drop{nn::Dropout<DpTp>(0.3, 42)}; },
                          x_of(std::type_identity<Drop>{}, Shape<2>{kBatch, kDim}));
}

// --- transformer layers: attention (heads over TP, sequence parallel, grouped-query
// heads, causal, RoPE, dropout), the SwiGLU feed-forward, position embeddings, a
// pre-norm block, the token mean pool ---

namespace {

constexpr nn::AttentionShape kDevGqa{.hidden = 16, .heads = 4, .kv_heads = 2};
constexpr nn::AttentionShape kDevOdd{.hidden = 10, .heads = 6, .kv_heads = 3, .head_dim = 4};
constexpr nn::AttentionOptions kDevCausal{.causal = true, .rope_base = 10000, .dropout = 0.2, .seed = 3};

template <class Cfg, nn::AttentionShape A, class Style, int64_t MaxLen = 16>
struct MakeAttention {
  using Model = nn::Sequential<nn::PositionEmbedding<Cfg, MaxLen, A.hidden>, nn::MultiHeadAttention<Cfg, A, Style>>;
  Model operator()(const DeviceMesh<Cfg::M>& m) const {
    return Model(nn::PositionEmbedding<Cfg, MaxLen, A.hidden>(m, 4),
                 nn::MultiHeadAttention<Cfg, A, Style>(m, kDevCausal));
  }
};

template <class Cfg, class Style, nn::NormKind N, nn::Mlp K, int64_t Ffn>
struct MakeBlock {
  using Model = nn::Sequential<nn::PositionEmbedding<Cfg, 16, kDevGqa.hidden>,
                               nn::TransformerBlock<Cfg, kDevGqa, Ffn, Style, N, K>>;
  Model operator()(const DeviceMesh<Cfg::M>& m) const {
    return Model(nn::PositionEmbedding<Cfg, 16, kDevGqa.hidden>(m, 4),
                 nn::TransformerBlock<Cfg, kDevGqa, Ffn, Style, N, K>(m, kDevCausal, 7));
  }
};

template <class Model>
auto normal_input(const Shape<3>& shape) {
  return [shape](const auto& m) {
    return dtensor::detail::counter_fill<typename Model::InputT>(shape, m, {},
                                                                 {.kind = CounterDraw::Kind::Normal, .seed = 3});
  };
}

// A layer without parameters alone (made by Layer{}): rank 0's gathered output and
// input gradient, for the input `s` (drawn by `draw`) and the gradient dy_of(y, mesh).
// Uniform draws are the host's bit for bit on a GPU; normal ones within a few ulp
// (the GPU's log and cos are not correctly rounded).
template <class Layer, int M, std::size_t R, class DyOf>
std::vector<double> parameterless_run(Device dev, const std::array<int, M>& shape, const Shape<R>& s, DyOf dy_of,
                                      CounterDraw::Kind draw = CounterDraw::Kind::Normal) {
  std::vector<double> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      ranks_of<M>(shape),
      [&](Comm& comm) {
        const DeviceMesh<M> mesh(comm, shape);
        Layer layer;
        const auto x = dtensor::detail::counter_fill<typename Layer::InputT>(s, mesh, {}, {.kind = draw, .seed = 8});
        const auto y = layer.forward(x);
        CHECK(y.local().device() == dev);
        const auto dx = layer.template backward<true>(dy_of(y, mesh));
        std::vector<double> mine = nn::detail::host_values(y.full_tensor());
        const auto g = nn::detail::host_values(dx.full_tensor());
        mine.insert(mine.end(), g.begin(), g.end());
        if (comm.rank() == 0) out = std::move(mine);
      },
      opt);
  return out;
}

}  // namespace

TEST_CASE("attention, SwiGLU, position embeddings, transformer blocks, image tokens and the token pool on device "
          "buffers equal the host's") {
  using Dp1 = nn::Config<double, 3, nn::Axes<1, 0, nn::kNone>>;
  using Tp1 = nn::Config<double, 3, nn::Axes<1, nn::kNone, 0>>;
  using DpTp = nn::Config<double, 3, nn::Axes<2, 0, 1>>;
  using Heads = nn::HeadParallel<>;
  using Seq = nn::HeadParallel<Shard<1>>;
  {
    using Make = MakeAttention<Dp1, kDevGqa, nn::NoParallel>;
    layer_same_on_device<1>("attention, batch 5 over 3 ranks, grouped-query heads, causal, RoPE, dropout", {3}, Make{},
                            normal_input<Make::Model>({5, 7, 16}));
  }
  {
    using Make = MakeAttention<DpTp, kDevGqa, Heads>;
    layer_same_on_device<2>("attention, heads over TP, batch over DP (2x2)", {2, 2}, Make{},
                            normal_input<Make::Model>({3, 9, 16}));
  }
  {
    using Make = MakeAttention<Tp1, kDevOdd, Heads>;
    layer_same_on_device<1>("attention, 6 heads over 3 ranks, head dim 4 with hidden 10", {3}, Make{},
                            normal_input<Make::Model>({2, 5, 10}));
  }
  {
    using Make = MakeAttention<DpTp, kDevGqa, Seq>;
    layer_same_on_device<2>("attention, sequence parallel, uneven sequence shards", {2, 2}, Make{},
                            normal_input<Make::Model>({3, 9, 16}));
  }
  {
    using Make = MakeBlock<DpTp, Heads, nn::NormKind::RMS, nn::Mlp::SwiGLU, 19>;
    layer_same_on_device<2>("pre-norm block, RMS norm and SwiGLU (inner 10 | 9), heads over TP", {2, 2}, Make{},
                            normal_input<Make::Model>({3, 7, 16}));
  }
  {
    using Make = MakeBlock<Tp1, Seq, nn::NormKind::Layer, nn::Mlp::Gelu, 24>;
    layer_same_on_device<1>("pre-norm block, layer norm and GELU, sequence parallel", {2}, Make{},
                            normal_input<Make::Model>({2, 7, 16}));
  }
  {
    using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;  // batch over 0, rows over 1
    INFO("image rows to tokens and back, 2x2 (batch x rows), uneven");
    const auto dy_is_y = [](const auto& y, const auto&) { return y; };  // in the tokens' blocks
    // Moves only: the same bits, from an input drawn the same on both (uniform).
    constexpr auto uniform = CounterDraw::Kind::Uniform;
    const auto host =
        parameterless_run<nn::ImageTokens<DpH>, 2>(Device::host(), {2, 2}, Shape<4>{3, 4, 5, 6}, dy_is_y, uniform);
    const auto dev =
        parameterless_run<nn::ImageTokens<DpH>, 2>(Device::cuda(0), {2, 2}, Shape<4>{3, 4, 5, 6}, dy_is_y, uniform);
    REQUIRE(!host.empty());
    CHECK(worst(host, dev) == 0);
  }
  for (int ranks : {1, 3}) {
    INFO("token mean pool, batch over ", ranks, " ranks");
    using Pool = nn::TokenMeanPool<Dp1>;
    const auto normal_dy = [](const auto& y, const auto& mesh) {
      return dtensor::detail::counter_fill<Pool::OutputT>(y.shape(), mesh, {},
                                                          {.kind = CounterDraw::Kind::Normal, .seed = 9});
    };
    const auto host = parameterless_run<Pool, 1>(Device::host(), {ranks}, Shape<3>{5, 4, 6}, normal_dy);
    const auto dev = parameterless_run<Pool, 1>(Device::cuda(0), {ranks}, Shape<3>{5, 4, 6}, normal_dy);
    REQUIRE(!host.empty());
    CHECK(worst(host, dev) < 1e-14);
  }
}

TEST_CASE("context-parallel attention on device buffers equals the host's: ring, load-balanced ring, all-to-all") {
  using Cp1 = nn::Config<double, 3, nn::Axes<1, nn::kNone, nn::kNone, 0>>;    // the sequence over mesh dim 0
  using TpCp = nn::Config<double, 3, nn::Axes<2, nn::kNone, 0, 1>>;            // heads over 0, sequence over 1
  constexpr nn::AttentionShape kRing{.hidden = 16, .heads = 4, .kv_heads = 2, .context = nn::ContextParallel::Ring};
  constexpr nn::AttentionShape kBalanced{.hidden = 16, .heads = 4, .kv_heads = 2,
                                         .context = nn::ContextParallel::RingBalanced};
  constexpr nn::AttentionShape kAllToAll{.hidden = 16, .heads = 4, .kv_heads = 2,
                                         .context = nn::ContextParallel::AllToAll};
  for (int ranks : {2, 3}) {
    INFO(ranks, " ranks on the sequence (13 positions: uneven blocks)");
    using Ring = MakeAttention<Cp1, kRing, nn::NoParallel>;
    layer_same_on_device<1>("ring attention", {ranks}, Ring{}, normal_input<Ring::Model>({2, 13, 16}));
    using Bal = MakeAttention<Cp1, kBalanced, nn::NoParallel>;
    layer_same_on_device<1>("load-balanced ring attention", {ranks}, Bal{}, normal_input<Bal::Model>({2, 13, 16}));
  }
  using A2A = MakeAttention<Cp1, kAllToAll, nn::NoParallel>;
  layer_same_on_device<1>("all-to-all attention", {2}, A2A{}, normal_input<A2A::Model>({2, 13, 16}));
  using TpRing = MakeAttention<TpCp, kBalanced, nn::HeadParallel<>>;
  layer_same_on_device<2>("load-balanced ring under heads over TP (2x2)", {2, 2}, TpRing{},
                          normal_input<TpRing::Model>({2, 11, 16}));
}

// --- fully sharded data parallelism: gathers, reduce-scatters and shard updates on device
// buffers ---

namespace {

constexpr int64_t kFsdpIn = 5, kFsdpHidden = 7, kFsdpOut = 3, kFsdpBatch = 6;

template <class Cfg>
using FsdpFirst =
    nn::Linear<Cfg, kFsdpIn, kFsdpHidden, std::conditional_t<(Cfg::tp >= 0), nn::Colwise, nn::NoParallel>>;
template <class Cfg>
using FsdpSecond =
    nn::Linear<Cfg, kFsdpHidden, kFsdpOut, std::conditional_t<(Cfg::tp >= 0), nn::Rowwise, nn::NoParallel>>;
// Master: the shards' type, or an nn::Precision (a bfloat16 layer on float shards: the
// gathers' and gradients' conversions run where the blocks live).
template <class Cfg, bool Reshard, class Master = typename Cfg::value_type>
using FsdpMlp = nn::Sequential<nn::FullyShard<FsdpFirst<Cfg>, Reshard, Master>, nn::GELU<Cfg>,
                               nn::FullyShard<FsdpSecond<Cfg>, Reshard, Master>>;

// Rank 0's losses and clip norms of 4 steps of AdamW with clip_grad_norm (each step
// two micro-batches, the first inside no_sync()), then every parameter gathered whole.
template <class Cfg, bool Reshard, class Master = typename Cfg::value_type>
std::vector<double> fsdp_run(Device dev, const std::array<int, Cfg::M>& shape) {
  std::vector<double> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      ranks_of<Cfg::M>(shape),
      [&](Comm& comm) {
        DeviceMesh<Cfg::M> mesh(comm, shape);
        using Model = FsdpMlp<Cfg, Reshard, Master>;
        Model model(nn::FullyShard<FsdpFirst<Cfg>, Reshard, Master>(FsdpFirst<Cfg>(mesh, {1})), nn::GELU<Cfg>(),
                    nn::FullyShard<FsdpSecond<Cfg>, Reshard, Master>(FsdpSecond<Cfg>(mesh, {2})));
        nn::MSELoss<Cfg> loss;
        nn::AdamW adam({.lr = 0.01, .eps = 1e-4});  // eps: see train_run
        std::vector<double> mine;
        for (int step = 0; step < 4; ++step) {
          const auto x = dtensor::detail::generate<typename Model::InputT>(
              {kFsdpBatch, kFsdpIn}, mesh, {},
              [&](uint64_t i) { return dtensor::detail::normal_value<double>(500 + step, i); });
          const auto t = dtensor::detail::generate<typename Model::OutputT>(
              {kFsdpBatch, kFsdpOut}, mesh, {}, [&](uint64_t i) { return std::sin(0.3 * double(i % 11) + step); });
          model.zero_grad();
          {  // a first micro-batch inside no_sync(): its whole gradients kept on the device
            auto guard = model.no_sync();
            const auto y0 = model.forward(x);
            (void)loss.forward(y0, t);
            model.backward(loss.backward(y0));
          }
          const auto y = model.forward(x);
          CHECK(y.local().device() == dev);
          mine.push_back(double(loss.forward(y, t)));
          model.backward(loss.backward(y));
          mine.push_back(nn::clip_grad_norm(model, 0.5));
          adam.step(model);
        }
        model.for_each_parameter([&](auto& p) {
          CHECK(p.value().local().device() == dev);
          const auto v = nn::detail::host_values(p.value().full_tensor());
          mine.insert(mine.end(), v.begin(), v.end());
        });
        if (comm.rank() == 0) out = std::move(mine);
      },
      opt);
  return out;
}

// tol: 1e-12 for double layers; a bfloat16 layer's products sum in another order on the
// device (cuBLAS or the emulator's loops against oneDNN), so an activation or gradient
// may round to its bfloat16 neighbour.
template <class Cfg, bool Reshard, class Master = typename Cfg::value_type>
void fsdp_same_on_device(const std::array<int, Cfg::M>& shape, double tol = 1e-12) {
  INFO("reshard_after_forward ", Reshard, ", mesh of ", ranks_of<Cfg::M>(shape), " ranks, ", Cfg::M, "-D");
  const auto host = fsdp_run<Cfg, Reshard, Master>(Device::host(), shape);
  const auto dev = fsdp_run<Cfg, Reshard, Master>(Device::cuda(0), shape);
  REQUIRE(host.size() == static_cast<std::size_t>(8 + kFsdpIn * kFsdpHidden + kFsdpHidden +
                                                  kFsdpHidden * kFsdpOut + kFsdpOut));
  CHECK(std::all_of(host.begin(), host.end(), [](double v) { return std::isfinite(v); }));
  CHECK(worst(host, dev) < tol);
}

}  // namespace

TEST_CASE("fully sharded data parallelism on device buffers equals the host's: 1-D DP, DP x TP") {
  using Dp1 = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;
  using DpTp = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
  fsdp_same_on_device<Dp1, true>({3});  // rows 3|3|1, an output bias of one row each
  fsdp_same_on_device<Dp1, false>({4});  // an empty shard of the output layer
  fsdp_same_on_device<DpTp, true>({2, 2});
  fsdp_same_on_device<DpTp, false>({3, 2});
}

TEST_CASE("fully sharded data parallelism with bfloat16 layers on float shards, on device buffers, against the "
          "host") {
  // Precision<float, bfloat16>: gathers in bfloat16, gradients reduce-scattered in float
  // and added into the float shards; each conversion on the device.
  using Bf16Dp = nn::Config<bfloat16, 2, nn::Axes<1, 0, nn::kNone>>;
  using Bf16DpTp = nn::Config<bfloat16, 2, nn::Axes<2, 0, 1>>;
  using Policy = nn::Precision<float, bfloat16>;
  fsdp_same_on_device<Bf16Dp, true, Policy>({3}, 2e-2);
  fsdp_same_on_device<Bf16DpTp, false, Policy>({3, 2}, 2e-2);
}
