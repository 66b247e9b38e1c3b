/* A stand-in for the CUDA driver (libcuda.so.1) on a machine without one.
 *
 * TVM's CUDA runtime library links these nine driver entry points. With this stub loaded the library
 * loads, so TVM compiles kernels with nvcc at build time instead of keeping raw CUDA source; any
 * attempt to run a kernel here fails as CUDA_ERROR_NO_DEVICE. resaware loads it only when no real
 * driver is present (the real one has cuInit, this one has not).
 */
typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100

CUresult cuGetErrorName(CUresult error, const char **name) {
  (void)error;
  if (name) *name = "CUDA_ERROR_NO_DEVICE";
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  (void)error;
  if (text) *text = "no CUDA driver on this machine (resaware's build-only stand-in)";
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuFuncSetAttribute(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuLaunchKernelEx(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleGetFunction(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleLoadData(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleUnload(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuTensorMapEncodeTiled(void) { return CUDA_ERROR_NO_DEVICE; }
