/*
 * kvs_asan.h — KVS_ASAN is 1 in a build under AddressSanitizer (gcc says
 * so with __SANITIZE_ADDRESS__, clang with __has_feature), else 0.  For
 * the code that must behave differently there: keep no freed memory for
 * reuse, count the heap through the sanitizer's allocator, run the largest
 * cases of a slow test in the plain build only.
 */
#ifndef KVS_ASAN_H
#define KVS_ASAN_H

#if defined(__SANITIZE_ADDRESS__)
#define KVS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVS_ASAN 1
#endif
#endif
#ifndef KVS_ASAN
#define KVS_ASAN 0
#endif

#endif
