#pragma once
// What a halo is: ghost widths on each side of each tensor dim, what lies beyond
// the global boundary, and whether corner ghosts are wanted.
//
//   HaloSpec<2> spec{.widths = HaloWidths<2>::uniform(1), .stencil = Stencil::Star};
//   spec.boundary[0] = Boundary::periodic();
//
// Widths may differ per side (a stride-2 convolution needs more on one side than
// the other). A dim with zero widths has no ghosts; a dim that is not sharded but
// has widths gets its ghosts from the boundary rule alone (or from itself, when
// periodic).
#include <array>
#include <cstdint>
#include <string>

#include "dtensor/core/shape.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

// PETSc's terms: Star fills the ghosts across faces only (a 5- or 7-point stencil
// reads no corner); Box fills edges and corners too (9- and 27-point stencils).
enum class Stencil { Star, Box };

// What a ghost beyond the global boundary holds. Values follow PyTorch's padding
// modes: constant (zero by default: a homogeneous Dirichlet condition), periodic
// (circular) and reflect (mirrored about the edge cell, which is not repeated:
// x[-1] = x[1]).
struct Boundary {
  enum class Kind { Constant, Periodic, Reflect };
  Kind kind = Kind::Constant;
  double value = 0;  // Constant only

  static constexpr Boundary zero() { return {Kind::Constant, 0}; }
  static constexpr Boundary constant(double v) { return {Kind::Constant, v}; }
  static constexpr Boundary periodic() { return {Kind::Periodic, 0}; }
  static constexpr Boundary reflect() { return {Kind::Reflect, 0}; }
  friend constexpr bool operator==(const Boundary&, const Boundary&) = default;
};

inline std::string to_string(const Boundary& b) {
  switch (b.kind) {
    case Boundary::Kind::Periodic: return "periodic";
    case Boundary::Kind::Reflect: return "reflect";
    default: return b.value == 0 ? "zero" : "constant(" + std::to_string(b.value) + ")";
  }
}

template <int Rank>
struct HaloWidths {
  Shape<Rank> lo{};  // ghost cells before the first interior cell, per dim
  Shape<Rank> hi{};  // after the last

  static constexpr HaloWidths uniform(int64_t w) {
    HaloWidths h;
    h.lo.fill(w), h.hi.fill(w);
    return h;
  }
  // Width w on the listed dims only, e.g. on(1, {2, 3}) for the H and W of NCHW.
  static constexpr HaloWidths on(int64_t w, std::initializer_list<int> dims) {
    HaloWidths h;
    for (int d : dims) h.lo[d] = w, h.hi[d] = w;
    return h;
  }
  constexpr bool any(int d) const { return lo[d] > 0 || hi[d] > 0; }
  friend constexpr bool operator==(const HaloWidths&, const HaloWidths&) = default;
};

template <int Rank>
struct HaloSpec {
  HaloWidths<Rank> widths{};
  std::array<Boundary, Rank> boundary{};  // zero by default
  Stencil stencil = Stencil::Star;

  void validate() const {
    for (int d = 0; d < Rank; ++d)
      DTENSOR_CHECK(widths.lo[d] >= 0 && widths.hi[d] >= 0, InvalidArgument, "HaloSpec: dim ", d,
                    " has a negative ghost width (", widths.lo[d], ", ", widths.hi[d], ")");
  }
};

}  // namespace dtensor
