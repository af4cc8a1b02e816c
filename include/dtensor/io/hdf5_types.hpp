#pragma once
// Element types in HDF5 files: the HDF5 type dtensor writes for each element type,
// whether a file's type holds a program's element type, and a file type's name for
// messages ("float64", "a big-endian float32" ...).
//
// float, double and the 1, 4 and 8 byte integers are HDF5's standard types, as h5py
// writes them. float16 is IEEE half precision built as h5py builds it (a 2-byte float:
// sign bit 15, exponent bits 10-14, mantissa bits 0-9, bias 15), so h5py and numpy
// read it as float16. bfloat16 has no HDF5 or numpy type: it is stored as a 2-byte
// float of its own layout (sign bit 15, exponent bits 7-14, mantissa bits 0-6, bias
// 127), which HDF5 describes exactly; dtensor reads it back bit for bit, and h5py sees
// an unknown float (read it as raw 16-bit words, or write the field as float).
//
// A file's type holds element type T when it is the same class (integer or float),
// size and signedness and, for floats, the same bit layout; the byte order may
// differ (HDF5 swaps the bytes; the transfer is then not collective). Nothing else
// is converted: a float64 dataset does not read into float.
#include <cstdint>
#include <string>
#include <type_traits>

#include "dtensor/core/dtype.hpp"
#include "dtensor/core/float16.hpp"
#include "dtensor/io/hdf5_handle.hpp"

namespace dtensor::io::detail {

// A 2-byte float with the given fields, little-endian (built as h5py builds float16).
inline Handle float16_type(std::size_t exp_bits, std::size_t mant_bits, std::size_t bias) {
  Handle t = checked(H5Tcopy(H5T_IEEE_F32LE), H5Tclose, "cannot copy a float type");
  check_hdf5(H5Tset_fields(t.get(), 15, mant_bits, exp_bits, 0, mant_bits), "cannot lay out a 16-bit float");
  check_hdf5(H5Tset_size(t.get(), 2), "cannot size a 16-bit float");
  check_hdf5(H5Tset_ebias(t.get(), bias), "cannot set a 16-bit float's exponent bias");
  return t;
}

// The HDF5 type of T in memory (native byte order), which is also the type dtensor
// writes to a file.
template <class T>
Handle memory_type() {
  auto copy = [](hid_t t) { return checked(H5Tcopy(t), H5Tclose, "cannot copy a native type"); };
  if constexpr (std::is_same_v<T, float>) return copy(H5T_NATIVE_FLOAT);
  else if constexpr (std::is_same_v<T, double>) return copy(H5T_NATIVE_DOUBLE);
  else if constexpr (std::is_same_v<T, float16>) return float16_type(5, 10, 15);
  else if constexpr (std::is_same_v<T, bfloat16>) return float16_type(8, 7, 127);
  else if constexpr (std::is_same_v<T, bool>)
    static_assert(sizeof(T) == 0, "dtensor::io::write_hdf5: bool has no HDF5 type; store it as uint8_t");
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 1)
    return copy(std::is_signed_v<T> ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8);
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 2)
    return copy(std::is_signed_v<T> ? H5T_NATIVE_INT16 : H5T_NATIVE_UINT16);
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4)
    return copy(std::is_signed_v<T> ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT32);
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8)
    return copy(std::is_signed_v<T> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64);
  else
    static_assert(sizeof(T) == 0,
                  "dtensor::io: this element type has no HDF5 type here; use float, double, float16, bfloat16 or "
                  "an integer of 1, 2, 4 or 8 bytes");
}

// The name of the program's element type T, as messages say it.
template <class T>
std::string element_name() {
  if constexpr (std::is_integral_v<T> && sizeof(T) == 2) return std::is_signed_v<T> ? "int16" : "uint16";
  else return dtensor::name(dtype_of<T>());
}

// A float type's bit layout: sign position, exponent (position, bits), mantissa
// (position, bits), bias. Two floats of one layout hold the same values.
struct FloatLayout {
  std::size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0, ebias = 0, size = 0;
  bool operator==(const FloatLayout&) const = default;
};
inline FloatLayout float_layout(hid_t t) {
  FloatLayout f;
  H5Tget_fields(t, &f.spos, &f.epos, &f.esize, &f.mpos, &f.msize);
  f.ebias = H5Tget_ebias(t);
  f.size = H5Tget_size(t);
  return f;
}

// A file's type, named as a reader of the message would ("float32", "int64",
// "bfloat16", "a big-endian float64", "a string", "a compound type" ...).
inline std::string type_name(hid_t t) {
  const H5T_class_t c = H5Tget_class(t);
  const std::size_t size = H5Tget_size(t);
  const std::string order = H5Tget_order(t) == H5T_ORDER_BE && size > 1 ? "a big-endian " : "";
  if (c == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(t) == H5T_SGN_2;
    return order + (is_signed ? "int" : "uint") + std::to_string(size * 8);
  }
  if (c == H5T_FLOAT) {
    const FloatLayout f = float_layout(t);
    if (size == 2 && f.esize == 5 && f.msize == 10) return order + "float16";
    if (size == 2 && f.esize == 8 && f.msize == 7) return order + "bfloat16";
    if ((size == 4 && f.esize == 8 && f.msize == 23) || (size == 8 && f.esize == 11 && f.msize == 52))
      return order + "float" + std::to_string(size * 8);
    return dtensor::detail::cat("a ", size, "-byte float (", f.esize, " exponent bits, ", f.msize, " mantissa bits)");
  }
  switch (c) {
    case H5T_STRING: return "a string";
    case H5T_COMPOUND: return "a compound type";
    case H5T_ENUM: return "an enum type";
    case H5T_ARRAY: return "an array type";
    case H5T_VLEN: return "a variable-length type";
    case H5T_OPAQUE: return "an opaque type";
    case H5T_REFERENCE: return "a reference type";
    case H5T_BITFIELD: return "a bitfield";
    case H5T_TIME: return "a time type";
    default: return "an unknown type";
  }
}

// Whether a file's type `file` holds the program's `mem` (see the head of this file).
inline bool holds(hid_t file, hid_t mem) {
  const H5T_class_t c = H5Tget_class(file);
  if (c != H5Tget_class(mem) || H5Tget_size(file) != H5Tget_size(mem)) return false;
  if (c == H5T_INTEGER) return H5Tget_sign(file) == H5Tget_sign(mem);
  if (c == H5T_FLOAT) return float_layout(file) == float_layout(mem);
  return false;
}

}  // namespace dtensor::io::detail
