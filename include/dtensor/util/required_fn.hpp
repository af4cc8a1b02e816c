#pragma once
// RequiredFn<R (*)(A...)>: an entry of a table of functions (the device tables) that
// must be set. It has no default constructor, so a designated initializer that leaves
// the entry out does not compile, where a plain function pointer would be left null;
// calling it calls the function.
#include <type_traits>
#include <utility>

namespace dtensor::detail {

template <class F>
class RequiredFn;

template <class R, class... A>
class RequiredFn<R (*)(A...)> {
 public:
  RequiredFn() = delete;  // a table that leaves this entry out: give the entry its function
  // From a function or a captureless lambda.
  template <class L>
    requires std::is_convertible_v<L, R (*)(A...)>
  constexpr RequiredFn(L f) : f_(f) {}  // NOLINT(google-explicit-constructor): tables are written with lambdas
  R operator()(A... a) const { return f_(std::forward<A>(a)...); }

 private:
  R (*f_)(A...);
};

}  // namespace dtensor::detail
