#pragma once
// The command-line options shared by examples/poisson2d.cpp and poisson3d.cpp
// (PETSc-style: "-name value"); see the comment at the top of each example.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dtensor/solvers.hpp>

namespace poisson_example {

struct Args {
  int ranks = 4;
  int64_t n = 31;
  int levels = 4;
  std::string stencil = "all";
  dtensor::CgVariant variant = dtensor::CgVariant::ChronopoulosGear;
  dtensor::ApplyMode mode = dtensor::ApplyMode::Overlapped;
  double rtol = 1e-10;
};

// Parses argv over `defaults`; an unknown option or a missing value exits with 2.
inline Args parse(int argc, char** argv, const char* program, Args defaults) {
  Args a = defaults;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&] {
      if (!v) {
        std::fprintf(stderr, "%s: option %s needs a value\n", program, k.c_str());
        std::exit(2);
      }
      ++i;
      return std::string(v);
    };
    if (k == "-ranks")
      a.ranks = std::stoi(need());
    else if (k == "-n")
      a.n = std::stoll(need());
    else if (k == "-levels")
      a.levels = std::stoi(need());
    else if (k == "-stencil")
      a.stencil = need();
    else if (k == "-variant")
      a.variant = need() == "classic" ? dtensor::CgVariant::Classic : dtensor::CgVariant::ChronopoulosGear;
    else if (k == "-overlap")
      a.mode = need() == "0" ? dtensor::ApplyMode::Plain : dtensor::ApplyMode::Overlapped;
    else if (k == "-rtol")
      a.rtol = std::stod(need());
    else {
      std::fprintf(stderr, "%s: unknown option %s (see the comment at the top of examples/%s.cpp)\n", program,
                   k.c_str(), program);
      std::exit(2);
    }
  }
  return a;
}

}  // namespace poisson_example
