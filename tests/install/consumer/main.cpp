#include <dtensor/dtensor.hpp>
int main() {
  int bad = 0;
  dtensor::run_threads(2, [&](dtensor::Comm& comm) {
    dtensor::DeviceMesh<1> mesh(comm);
    auto x = dtensor::ones<float, dtensor::Shard<0>>(dtensor::Shape<1>{5}, mesh);
    if (x.full_tensor() != dtensor::Tensor<float, 1>::full({5}, 1.f)) bad = 1;
  });
  return bad;
}
