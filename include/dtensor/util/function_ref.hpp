#pragma once
// FunctionRef<R(A...)>: a reference to a callable, which it does not own or copy, as
// the parameter of a function that calls it before returning. The launchers take
// their SPMD program as one (run_threads, run_mpi): they are then plain functions,
// compiled once by the compiled runtime instead of once per lambda of a program
// (util/compiled_runtime.hpp), for one indirect call per rank.
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace dtensor {

template <class Signature>
class FunctionRef;

template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  // From a function, or from any object callable as f(A...): the object must outlive
  // every call through this reference.
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, A...>)
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): a parameter type, as std::function
      : call_(&call<std::remove_reference_t<F>>) {
    if constexpr (std::is_function_v<std::remove_reference_t<F>>)
      target_.function = reinterpret_cast<void (*)()>(&f);
    else
      target_.object = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
  }

  R operator()(A... a) const { return call_(target_, std::forward<A>(a)...); }

 private:
  // A function pointer may not be stored in a void* portably: the union holds either.
  union Target {
    void* object;
    void (*function)();
  };

  template <class F>
  static F& target(Target t) {
    if constexpr (std::is_function_v<F>)
      return *reinterpret_cast<F*>(t.function);
    else
      return *static_cast<F*>(t.object);
  }
  template <class F>
  static R call(Target t, A... a) {
    if constexpr (std::is_void_v<R>)
      std::invoke(target<F>(t), std::forward<A>(a)...);  // a result, if any, dropped
    else
      return std::invoke(target<F>(t), std::forward<A>(a)...);
  }

  Target target_;
  R (*call_)(Target, A...);
};

}  // namespace dtensor
