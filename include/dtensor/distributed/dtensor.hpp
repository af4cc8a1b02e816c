#pragma once
// DTensor (distributed/dtensor_type.hpp) with redistribute and full_tensor
// (distributed/redistribute.hpp): what a user of DTensor includes. The type and the
// redistribution are two headers so that neither includes the other back.
#include "dtensor/distributed/dtensor_type.hpp"
#include "dtensor/distributed/redistribute.hpp"
