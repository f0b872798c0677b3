// Small C helpers Swift has no spelling for.
#ifndef TIDEMARK_SHIMS_H
#define TIDEMARK_SHIMS_H

// Asks the CPU to start loading the cache line at `address` (for reading, kept briefly): a probe of a
// large hash table issued one row ahead finds its slot in cache instead of waiting on memory.
static inline void tidemark_prefetch(const void *address) { __builtin_prefetch(address, 0, 1); }

#endif
