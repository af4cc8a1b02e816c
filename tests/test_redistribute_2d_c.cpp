// 2-D transitions whose source places mesh dim 0 as one of: Partial<Max>.
#include "redistribute_2d.hpp"

TEST_CASE("every 2-D transition whose source has mesh dim 0 in {Partial<Max>}") {
  dtensor::test::all_2d_transitions_from<dtensor::Partial<dtensor::Max>>();
}
