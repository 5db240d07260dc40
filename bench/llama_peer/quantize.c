// llama.cpp's own quantizer (llama_model_quantize, what its llama-quantize tool calls) from the
// prebuilt libllama that node-llama-cpp ships, for scripts/bench-peer's DTYPE=int8 when no
// LLAMA_CPP_DIR gives a llama-quantize: the prebuilt package has the library but not the tool.
//
//   quantize IN.gguf OUT.gguf Q8_0|Q4_0 THREADS      (llama-quantize's argument order)
//
// Built by scripts/bench-peer against llama.h from the same release's source (node-llama-cpp's
// bundled llama.cpp), so the struct it passes is the library's own.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 5 || (strcmp(argv[3], "Q8_0") != 0 && strcmp(argv[3], "Q4_0") != 0)) {
    fprintf(stderr, "usage: quantize IN.gguf OUT.gguf Q8_0|Q4_0 THREADS\n");
    return 2;
  }
  llama_backend_init();
  struct llama_model_quantize_params params = llama_model_quantize_default_params();
  params.ftype = strcmp(argv[3], "Q8_0") == 0 ? LLAMA_FTYPE_MOSTLY_Q8_0 : LLAMA_FTYPE_MOSTLY_Q4_0;
  params.nthread = atoi(argv[4]);
  const uint32_t failed = llama_model_quantize(argv[1], argv[2], &params);
  llama_backend_free();
  if (failed != 0) fprintf(stderr, "quantize: llama_model_quantize failed (%u)\n", failed);
  return failed == 0 ? 0 : 1;
}
