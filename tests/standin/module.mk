# tests/standin/: the stand-in CUDA driver, for machines without a GPU.
#
# $(STANDIN_SO) exports the CUDA driver entry points kvshare resolves
# (gpu/kvs_cuda_int.h) over memfd + mmap + threads, with the C kernel twins
# standing in for the CUDA kernels; see tests/standin/cuda_standin.c.  A test
# points kvshare at it with KVS_CUDA_DRIVER=$KVS_BUILD/tests/standin/
# libcuda-standin.so.  It is built by `all`, so it exists before
# `make test` runs anything.  (This fragment is included last: other
# fragments name the file by its path, not by $(STANDIN_SO), in their
# prerequisites.)
#
# standin.map keeps everything but the cu* symbols local: the twins' kvs_*
# symbols must not interpose with libkvshare's.

STANDIN_SO   := $(BUILD)/tests/standin/libcuda-standin.so
STANDIN_SRCS := tests/standin/cuda_standin.c tests/standin/standin_exec.c \
                tests/standin/flash_model.c
STANDIN_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(STANDIN_SRCS)) \
                $(BUILD)/gpu/kernels_cpu.o $(BUILD)/gpu/kernels_common.o \
                $(BUILD)/proto/kvs_status.o

$(STANDIN_SO): $(STANDIN_OBJS) tests/standin/standin.map
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(LDFLAGS) \
	  -Wl,--version-script=tests/standin/standin.map -o $@ $(STANDIN_OBJS) \
	  -lpthread -lm

all: $(STANDIN_SO)

# Its own test: plain C, through kvshare's loader (gpu/cuda_loader.c).
STANDIN_TEST := $(BUILD)/tests/unit/test_standin
UNIT_TESTS += $(STANDIN_TEST)
$(STANDIN_TEST): $(BUILD)/tests/unit/test_standin.o $(BUILD)/libkvsgpu.a \
                 $(BUILD)/libkvsshm.a $(BUILD)/proto/kvs_status.o $(STANDIN_SO)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkvsgpu.a $(BUILD)/libkvsshm.a \
	  $(BUILD)/proto/kvs_status.o $(GPU_LIBS)
