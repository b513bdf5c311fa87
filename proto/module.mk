# proto/: status codes, the .proto (compiled at build time), framing, the
# one op type (kvs_op.h) and the codecs between it and the wire
# (kvs_codec.h: codec_envelope.c, codec_packed.c, codec_compact.c; what
# they share in codec.c; a call's shape to its codec in codec_frame.c).
#
# protoc-c writes $(BUILD)/proto/kvshare.pb-c.{c,h}; they are never committed
# or edited.  Any object that includes kvs_frame.h or kvshare.pb-c.h needs an
# order dependency on the header:   $(MY_OBJS): | $(PROTO_GEN_H)
# Link users with $(BUILD)/libkvsproto.a $(PROTO_LIBS) (an internal static
# library, built with -fPIC for libkvshare.so; not installed).
PROTOC_C   ?= protoc-c
PROTO_GEN_C := $(BUILD)/proto/kvshare.pb-c.c
PROTO_GEN_H := $(BUILD)/proto/kvshare.pb-c.h
PROTO_OBJS := $(BUILD)/proto/kvs_status.o $(BUILD)/proto/kvs_frame.o \
              $(BUILD)/proto/kvs_arena.o $(BUILD)/proto/kvshare.pb-c.o \
              $(BUILD)/proto/codec.o $(BUILD)/proto/codec_envelope.o \
              $(BUILD)/proto/codec_packed.o $(BUILD)/proto/codec_compact.o \
              $(BUILD)/proto/codec_frame.o
PROTO_LIBS  = $(call DEP_LIBS,libprotobuf-c)
MOD_CFLAGS_proto_ := $(call DEP_CFLAGS,libprotobuf-c)

# One recipe makes both files (a grouped target: GNU make >= 4.3).
$(PROTO_GEN_C) $(PROTO_GEN_H) &: proto/kvshare.proto
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  PROTOC  $<")
	$(Q)$(PROTOC_C) --proto_path=proto --c_out=$(BUILD)/proto $<

$(BUILD)/proto/kvshare.pb-c.o: $(PROTO_GEN_C) | $(PROTO_GEN_H)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(MOD_CFLAGS_proto_) -c -o $@ $<

$(filter-out $(BUILD)/proto/kvshare.pb-c.o,$(PROTO_OBJS)): | $(PROTO_GEN_H)

$(BUILD)/libkvsproto.a: $(PROTO_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

# Unit tests: tests/unit/test_proto*.c, linked with libkvsproto.a.
PROTO_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_proto*.c))
UNIT_TESTS += $(PROTO_TESTS)
$(PROTO_TESTS:%=%.o): | $(PROTO_GEN_H)
$(PROTO_TESTS): $(BUILD)/%: $(BUILD)/%.o $(BUILD)/libkvsproto.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkvsproto.a $(PROTO_LIBS) $(TEST_LIBS)
