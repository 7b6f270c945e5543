// Heap split for long soaks (docs/RELIABILITY.md, "Soak"): preloaded into a soak, a thread in
// the llm-canary process writes glibc's malloc_info every MI_SECS seconds (default 60) to
// MI_DIR/mi-PID-SECONDS.xml, so the heap shows what is in use apart from what glibc freed and
// kept. A measurement aid, not part of the daemon; it does nothing in any other process (cargo,
// rustc, the test binary) or without MI_DIR.
//   gcc -O2 -shared -fPIC -o target/malloc-info.so scripts/heap/malloc-info.c -lpthread
//   mkdir -p target/mi && MI_DIR=$PWD/target/mi LD_PRELOAD=$PWD/target/malloc-info.so scripts/soak 8400
//   scripts/heap/summary target/mi
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *loop(void *arg) {
  (void)arg;
  const char *dir = getenv("MI_DIR");
  int secs = getenv("MI_SECS") ? atoi(getenv("MI_SECS")) : 60;
  if (secs <= 0) secs = 60;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct timespec ts = {secs, 0};
    while (nanosleep(&ts, &ts) != 0) {
    }
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    char path[512];
    snprintf(path, sizeof path, "%s/mi-%d-%06ld.xml", dir, (int)getpid(),
             (long)(t.tv_sec - t0.tv_sec));
    FILE *f = fopen(path, "w");
    if (f) {
      malloc_info(0, f);
      fclose(f);
    }
  }
  return NULL;
}

__attribute__((constructor)) static void start(void) {
  char comm[64] = {0};
  FILE *c = fopen("/proc/self/comm", "r");
  if (!c) return;
  int named = fgets(comm, sizeof comm, c) != NULL;
  fclose(c);
  if (!named || strncmp(comm, "llm-canary", 10) != 0 || !getenv("MI_DIR")) return;
  pthread_t th;
  if (pthread_create(&th, NULL, loop, NULL) == 0) pthread_detach(th);
}
