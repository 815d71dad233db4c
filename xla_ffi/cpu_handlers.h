// XLA FFI handlers for the CPU platform, exported to Python as capsules by the module.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* GearJaxSampleCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxGatherCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxUpdatePrioritiesCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxTotalWeightCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxSampleAtCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxOrderedCandidatesCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxSampleGatherCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxInsertCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxShuffleCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GearJaxConsumeCpu(XLA_FFI_CallFrame* call_frame);
}
