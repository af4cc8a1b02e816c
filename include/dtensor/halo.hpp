#pragma once
// Ghost cells: sharded tensors with ghost layers, the halo exchange object
// (forward fill and reverse accumulate, each in begin/end halves), and the regions
// a stencil may update while the exchange is in flight.
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/halo/halo_exchange.hpp"
#include "dtensor/halo/halo_spec.hpp"
#include "dtensor/halo/stencil_regions.hpp"
