#pragma once
// Moved to nn/model_plan.hpp (the model's plan, apart from plan/: the redistribution
// planner; issue 27): this path stays for code that includes it.
#include "dtensor/nn/model_plan.hpp"
