#pragma once
// The compiled runtime, an option: a program that defines DTENSOR_COMPILED_RUNTIME in
// every translation unit and links the TUs that define the runtimes' key functions
// (src/compiled_runtime.cpp, src/compiled_runtime_mpi.cpp; CMake: link dtensor::runtime
// or dtensor::runtime_mpi, which do both) compiles the in-process and MPI runtimes once
// instead of in each of its TUs.
//
// Why this works: each polymorphic class of the runtimes then declares one virtual
// function that it does not define inline, its key function. By the C++ ABI's rule a
// compiler emits a class's vtable only in the TU that defines its key function, and
// with the vtable every virtual function it lists and what those call: the
// collectives' bodies, the waits, the reductions over every element type. Elsewhere a
// call through Comm& needs none of them. A TU of the tests spends about 3 s less at
// -Og (bench/README.md, "Compile time of the examples", has the numbers).
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

// The launchers (run_threads, run, run_mpi, make_thread_comms) are plain functions that take
// the program as a FunctionRef: header-only they are `inline`; with the compiled runtime
// a program's TUs see their declarations only (DTENSOR_RUNTIME_FUNCTION adds nothing,
// DTENSOR_DEFINE_RUNTIME is 0) and the library's sources their definitions. What a
// launcher runs (the threads, the failure handling, MPI's set-up, the watchdog) is then
// compiled once, not once per lambda in every TU that starts a program: an example's
// empty program 13.8 -> 8.1 s at -O2, test_solvers.cpp (26 programs) 30.0 -> 25.4 s at
// -Og (bench/README.md, "Compile time of the examples").
#ifdef DTENSOR_COMPILED_RUNTIME
#define DTENSOR_RUNTIME_FUNCTION
#else
#define DTENSOR_RUNTIME_FUNCTION inline
#endif
#if !defined(DTENSOR_COMPILED_RUNTIME) || defined(DTENSOR_COMPILED_RUNTIME_SOURCE)
#define DTENSOR_DEFINE_RUNTIME 1  // the in-process runtime's launcher (src/compiled_runtime.cpp)
#else
#define DTENSOR_DEFINE_RUNTIME 0
#endif
#if !defined(DTENSOR_COMPILED_RUNTIME) || defined(DTENSOR_COMPILED_RUNTIME_MPI_SOURCE)
#define DTENSOR_DEFINE_RUNTIME_MPI 1  // the MPI runtime's (src/compiled_runtime_mpi.cpp)
#else
#define DTENSOR_DEFINE_RUNTIME_MPI 0
#endif

// The compute kernels most programs call (attention, products, convolutions, optimizer
// updates, rotary embeddings, row statistics; float and double) are compiled there
// too: each of their headers lists them under DTENSOR_KERNEL_INSTANCE, which makes the
// list explicit instantiation declarations (`extern template`) in a program's TUs, so
// they call the library's copy instead of instantiating their own (Eigen's products
// included), and definitions in the library's source, which defines
// DTENSOR_COMPILED_RUNTIME_SOURCE first. The library's flags (its build type, any
// -march) are then the kernels' flags.
#if defined(DTENSOR_COMPILED_RUNTIME) && defined(DTENSOR_COMPILED_RUNTIME_SOURCE)
#define DTENSOR_KERNEL_INSTANCE template
#elif defined(DTENSOR_COMPILED_RUNTIME)
#define DTENSOR_KERNEL_INSTANCE extern template
#endif
