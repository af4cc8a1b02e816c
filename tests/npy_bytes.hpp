#pragma once
// A .npy file's bytes as numpy.save writes them (version 1.0, the header padded to a
// multiple of 64 bytes), for the loader's tests; `extra_keys` inserts keys numpy never
// writes (the strict reader must refuse them).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtensor::test {

inline std::string npy_bytes(const std::string& descr, const std::vector<int64_t>& shape, const void* data,
                             std::size_t bytes, const std::string& extra_keys = "") {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, " + extra_keys + "'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  std::size_t total = 10 + dict.size() + 1;
  dict += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string out = std::string("\x93NUMPY", 6) + '\x01' + '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

}  // namespace dtensor::test
