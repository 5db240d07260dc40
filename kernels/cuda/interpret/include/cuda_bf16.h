// The interpreter's stand-in for CUDA's header (docs/ARCHITECTURE.md, "CUDA interpret mode").
#pragma once
#include "kernels/cuda/interpret/half.h"
