#pragma once
// Fourier transforms of DTensors over 1 or more chosen dims, any placements, any
// extents (uneven and empty blocks), with numpy's and PyTorch's conventions:
//
//   auto X = spectral::rfft<Dims<1, 2>>(u);                        // real -> complex, n/2+1 on dim 2
//   auto u2 = spectral::irfft<Dims<1, 2>>(X, {.n = u.shape()[2]});  // back; odd n needs .n
//   auto Y = spectral::fft<Dims<0>, Out::AsInput>(z, {.norm = Norm::Ortho});
//   auto f2 = spectral::irfft_like<Dims<1, 2>>(X, u);             // placed and laid out as u
//   auto dz = spectral::fft_backward<Dims<0>, Z::placements>(dY, z.layout(), {.norm = Norm::Ortho});
//
// fft (e^{-2 pi i jk/n}) and ifft (e^{+...}) take complex tensors, rfft real ones
// (float, double: cast bfloat16 to float first, as PyTorch's CPU does), irfft complex
// ones whose last transformed dim holds n/2+1 bins (n from IrfftOptions::n, else
// 2(m-1)). `norm` as numpy (spectral/norm.hpp).
//
// The plan (spectral/fft_plan.hpp) is the compiler's: which placements the tensor takes
// before each local transform; the collectives between them are redistribute's, so a
// slab (one sharded dim) costs one all-to-all and pencils (two) two, and explain()
// prints them. The result is placed as the plan leaves it (Out::Transposed, the default:
// FFTW-MPI's transposed-out layout) or as the input was (Out::AsInput). Local
// transforms are FFTW's (compute/fftw.hpp) on host blocks and the device backend's on
// device blocks (cuFFT on a GPU: cuda/fft.hpp), with the redistributions on the device.
//
// Block sizes: every redistribution gets explicit target sizes, so the layout at each
// stage is a function of the input's layout alone: the input's (possibly uneven) blocks
// regrouped as redistribute regroups them (kept where a dim is sharded by the same mesh
// dims, summed or cut where mesh dims left or joined it), the chunk rule where a
// transform changed the dim's extent. Out::AsInput therefore returns the input's own
// layout, irfft_like / irfft_to the real tensor's, and each backward, given the input's
// layout, retraces the forward's layouts and returns a gradient laid out as the input.
// An rvalue spectrum given to irfft or irfft_like is the scratch of FFTW's c2r.
//
// Backward passes (the adjoints, PyTorch's convention for complex gradients: the
// gradient of a real loss L with respect to z = a + ib is dL/da + i dL/db):
//   fft_backward    = ifft with the dual norm (the adjoint of the DFT matrix is its
//                     conjugate transpose)
//   ifft_backward   = fft with the dual norm
//   rfft_backward   = the real part of the zero-padded conjugate transform: a c2r with
//                     the bins that stand for two frequencies (0 < k, 2k != n) halved
//   irfft_backward  = an r2c with those bins doubled (c2r counts them twice)
// each placed as the gradient of its input (placement/gradient.hpp).
#include <array>
#include <complex>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/fft_dims.hpp"
#include "dtensor/compute/fftw.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/placement/gradient.hpp"
#include "dtensor/spectral/fft_plan.hpp"
#include "dtensor/spectral/norm.hpp"

namespace dtensor::spectral {

struct FftOptions {
  Norm norm = Norm::Backward;
};
struct IrfftOptions {
  Norm norm = Norm::Backward;
  int64_t n = -1;  // the real length of the last transformed dim; -1: 2 (m - 1) for m bins
};

enum class Transform { Fft, Ifft, Rfft, Irfft };

namespace detail {

template <class T>
struct real_of {
  using type = T;
};
template <class R>
struct real_of<std::complex<R>> {
  using type = R;
};

template <class D, int Rank>
constexpr bool dims_valid() {
  if (D::count < 1 || D::count > FftPlan<1>::kMaxStages) return false;
  for (int i = 0; i < D::count; ++i) {
    if (D::list[i] < 0 || D::list[i] >= Rank) return false;
    for (int j = 0; j < i; ++j)
      if (D::list[i] == D::list[j]) return false;
  }
  return true;
}

// The order the local transforms run in: the last listed dim first, except irfft's,
// whose complex-to-real step on the last listed dim comes last.
template <class D>
constexpr std::array<int, D::count> execution_order(bool listed_order) {
  std::array<int, D::count> o{};
  for (int i = 0; i < D::count; ++i) o[i] = listed_order ? D::list[i] : D::list[D::count - 1 - i];
  return o;
}

template <Transform Tr, class D, Out O, int Rank, std::size_t M>
constexpr FftPlan<M> plan_of(const PlacementState<M>& in) {
  const bool inverse_real = Tr == Transform::Irfft;
  return plan_fft(in, Rank, execution_order<D>(inverse_real), Tr == Transform::Rfft ? Local::R2C : Local::C2C,
                  inverse_real ? Local::C2R : Local::C2C, O);
}

// The layout the input had, which every stage's block sizes derive from.
template <int Rank, std::size_t M>
struct Origin {
  ShardLayout<Rank> layout;
  PlacementState<M> state;
};

// The block sizes of a tensor of `global` shape placed `state`: the input's blocks
// regrouped as redistribute regroups them (placement/shard_layout.hpp: kept where the
// dim is sharded by the same mesh dims, summed where inner mesh dims left it, cut by the
// chunk rule where inner ones joined), and the chunk rule for a dim whose extent the
// transforms changed. A function of the input's layout and `state` alone, so the
// backward passes meet the forward's layouts whatever path they take.
template <int Rank, std::size_t M, class MeshShape>
Splits<Rank> stage_splits(const Origin<Rank, M>& o, const std::type_identity_t<Shape<Rank>>& global,
                          const std::type_identity_t<PlacementState<M>>& state, const MeshShape& mesh_shape) {
  std::array<int, M> ms{};
  for (std::size_t m = 0; m < M; ++m) ms[m] = static_cast<int>(mesh_shape[m]);
  Splits<Rank> s{};
  for (int d = 0; d < Rank; ++d) {
    const auto g = dtensor::detail::sharding_mesh_dims(state, d);
    if (g.n == 0) continue;
    const bool kept = global[d] == o.layout.global[d];
    const auto from = kept ? dtensor::detail::sharding_mesh_dims(o.state, d) : dtensor::detail::MeshDimList{};
    s[d] = dtensor::detail::regroup(global[d], from, kept ? o.layout.blocks[d] : std::vector<int64_t>{}, g, ms);
  }
  return s;
}

template <auto State, class T, int Rank, class... P, std::size_t M>
decltype(auto) move_to(const DTensor<T, Rank, P...>& x, const Origin<Rank, M>& o) {
  if constexpr (State == DTensor<T, Rank, P...>::placement_state) {
    return (x);
  } else {
    auto target = stage_splits(o, x.shape(), State, x.mesh().shape());
    // A dim this move leaves alone keeps its blocks (a spectrum made elsewhere may have
    // others; irfft_like says so at the end).
    for (int d = 0; d < Rank; ++d)
      if (dtensor::detail::sharding_mesh_dims(State, d) ==
          dtensor::detail::sharding_mesh_dims(DTensor<T, Rank, P...>::placement_state, d))
        target[d] = x.layout().blocks[d];
    return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(x, target); }(placements_t<State>{});
  }
}

// What one call computes at run time: the exponent's sign, the normalization (a
// factor per transformed dim), the real length of a c2r, and the weight of the bins
// that stand for two frequencies (after an r2c, before a c2r; 1: none).
struct Math {
  compute::Sign sign = compute::Sign::Forward;
  double scale = 1.0;  // the product of every transformed dim's factor, applied once (last stage)
  int64_t c2r_length = -1;
  double paired_bin_weight = 1.0;
};

// The product over D's dims of the normalization factors; `shape` in real space.
template <class D, std::size_t Rank>
double total_scale(Norm norm, bool inverse, const std::array<int64_t, Rank>& shape) {
  double s = 1.0;
  for (int d : D::list) s *= inverse ? inverse_scale(norm, shape[d]) : forward_scale(norm, shape[d]);
  return s;
}

// One local transform over `dims` (the halved one last), whole on every rank under
// these placements, as compute::FftDims: FFTW's on a host block (compute/fftw.hpp), the
// device backend's on a device block (cuFFT on a GPU, cuda/fft.hpp). `last` applies
// the call's scale; `owned`: x is a temporary of this call that the transform may
// overwrite (a C2R does).
template <Local K, class T, int Rank, class... P>
auto local_stage(const DTensor<T, Rank, P...>& x, std::span<const int> dims, const Math& m, bool last, bool owned) {
  using R = typename real_of<T>::type;
  using C = std::complex<R>;
  using U = std::conditional_t<K == Local::C2R, R, C>;
  static_assert(Rank <= compute::FftDims::kMaxRank, "dtensor::spectral: tensors of up to 8 dims");
  const int halved = dims.back();
  ShardLayout<Rank> layout = x.layout();
  const int64_t n = K == Local::C2R ? m.c2r_length : x.shape()[halved];  // its real-space length
  const int64_t out_extent = K == Local::R2C ? n / 2 + 1 : n;
  layout.global[halved] = out_extent;
  if (!layout.blocks[halved].empty()) layout.blocks[halved] = {out_extent};  // cut by mesh dims of one rank
  Shape<Rank> out_shape = x.local().shape();
  out_shape[halved] = out_extent;
  const Device device = x.local().device();
  auto y = Tensor<U, Rank>::uninitialized(out_shape, device);
  compute::FftDims f;
  f.kind = K == Local::C2C ? compute::FftKind::C2C : K == Local::R2C ? compute::FftKind::R2C : compute::FftKind::C2R;
  f.sign = m.sign;
  f.rank = Rank;
  for (int d = 0; d < Rank; ++d) f.shape[d] = x.local().shape()[d];
  f.shape[halved] = n;  // the block in real space
  f.ndims = static_cast<int>(dims.size());
  for (int k = 0; k < f.ndims; ++k) f.dims[k] = dims[k];
  f.scale = last ? m.scale : 1.0;
  f.paired_bin_weight = K == Local::C2C ? 1.0 : m.paired_bin_weight;
  f.may_destroy_input = owned;
  if (device.is_host()) compute::fft<R>(f, x.local().data(), y.data());
  else dtensor::detail::device_backend(device).fft(dtype_of<R>(), f, x.local().data(), y.data());
  return DTensor<U, Rank, P...>(x.mesh(), std::move(layout), std::move(y));
}

// Stage S onwards. x is the previous stage's result (a temporary, moved through), or
// the call's input when S = 0 (`owned` says whether the call made it).
template <auto Plan, int S, class X, int Rank, std::size_t M>
auto run_stages(X&& x, const Math& m, const Origin<Rank, M>& o, bool owned) {
  using XT = std::remove_cvref_t<X>;
  if constexpr (S == Plan.stages) {
    if constexpr (Plan.out == XT::placement_state) return XT(std::forward<X>(x));
    else return move_to<Plan.out>(x, o);
  } else {
    constexpr bool moves = !(Plan.before[S] == XT::placement_state);
    const auto& xs = move_to<Plan.before[S]>(x, o);
    const std::span<const int> dims(Plan.dims[S].data(), static_cast<std::size_t>(Plan.ndims[S]));
    return run_stages<Plan, S + 1>(local_stage<Plan.local[S]>(xs, dims, m, S + 1 == Plan.stages, owned || moves), m,
                                   o, true);
  }
}
// The type run_stages returns ends with the result's placements.
// The plan's local transforms, stage by stage, without its redistributions: what runs
// when no transformed dim is cut (mesh dims of one rank: one process, say). The stages
// stay (a slab's 2-D transform, then dim 0 in cache-sized pieces: faster than FFTW's
// one-shot 3-D plan under FFTW_ESTIMATE, bench/bench_fft).
template <auto Plan, int S, class X>
auto run_local_stages(X&& x, const Math& m, bool owned) {
  if constexpr (S == Plan.stages) {
    return std::remove_cvref_t<X>(std::forward<X>(x));
  } else {
    const std::span<const int> dims(Plan.dims[S].data(), static_cast<std::size_t>(Plan.ndims[S]));
    return run_local_stages<Plan, S + 1>(local_stage<Plan.local[S]>(x, dims, m, S + 1 == Plan.stages, owned), m, true);
  }
}

// The plan's stages as one local transform over all their dims (the halved one last):
// what a device block runs when every transformed dim is whole on it, since cuFFT,
// unlike FFTW under FFTW_ESTIMATE, gains nothing from the host's stages and pays a
// launch per piece.
struct WholeTransform {
  Local kind = Local::C2C;
  std::array<int, FftPlan<1>::kMaxStages> dims{};
  int ndims = 0;
};
template <auto Plan>
constexpr WholeTransform whole_transform() {
  WholeTransform w;
  int real_stage = -1;  // the R2C or C2R stage, whose halved dim goes last
  for (int s = 0; s < Plan.stages; ++s)
    if (Plan.local[s] != Local::C2C) w.kind = Plan.local[s], real_stage = s;
  for (int s = 0; s < Plan.stages; ++s)
    if (s != real_stage)
      for (int k = 0; k < Plan.ndims[s]; ++k) w.dims[w.ndims++] = Plan.dims[s][k];
  if (real_stage >= 0)
    for (int k = 0; k < Plan.ndims[real_stage]; ++k) w.dims[w.ndims++] = Plan.dims[real_stage][k];
  return w;
}

template <auto Plan, class T, int Rank, class... P, std::size_t M>
auto run(const DTensor<T, Rank, P...>& x, const Math& m, const Origin<Rank, M>& o, bool owned) {
  const auto& x0 = move_to<Plan.start>(x, o);
  const bool start_owned = owned || !(Plan.start == Plan.in);
  using Result = decltype(run_stages<Plan, 0>(x0, m, o, start_owned));
  if constexpr (Plan.stages > 1) {
    // Where the mesh dims that cut the transformed dims have one rank each (one
    // process, say), every transformed dim is already whole: the local transforms
    // alone, then the placements the plan states.
    // (Decided from the mesh's shape, the same on every rank.)
    bool whole = true;
    for (int s = 0; s < Plan.stages; ++s)
      for (int k = 0; k < Plan.ndims[s]; ++k)
        for (std::size_t md = 0; md < M; ++md)
          whole = whole && (!Plan.start[md].is_shard(Plan.dims[s][k]) || x0.mesh().shape()[md] == 1);
    if (whole) {
      auto y = [&] {
        if (!x0.local().device().is_host()) {
          constexpr WholeTransform w = whole_transform<Plan>();
          return local_stage<w.kind>(x0, std::span<const int>(w.dims.data(), static_cast<std::size_t>(w.ndims)), m,
                                     /*last=*/true, start_owned);
        }
        return run_local_stages<Plan, 0>(x0, m, start_owned);
      }();
      if constexpr (std::is_same_v<decltype(y), Result>) {
        return Result(std::move(y));
      } else {
        // The placements change only on mesh dims of one rank, where a block is the
        // whole dim either way: the same block under the stated placements, no copy.
        const auto mesh = y.mesh();
        auto layout = ShardLayout<Rank>::make(y.shape(), Plan.out, mesh.shape(),
                                              stage_splits(o, y.shape(), Plan.out, mesh.shape()));
        return Result(mesh, std::move(layout), std::move(y).to_local());
      }
    }
  }
  return run_stages<Plan, 0>(x0, m, o, start_owned);
}

template <class D, class T, int Rank>
void check_extents(const char* op, const Shape<Rank>& global) {
  for (int d : D::list)
    DTENSOR_CHECK(global[d] > 0, InvalidArgument, "spectral::", op, ": tensor dim ", d, " has extent 0 in ",
                  dtensor::to_string(global), "; a Fourier transform needs at least one sample");
}

template <class D, int Rank, class T>
constexpr void check_call() {
  static_assert(dims_valid<D, Rank>(),
                "dtensor::spectral: Dims<...> must list 1 to 8 distinct dims of the tensor (each less than its Rank)");
}

// The result c2r gives for m bins: n, or 2(m - 1) by default; m must be n/2 + 1.
inline int64_t c2r_length(const char* op, int64_t bins, int64_t n) {
  DTENSOR_CHECK(n >= -1, InvalidArgument, "spectral::", op, ": a real length of ", n,
                "; give a positive length, or -1 for 2 (m - 1)");
  const int64_t len = n < 0 ? 2 * (bins - 1) : n;
  DTENSOR_CHECK(len > 0, InvalidArgument, "spectral::", op, ": the last transformed dim holds ", bins,
                " bins, which make no real signal; pass IrfftOptions::n");
  DTENSOR_CHECK(len / 2 + 1 == bins, InvalidArgument, "spectral::", op, ": a real length of ", len, " needs ",
                len / 2 + 1, " bins on the last transformed dim, which holds ", bins,
                " (trim or pad the spectrum first)");
  return len;
}

// `owned`: x is a temporary the caller gave up (an rvalue), which FFTW's c2r may overwrite.
template <Transform Tr, class D, Out O, class T, int Rank, class... P>
auto transform(const DTensor<T, Rank, P...>& x, const Math& m, const Origin<Rank, sizeof...(P)>& o,
               bool owned = false) {
  constexpr auto plan = plan_of<Tr, D, O, Rank>(DTensor<T, Rank, P...>::placement_state);
  return run<plan>(x, m, o, owned);
}

template <class T, int Rank, class... P>
Origin<Rank, sizeof...(P)> origin_of(const DTensor<T, Rank, P...>& x) {
  return {x.layout(), DTensor<T, Rank, P...>::placement_state};
}

// The gradient, computed placed `G`, moved to a gradient placement of an input
// placed `In` (whose layout the origin holds), through the reduction the forward ran
// first (Partial<Avg|Max|Min> -> Replicate) when it ran one.
template <class InPlacements, class T, int Rank, class... G, std::size_t M>
auto finish_gradient(DTensor<T, Rank, G...> g, const Origin<Rank, M>& o) {
  constexpr auto in = []<class... P>(Placements<P...>) { return describe_all<P...>(); }(InPlacements{});
  constexpr auto start = plan_fft(in, Rank, std::array<int, 0>{}, Local::C2C, Local::C2C, Out::AsInput).start;
  constexpr auto target = grad_targets(start, DTensor<T, Rank, G...>::placement_state);
  if constexpr (start == in && DTensor<T, Rank, G...>::placement_state == target) {
    return g;
  } else if constexpr (start == in) {
    return move_to<target>(g, o);
  } else {
    const auto& gs = move_to<target>(g, o);
    return redistribute_backward_from<InPlacements, placements_t<start>>(gs, o.layout.blocks);
  }
}

}  // namespace detail

// The plan a transform of a tensor of type X runs, as a constant (static_assert on
// it), and as text for a tensor x.
//   static_assert(spectral::plan<Transform::Rfft, Dims<0, 1, 2>, X>().redistributions() == 2);
template <Transform Tr, class D, class X, Out O = Out::Transposed>
constexpr auto plan() {
  detail::check_call<D, X::rank, typename X::value_type>();
  return detail::plan_of<Tr, D, O, X::rank>(X::placement_state);
}
template <Transform Tr, class D, Out O = Out::Transposed, class T, int Rank, class... P>
std::string explain(const DTensor<T, Rank, P...>& x) {
  constexpr auto p = plan<Tr, D, DTensor<T, Rank, P...>, O>();
  return std::string(Tr == Transform::Fft ? "fft" : Tr == Transform::Ifft ? "ifft" : Tr == Transform::Rfft ? "rfft" : "irfft") +
         " over dims" + [] { std::string s; for (int d : D::list) s += " " + std::to_string(d); return s; }() + " of " +
         dtensor::to_string(x.shape()) + " on " + x.mesh().to_string() + ", " + std::to_string(p.redistributions()) +
         " redistribution(s):\n" + to_string(p);
}

template <class D, Out O = Out::Transposed, class R, int Rank, class... P>
auto fft(const DTensor<std::complex<R>, Rank, P...>& x, const FftOptions& opt = {}) {
  detail::check_call<D, Rank, R>();
  detail::check_extents<D, R, Rank>("fft", x.shape());
  return detail::transform<Transform::Fft, D, O>(x, {.sign = compute::Sign::Forward, .scale = detail::total_scale<D>(opt.norm, false, x.shape())},
      detail::origin_of(x));
}

template <class D, Out O = Out::Transposed, class R, int Rank, class... P>
auto ifft(const DTensor<std::complex<R>, Rank, P...>& x, const FftOptions& opt = {}) {
  detail::check_call<D, Rank, R>();
  detail::check_extents<D, R, Rank>("ifft", x.shape());
  return detail::transform<Transform::Ifft, D, O>(
      x, {.sign = compute::Sign::Backward, .scale = detail::total_scale<D>(opt.norm, true, x.shape())},
      detail::origin_of(x));
}

template <class D, Out O = Out::Transposed, class T, int Rank, class... P>
auto rfft(const DTensor<T, Rank, P...>& x, const FftOptions& opt = {}) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "dtensor::spectral::rfft: the input must be real float or double (cast<float> a 16-bit tensor; "
                "fft takes complex ones)");
  detail::check_call<D, Rank, T>();
  detail::check_extents<D, T, Rank>("rfft", x.shape());
  return detail::transform<Transform::Rfft, D, O>(x, {.sign = compute::Sign::Forward, .scale = detail::total_scale<D>(opt.norm, false, x.shape())},
      detail::origin_of(x));
}

namespace detail {
template <class D, Out O, class R, int Rank, class... P>
auto irfft(const DTensor<std::complex<R>, Rank, P...>& x, const IrfftOptions& opt, bool owned) {
  check_call<D, Rank, R>();
  check_extents<D, R, Rank>("irfft", x.shape());
  constexpr int last = D::list[D::count - 1];
  const int64_t n = c2r_length("irfft", x.shape()[last], opt.n);
  Shape<Rank> real = x.shape();
  real[last] = n;
  return transform<Transform::Irfft, D, O>(
      x, {.sign = compute::Sign::Backward, .scale = total_scale<D>(opt.norm, true, real), .c2r_length = n},
      origin_of(x), owned);
}
}  // namespace detail

// (An rvalue spectrum is used as scratch: its last transform overwrites it.)
template <class D, Out O = Out::Transposed, class R, int Rank, class... P>
auto irfft(const DTensor<std::complex<R>, Rank, P...>& x, const IrfftOptions& opt = {}) {
  return detail::irfft<D, O>(x, opt, false);
}
template <class D, Out O = Out::Transposed, class R, int Rank, class... P>
auto irfft(DTensor<std::complex<R>, Rank, P...>&& x, const IrfftOptions& opt = {}) {
  return detail::irfft<D, O>(x, opt, true);
}

// irfft of a spectrum made by rfft<D>(like) (and changed elementwise: a filter, a
// spectral solve), returned placed and laid out as `like` (its blocks too: the stages
// derive their layouts from like's, as rfft's did).
//   auto X = spectral::rfft<Dims<0, 1>>(f);  ... scale X ...;  auto u = spectral::irfft_like<Dims<0, 1>>(X, f);
namespace detail {
// Result: the result's type, DTensor<R, Rank, P...>.
template <class D, class Result, class R, int Rank, class... Q>
Result irfft_to(const DTensor<std::complex<R>, Rank, Q...>& x, const ShardLayout<Rank>& layout, const FftOptions& opt,
             bool owned) {
  static_assert(std::is_same_v<typename Result::value_type, R> && Result::rank == Rank);
  check_call<D, Rank, R>();
  check_extents<D, R, Rank>("irfft_like", x.shape());
  constexpr int last = D::list[D::count - 1];
  const int64_t n = c2r_length("irfft_like", x.shape()[last], layout.global[last]);
  for (int d = 0; d < Rank; ++d)
    DTENSOR_CHECK(d == last || x.shape()[d] == layout.global[d], InvalidArgument, "spectral::irfft_like: the spectrum ",
                  dtensor::to_string(x.shape()), " is not the rfft of a tensor shaped ",
                  dtensor::to_string(layout.global));
  const Origin<Rank, Result::mesh_dims> o{layout, Result::placement_state};
  auto y = transform<Transform::Irfft, D, Out::Transposed>(
      x, {.sign = compute::Sign::Backward, .scale = total_scale<D>(opt.norm, true, layout.global), .c2r_length = n}, o,
      owned);
  using Y = decltype(y);
  Result out = [&]() -> Result {
    if constexpr (Y::placement_state == Result::placement_state) return std::move(y);
    else return move_to<Result::placement_state>(y, o);
  }();
  DTENSOR_CHECK(out.layout().blocks == layout.blocks, InvalidArgument,
                "spectral::irfft_like: the spectrum's blocks do not derive from the layout asked for (was it made by "
                "rfft of a tensor laid out so?); use irfft and redistribute");
  return out;
}
}  // namespace detail

template <class D, class R, int Rank, class... Q, class... P>
DTensor<R, Rank, P...> irfft_like(const DTensor<std::complex<R>, Rank, Q...>& x, const DTensor<R, Rank, P...>& like,
                                  const FftOptions& opt = {}) {
  return detail::irfft_to<D, DTensor<R, Rank, P...>>(x, like.layout(), opt, false);
}
template <class D, class R, int Rank, class... Q, class... P>
DTensor<R, Rank, P...> irfft_like(DTensor<std::complex<R>, Rank, Q...>&& x, const DTensor<R, Rank, P...>& like,
                                  const FftOptions& opt = {}) {
  return detail::irfft_to<D, DTensor<R, Rank, P...>>(x, like.layout(), opt, true);
}
// The same for a real tensor placed PList and laid out as `layout` (one not made yet:
// a layer's output with other channels than its input).
template <class D, class PList, class R, int Rank, class... Q>
auto irfft_to(DTensor<std::complex<R>, Rank, Q...>&& x, const ShardLayout<Rank>& layout, const FftOptions& opt = {}) {
  return [&]<class... P>(Placements<P...>) {
    return detail::irfft_to<D, DTensor<R, Rank, P...>>(x, layout, opt, true);
  }(PList{});
}

namespace detail {
// A backward's dy against the input's layout: the same extents but along `halved`,
// where the spectrum holds n/2 + 1 bins of the real length n (-1: no such dim).
template <std::size_t Rank>
void check_gradient_shape(const char* op, const std::array<int64_t, Rank>& dy, const std::array<int64_t, Rank>& x,
                          int halved, bool x_is_real) {
  for (int d = 0; d < static_cast<int>(Rank); ++d) {
    const bool ok = d != halved ? dy[d] == x[d] : x_is_real ? dy[d] == x[d] / 2 + 1 : x[d] == dy[d] / 2 + 1;
    DTENSOR_CHECK(ok, InvalidArgument, "spectral::", op, ": dy ", dtensor::to_string(dy),
                  " is not shaped as the gradient of the transform of an input ", dtensor::to_string(x));
  }
}
}  // namespace detail

// Backward passes. `dy` is the gradient of the transform's result (laid out as the
// result was); `x_layout` the input's layout; the gradient comes back laid out as the
// input, placed as its gradient. InPlacements are the input's placements
// (`decltype(x)::placements`).
template <class D, class InPlacements, class R, int Rank, class... G>
auto fft_backward(const DTensor<std::complex<R>, Rank, G...>& dy, const ShardLayout<Rank>& x_layout,
                  const FftOptions& opt = {}) {
  detail::check_call<D, Rank, R>();
  constexpr auto in = []<class... P>(Placements<P...>) { return describe_all<P...>(); }(InPlacements{});
  const detail::Origin<Rank, sizeof...(G)> o{x_layout, in};
  detail::check_gradient_shape("fft_backward", dy.shape(), x_layout.global, -1, false);
  auto g = detail::transform<Transform::Ifft, D, Out::Transposed>(
      dy, {.sign = compute::Sign::Backward, .scale = detail::total_scale<D>(opt.norm, false, dy.shape())}, o);
  return detail::finish_gradient<InPlacements>(g, o);
}
template <class D, class InPlacements, class R, int Rank, class... G>
auto ifft_backward(const DTensor<std::complex<R>, Rank, G...>& dy, const ShardLayout<Rank>& x_layout,
                   const FftOptions& opt = {}) {
  detail::check_call<D, Rank, R>();
  constexpr auto in = []<class... P>(Placements<P...>) { return describe_all<P...>(); }(InPlacements{});
  const detail::Origin<Rank, sizeof...(G)> o{x_layout, in};
  detail::check_gradient_shape("ifft_backward", dy.shape(), x_layout.global, -1, false);
  auto g = detail::transform<Transform::Fft, D, Out::Transposed>(
      dy, {.sign = compute::Sign::Forward, .scale = detail::total_scale<D>(opt.norm, true, dy.shape())}, o);
  return detail::finish_gradient<InPlacements>(g, o);
}
template <class D, class InPlacements, class R, int Rank, class... G>
auto rfft_backward(const DTensor<std::complex<R>, Rank, G...>& dy, const ShardLayout<Rank>& x_layout,
                   const FftOptions& opt = {}) {
  detail::check_call<D, Rank, R>();
  constexpr auto in = []<class... P>(Placements<P...>) { return describe_all<P...>(); }(InPlacements{});
  const detail::Origin<Rank, sizeof...(G)> o{x_layout, in};
  constexpr int last = D::list[D::count - 1];
  detail::check_gradient_shape("rfft_backward", dy.shape(), x_layout.global, last, true);
  const int64_t n = detail::c2r_length("rfft_backward", dy.shape()[last], x_layout.global[last]);
  auto g = detail::transform<Transform::Irfft, D, Out::Transposed>(
      dy,
      {.sign = compute::Sign::Backward, .scale = detail::total_scale<D>(opt.norm, false, x_layout.global),
       .c2r_length = n, .paired_bin_weight = 0.5},
      o);
  return detail::finish_gradient<InPlacements>(g, o);
}
template <class D, class InPlacements, class R, int Rank, class... G>
auto irfft_backward(const DTensor<R, Rank, G...>& dy, const ShardLayout<Rank>& x_layout,
                    const IrfftOptions& opt = {}) {
  detail::check_call<D, Rank, R>();
  constexpr auto in = []<class... P>(Placements<P...>) { return describe_all<P...>(); }(InPlacements{});
  const detail::Origin<Rank, sizeof...(G)> o{x_layout, in};
  detail::check_gradient_shape("irfft_backward", dy.shape(), x_layout.global, D::list[D::count - 1], false);
  auto g = detail::transform<Transform::Rfft, D, Out::Transposed>(
      dy,
      {.sign = compute::Sign::Forward, .scale = detail::total_scale<D>(opt.norm, true, dy.shape()),
       .paired_bin_weight = 2.0},
      o);
  return detail::finish_gradient<InPlacements>(g, o);
}

}  // namespace dtensor::spectral
