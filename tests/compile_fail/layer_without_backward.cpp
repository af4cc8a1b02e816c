// A user's layer (a scaling by 2) that has a forward but no backward, in a model:
// the model's protocol check names the missing piece in one error, before anything
// calls it. With the backward written, it compiles and trains.
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<1, 0, nn::kNone>>;

struct Double {
  using config = Cfg;
  using State = Cfg::State;
  using X = dtensor_t<float, 2, placements_t<Cfg::activation()>>;
  static constexpr const char* name = "double";
  static constexpr State input(const State&) { return Cfg::activation(); }
  static constexpr State output(const State& in) { return in; }
  static constexpr State grad_input(const State&, const State& g) { return g; }
  static constexpr int64_t out_features(int64_t f) { return f; }
  template <int C>
  static constexpr void plan(nn::ModelPlan<Cfg::M, C>&, int, const State&, const State&, int64_t, bool) {}
  X forward(const X& x) {
    X y = x;
    compute::binary_scalar(BinaryOp::Mul, y.local(), 2.0f, y.local());
    return y;
  }
#ifdef DTENSOR_COMPILE_OK
  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      G dx = dy;
      compute::binary_scalar(BinaryOp::Mul, dx.local(), 2.0f, dx.local());
      return dx;
    }
  }
#endif
};

using Model = nn::Sequential<nn::Linear<Cfg, 4, 4>, Double>;

void train(Model& model, const Model::InputT& x) {
  auto y = model.forward(x);
  model.backward(y);
}
