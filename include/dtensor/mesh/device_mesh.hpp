#pragma once
// DeviceMesh<NDim>: the ranks of a communicator arranged as a row-major NDim grid.
// Each mesh dimension gets its own communicator (the ranks that differ only in
// that coordinate), made once at construction. Copies share one state, so a mesh
// is cheap to pass around; it must not outlive the communicator it was built on.
#include <array>
#include <climits>
#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "dtensor/comm/comm.hpp"
#include "dtensor/mesh/link_cost.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

template <int NDim>
class DeviceMesh {
  static_assert(NDim >= 1, "dtensor::DeviceMesh: a mesh needs at least one dimension");

 public:
  using Coords = std::array<int, NDim>;
  static constexpr int ndim = NDim;

  // Collective over `comm`: every rank must construct the mesh with the same shape.
  DeviceMesh(Comm& comm, const Coords& shape, const std::array<LinkCost, NDim>& links = {})
      : DeviceMesh(std::shared_ptr<Comm>(std::shared_ptr<Comm>{}, &comm), shape, links) {}

  // The same from extents of another integer type (a std::array<int64_t, N>, say).
  template <std::integral I>
    requires(!std::is_same_v<I, int>)
  DeviceMesh(Comm& comm, const std::array<I, NDim>& shape, const std::array<LinkCost, NDim>& links = {})
      : DeviceMesh(comm, narrow(shape), links) {}

  // 1-D mesh over the whole communicator.
  explicit DeviceMesh(Comm& comm)
    requires(NDim == 1)
      : DeviceMesh(comm, Coords{comm.size()}) {}

  const Coords& shape() const { return s_->shape; }
  int size() const { return s_->world->size(); }
  int size(int dim) const { return s_->shape[dim]; }
  int rank() const { return s_->world->rank(); }
  const Coords& coords() const { return s_->coords; }
  int coord(int dim) const { return s_->coords[dim]; }
  Comm& comm() const { return *s_->world; }
  // Where the local blocks of DTensors on this mesh live (the communicator's device).
  Device device() const { return s_->device; }
  Comm& comm(int dim) const { return *s_->dim_comms[dim]; }
  const std::array<LinkCost, NDim>& links() const { return s_->links; }

  // Rank in comm() of the given coordinates (row-major).
  int rank_of(const Coords& c) const {
    int r = 0;
    for (int d = 0; d < NDim; ++d) r = r * s_->shape[d] + c[d];
    return r;
  }
  Coords coords_of(int rank) const {
    Coords c{};
    for (int d = NDim; d-- > 0;) c[d] = rank % s_->shape[d], rank /= s_->shape[d];
    return c;
  }

  // The sub-mesh over the mesh dims `dims` (in that order) that contains this rank:
  // e.g. on a 2x3 mesh, submesh<1>({1}) is this rank's row. Collective.
  template <int K>
  DeviceMesh<K> submesh(const std::array<int, K>& dims) const {
    std::array<bool, NDim> kept{};
    typename DeviceMesh<K>::Coords shape{};
    for (int i = 0; i < K; ++i) {
      DTENSOR_CHECK(dims[i] >= 0 && dims[i] < NDim && !kept[dims[i]], InvalidArgument, "DeviceMesh::submesh: dim ",
                    dims[i], " is not a distinct dimension of a ", NDim, "-D mesh");
      kept[dims[i]] = true;
      shape[i] = s_->shape[dims[i]];
    }
    int color = 0, key = 0;
    for (int d = 0; d < NDim; ++d)
      if (!kept[d]) color = color * s_->shape[d] + s_->coords[d];
    for (int i = 0; i < K; ++i) key = key * shape[i] + s_->coords[dims[i]];
    std::array<LinkCost, K> links{};
    for (int i = 0; i < K; ++i) links[i] = s_->links[dims[i]];
    std::shared_ptr<Comm> sub = comm().split(color, key);
    return DeviceMesh<K>(std::move(sub), shape, links);
  }

  std::string to_string() const {
    std::string s = "DeviceMesh(";
    for (int d = 0; d < NDim; ++d) s += (d ? "x" : "") + std::to_string(s_->shape[d]);
    return s + ", " + s_->world->backend() + ")";
  }

 private:
  template <int>
  friend class DeviceMesh;

  struct State {
    std::shared_ptr<Comm> world;
    Device device;  // world->device(), read once: every DTensor checks its block against it
    Coords shape{};
    Coords coords{};
    std::array<std::unique_ptr<Comm>, NDim> dim_comms;
    std::array<LinkCost, NDim> links{};
  };

  template <class I>
  static Coords narrow(const std::array<I, NDim>& shape) {
    Coords c{};
    for (int d = 0; d < NDim; ++d) {
      DTENSOR_CHECK(shape[d] >= 0 && static_cast<int64_t>(shape[d]) <= INT_MAX, InvalidArgument,
                    "DeviceMesh: mesh dim ", d, " has extent ", static_cast<int64_t>(shape[d]),
                    ", outside [0, INT_MAX]");
      c[d] = static_cast<int>(shape[d]);
    }
    return c;
  }
  DeviceMesh(std::shared_ptr<Comm> comm, const Coords& shape, const std::array<LinkCost, NDim>& links)
      : s_(std::make_shared<State>()) {
    long long total = 1;
    std::string dims;
    for (int d = 0; d < NDim; ++d) {
      DTENSOR_CHECK(shape[d] >= 1, InvalidArgument, "DeviceMesh: mesh dim ", d, " has size ", shape[d],
                    "; every mesh dimension needs at least one rank");
      total *= shape[d];
      dims += (d ? "x" : "") + std::to_string(shape[d]);
    }
    DTENSOR_CHECK(total == comm->size(), InvalidArgument, "DeviceMesh: a ", dims, " mesh has ", total,
                  " ranks but the communicator has ", comm->size());
    s_->world = std::move(comm);
    s_->device = s_->world->device();
    s_->shape = shape;
    s_->links = links;
    s_->coords = coords_of(s_->world->rank());
    for (int m = 0; m < NDim; ++m) {
      int color = 0;
      for (int d = 0; d < NDim; ++d)
        if (d != m) color = color * shape[d] + s_->coords[d];
      s_->dim_comms[m] = s_->world->split(color, s_->coords[m]);
    }
  }

  std::shared_ptr<State> s_;
};

}  // namespace dtensor
