// 2-D transitions whose source places mesh dim 0 as one of: Replicate, Shard<0>.
#include "redistribute_2d.hpp"

TEST_CASE("every 2-D transition whose source has mesh dim 0 in {Replicate, Shard<0>}") {
  dtensor::test::all_2d_transitions_from<dtensor::Replicate, dtensor::Shard<0>>();
}
