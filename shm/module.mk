# shm/: the layout header (kvs_layout.h) and what processes share.
SHM_OBJS :=
