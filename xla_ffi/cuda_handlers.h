// XLA FFI handlers for the CUDA platform, exported to Python as capsules by the module (CUDA builds).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* GearJaxSampleCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxGatherCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxUpdatePrioritiesCuda(XLA_FFI_CallFrame* call_frame);
}
