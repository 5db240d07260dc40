// The interpreter's stand-in for cuBLAS's header (docs/ARCHITECTURE.md, "CUDA interpret mode").
#pragma once
#include "kernels/cuda/interpret/cublas_api.h"
