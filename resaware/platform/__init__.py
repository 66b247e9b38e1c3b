"""The platform: the hardware a store is keyed by, confining a process to its cores, CUDA and MPS,
TVM's native noise, and `resaware doctor`'s report of what this machine can do."""
