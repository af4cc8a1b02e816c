#pragma once
// Moved to tensor/movement.hpp (data movement sits below comm/; issue 27): this path
// stays for code that includes it.
#include "dtensor/tensor/movement.hpp"
