/*
 * cuda_fatbin.S — embeds the fatbin nvcc built from gpu/kernels.cu (path in
 * KVS_FATBIN, given by gpu/module.mk) as kvs__cuda_fatbin[kvs__cuda_fatbin_size].
 * Built only when nvcc is installed; cuda_nofatbin.c stands in otherwise.
 */
	.section .rodata.kvs_fatbin, "a"
	.balign 64
	.globl kvs__cuda_fatbin
	.hidden kvs__cuda_fatbin
	.type kvs__cuda_fatbin, @object
kvs__cuda_fatbin:
	.incbin KVS_FATBIN
kvs__cuda_fatbin_end:
	.byte 0
	.balign 8
	.globl kvs__cuda_fatbin_size
	.hidden kvs__cuda_fatbin_size
	.type kvs__cuda_fatbin_size, @object
kvs__cuda_fatbin_size:
	.quad kvs__cuda_fatbin_end - kvs__cuda_fatbin
	.section .note.GNU-stack, "", @progbits
