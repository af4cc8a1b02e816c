// A memory plan of a model holding neighborhood attention whose window is given only to
// its constructor: how far its halo reaches is not known to the compiler, so the plan
// refuses it by name, with the spelling that works (DTENSOR_COMPILE_OK: the window in
// the type, nn/image/neighborhood_attention.hpp).
#include <dtensor/cnn.hpp>
using namespace dtensor;

using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, /*dp*/ 0, /*H*/ 1, nn::kNone>>;
#ifdef DTENSOR_COMPILE_OK
using NA = nn::NeighborhoodAttention<Img, 8, 2, NeighborhoodSpec{.kernel = {7, 7}}>;
#else
using NA = nn::NeighborhoodAttention<Img, 8, 2>;
#endif
using Model = nn::Sequential<nn::Residual<NA>>;
constexpr auto kPlan = Model::memory_plan<nn::MSELoss<Img>, nn::SGD>({2, 8, 16, 16}, {1, 2});
static_assert(kPlan.peak_bytes() > 0);

int main() {}
