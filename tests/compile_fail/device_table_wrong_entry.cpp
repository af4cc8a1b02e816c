// A device backend is a type with one static function per table entry, and
// device_backend_of lists the entries once (compute/device_backend.hpp). A backend
// whose attention_merge has another signature than the table's does not compile, and
// the error names the entry; the emulated device's own functions compile.
#include "../emulated_device.hpp"

struct Backend : dtensor::test::emulated::EmulatedMath {
#ifndef DTENSOR_COMPILE_OK
  static void attention_merge(dtensor::DType, void* o, const void* ob, int64_t rows) {}  // no lse, no dim
#endif
};
constexpr auto table = dtensor::detail::device_backend_of<Backend>();
int main() {}
