#pragma once
// Moved to dtensor/core/shape.hpp, the vocabulary floor (issue 27); this path is kept
// for one release.
#include "dtensor/core/shape.hpp"
