#pragma once
// StateDict: the named things a checkpoint saves and loads in place: DTensors (any
// placements, any mesh), plain tensors, scalars (integers, floating point, strings),
// and blocks of state that live beside a DTensor (an optimizer's moments).
//
//   io::StateDict sd;
//   sd.add("w", w);                 // DTensor<float, 2, Shard<0>, Replicate>
//   sd.add("step", step);           // int64_t (any integer or floating type, or std::string)
//   io::save(sd, "ckpt", comm);     // collective
//   ...
//   io::load(sd, "ckpt", comm);     // collective: fills w in its own placements and mesh
//
// A StateDict holds references: what it names must outlive it and must not move.
// Loading writes into the registered objects in place; a DTensor keeps its mesh and
// placements, and the checkpoint may have been saved from any other. Ranks may
// register different names (each its own pipeline stage), but the ranks of one mesh
// register its tensors that hold Partial placements in the same order: saving
// reduces them (a collective over their mesh).
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/io/blocks.hpp"
#include "dtensor/io/checkpoint_format.hpp"

namespace dtensor::io {

namespace detail {

struct Entry {
  std::string name;
  bool is_scalar = false;
  // Tensors.
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  std::string placements;
  std::vector<int> mesh;
  bool optional = false;                       // loading skips it where the checkpoint lacks it (calling `missing`)
  std::function<SaveBlock(Comm& world)> save;  // may run collectives over the tensor's mesh (Partial)
  std::function<LoadBlock(Comm& world)> load;
  std::function<void()> missing;
  // Scalars.
  std::function<Scalar()> get;
  std::function<void(const Scalar&)> set;
};

template <class T>
void assign_scalar(const std::string& name, const Scalar& s, T& v) {
  auto wrong = [&](const char* have) {
    return CheckpointError(dtensor::detail::cat("dtensor: checkpoint: scalar \"", name, "\" is ", have,
                                                " in the checkpoint but the program loads it into a ",
                                                std::is_same_v<T, std::string> ? "string"
                                                : std::is_floating_point_v<T>  ? "floating-point value"
                                                                               : "integer"));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (const auto* p = std::get_if<std::string>(&s)) v = *p;
    else throw wrong(std::holds_alternative<double>(s) ? "a float" : "an integer");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (const auto* p = std::get_if<double>(&s)) v = static_cast<T>(*p);
    else throw wrong(std::holds_alternative<int64_t>(s) ? "an integer" : "a string");
  } else {
    const auto* p = std::get_if<int64_t>(&s);
    if (!p) throw wrong(std::holds_alternative<double>(s) ? "a float" : "a string");
    const bool fits = std::is_same_v<T, bool> ? (*p == 0 || *p == 1)
                      : std::is_signed_v<T>   ? *p >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                                  *p <= static_cast<int64_t>(std::numeric_limits<T>::max())
                                            : *p >= 0 && static_cast<uint64_t>(*p) <=
                                                             static_cast<uint64_t>(std::numeric_limits<T>::max());
    if (!fits)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: scalar \"", name, "\" = ", *p,
                                                 " does not fit the program's integer type"));
    v = static_cast<T>(*p);
  }
}

}  // namespace detail

class StateDict {
 public:
  // A DTensor, saved as its global value (Partial placements reduced) and loaded
  // into its own placements and mesh.
  template <class T, int R, class... P>
  void add(std::string name, DTensor<T, R, P...>& x) {
    using DT = DTensor<T, R, P...>;
    detail::Entry e = tensor_entry(std::move(name), dtype_of<T>(), detail::to_vector(x.shape()));
    e.placements = DT::placements_string();
    e.mesh.assign(x.mesh().shape().begin(), x.mesh().shape().end());
    e.save = [&x](Comm&) { return detail::save_dtensor(x); };
    e.load = [&x](Comm&) { return detail::load_dtensor(x); };
    push(std::move(e));
  }

  // A plain tensor that every rank holds alike (the world's rank 0 writes it; every
  // rank loads all of it). Its shape must match the checkpoint's.
  template <class T, int R>
  void add(std::string name, Tensor<T, R>& t) {
    detail::Entry e = tensor_entry(std::move(name), dtype_of<T>(), detail::to_vector(t.shape()));
    e.placements = "plain";
    e.save = [&t](Comm& world) {
      return detail::save_block(world.rank() == 0, Shape<R>{}, t.shape(), t.data(), t.device(), nullptr);
    };
    e.load = [&t](Comm&) {
      detail::LoadBlock b;
      b.offset.assign(R, 0);
      b.sizes = detail::to_vector(t.shape());
      b.read = t.numel() > 0;
      if (t.device().is_host()) {
        b.data = reinterpret_cast<unsigned char*>(t.data());
      } else {
        auto host = std::make_shared<Tensor<T, R>>(Tensor<T, R>::uninitialized(t.shape()));
        b.data = reinterpret_cast<unsigned char*>(host->data());
        b.finish = [&t, host] {
          if (host->numel() > 0)
            dtensor::detail::copy_bytes(t.data(), t.device(), host->data(), Device::host(), host->bytes());
        };
        b.keep = host;
      }
      return b;
    };
    push(std::move(e));
  }

  // A scalar: any integer (saved as a 64-bit integer) or floating type (saved bit
  // for bit as a double), or a string. Saved from the world's rank 0; every rank
  // loads it.
  template <class T>
  requires(std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) void add(std::string name, T& v) {
    const std::string n = name;
    add_scalar(
        std::move(name),
        [&v]() -> Scalar {
          if constexpr (std::is_same_v<T, std::string>) return v;
          else if constexpr (std::is_floating_point_v<T>) return static_cast<double>(v);
          else return static_cast<int64_t>(v);
        },
        [&v, n](const Scalar& s) { detail::assign_scalar(n, s, v); });
  }

  // A scalar behind accessors (an optimizer's step count). optional: a load from a
  // checkpoint without it calls missing() instead of failing (a scalar a later version
  // added). Entries load in the order they were added.
  void add_scalar(std::string name, std::function<Scalar()> get, std::function<void(const Scalar&)> set,
                  bool optional = false, std::function<void()> missing = {}) {
    detail::Entry e;
    e.name = std::move(name);
    e.is_scalar = true;
    e.get = std::move(get);
    e.set = std::move(set);
    e.optional = optional;
    e.missing = std::move(missing);
    push(std::move(e));
  }

  // A block of state laid out like a DTensor of type DT with `layout` on `mesh` (not
  // Partial), in memory the caller manages on `device`: data() gives this rank's
  // block (the local shape's elements) when saving; when loading, data() may first
  // allocate it. optional: a load from a checkpoint without it calls missing()
  // instead of failing. present(): whether there is anything to save (an optimizer
  // before its first step has no moments).
  template <class DT>
  void add_block(std::string name, const typename DT::Mesh& mesh, const ShardLayout<DT::rank>& layout,
                 std::function<typename DT::value_type*()> data, Device device = Device::host(),
                 bool optional = false, std::function<bool()> present = {}, std::function<void()> missing = {}) {
    using T = typename DT::value_type;
    static_assert(!detail::has_partial(DT::placement_state),
                  "dtensor::io::StateDict::add_block: a block of state is saved as it is held, so its placements "
                  "cannot be Partial; reduce it first, or register the DTensor with add()");
    detail::Entry e = tensor_entry(std::move(name), dtype_of<T>(), detail::to_vector(layout.global));
    e.placements = DT::placements_string();
    e.mesh.assign(mesh.shape().begin(), mesh.shape().end());
    e.optional = optional;
    e.missing = std::move(missing);
    e.save = [mesh, layout, data, device, present](Comm&) {
      if (present && !present()) {
        detail::SaveBlock absent;
        absent.present = false;
        return absent;
      }
      const auto ps = DT::placement_state;
      return detail::save_block(detail::writes_block(ps, mesh.coords()),
                                layout.local_offset(ps, mesh.shape(), mesh.coords()),
                                layout.local_shape(ps, mesh.shape(), mesh.coords()), data(), device, nullptr);
    };
    e.load = [mesh, layout, data, device](Comm&) {
      const auto ps = DT::placement_state;
      const auto shape = layout.local_shape(ps, mesh.shape(), mesh.coords());
      detail::LoadBlock b;
      b.offset = detail::to_vector(layout.local_offset(ps, mesh.shape(), mesh.coords()));
      b.sizes = detail::to_vector(shape);
      b.read = numel(shape) > 0;
      T* dst = data();
      if (device.is_host()) {
        b.data = reinterpret_cast<unsigned char*>(dst);
      } else {  // read into host staging, then one copy to the device
        auto host = std::make_shared<std::vector<unsigned char>>(static_cast<std::size_t>(numel(shape)) * sizeof(T));
        b.data = host->data();
        b.finish = [dst, device, host] {
          if (!host->empty()) dtensor::detail::copy_bytes(dst, device, host->data(), Device::host(), host->size());
        };
        b.keep = host;
      }
      return b;
    };
    push(std::move(e));
  }

  const std::vector<detail::Entry>& entries() const { return entries_; }
  std::vector<detail::Entry>& entries() { return entries_; }
  bool contains(const std::string& name) const { return names_.count(name) > 0; }
  std::size_t size() const { return entries_.size(); }

 private:
  static detail::Entry tensor_entry(std::string name, DType t, std::vector<int64_t> shape) {
    detail::Entry e;
    e.name = std::move(name);
    e.dtype = t;
    e.shape = std::move(shape);
    return e;
  }

  void push(detail::Entry e) {
    DTENSOR_CHECK(!e.name.empty() && e.name != "__metadata__", InvalidArgument, "io::StateDict: \"", e.name,
                  "\" cannot name a tensor (empty, or safetensors' reserved \"__metadata__\"); choose another name");
    DTENSOR_CHECK(names_.insert(e.name).second, InvalidArgument, "io::StateDict: \"", e.name,
                  "\" is registered twice; every entry needs a name of its own");
    entries_.push_back(std::move(e));
  }

  std::vector<detail::Entry> entries_;
  std::set<std::string> names_;
};

}  // namespace dtensor::io
