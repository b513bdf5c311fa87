# gpu/: kernels, their CPU twins, CUDA pool export/import.
GPU_OBJS :=
