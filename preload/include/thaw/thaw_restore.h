/* thaw_restore.h — the restore ABI of libthaw-preload.so, version 2.
 *
 * thaw works under an unmodified engine; some savings need the engine's consent. This ABI is
 * how an engine that opts in skips work whose outcome thaw recorded on an earlier run of the
 * same engine, model, GPU and driver. Version 1 covers KV-cache initialisation (MEDUSA §6):
 * instead of its profiling forward pass, the engine asks for the KV-cache size that pass
 * decided last time, and gets it only where nothing it sized from has changed since.
 *
 * FINDING IT. The functions below exist only in a process running under thaw
 * (LD_PRELOAD=libthaw-preload.so). An engine must not link against them: it looks each one up
 * at run time and falls back to its own path when any is missing —
 *
 *     typedef uint32_t (*thaw_restore_abi_version_fn)(void);
 *     thaw_restore_abi_version_fn version =
 *         (thaw_restore_abi_version_fn)dlsym(RTLD_DEFAULT, "thaw_restore_abi_version");
 *     if (version == NULL || version() < 1) { profile as usual }
 *
 * and the same for thaw_restore_kv_lookup and thaw_restore_kv_record. A newer shim keeps
 * answering version 1's calls as documented here; thaw_restore_abi_version() says the highest
 * version it implements.
 *
 * VERSION 2 adds CUDA graphs (MEDUSA §5, Foundry): instead of warming up and capturing a graph,
 * the engine asks for the one an earlier run captured under the same label — see THE GRAPH
 * CALLS below. Version 1's calls, codes and structs are unchanged; an engine that needs only
 * them checks version() >= 1, one that asks for graphs checks version() >= 2 and looks up
 * thaw_restore_graph_label and thaw_restore_graph.
 *
 * THE KV CALLS. Call thaw_restore_kv_lookup after the model's weights and the engine's
 * persistent buffers are allocated and before the profiling pass, on a thread whose current
 * CUDA context is the device the KV cache is for. With THAW_RESTORE_OK, allocate the
 * returned cache and skip the pass. With anything else, profile as usual, allocate the cache,
 * and then report what the pass decided with thaw_restore_kv_record (same key, same thread
 * and device): the next run finds it.
 *
 * The configuration key is the engine's own description of everything that determines its
 * KV-cache size besides the device and the model — e.g. "gpu_memory_utilization=0.9
 * max_model_len=4096 block_size=16 max_num_seqs=256 max_num_batched_tokens=8192 dtype=f16".
 * thaw compares it byte for byte and never interprets it; 1 to THAW_RESTORE_MAX_KEY_BYTES
 * printable ASCII bytes (0x20-0x7e).
 *
 * What thaw checks itself (a record that fails any check is STALE, never returned):
 *   - the engine binary, the model (opened from thaw's cache), the GPU's name and the driver
 *     version: a record is stored and found under these (and under the engine's command line,
 *     falling back to another command line's record, which the key then tells apart);
 *   - the configuration key;
 *   - the device's total memory (cuDeviceTotalMem);
 *   - what cuMemGetInfo answers the engine at the lookup: its total (the memory budget — under
 *     thawd a lent or slot budget) exactly, its free bytes within 1/256 of the total;
 *   - the device memory the engine holds at the lookup (its weights and buffers, as thaw's
 *     allocation hooks count them).
 * What the engine checks: that the record's block_bytes is still its own block size (the
 * model's shape and KV dtype), and anything else it knows thaw cannot see.
 *
 * THE GRAPH CALLS (version 2). A label is the engine's own name for a graph it captures — e.g.
 * "decode batch=8" — printable ASCII (0x20-0x7e), 1 to THAW_RESTORE_MAX_KEY_BYTES bytes; thaw
 * compares it byte for byte. For each graph the engine would capture:
 *   1. thaw_restore_graph(label, flags, &exec, ...): THAW_RESTORE_OK gives an instantiated
 *      CUgraphExec (cuGraphInstantiateWithFlags with `flags`) that does what the recorded capture
 *      did; the engine skips that graph's warm-ups and capture, launches it as its own and
 *      destroys it with cuGraphExecDestroy. Call it where the engine would begin the capture —
 *      after its model, buffers and KV cache are allocated and its kernels loaded — on a thread
 *      whose current context is the device's.
 *   2. With any other code: thaw_restore_graph_label(label, ...), then warm up and capture as
 *      usual. The shim records the next capture that begins (on any thread) under that label,
 *      and stores the run's graphs in thawd at exit, for the next run.
 * thaw hands out a graph only when every pointer in it means what it meant when it was recorded
 * (otherwise the code says why, and the engine captures): this run follows the deterministic
 * device layout the graph was recorded in (the same allocation sequence so far), it has made
 * exactly as many allocations as when the graph's capture began, each kernel's module image (by
 * SHA-256) was loaded by this run, and every device address in the graph lies in an allocation
 * live now. What thaw cannot see the engine must put into the label: anything that changes what
 * it would capture without changing its allocations (e.g. a kernel chosen at run time).
 *
 * RETURN CODES. Every call returns one of the THAW_RESTORE_* codes below; `why` (when not
 * NULL and why_size > 0) receives a one-line, NUL-terminated, printable explanation of any
 * code other than THAW_RESTORE_OK (truncated to why_size - 1 bytes).
 *
 * THREAD SAFETY. Every function may be called from any thread at any time; calls are
 * serialised inside the shim. The answers describe the calling thread's current context.
 * After fork(), a child starts with no lookup made (the parent's does not count).
 *
 * This header is plain C (C99 and C++), with fixed-width types only.
 */
#ifndef THAW_RESTORE_H
#define THAW_RESTORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes. */
#define THAW_RESTORE_ABI_VERSION 2u

/* The longest configuration key, in bytes (without the NUL). */
#define THAW_RESTORE_MAX_KEY_BYTES 4096u

/* Return codes. */
/* The call did what it says (lookup: a valid record is in *out). */
#define THAW_RESTORE_OK 0
/* lookup: thawd holds no KV record for this engine, model, GPU and driver.
   graph: no graphs record for them, or none labelled so in it. */
#define THAW_RESTORE_NONE 1
/* lookup: a record exists, but something it was sized from differs now (why says what).
   graph: this run does not follow the device layout the graphs were recorded in. */
#define THAW_RESTORE_STALE 2
/* lookup: the stored record was refused — unreadable, of an unknown version, inconsistent. */
#define THAW_RESTORE_CORRUPT 3
/* Nothing to look up or record with: no thawd, the model was not opened from thaw's cache,
   no current context, or the shim is disabled (THAW_PRELOAD_DISABLE). record: not stored. */
#define THAW_RESTORE_UNAVAILABLE 4
/* A NULL pointer, a key that is empty, too long or not printable ASCII, a struct_size this
   shim does not know, or values that contradict one another (record). */
#define THAW_RESTORE_INVALID_ARGUMENT 5
/* record: no lookup with this key was made in this process before (the lookup is where thaw
   observes the conditions the profiling pass sizes from). */
#define THAW_RESTORE_NO_LOOKUP 6
/* graph (version 2): the recorded graph does not fit this run — captured after another number
   of allocations, a kernel of a module image this run has not loaded, a device address outside
   the allocations live now, a node a restore cannot rebuild, or the driver refused to build or
   instantiate it. */
#define THAW_RESTORE_MISMATCH 7

/* CUgraphExec of cuda.h, declared here without it. */
struct CUgraphExec_st;

/* A KV-cache size. Set struct_size to sizeof(thaw_restore_kv) before every call: it tells a
   later shim which version of the struct the caller has. */
typedef struct thaw_restore_kv {
  uint32_t struct_size;
  uint32_t reserved; /* 0 */
  /* Bytes of the whole KV cache on this device (all layers, K and V):
     num_blocks * block_bytes. */
  uint64_t kv_bytes;
  /* Number of KV blocks (pages) the cache holds; at least 1. */
  uint64_t num_blocks;
  /* Bytes of one block across all layers of this device, K and V; at least 1. */
  uint64_t block_bytes;
} thaw_restore_kv;

/* The highest ABI version the shim implements (1 for this header). Never fails. */
uint32_t thaw_restore_abi_version(void);

/* Looks up the KV-cache size recorded for this engine, model, device and `config_key`.
   THAW_RESTORE_OK: *out holds it (out->struct_size must be set by the caller, and stays).
   THAW_RESTORE_NONE, _STALE, _CORRUPT, _UNAVAILABLE: profile; *out is untouched.
   Also notes the conditions thaw checks (see above) for a later thaw_restore_kv_record. */
int thaw_restore_kv_lookup(const char* config_key, thaw_restore_kv* out, char* why,
                           size_t why_size);

/* Records what the profiling pass decided, for the key of this process's last lookup, with
   the conditions noted at that lookup. Call it once the cache is allocated. Replaces the
   stored record (a stale or corrupt one included). THAW_RESTORE_OK: stored in thawd. */
int thaw_restore_kv_record(const char* config_key, const thaw_restore_kv* kv, char* why,
                           size_t why_size);

/* Version 2. The graph recorded under `label` on an earlier run, rebuilt and instantiated with
   cuGraphInstantiateWithFlags(`flags`) in the calling thread's current context.
   THAW_RESTORE_OK: *exec holds it (the caller's, as if it had instantiated it).
   THAW_RESTORE_NONE, _STALE, _CORRUPT, _MISMATCH, _UNAVAILABLE: capture as usual (after
   thaw_restore_graph_label); *exec is untouched. */
int thaw_restore_graph(const char* label, unsigned long long flags, struct CUgraphExec_st** exec,
                       char* why, size_t why_size);

/* Version 2. The next stream capture to begin, on any thread, is recorded under `label` (a
   later call before it begins replaces the label). THAW_RESTORE_OK: noted;
   THAW_RESTORE_UNAVAILABLE: this run's graphs are not recorded (no deterministic layout, the
   shim disabled, no driver yet). */
int thaw_restore_graph_label(const char* label, char* why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* THAW_RESTORE_H */
