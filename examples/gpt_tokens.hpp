#pragma once
// The language examples' data (train_gpt, train_gpt_pipeline): sequences of tokens
// counting modulo the vocabulary from a random start with a stride of 1, 2 or 3 drawn
// per sequence, so the next token is the last one plus the stride the context shows.
// Sequence n of step s depends on (s, n) only, whatever the mesh.
#include <cstdint>

#include <dtensor/dtensor.hpp>

namespace examples {

inline uint64_t draw(int step, int64_t n, int what) {
  return dtensor::detail::mix64(static_cast<uint64_t>((step * 1000 + n) * 4 + what));
}
// Token `position` of sequence n at step `step`, over a vocabulary of `vocab`.
inline int64_t token(int step, int64_t n, int64_t position, int64_t vocab) {
  const auto start = static_cast<int64_t>(draw(step, n, 0) % static_cast<uint64_t>(vocab));
  const auto stride = static_cast<int64_t>(1 + draw(step, n, 1) % 3);
  return (start + stride * position) % vocab;
}

// ids [batch, len] and the targets (the next token; the last position ignored, -100)
// of a step, as DTensors of the given types on `mesh`.
template <class Ids, class Mesh>
Ids token_ids(int step, int64_t batch, int64_t len, int64_t vocab, const Mesh& mesh) {
  return dtensor::detail::generate<Ids>({batch, len}, mesh, {}, [&](uint64_t i) {
    return token(step, static_cast<int64_t>(i) / len, static_cast<int64_t>(i) % len, vocab);
  });
}
template <class Targets, class Mesh>
Targets next_tokens(int step, int64_t batch, int64_t len, int64_t vocab, const Mesh& mesh) {
  return dtensor::detail::generate<Targets>({batch, len}, mesh, {}, [&](uint64_t i) {
    const auto n = static_cast<int64_t>(i) / len, s = static_cast<int64_t>(i) % len;
    return s + 1 < len ? token(step, n, s + 1, vocab) : int64_t{-100};
  });
}

}  // namespace examples
