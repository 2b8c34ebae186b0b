// Stand-in for the toolkit's <cuda_fp16.h> in the emulated host build: the types and
// conversions the kernels use come from cuda_emu.h.
#pragma once
#include "../cuda_emu.h"
