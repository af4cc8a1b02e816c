#pragma once
// The alpha-beta model of one mesh dimension's links, used to rank redistribution
// plans: moving b bytes over a step of h hops costs h * latency + b / bandwidth.
namespace dtensor {

struct LinkCost {
  double latency_s = 5e-6;        // per hop
  double bandwidth_Bps = 25e9;    // per rank, one direction
  // Local copies (slicing, zero-fill) run at memory speed, far faster than any link.
  static constexpr double local_bandwidth_Bps = 200e9;
};

}  // namespace dtensor
