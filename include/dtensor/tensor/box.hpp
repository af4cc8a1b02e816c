#pragma once
// Moved to dtensor/core/box.hpp, the vocabulary floor (issue 27); this path is kept
// for one release.
#include "dtensor/core/box.hpp"
