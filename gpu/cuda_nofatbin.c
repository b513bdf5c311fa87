/*
 * cuda_nofatbin.c — stands in for cuda_fatbin.S when the build had no nvcc:
 * an empty kernel image, so kvs_cuda_available() reports why CUDA is off.
 */
extern const unsigned char kvs__cuda_fatbin[];
extern const unsigned long long kvs__cuda_fatbin_size;

__attribute__((visibility("hidden"))) const unsigned char kvs__cuda_fatbin[1];
__attribute__((visibility("hidden"))) const unsigned long long
    kvs__cuda_fatbin_size = 0;
