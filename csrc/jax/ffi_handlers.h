// ffi_handlers.h — the one list of dualemb's XLA FFI targets, and their handler declarations.
//
// Entry X(name) stands for the target "dualemb_<name>": its handler symbol dualemb_<name>
// (defined with XLA_FFI_DEFINE_HANDLER_SYMBOL in ffi_*.cc, beside its implementation) and its
// host-callback twin dualemb.jax._host.<name> (the same semantics in numpy, for platforms
// without a native handler). Everything else is generated from this list: the declarations
// below, the {target: capsule} dict of module.cc, and through that dict the targets that
// dualemb/jax/_ffi.py registers with JAX and pairs with their twins (an import error names a
// target without a twin, or a twin without a target). tests/repo/test_op_lists.py checks that the
// symbols defined in ffi_*.cc are exactly this list.
//
// Adding a target: its handler in ffi_<concern>.cc, its entry here, its twin in _host.py
// (decorated @twin), its wrapper in _ffi.py.
//
// The second column says whether the target also has a CUDA handler, dualemb_<name>_cuda
// (csrc/jax/cuda/ffi_cuda.cc, on a GPU table's device buffers and XLA's stream), built into the
// module dualemb._jax_ffi_cuda only where the GPU table (libdualemb_cuda.so) is built; that
// module hands out {target: capsule} for the entries marked 1 and dualemb/jax/_ffi.py registers
// them under the same target names for the platform "CUDA". A target is still named once.
// tests/repo/test_op_lists.py checks that the _cuda symbols defined in csrc/jax/cuda are exactly
// the entries marked 1.
#ifndef DUALEMB_JAX_FFI_HANDLERS_H_
#define DUALEMB_JAX_FFI_HANDLERS_H_

#include "xla/ffi/api/api.h"

#define DUALEMB_JAX_FFI_TARGETS(X)       \
  /* Reads (ffi_read.cc). */             \
  X(find, 1)                             \
  X(size, 0)                             \
  X(export, 0)                           \
  X(after, 0)                            \
  /* Writes (ffi_write.cc). */           \
  X(find_or_insert, 1)                   \
  X(insert_or_assign, 0)                 \
  X(insert_masked, 0)                    \
  X(accum, 0)                            \
  X(erase, 0)                            \
  /* Training (ffi_train.cc). */         \
  X(apply_gradients, 1)                  \
  X(unique, 0)                           \
  /* Sharded path (ffi_exchange.cc). */  \
  X(exchange_check, 0)                   \
  X(apply_gradients_first, 0)            \
  /* Many tables (ffi_many.cc). */       \
  X(find_many, 0)                        \
  X(find_or_insert_many, 0)              \
  X(apply_gradients_many, 0)             \
  /* Dense parameters (ffi_dense.cc). */ \
  X(dense_keras_adam, 0)

// DUALEMB_JAX_IF_CUDA_<0|1>(x): x for the entries with a CUDA handler.
#define DUALEMB_JAX_IF_CUDA_0(x)
#define DUALEMB_JAX_IF_CUDA_1(x) x

#define DUALEMB_JAX_DECLARE_HANDLER(name, cuda) XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_##name);
DUALEMB_JAX_FFI_TARGETS(DUALEMB_JAX_DECLARE_HANDLER)
#undef DUALEMB_JAX_DECLARE_HANDLER

#define DUALEMB_JAX_DECLARE_CUDA_HANDLER(name, cuda) \
  DUALEMB_JAX_IF_CUDA_##cuda(XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_##name##_cuda);)
DUALEMB_JAX_FFI_TARGETS(DUALEMB_JAX_DECLARE_CUDA_HANDLER)
#undef DUALEMB_JAX_DECLARE_CUDA_HANDLER

#endif  // DUALEMB_JAX_FFI_HANDLERS_H_
