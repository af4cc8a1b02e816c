#pragma once
// Rows picked by index (compute/local.hpp: gather_rows, scatter_add_rows,
// take_along_last, add_along_last): an embedding's masked lookup and its adjoint, and
// a loss's target logit and its adjoint. A block holds rows [lo, lo + rows) of a
// table sharded over ranks; an index outside them contributes nothing here.
#include <cstdint>

#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

// out[i, j] = table[index[i] - lo, j], or 0 for an index outside [lo, lo + table_rows).
// One thread per output element: consecutive threads read and write consecutive j.
template <class T>
DTENSOR_KERNEL void gather_rows_kernel(const T* __restrict__ table, int64_t table_rows, int64_t cols,
                                       const int64_t* __restrict__ index, int64_t lo, T* __restrict__ out, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t i, j;
    divmod(e, cols, i, j);
    const int64_t r = index[i] - lo;
    out[e] = r >= 0 && r < table_rows ? table[r * cols + j] : T(0);
  }
}

// table[index[i] - lo, j] += dy[i, j] over i in order, without atomics (the host
// launcher has none, and the sum is then the same bits on every run and as on the
// host): each thread owns one column j of one chunk of `chunk` table rows, and scans
// every i, adding the rows whose index falls in its chunk. Threads of a warp share
// the chunk and read consecutive j, so their loads are coalesced and index[i] is one
// broadcast load. items = chunks * cols. The table is of type A: T itself, or for a
// 16-bit T a float copy of it (kernels.cu), so that a row's many terms add in float and
// round once when the copy is converted back, as on the host.
template <class T, class A = T>
DTENSOR_KERNEL void scatter_add_rows_kernel(const T* __restrict__ dy, const int64_t* __restrict__ index, int64_t rows,
                                            int64_t cols, int64_t lo, A* __restrict__ table, int64_t table_rows,
                                            int64_t chunk, int64_t items) {
  for (int64_t e = first(); e < items; e += stride()) {
    int64_t c, j;
    divmod(e, cols, c, j);
    const int64_t begin = c * chunk, end = begin + chunk < table_rows ? begin + chunk : table_rows;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = index[i] - lo;
      if (r >= begin && r < end) table[r * cols + j] = SumOp{}(table[r * cols + j], static_cast<A>(dy[i * cols + j]));
    }
  }
}

// out[i] = x[i, target[i] - lo], or 0 for a target outside [lo, lo + cols).
template <class T>
DTENSOR_KERNEL void take_along_last_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                           const int64_t* __restrict__ target, int64_t lo, T* __restrict__ out) {
  for (int64_t i = first(); i < rows; i += stride()) {
    const int64_t c = target[i] - lo;
    out[i] = c >= 0 && c < cols ? x[i * cols + c] : T(0);
  }
}

// x[i, target[i] - lo] += g[i] for a target in [lo, lo + cols): one element per row,
// so no two threads touch the same element.
template <class T>
DTENSOR_KERNEL void add_along_last_kernel(const T* __restrict__ g, const int64_t* __restrict__ target, int64_t lo,
                                          T* __restrict__ x, int64_t rows, int64_t cols) {
  for (int64_t i = first(); i < rows; i += stride()) {
    const int64_t c = target[i] - lo;
    if (c >= 0 && c < cols) x[i * cols + c] = SumOp{}(x[i * cols + c], g[i]);
  }
}

// The chunk of table rows per thread of scatter_add_rows_kernel: enough chunks that
// chunks * cols threads fill a GPU (about 64K), no more (each thread scans every row).
inline int64_t scatter_chunk(int64_t table_rows, int64_t cols) {
  constexpr int64_t kTargetThreads = int64_t{1} << 16;
  int64_t chunks = (kTargetThreads + cols - 1) / cols;
  if (chunks > table_rows) chunks = table_rows;
  if (chunks < 1) chunks = 1;
  return (table_rows + chunks - 1) / chunks;
}

}  // namespace dtensor::cuda::kernels::detail
