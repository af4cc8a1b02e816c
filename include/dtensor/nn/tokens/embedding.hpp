#pragma once
// Embedding<Cfg, Vocab, Dim, Style>: rows of a [Vocab, Dim] table picked by token ids
// (int64, of shape [batch, ...]: the activations' shape without the features). As the
// first layer of a Sequential it takes the model's input.
//
//   style                       table [Vocab, Dim]   output on TP   collectives
//   NoParallel                  Replicate            Replicate      none
//   RowwiseParallel<Out>        Shard<0> (vocab)     Out            forward: the masked lookup gives a
//                                                                   Partial<Sum> (ids outside this rank's
//                                                                   rows give zeros: PyTorch's MaskPartial),
//                                                                   then all-reduce (Out = Replicate) or
//                                                                   reduce-scatter (Out = Shard<1>)
//   ColwiseParallel<>           Shard<1> (dim)       Shard<features> none
// The table's gradient is a scatter-add of the output's gradient rows: local, placed
// like the table on TP and Partial<Sum> over the data-parallel dim.
#include <cstdlib>
#include <optional>
#include <vector>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/styles.hpp"

namespace dtensor::nn {

// How an embedding table starts: element i is a function of (seed, i) only, as for
// Linear and Conv (LinearInit, ConvInit): Embedding<...>(mesh, {.seed = 3}).
struct EmbeddingInit {
  uint64_t seed = 0;
};

template <class Cfg, int64_t Vocab, int64_t Dim, LinearStyle Style = NoParallel>
class Embedding {
  static_assert(Vocab > 0 && Dim > 0, "dtensor::nn::Embedding<Cfg, Vocab, Dim>: sizes must be positive");
  static_assert(detail::style_kind<Style> != StyleKind::Colwise || std::is_same_v<Style, ColwiseParallel<Replicate>>,
                "dtensor::nn::Embedding: a colwise embedding takes replicated ids (ColwiseParallel<>)");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int F = Cfg::feature_dim;
  static constexpr StyleKind kind = detail::style_kind<Style>;
  static constexpr bool rowwise = kind == StyleKind::Rowwise, colwise = kind == StyleKind::Colwise;
  static constexpr const char* name = rowwise ? "embedding(rowwise)" : colwise ? "embedding(colwise)" : "embedding";

  static constexpr State table_state() {
    State s{};
    if (Cfg::tp >= 0) s[Cfg::tp] = rowwise ? shard(0) : colwise ? shard(1) : replicate();
    return s;
  }
  static constexpr State product() {
    return Cfg::activation(rowwise ? partial_sum() : colwise ? shard(F) : replicate());
  }
  static constexpr State out_state() {
    if constexpr (rowwise) return Cfg::activation(Style::output_on_tp);
    else return product();
  }
  static constexpr State input(const State&) { return Cfg::activation(); }
  static constexpr State output(const State&) { return out_state(); }
  static constexpr State grad_input(const State&, const State&) { return Cfg::activation(); }  // ids: none
  static constexpr int64_t out_features(int64_t) { return Dim; }
  static constexpr State grad_product(const State& grad_out) {
    if constexpr (rowwise) return redistribute_backward_placements(product(), grad_out);
    else return grad_out;
  }
  static constexpr State table_grad(const State& grad_out) {
    State s = table_state();
    s = Cfg::partial_over_tokens(s);
    if (Cfg::tp >= 0 && s[Cfg::tp].is_replicate()) s[Cfg::tp] = grad_product(grad_out)[Cfg::tp];
    return s;
  }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t, bool) {
    p.redistribution(Phase::Forward, layer, product(), out_state(), Dim, true);
    if constexpr (rowwise) p.adjoint(Phase::Backward, layer, product(), grad_out, Dim, true);
  }
  // The parameter (nn/parameters.hpp): the table [Vocab, Dim].
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{declare<&Embedding::table_>(table_state(), table_grad(grad_out), {Vocab, Dim})};
  }

  using TableT = dtensor_t<T, 2, placements_t<table_state()>>;
  using input_type = dtensor_t<int64_t, Rank - 1, placements_t<Cfg::activation()>>;
  using OutputT = dtensor_t<T, Rank, placements_t<out_state()>>;

  // Entries N(0, 1) (PyTorch's default), a function of (seed, index) only.
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  Embedding(const DeviceMesh<GivenDims>& mesh, EmbeddingInit init = {})
      : Embedding(mesh_for_config<Cfg::M>(mesh), init) {}
  template <int GivenDims>
  Embedding(EmbeddingInit init, const DeviceMesh<GivenDims>& mesh) : Embedding(mesh_given_last<Cfg::M>(mesh), init) {}
  Embedding(const typename TableT::Mesh& mesh, EmbeddingInit init = {}) : Embedding(mesh, init.seed) {}
  Embedding(const typename TableT::Mesh& mesh, uint64_t seed)
      : table_("table", dtensor::detail::generate<TableT>({Vocab, Dim}, mesh, {}, [&](uint64_t i) {
          return dtensor::detail::normal_value<T>(seed, i);
        })) {}

  Parameter<TableT>& table() { return table_; }

  // Token ids of another element type, rank or placement: one error that says what the
  // layer takes (rather than "cannot convert" to input_type).
  template <class U, int R, class... P>
    requires(!std::is_same_v<DTensor<U, R, P...>, input_type>)
  OutputT forward(const DTensor<U, R, P...>&) {
    static_assert(std::is_same_v<U, int64_t>,
                  "nn::Embedding::forward takes token ids as int64_t DTensors (Embedding::input_type): make them "
                  "int64_t (zeros<int64_t, ...>, from_function with an int64_t result), not float");
    static_assert(!std::is_same_v<U, int64_t> || R == Rank - 1,
                  "nn::Embedding::forward: token ids have one dim fewer than the output (e.g. [batch, seq] for "
                  "[batch, seq, Dim])");
    static_assert(!std::is_same_v<U, int64_t> || R != Rank - 1,
                  "nn::Embedding::forward: token ids are placed as the activations without the feature dim "
                  "(Embedding::input_type, Cfg::activation()): redistribute them to those placements first");
    std::abort();  // not reached: an assertion above stops the build
  }

  OutputT forward(const input_type& ids) {
    DTENSOR_CHECK(!pending_.has_value(), InvalidArgument, name,
                  ": a forward between backward_input and backward_weight; run the weight step first (a pipeline "
                  "sets each micro-batch's state aside: nn::SavedStash)");
    const auto& t = table_.value();
    const Device dev = t.local().device();  // the ids are checked on the host, looked up beside the table
    const int64_t rows = ids.local().numel();
    const std::vector<int64_t> host_ids = detail::host_values(ids.local());
    for (int64_t i = 0; i < rows; ++i)
      DTENSOR_CHECK(host_ids[i] >= 0 && host_ids[i] < Vocab, InvalidArgument, name, ": token id ", host_ids[i],
                    " is outside the vocabulary [0, ", Vocab, ")");
    ids_.emplace(ids.local().device() == dev ? ids.local() : ids.local().to(dev));
    const int64_t lo = t.local_offset()[0], cols = t.local().shape()[1];
    ShardLayout<Rank> layout;
    for (int d = 0; d < Rank - 1; ++d) {
      layout.global[d] = ids.shape()[d];
      layout.blocks[d] = ids.layout().blocks[d];
    }
    layout.global[F] = Dim;
    if constexpr (colwise) layout.blocks[F] = t.layout().blocks[1];
    Shape<Rank> ls{};
    for (int d = 0; d < Rank - 1; ++d) ls[d] = ids.local().shape()[d];
    ls[F] = cols;
    auto y = Tensor<T, Rank>::uninitialized(ls, dev);
    compute::gather_rows(dev, t.local().data(), t.local().shape()[0], cols, ids_->data(), rows, lo, y.data());
    using Product = dtensor_t<T, Rank, placements_t<product()>>;
    Product z(ids.mesh(), std::move(layout), std::move(y));
    return redistribute_as<placements_t<out_state()>>(std::move(z));  // moved where placed alike
  }

  template <bool NeedInputGrad = false, class G>
  auto backward(const G& dy) {
    static_assert(!NeedInputGrad, "dtensor::nn::Embedding: token ids have no gradient; the embedding must be "
                                  "the model's first layer, called without an input gradient");
    DTENSOR_CHECK(ids_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& dz = [&]() -> decltype(auto) {
      if constexpr (rowwise) return redistribute_backward_as<placements_t<product()>>(dy);
      else return (dy);
    }();
    check_rows(dz.local());
    add_table_gradient(*ids_, dz.local());
    ids_.reset();
    return 0;
  }

  // The backward in two steps (nn/layer.hpp, zero-bubble pipelines): an embedding's
  // backward is all weight work (ids have no gradient), so the input step only brings
  // dy to the rows' placements (rowwise: the adjoint's collective, in the step every
  // rank of the stage runs in order) and keeps it with the ids; backward_weight adds
  // the table's gradient. The two make backward's sums bit for bit.
  template <bool NeedInputGrad = false, class G>
  auto backward_input(G&& dy) {
    static_assert(!NeedInputGrad, "dtensor::nn::Embedding: token ids have no gradient; the embedding must be "
                                  "the model's first layer, called without an input gradient");
    DTENSOR_CHECK(ids_.has_value(), InvalidArgument, name, ": backward_input without a forward");
    auto dz = owned_product_gradient<placements_t<product()>, rowwise>(std::forward<G>(dy));
    check_rows(dz.local());
    pending_.emplace(Pending{std::move(*ids_), std::move(dz.local())});  // a forward cannot replace what it reads
    ids_.reset();
    return 0;
  }
  void backward_weight() {
    DTENSOR_CHECK(pending_.has_value(), InvalidArgument, name, ": backward_weight without a backward_input before it");
    add_table_gradient(pending_->ids, pending_->dz);
    pending_.reset();
  }
  // From its input step to its weight step: the rows' gradient (the ids move over from
  // what the forward saved).
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& ids, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    return ids.template as<T>()
        .reshaped(std::array<int64_t, 3>{ids.global[0], ids.global[1], Dim}, product())
        .bytes(mesh_shape, coords, a);
  }

  // What it holds over a step (nn/memory_plan.hpp), for the token ids x: the ids saved,
  // the rows looked up (the product, reduced or scattered into the output where they
  // differ); in the backward the table's gradient block and, rowwise, the product's
  // gradient.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& ids) {
    LayerMemory<M> m;
    m.save(ids);
    const PlannedTensor<M> rows = ids.template as<T>().reshaped(
        std::array<int64_t, 3>{ids.global[0], ids.global[1], Dim}, product());
    m.out = rows.placed(out_state());
    if (product() != out_state()) m.forward_temporary(rows);
    if constexpr (rowwise) m.backward_temporary(rows);
    m.backward_temporary(PlannedTensor<M>::template of<T>(std::array<int64_t, 2>{Vocab, Dim}, TableT::placement_state));
    return m;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(ids_, pending_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    ids_.reset();
    pending_.reset();
  }

 private:
  void check_rows(const Tensor<T, Rank>& dz) const {
    DTENSOR_CHECK(dz.numel() == ids_->numel() * table_.value().local().shape()[1], InvalidArgument, name,
                  ": the gradient's block ", dtensor::to_string(dz.shape()), " does not match the ids of the last forward");
  }
  // The table's gradient block from the rows' gradient dz and the saved ids: a
  // scatter-add, then added into the parameter's gradient.
  void add_table_gradient(const Tensor<int64_t, Rank - 1>& ids, const Tensor<T, Rank>& dz) {
    const auto& t = table_.value();
    Tensor<T, 2> g(t.local().shape(), t.local().device());
    compute::scatter_add_rows(g.device(), dz.data(), ids.data(), ids.numel(), t.local().shape()[1],
                              t.local_offset()[0], g.data(), t.local().shape()[0]);
    table_.accumulate(g);
  }

  Parameter<TableT> table_;
  std::optional<Tensor<int64_t, Rank - 1>> ids_;
  // From backward_input to backward_weight: the ids and the rows' gradient.
  struct Pending {
    Tensor<int64_t, Rank - 1> ids;
    Tensor<T, Rank> dz;
  };
  std::optional<Pending> pending_;
};

}  // namespace dtensor::nn
