#pragma once
// The compiled runtime, an option: a program that defines DTENSOR_COMPILED_RUNTIME in
// every translation unit and links the one TU that defines the runtimes' key functions
// (src/compiled_runtime.cpp; CMake: link dtensor::runtime, which does both) compiles
// the in-process runtime once instead of in each of its TUs.
//
// Why this works: each polymorphic class of the runtimes then declares one virtual
// function that it does not define inline, its key function. By the C++ ABI's rule a
// compiler emits a class's vtable only in the TU that defines its key function, and
// with the vtable every virtual function it lists and what those call: the
// collectives' bodies, the waits, the reductions over every element type. Elsewhere a
// call through Comm& needs none of them. A TU of the tests spends about 3 s less at
// -Og (bench/compile_time/README: the numbers).
//
// Header-only (the default) the macro adds nothing. Every TU of one program must
// agree: a class's virtual functions are part of its definition.
#ifdef DTENSOR_COMPILED_RUNTIME
// A key function named after its class, so that a derived class's is not an override
// of its base's.
#define DTENSOR_RUNTIME_KEY_FUNCTION(Class) virtual void compiled_runtime_key_##Class() const;
#else
#define DTENSOR_RUNTIME_KEY_FUNCTION(Class)
#endif
