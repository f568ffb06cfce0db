// KVQ_UNROLL: full unrolling on the device, where register arrays indexed by the loop must stay in registers; the
// same code compiled for the host (the CPU tests of the kernels' fragment and transform code) runs the plain loop.
#pragma once

#if defined(__CUDA_ARCH__)
#define KVQ_UNROLL _Pragma("unroll")
#else
#define KVQ_UNROLL
#endif
