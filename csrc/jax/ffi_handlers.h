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
// Adding a platform (CUDA handlers in new files): give the entries a column rather than
// starting a second list, e.g. X(name, CUDA) with CUDA 1 where a handler dualemb_<name>_cuda
// exists; declare those symbols from the column here, and have module.cc return one dict per
// platform ({"cpu": {...}, "CUDA": {...}}) for _ffi.py to register, so that a target is still
// named once.
#ifndef DUALEMB_JAX_FFI_HANDLERS_H_
#define DUALEMB_JAX_FFI_HANDLERS_H_

#include "xla/ffi/api/api.h"

#define DUALEMB_JAX_FFI_TARGETS(X)      \
  /* Reads (ffi_read.cc). */            \
  X(find)                               \
  X(size)                               \
  X(export)                             \
  X(after)                              \
  /* Writes (ffi_write.cc). */          \
  X(find_or_insert)                     \
  X(insert_or_assign)                   \
  X(insert_masked)                      \
  X(accum)                              \
  X(erase)                              \
  /* Training (ffi_train.cc). */        \
  X(apply_gradients)                    \
  X(unique)                             \
  /* Sharded path (ffi_exchange.cc). */ \
  X(exchange_check)                     \
  X(apply_gradients_first)              \
  /* Many tables (ffi_many.cc). */      \
  X(find_many)                          \
  X(find_or_insert_many)                \
  X(apply_gradients_many)

#define DUALEMB_JAX_DECLARE_HANDLER(name) XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_##name);
DUALEMB_JAX_FFI_TARGETS(DUALEMB_JAX_DECLARE_HANDLER)
#undef DUALEMB_JAX_DECLARE_HANDLER

#endif  // DUALEMB_JAX_FFI_HANDLERS_H_
