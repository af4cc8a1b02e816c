// 2-D transitions whose source places mesh dim 0 as one of: Shard<1>, Partial<Sum>.
#include "redistribute_2d.hpp"

TEST_CASE("every 2-D transition whose source has mesh dim 0 in {Shard<1>, Partial<Sum>}") {
  dtensor::test::all_2d_transitions_from<dtensor::Shard<1>, dtensor::Partial<dtensor::Sum>>();
}
