#pragma once
// Moved to dtensor/core/reduce_op.hpp, the vocabulary floor (issue 27); this path is kept
// for one release.
#include "dtensor/core/reduce_op.hpp"
