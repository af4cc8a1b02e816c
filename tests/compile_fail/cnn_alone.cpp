// <dtensor/cnn.hpp> (or <dtensor/nn.hpp>) alone is enough for a model program: the
// runtimes and meshes come with it. Only compiled (compile_ok); nothing to fail.
#include <dtensor/cnn.hpp>
using namespace dtensor;
int main() {
  run_threads(2, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, std::array<int64_t, 2>{2, 1});
    using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
    nn::Sequential<nn::Conv<Img, 1, 2, nn::ConvSpec<2>::square_same(3)>> model{
        nn::Conv<Img, 1, 2, nn::ConvSpec<2>::square_same(3)>(mesh, {1})};
    (void)model.forward(zeros<float, Shard<2>, Shard<3>>(std::array<int64_t, 4>{1, 1, 8, 8}, mesh));
  });
}
