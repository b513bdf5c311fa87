/*
 * bench_tiers — the tiers' byte movers against their baselines, same run.
 *
 * 1. Disk tier (daemon/tiers/tier_disk.c: io_uring, registered buffers and file,
 *    O_DIRECT, a 4 KiB header and an XXH3 checksum per slot): write then
 *    read every slot of a file, queue depth QD, at block sizes 64-512 KiB,
 *    against fio (ioengine io_uring, direct=1, the same file, the same
 *    request size - block + header - and iodepth), REPS interleaved
 *    pairs, the median of the pairs' ratios reported.  Target >= 0.9x.
 * 2. Host-tier copies (the copy engine's COPY_TO_HOST / COPY_FROM_HOST on
 *    the host pool) against memcpy of the same blocks.  Target >= 0.8x.
 * 2b. On a GPU (the cuda pool): the same copy-engine jobs between device
 *    blocks and pinned host memory (the host tier's case: cuMemHostRegister
 *    and the engine's own stream) against raw pinned copies in the same
 *    run: cuMemcpyDtoHAsync / HtoDAsync of the same blocks on a stream of
 *    the bench's, and one contiguous cuMemcpy of the same bytes (the
 *    ceiling).  Target >= 0.8x.  Last, a job of two blocks: what a job
 *    costs the engine beyond the copies.  Without a GPU it says why and skips; on
 *    the stand-in driver (KVS_CUDA_DRIVER) it runs, and its figures are the
 *    stand-in's memcpy, which say nothing about a GPU.
 * 3. The start-up scan of a kept disk tier (disk_tier_persist): every slot
 *    of a file of SCAN_SLOTS slots written, the file closed and reopened,
 *    every header read and checked (tier_disk_scan).  A time, no target.
 *
 * `bench_tiers scan` runs 3 alone, `bench_tiers gpu` 2b alone;
 * `bench_tiers disk [KIB ...]` runs 1
 * alone, at the block sizes named (default 64 128 256 512), with
 * KVS_BENCH_REPS pairs (default 15) over a file of KVS_BENCH_FILE_MB MiB
 * (default 256).
 * KVS_BENCH_DIR: where the test file goes (default: the build directory;
 * not /tmp, which may be tmpfs, where O_DIRECT is refused).  Skips (77)
 * without fio.  Prints ratios; the times are for orientation only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/pool/backend.h"
#include "daemon/pool/copy.h"
#include "daemon/tiers/tier_disk.h"
#include "gpu/kvs_cuda_int.h"
#include "kvs_status.h"

#define QD 32

static int reps = 15;        /* interleaved tier / fio pairs a block size */
static uint64_t file_mb = 256;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct run {
  tier_disk *d;
  uint32_t next, done, total;
  int write, errors;
  disk_io io[QD];
} run;

static void on_io(disk_io *io);

static void start(run *r, disk_io *io) {
  io->write = r->write;
  io->slot = r->next++;
  io->hash.lo = io->slot;
  io->hash.hi = 7;
  io->cb = on_io;
  io->data = r;
  tier_disk_submit(r->d, io);
}

static void on_io(disk_io *io) {
  run *r = io->data;

  r->errors += io->status != 0;
  r->done++;
  if (r->next < r->total)
    start(r, io);
}

/* Seconds to write (or read) every slot at queue depth QD. */
static double pass(uv_loop_t *loop, tier_disk *d, int write) {
  run r = {.d = d, .total = tier_disk_slots(d), .write = write};
  double t0 = now();

  for (uint32_t i = 0; i < QD && i < r.total; i++) {
    tier_disk_buf_get(d, &r.io[i].buf);
    memset(tier_disk_buf_data(d, r.io[i].buf), 0x5a + (int)i, 4096);
    start(&r, &r.io[i]);
  }
  while (r.done < r.total)
    uv_run(loop, UV_RUN_ONCE);
  double dt = now() - t0;
  for (uint32_t i = 0; i < QD && i < r.total; i++)
    tier_disk_buf_put(d, r.io[i].buf);
  if (r.errors) {
    fprintf(stderr, "bench_tiers: %d I/O errors\n", r.errors);
    exit(1);
  }
  return dt;
}

/* fio's bandwidth (bytes/s) for the same file, request size and depth. */
static double fio_bw(const char *path, uint64_t bs, uint64_t size,
                     int write) {
  char cmd[1024], line[4096];
  double bw = -1;
  snprintf(cmd, sizeof cmd,
           "fio --name=kvs --filename=%s --ioengine=io_uring --direct=1 "
           "--rw=%s --bs=%llu --iodepth=%d --size=%llu --numjobs=1 "
           "--output-format=terse --terse-version=3 2>/dev/null",
           path, write ? "write" : "read", (unsigned long long)bs, QD,
           (unsigned long long)size);
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  if (fgets(line, sizeof line, p)) {
    /* terse v3: field 7 read bw KiB/s, field 48 write bw KiB/s */
    char *save = NULL, *f = strtok_r(line, ";", &save);
    for (int i = 1; f; i++, f = strtok_r(NULL, ";", &save))
      if (i == (write ? 48 : 7))
        bw = atof(f) * 1024;
  }
  pclose(p);
  return bw;
}

static void bench_disk(const char *dir, const uint64_t *sizes, size_t nsizes) {
  char path[512], err[256];

  snprintf(path, sizeof path, "%s/bench-tier-%d", dir, (int)getpid());
  printf("disk tier vs fio (io_uring, O_DIRECT, same file and request size, "
         "iodepth %d, %llu MiB file, %d pairs)\n", QD,
         (unsigned long long)file_mb, reps);
  printf("  %-8s %-6s %10s %10s %7s\n", "block", "op", "tier MB/s",
         "fio MB/s", "median ratio of pairs");
  for (size_t i = 0; i < nsizes; i++) {
    uv_loop_t loop;
    tier_disk *d;
    uint64_t slot = 4096 + sizes[i];
    tier_disk_stamp stamp = {16, 1, 1, 1, 0, {0, 0}};

    uv_loop_init(&loop);
    if (tier_disk_open(&loop, path, file_mb << 20, sizes[i],
                       &stamp, QD, NULL, &d, err, sizeof err) < 0) {
      fprintf(stderr, "bench_tiers: %s\n", err);
      exit(1);
    }
    if (!tier_disk_direct(d))
      printf("  (no O_DIRECT on %s: buffered, the ratio means little)\n",
             dir);
    uint64_t bytes = (uint64_t)tier_disk_slots(d) * sizes[i];
    /* Interleaved: the tier writes every slot and reads it back (checked),
     * and fio writes and reads the same file, reps times, the tier first
     * in even pairs and fio first in odd ones (so a disk that speeds up or
     * slows down over the run favours neither).  This disk drifts by tens
     * of percent within a minute, so each pass's ratio is taken against
     * the fio pass beside it, and the median of those is reported (with
     * their range and the best of each side). */
    double tt[2] = {1e9, 1e9}, ff[2] = {0, 0}, *ratio[2];
    uint64_t fsize = (uint64_t)tier_disk_slots(d) * slot;
    ratio[0] = calloc((size_t)reps, sizeof(double));
    ratio[1] = calloc((size_t)reps, sizeof(double));
    for (int rep = 0; rep < reps; rep++) {
      double t[2] = {1, 1}, f[2] = {0, 0};
      for (int side = 0; side < 2; side++) {
        if ((side ^ (rep & 1)) == 0) {
          for (int w = 1; w >= 0; w--) {
            t[w] = pass(&loop, d, w);
            tt[w] = t[w] < tt[w] ? t[w] : tt[w];
          }
        } else {
          for (int w = 1; w >= 0; w--) {
            f[w] = fio_bw(path, slot, fsize, w);
            ff[w] = f[w] > ff[w] ? f[w] : ff[w];
          }
        }
      }
      for (int w = 1; w >= 0; w--)
        ratio[w][rep] = f[w] > 0 ? (double)fsize / t[w] / f[w] : 0;
    }
    for (int w = 1; w >= 0; w--) {
      double tier = (double)fsize / tt[w];
      qsort(ratio[w], (size_t)reps, sizeof(double), cmp_double);
      printf("  %-5lluKiB %-6s %10.0f %10.0f %6.2fx   (pairs: %.2f-%.2fx; "
             "%llu MiB of blocks)\n",
             (unsigned long long)(sizes[i] >> 10), w ? "write" : "read",
             tier / 1e6, ff[w] / 1e6, ratio[w][reps / 2], ratio[w][0],
             ratio[w][reps - 1], (unsigned long long)(bytes >> 20));
    }
    free(ratio[0]);
    free(ratio[1]);
    tier_disk_close(d);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  unlink(path);
}

#define SCAN_SLOTS 10000

static void on_scanned(void *arg, uint32_t slot, uint64_t gen, kvs_hash128 h,
                       const uint32_t *tokens) {
  (void)slot;
  (void)gen;
  (void)h;
  (void)tokens;
  ++*(uint32_t *)arg;
}

static void bench_scan(const char *dir) {
  char path[512], err[256];
  tier_disk_stamp stamp = {16, 2, 1, 64, 0, {1, 2}};
  const uint64_t block = 4096, bytes = SCAN_SLOTS * (4096 + block);

  snprintf(path, sizeof path, "%s/bench-scan-%d", dir, (int)getpid());
  for (int round = 0; round < 2; round++) {
    uv_loop_t loop;
    tier_disk *d;
    tier_disk_scan_stats st;
    uint32_t good = 0;

    uv_loop_init(&loop);
    if (tier_disk_open(&loop, path, bytes, block, &stamp, 512, NULL, &d, err,
                       sizeof err) < 0) {
      fprintf(stderr, "bench_tiers: %s\n", err);
      exit(1);
    }
    if (round == 0) {
      pass(&loop, d, 1); /* every slot written (not restorable: counted) */
    } else {
      double t0 = now();
      if (tier_disk_scan(d, on_scanned, &good, &st) < 0) {
        fprintf(stderr, "bench_tiers: the scan failed\n");
        exit(1);
      }
      double dt = now() - t0;
      printf("disk tier start-up scan: %u slot headers read and checked in "
             "%.1f ms (%s, queue depth 512; %u private copies)\n", st.slots,
             dt * 1e3, tier_disk_direct(d) ? "O_DIRECT" : "buffered",
             st.private_copies);
      if (st.private_copies != SCAN_SLOTS || good != 0) {
        fprintf(stderr, "bench_tiers: the scan saw %u of %u headers\n",
                st.private_copies, SCAN_SLOTS);
        exit(1);
      }
    }
    tier_disk_close(d);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  unlink(path);
}

static int copied;
static void on_copy(copy_job *j) {
  (void)j;
  copied = 1;
}

static void bench_host(void) {
  cfg c;
  kvs_layout l;
  backend *b;
  copy_engine e;
  uv_loop_t loop;
  char err[256];
  const uint32_t n = 256;

  cfg_init(&c);
  cfg_set(&c, "backend", "host", err, sizeof err);
  cfg_set(&c, "pool_blocks", "512", err, sizeof err);
  cfg_set(&c, "num_layers", "32", err, sizeof err);
  cfg_set(&c, "num_kv_heads", "8", err, sizeof err);
  cfg_set(&c, "head_dim", "128", err, sizeof err);
  cfg_set(&c, "dtype", "fp16", err, sizeof err);
  cfg_set(&c, "block_size", "1", err, sizeof err); /* 128 KiB blocks */
  cfg_set(&c, "socket", "/nonexistent/bench.sock", err, sizeof err);
  if (cfg_finish(&c, err, sizeof err) < 0 ||
      backend_open(&c, (l = c.layout, &l), &b, err, sizeof err) < 0) {
    fprintf(stderr, "bench_tiers: %s\n", err);
    exit(1);
  }
  uv_loop_init(&loop);
  copy_engine_init(&e, &loop, b);
  uint64_t stride = l.block_stride;
  uint8_t *host = aligned_alloc(4096, n * stride);
  void **ptrs = malloc(n * sizeof *ptrs);
  uint32_t *blocks = malloc(n * sizeof *blocks);
  for (uint32_t i = 0; i < n; i++) {
    ptrs[i] = host + i * stride;
    blocks[i] = (i * 7) % l.num_blocks;
  }
  memset(host, 1, n * stride);
  memset(b->base, 2, kvs_pool_bytes(&l));
  printf("host-tier copies vs memcpy (%u blocks of %llu KiB, the copy "
         "engine on the host pool)\n", n, (unsigned long long)(stride >> 10));
  for (int kind = 0; kind < 2; kind++) {
    double best_e = 1e9, best_m = 1e9;
    for (int rep = 0; rep < 7; rep++) {
      copy_job j = {.kind = kind ? COPY_FROM_HOST : COPY_TO_HOST,
                    .blocks = blocks, .host = ptrs, .n = n, .cb = on_copy};
      double t0 = now();
      copied = 0;
      copy_submit(&e, &j);
      while (!copied)
        uv_run(&loop, UV_RUN_ONCE);
      double te = now() - t0;
      t0 = now();
      for (uint32_t i = 0; i < n; i++) {
        uint8_t *pb = (uint8_t *)b->base + blocks[i] * stride;
        if (kind)
          memcpy(pb, ptrs[i], stride);
        else
          memcpy(ptrs[i], pb, stride);
      }
      double tm = now() - t0;
      best_e = te < best_e ? te : best_e;
      best_m = tm < best_m ? tm : best_m;
    }
    double bytes = (double)n * stride;
    printf("  %-14s engine %6.2f GB/s  memcpy %6.2f GB/s  ratio %.2fx\n",
           kind ? "host -> pool" : "pool -> host", bytes / best_e / 1e9,
           bytes / best_m / 1e9, best_m / best_e);
  }
  copy_engine_close(&e);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  backend_close(b);
  free(host);
  free(ptrs);
  free(blocks);
}

/* 2b: n blocks of `tokens`-token blocks (128 KiB a token) between the
 * cuda pool and pinned host memory, the engine against raw copies. */
static void gpu_copies(uint32_t n, const char *tokens, const char *layers) {
  cfg c;
  kvs_layout l;
  backend *b;
  copy_engine e;
  uv_loop_t loop;
  CUstream s;
  char err[256];

  cfg_init(&c);
  cfg_set(&c, "backend", "cuda", err, sizeof err);
  cfg_set(&c, "pool_blocks", "512", err, sizeof err);
  cfg_set(&c, "num_layers", layers, err, sizeof err);
  cfg_set(&c, "num_kv_heads", "8", err, sizeof err);
  cfg_set(&c, "head_dim", "128", err, sizeof err);
  cfg_set(&c, "dtype", "fp16", err, sizeof err);
  cfg_set(&c, "block_size", tokens, err, sizeof err);
  cfg_set(&c, "socket", "/nonexistent/bench.sock", err, sizeof err);
  if (cfg_finish(&c, err, sizeof err) < 0 ||
      backend_open(&c, (l = c.layout, &l), &b, err, sizeof err) < 0) {
    printf("device <-> host: skipped (%s)\n", err);
    return;
  }
  uint64_t stride = l.block_stride, bytes = (uint64_t)n * stride;
  uint8_t *host = aligned_alloc(4096, bytes);
  void **ptrs = malloc(n * sizeof *ptrs);
  uint32_t *blocks = malloc(n * sizeof *blocks);
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)b->base;
  if (!host || !ptrs || !blocks ||
      b->ops->host_register(b, host, bytes) < 0 ||
      kvs__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    fprintf(stderr, "bench_tiers: pinned memory or a stream\n");
    exit(1);
  }
  for (uint32_t i = 0; i < n; i++) {
    ptrs[i] = host + i * stride;
    blocks[i] = (i * 7) % l.num_blocks; /* scattered, as in a pool */
  }
  memset(host, 1, bytes);
  uv_loop_init(&loop);
  copy_engine_init(&e, &loop, b);
  printf("device <-> host, %s (%u blocks of %llu KiB, pinned host memory)\n",
         b->desc, n, (unsigned long long)(stride >> 10));
  CUdeviceptr *bd = malloc(2 * n * sizeof(*bd));
  size_t *bsz = malloc(n * sizeof(*bsz));
  if (!bd || !bsz) {
    fprintf(stderr, "bench_tiers: out of memory\n");
    exit(1);
  }
  for (int kind = 0; kind < 2; kind++) {
    double best_e = 1e9, best_r = 1e9, best_c = 1e9, best_b = 1e9;
    CUresult r = CUDA_SUCCESS;
    for (int rep = 0; rep < 7; rep++) {
      copy_job j = {.kind = kind ? COPY_FROM_HOST : COPY_TO_HOST,
                    .blocks = blocks, .host = ptrs, .n = n, .cb = on_copy};
      double t0 = now();
      copied = 0;
      if (copy_submit(&e, &j) < 0) {
        fprintf(stderr, "bench_tiers: copy_submit\n");
        exit(1);
      }
      while (!copied)
        uv_run(&loop, UV_RUN_ONCE);
      double te = now() - t0;
      if (j.status < 0) {
        fprintf(stderr, "bench_tiers: the engine's copy failed\n");
        exit(1);
      }
      t0 = now();
      for (uint32_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        CUdeviceptr d = base + blocks[i] * stride;
        r = kind ? kvs__cu.cuMemcpyHtoDAsync(d, ptrs[i], stride, s)
                 : kvs__cu.cuMemcpyDtoHAsync(ptrs[i], d, stride, s);
      }
      if (r == CUDA_SUCCESS)
        r = kvs__cu.cuStreamSynchronize(s);
      double tr = now() - t0;
      if (kvs__cu_batch && r == CUDA_SUCCESS) {
        /* the driver's batched copy of the same blocks, raw */
        CUmemcpyAttributes at = {.srcAccessOrder =
                                     CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        size_t idx0 = 0;

        for (uint32_t i = 0; i < n; i++) {
          CUdeviceptr d = base + blocks[i] * stride;
          CUdeviceptr h = (CUdeviceptr)(uintptr_t)ptrs[i];

          bd[i] = kind ? d : h;     /* dsts */
          bd[n + i] = kind ? h : d; /* srcs */
          bsz[i] = stride;
        }
        t0 = now();
        r = kvs__cu.cuMemcpyBatchAsync(bd, bd + n, bsz, n, &at, &idx0, 1, s);
        if (r == CUDA_SUCCESS)
          r = kvs__cu.cuStreamSynchronize(s);
        double tb = now() - t0;
        best_b = tb < best_b ? tb : best_b;
      }
      t0 = now();
      if (r == CUDA_SUCCESS)
        r = kind ? kvs__cu.cuMemcpyHtoD(base, host, bytes)
                 : kvs__cu.cuMemcpyDtoH(host, base, bytes);
      double tc = now() - t0;
      if (r != CUDA_SUCCESS) {
        fprintf(stderr, "bench_tiers: a raw copy failed (%d)\n", (int)r);
        exit(1);
      }
      best_e = te < best_e ? te : best_e;
      best_r = tr < best_r ? tr : best_r;
      best_c = tc < best_c ? tc : best_c;
    }
    printf("  %-14s engine %6.2f GB/s  raw per block %6.2f GB/s (%.2fx)  "
           "one cuMemcpy %6.2f GB/s (%.2fx)",
           kind ? "host -> device" : "device -> host", bytes / best_e / 1e9,
           bytes / best_r / 1e9, best_r / best_e, bytes / best_c / 1e9,
           best_c / best_e);
    if (kvs__cu_batch)
      printf("  raw batched %6.2f GB/s (%.2fx)", bytes / best_b / 1e9,
             best_b / best_e);
    printf("\n");
  }
  free(bd);
  free(bsz);
  copy_engine_close(&e);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  kvs__cu.cuStreamDestroy(s);
  b->ops->host_unregister(b, host);
  backend_close(b);
  free(host);
  free(ptrs);
  free(blocks);
}

static void bench_gpu(void) {
  const char *drv = getenv("KVS_CUDA_DRIVER");

  if (drv && strstr(drv, "standin"))
    printf("(on the stand-in driver %s: the figures below are memcpy on "
           "the CPU and say nothing about a GPU)\n", drv);
  gpu_copies(512, "1", "16"); /* 64 KiB blocks, 32 MiB */
  gpu_copies(256, "1", "32"); /* 128 KiB blocks, 32 MiB */
  gpu_copies(64, "16", "32"); /* 2 MiB blocks, 128 MiB */
  /* a job of two blocks: mostly the engine's fixed cost a job (its
   * completion through cuLaunchHostFunc and the loop's wake-up) against
   * the driver's batched call, which a 32 MiB job pays once too (issue
   * 30, part 4: the engine was 0.87-0.90x that call there) */
  gpu_copies(2, "1", "32");
}

int main(int argc, char **argv) {
  const char *dir = getenv("KVS_BENCH_DIR");
  const char *build = getenv("KVS_BUILD");
  const char *env_reps = getenv("KVS_BENCH_REPS");
  const char *env_mb = getenv("KVS_BENCH_FILE_MB");
  uint64_t sizes[8] = {64 << 10, 128 << 10, 256 << 10, 512 << 10};
  size_t nsizes = 4;
  int disk_only = argc > 1 && strcmp(argv[1], "disk") == 0;

  dir = dir ? dir : build ? build : ".";
  if (argc > 1 && strcmp(argv[1], "scan") == 0) { /* the scan alone */
    bench_scan(dir);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "gpu") == 0) { /* device <-> host alone */
    bench_gpu();
    return 0;
  }
  if (env_reps && (reps = atoi(env_reps)) < 1)
    reps = 1;
  if (env_mb && (file_mb = strtoull(env_mb, NULL, 10)) < 16)
    file_mb = 16;
  if (disk_only && argc > 2) {
    for (nsizes = 0; nsizes + 2 < (size_t)argc && nsizes < 8; nsizes++) {
      long kib = atol(argv[nsizes + 2]);
      if (kib < 4 || kib % 4) {
        fprintf(stderr, "bench_tiers: a block size in KiB, a multiple of 4: "
                "%s\n", argv[nsizes + 2]);
        return 2;
      }
      sizes[nsizes] = (uint64_t)kib << 10;
    }
  }
  if (!disk_only) {
    bench_host();
    bench_gpu();
    bench_scan(dir);
  }
  if (system("fio --version >/dev/null 2>&1") != 0) {
    printf("disk tier: skipped (no fio; apt-get install fio)\n");
    return 0;
  }
  bench_disk(dir, sizes, nsizes);
  return 0;
}
