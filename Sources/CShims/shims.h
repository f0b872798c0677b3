// Small C helpers Swift has no spelling for.
#ifndef TIDEMARK_SHIMS_H
#define TIDEMARK_SHIMS_H

// Asks the CPU to start loading the cache line at `address` (for reading, kept briefly): a probe of a
// large hash table issued one row ahead finds its slot in cache instead of waiting on memory.
static inline void tidemark_prefetch(const void *address) { __builtin_prefetch(address, 0, 1); }

// Lowers the CPU priority of the calling thread only (Linux: a thread id names one thread for
// setpriority), by `niceness` steps; raising it back needs no privilege it did not have. Returns 0,
// or -1 with errno set. Elsewhere it does nothing.
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
static inline int tidemark_lower_thread_priority(int niceness) {
    return setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), niceness);
}
#else
static inline int tidemark_lower_thread_priority(int niceness) { (void)niceness; return 0; }
#endif

// Hands the heap's free memory back to the system. glibc keeps what a large peak (a whole read of a
// million devices) freed mapped, so without this a process's resident size stays at its highest
// peak. Returns 1 when memory was released. Elsewhere it does nothing.
#if defined(__linux__)
#include <features.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
static inline int tidemark_release_free_memory(void) { return malloc_trim(0); }
#else
static inline int tidemark_release_free_memory(void) { return 0; }
#endif

// The type of the file system `path` is on (statfs's f_type: NFS is 0x6969), or 0 when it cannot be
// told. Elsewhere than Linux, 0.
#if defined(__linux__)
#include <sys/vfs.h>
static inline unsigned long tidemark_filesystem_type(const char *path) {
    struct statfs info;
    if (statfs(path, &info) != 0) return 0;
    return (unsigned long)info.f_type;
}
#else
static inline unsigned long tidemark_filesystem_type(const char *path) { (void)path; return 0; }
#endif

#endif
