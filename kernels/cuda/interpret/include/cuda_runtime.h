// The interpreter's stand-in for CUDA's header (docs/ARCHITECTURE.md, "CUDA interpret mode").
#pragma once
#include "kernels/cuda/interpret/device_api.h"
#include "kernels/cuda/interpret/launch.h"
#include "kernels/cuda/interpret/runtime_api.h"
