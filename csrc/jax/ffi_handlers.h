// ffi_handlers.h — the XLA FFI handler symbols of dualemb._jax_ffi (defined in ffi_*.cc),
// collected by module.cc into the capsules that jax.ffi.register_ffi_target takes.
#ifndef DUALEMB_JAX_FFI_HANDLERS_H_
#define DUALEMB_JAX_FFI_HANDLERS_H_

#include "xla/ffi/api/api.h"

// Reads (ffi_read.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_find);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_size);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_export);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_after);
// Writes (ffi_write.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_find_or_insert);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_insert_or_assign);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_insert_masked);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_accum);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_erase);
// Training (ffi_train.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_apply_gradients);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_unique);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_exchange_check);
XLA_FFI_DECLARE_HANDLER_SYMBOL(dualemb_apply_gradients_first);

#endif  // DUALEMB_JAX_FFI_HANDLERS_H_
