// XLA FFI handlers for the CUDA platform, exported to Python as capsules by the module (CUDA builds).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* GearJaxSampleCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxGatherCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxSampleGatherCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxUpdatePrioritiesCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxConsumeCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxTotalWeightCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxSampleAtCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxOrderedCandidatesCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxInsertCuda(XLA_FFI_CallFrame* call_frame);
}

namespace gear {
// Releases the tables that host callbacks of update_priorities left behind when their table was closed
// while they were in flight (see cuda_handlers.cu). Called when a table is created or closed.
void DropTablesLeftByHostCallbacks();
}  // namespace gear
