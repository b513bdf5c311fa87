# proto/: status codes, the .proto (compiled at build time), framing.
PROTO_OBJS := $(BUILD)/proto/kvs_status.o
