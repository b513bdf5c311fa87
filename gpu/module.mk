# gpu/: kernels, their CPU twins, CUDA pool export/import.
#
# $(BUILD)/libkvsgpu.a holds the C twins and the CUDA host side (libcuda.so.1
# is dlopen'ed at run time, so nothing links against CUDA).  When nvcc is
# installed (NVCC, found by the top Makefile) the CUDA kernels are compiled
# into a fatbin (sm_80, sm_90 and PTX) and embedded; without nvcc an empty
# stand-in is linked instead and kvs_cuda_available() says why.
# A program that links libkvsgpu.a adds $(GPU_LIBS).

GPU_SRCS  := gpu/kernels_common.c gpu/kernels_cpu.c gpu/cuda_loader.c \
             gpu/cuda_driver.c gpu/vmm.c
# sm_90a (not sm_90): the image for compute capability 9.0 carries the
# flash prefill's wgmma variant, which needs the architecture-specific
# features; compute_90 PTX stays for later GPUs (without that variant).
GPU_ARCHS ?= -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_90,code=compute_90
GPU_LIBS  := -ldl -lpthread -lm
MOD_CFLAGS_gpu_ := $(if $(filter 1,$(SAN)),,-O3) -Wno-psabi

ifneq ($(NVCC),)
GPU_FATBIN := $(BUILD)/gpu/kernels.fatbin
GPU_OBJS   := $(patsubst %.c,$(BUILD)/%.o,$(GPU_SRCS)) $(BUILD)/gpu/cuda_fatbin.o

# No --use_fast_math, -ftz=true or -prec-div=false: the write kernel's
# bytes must equal its C twin's (test_gpu_cuda), which takes IEEE division
# and subnormals; CUDA 13 gives the source no macro to check this by.
$(GPU_FATBIN): gpu/kernels.cu gpu/kernels_prefill.cuh gpu/kernels_wgmma.cuh \
              gpu/kvs_prefill_sched.h \
              gpu/kvs_kernels.h gpu/kvs_kernels_int.h shm/kvs_layout.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -fatbin -O3 -std=c++17 -Werror all-warnings -I. -Ishm -Igpu \
	  $(GPU_ARCHS) -o $@ $<

$(BUILD)/gpu/cuda_fatbin.o: gpu/cuda_fatbin.S $(GPU_FATBIN)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AS      $<")
	$(Q)$(CC) -DKVS_FATBIN='"$(GPU_FATBIN)"' -c -o $@ $<
else
GPU_OBJS   := $(patsubst %.c,$(BUILD)/%.o,$(GPU_SRCS) gpu/cuda_nofatbin.c)
endif

$(BUILD)/libkvsgpu.a: $(GPU_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

all: $(BUILD)/libkvsgpu.a

# Tests.  test_gpu_kernels / test_gpu_toymodel use cmocka; test_gpu_numpy
# and test_gpu_cuda are plain C so the GPU machine (no cmocka) builds them.
GPU_CMOCKA_TESTS := $(BUILD)/tests/unit/test_gpu_kernels \
                    $(BUILD)/tests/unit/test_gpu_toymodel
GPU_PLAIN_TESTS  := $(BUILD)/tests/unit/test_gpu_numpy \
                    $(BUILD)/tests/unit/test_gpu_quant \
                    $(BUILD)/tests/unit/test_gpu_cuda \
                    $(BUILD)/tests/unit/test_gpu_flash_model
UNIT_TESTS += $(GPU_CMOCKA_TESTS) $(GPU_PLAIN_TESTS)

$(BUILD)/tests/unit/test_gpu_toymodel: $(BUILD)/tests/demo/toymodel.o
# the flash prefill kernel's C model (test code: tests/standin/), and the
# stand-in driver that runs it for the launcher's half of the test
$(BUILD)/tests/unit/test_gpu_flash_model: $(BUILD)/tests/standin/flash_model.o \
  $(BUILD)/tests/standin/libcuda-standin.so
# (kvs_status.o only, for kvs_strerror: the rest of proto/ needs protobuf-c)
GPU_TEST_DEPS := $(BUILD)/libkvsgpu.a $(BUILD)/proto/kvs_status.o
$(GPU_CMOCKA_TESTS): $(BUILD)/%: $(BUILD)/%.o $(GPU_TEST_DEPS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(BUILD)/libkvsgpu.a \
	  $(call DEP_LIBS,cmocka) $(GPU_LIBS)
$(GPU_PLAIN_TESTS): $(BUILD)/%: $(BUILD)/%.o $(GPU_TEST_DEPS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(BUILD)/libkvsgpu.a $(GPU_LIBS)

# The driver API kvshare declares itself (gpu/kvs_cuda_int.h), against the
# installed toolkit's cuda.h (compile-time checks; skipped without cuda.h).
CUDA_H := $(if $(NVCC),$(wildcard $(dir $(NVCC))../include/cuda.h))
UNIT_TESTS += $(BUILD)/tests/unit/test_cuda_abi
$(BUILD)/tests/unit/test_cuda_abi.o: tests/unit/test_cuda_abi.c gpu/kvs_cuda_int.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(if $(CUDA_H),-DKVS_HAVE_CUDA_H \
	  -isystem $(dir $(CUDA_H))) -c -o $@ $<
$(BUILD)/tests/unit/test_cuda_abi: $(BUILD)/tests/unit/test_cuda_abi.o
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $<

# Benchmarks: CPU decode attention against memcpy; GPU decode against HBM.
GPU_BENCHES := $(BUILD)/tests/bench/bench_attention \
               $(BUILD)/tests/bench/bench_attention_gpu
BENCHES += $(GPU_BENCHES)
# (make test runs bench_attention_gpu in its smoke mode on the stand-in)
all: $(BUILD)/tests/bench/bench_attention_gpu
$(GPU_BENCHES): $(BUILD)/%: $(BUILD)/%.o $(GPU_TEST_DEPS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(BUILD)/libkvsgpu.a $(GPU_LIBS)

# On a GPU machine without the third-party libraries:
#   make KVS_NO_DEPS=1 BUILD=build-dev gpu-check
.PHONY: gpu-check
gpu-check: $(BUILD)/tests/unit/test_gpu_cuda $(BUILD)/tests/unit/test_gpu_numpy \
           $(BUILD)/tests/bench/bench_attention_gpu $(BUILD)/tests/bench/bench_attention
	$(Q)tests/run-tests.sh $(BUILD) $(BUILD)/tests/unit/test_gpu_cuda \
	  $(BUILD)/tests/unit/test_gpu_numpy
	$(Q)$(BUILD)/tests/bench/bench_attention_gpu
