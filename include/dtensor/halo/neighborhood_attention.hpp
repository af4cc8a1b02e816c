#pragma once
// NeighborhoodAttention2d<DT>: neighborhood attention (NATTEN's na2d, the local core
// of compute/neighborhood_attention.hpp) on images sharded in space, ShardTensor's
// domain-parallel na2d made exact on any shards.
//
// q, k, v are DTensors [batch, X, Y, heads, head_dim] (heads-last, NATTEN's layout),
// X and Y sharded over any mesh dims, the batch too (data parallel); heads and head
// dim whole. Each rank computes the outputs of its own pixels. Their windows (clamped
// at the image's borders, so shifted inward there) read keys beyond its block: the
// widths of that reach are worked out for every rank's block from the layout (the
// same on every rank, without communication), and k and v get them as ghosts through
// the halo exchange (halo/halo_exchange.hpp, corners included). A block thinner than
// a window is no special case: its ghosts come from ranks two or more blocks away,
// and near a border the inward-shifted windows need more than kernel / 2 on one side
// (ShardTensor takes kernel / 2, and refuses dilation).
//
//   forward    ghosts of k and v (two exchanges), the local core on this rank's queries
//   backward   the core's backward: dq local, dk and dv into padded blocks whose
//              ghosts the reverse exchange adds into their owners (two exchanges)
//
// On device blocks the core runs through the device table (the CUDA kernels of
// kernels/neighborhood_attention.cuh; the host's loops on the tests' emulated device),
// the copies into and out of the padded blocks and the halo on the device too.
//
//   NeighborhoodAttention2d<DT> na({.kernel = {7, 7}, .dilation = {1, 2}});
//   DT o = na.forward(q, k, v);
//   auto [dq, dk, dv] = na.backward(dout);
#include <array>
#include <optional>
#include <string>
#include <tuple>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/neighborhood_attention.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/halo/halo_exchange.hpp"
#include "dtensor/tensor/movement.hpp"

namespace dtensor {

struct NeighborhoodSpec {
  std::array<int64_t, 2> kernel{3, 3}, dilation{1, 1};
  double scale = 0;  // 0: 1 / sqrt(head_dim)
  friend constexpr bool operator==(const NeighborhoodSpec&, const NeighborhoodSpec&) = default;
};

template <class DT>
class NeighborhoodAttention2d {
  static_assert(DT::rank == 5, "dtensor::NeighborhoodAttention2d: tensors are [batch, X, Y, heads, head_dim]");
  static constexpr bool kHeadsWhole = [] {
    for (const auto& p : DT::placement_state)
      if (p.is_shard(3) || p.is_shard(4) || p.is_partial()) return false;
    return true;
  }();
  static_assert(kHeadsWhole, "dtensor::NeighborhoodAttention2d: shard the batch, X or Y (dims 0-2), not the heads or "
                             "the head dim, and no Partial placements (reduce them first)");

 public:
  using T = typename DT::value_type;
  static constexpr int M = DT::mesh_dims;

  explicit NeighborhoodAttention2d(NeighborhoodSpec spec = {}) : spec_(spec) {}

  DT forward(const DT& q, const DT& k, const DT& v) {
    for (const DT* t : {&k, &v})
      DTENSOR_CHECK(t->shape() == q.shape() && t->layout().blocks == q.layout().blocks, InvalidArgument,
                    "NeighborhoodAttention2d: q ", dtensor::to_string(q.shape()), " and k or v ",
                    dtensor::to_string(t->shape()), " differ in shape or blocks; give them the same layout");
    const Device dev = q.local().device();
    for (const DT* t : {&k, &v})
      DTENSOR_CHECK(t->local().device() == dev, InvalidArgument, "NeighborhoodAttention2d: q lives on ",
                    dtensor::to_string(dev), " and k or v on ", dtensor::to_string(t->local().device()),
                    "; give them one device");
    plan(q);
    const Shape<5> ls = q.local().shape();
    dims_.batch = ls[0], dims_.heads = ls[3], dims_.head_dim = ls[4];
    kp_ = padded(k.local());
    vp_ = padded(v.local());
    halo_->forward(kp_->data());
    halo_->forward(vp_->data());
    q_.emplace(q);
    auto o = Tensor<T, 5>::uninitialized(ls, dev);
    if (dev.is_host())
      compute::neighborhood_attention_forward(dims_, q.local().data(), kp_->data(), vp_->data(), o.data());
    else
      dtensor::detail::device_backend(dev).neighborhood_attention_forward(dtype_of<T>(), dims_, q.local().data(),
                                                                          kp_->data(), vp_->data(), o.data());
    return DT(q.mesh(), q.layout(), std::move(o));
  }

  std::tuple<DT, DT, DT> backward(const DT& dout) {
    DTENSOR_CHECK(q_.has_value(), InvalidArgument, "NeighborhoodAttention2d: backward without a forward");
    const DT& q = *q_;
    DTENSOR_CHECK(dout.local().shape() == q.local().shape(), InvalidArgument, "NeighborhoodAttention2d: dout's block ",
                  dtensor::to_string(dout.local().shape()), " is not the output's ",
                  dtensor::to_string(q.local().shape()));
    DTENSOR_CHECK(dout.local().device() == q.local().device(), InvalidArgument,
                  "NeighborhoodAttention2d: dout lives on ", dtensor::to_string(dout.local().device()),
                  " and the forward's q on ", dtensor::to_string(q.local().device()), "; give them one device");
    const Device dev = q.local().device();
    auto dq = Tensor<T, 5>::uninitialized(q.local().shape(), dev);
    if (dev.is_host()) {
      Tensor<T, 5> dkp(halo_->padded_shape(), dev), dvp(halo_->padded_shape(), dev);  // zeroed: the loops add
      compute::neighborhood_attention_backward(dims_, q.local().data(), kp_->data(), vp_->data(), dout.local().data(),
                                               dq.data(), dkp.data(), dvp.data());
      return finish_backward(std::move(dq), std::move(dkp), std::move(dvp));
    }
    // The kernels write the padded blocks whole; stats: each query's log-sum-exp and
    // delta, 2 / head_dim of q's bytes for the call (in a memory plan made for device
    // blocks, nn/image/neighborhood_attention.hpp).
    auto dkp = Tensor<T, 5>::uninitialized(halo_->padded_shape(), dev);
    auto dvp = Tensor<T, 5>::uninitialized(halo_->padded_shape(), dev);
    const Shape<5> ls = q.local().shape();
    auto stats = Tensor<T, 1>::uninitialized(Shape<1>{2 * ls[0] * ls[1] * ls[2] * ls[3]}, dev);
    dtensor::detail::device_backend(dev).neighborhood_attention_backward(
        dtype_of<T>(), dims_, q.local().data(), kp_->data(), vp_->data(), dout.local().data(), stats.data(), dq.data(),
        dkp.data(), dvp.data());
    return finish_backward(std::move(dq), std::move(dkp), std::move(dvp));
  }

  // The ghost widths of the last plan, (lo, hi) per spatial dim.
  std::array<std::array<int64_t, 2>, 2> ghosts() const { return ghosts_; }
  // The cells of this rank's k (and v) block its halo sends, per exchange: what the
  // reverse exchanges receive back into the staging buffer the halo keeps (0 before a plan).
  int64_t elements_sent() const { return halo_ ? halo_->elements_sent() : 0; }

 private:
  // The ghosts' gradients added into their owners; the saved blocks released.
  std::tuple<DT, DT, DT> finish_backward(Tensor<T, 5> dq, Tensor<T, 5> dkp, Tensor<T, 5> dvp) {
    const DT& q = *q_;
    halo_->reverse(dkp.data());
    halo_->reverse(dvp.data());
    DT gq(q.mesh(), q.layout(), std::move(dq)), gk(q.mesh(), q.layout(), interior(dkp)),
        gv(q.mesh(), q.layout(), interior(dvp));
    q_.reset();
    kp_.reset();
    vp_.reset();
    return {std::move(gq), std::move(gk), std::move(gv)};
  }

  // The halo for q's layout: the widest reach of any rank's windows beyond its block.
  void plan(const DT& q) {
    if (halo_ && planned_for_ == q.layout().blocks && planned_shape_ == q.shape() && planned_mesh_ == &q.mesh().comm())
      return;
    const Shape<5> g = q.shape();
    dims_.extent = {g[1], g[2]};
    dims_.kernel = spec_.kernel;
    dims_.dilation = spec_.dilation;
    dims_.scale = spec_.scale;
    HaloSpec<5> hs;
    hs.stencil = Stencil::Box;  // windows reach diagonally: corners too
    const Shape<5> off = q.local_offset(), ls = q.local().shape();
    for (int a = 0; a < 2; ++a) {
      const int d = 1 + a;
      const std::vector<int64_t> blocks = q.layout().blocks[d].empty() ? std::vector<int64_t>{g[d]}
                                                                        : q.layout().blocks[d];
      compute::NeighborhoodDims probe = dims_;
      probe.check("NeighborhoodAttention2d");
      int64_t first = 0, lo = 0, hi = 0;
      for (int64_t len : blocks) {  // every rank's block, so that all agree on the widths
        if (len > 0) {
          probe.q_first[a] = first, probe.q_len[a] = len;
          const auto r = compute::neighborhood_reach(probe, a);
          lo = std::max(lo, first - r[0]);
          hi = std::max(hi, r[1] - (first + len));
        }
        first += len;
      }
      hs.widths.lo[d] = lo, hs.widths.hi[d] = hi;
      ghosts_[a] = {lo, hi};
      dims_.q_first[a] = off[d], dims_.q_len[a] = ls[d];
      dims_.kv_first[a] = off[d] - lo, dims_.kv_len[a] = ls[d] + lo + hi;
    }
    halo_.emplace(q.mesh(), DT::placement_state, q.layout(), hs);
    planned_for_ = q.layout().blocks, planned_shape_ = g, planned_mesh_ = &q.mesh().comm();
  }
  // x's block inside a zeroed padded block, ghosts to be filled.
  Tensor<T, 5> padded(const Tensor<T, 5>& x) const {
    Tensor<T, 5> p(halo_->padded_shape(), x.device());
    movement::copy_region(x.device(), x.data(), block_region(p.shape(), false), p.data(),
                          block_region(p.shape(), true), sizeof(T));
    return p;
  }
  Tensor<T, 5> interior(const Tensor<T, 5>& p) const {
    const Shape<5> ps = p.shape();
    const Shape<5> s{ps[0], ps[1] - ghosts_[0][0] - ghosts_[0][1], ps[2] - ghosts_[1][0] - ghosts_[1][1], ps[3], ps[4]};
    auto x = Tensor<T, 5>::uninitialized(s, p.device());
    movement::copy_region(p.device(), p.data(), block_region(ps, true), x.data(), block_region(ps, false), sizeof(T));
    return x;
  }
  // The block's cells [batch, X, Y x heads x head_dim] inside a padded block of shape ps
  // (in_padded), or as a block of its own: the same extents, so that a device copies
  // one strided block per batch.
  Region block_region(const Shape<5>& ps, bool in_padded) const {
    const int64_t row = ps[3] * ps[4];
    const int64_t nx = ps[1] - ghosts_[0][0] - ghosts_[0][1], ny = ps[2] - ghosts_[1][0] - ghosts_[1][1];
    Region r;
    r.ndim = 3;
    r.extent = {ps[0], nx, ny * row};
    if (in_padded) {
      r.offset = (ghosts_[0][0] * ps[2] + ghosts_[1][0]) * row;
      r.stride = {ps[1] * ps[2] * row, ps[2] * row, 1};
    } else {
      r.stride = {nx * ny * row, ny * row, 1};
    }
    return r;
  }

  NeighborhoodSpec spec_;
  compute::NeighborhoodDims dims_{};
  std::array<std::array<int64_t, 2>, 2> ghosts_{};
  std::optional<HaloExchange<T, 5>> halo_;
  Splits<5> planned_for_{};
  Shape<5> planned_shape_{};
  const Comm* planned_mesh_ = nullptr;
  std::optional<DT> q_;
  std::optional<Tensor<T, 5>> kp_, vp_;
};

}  // namespace dtensor
