/* Inspection entry points of thaw's CUDA driver emulator (libcuda.so.1 built from emu/).
 *
 * These are not CUDA API: they exist so tests can check exactly what the emulated
 * driver holds (bytes, handles, mappings) and so leak checks are exact. Resolve them
 * with dlsym(RTLD_DEFAULT, "thawEmuGetDeviceStats") or link the emulator directly.
 * On NVIDIA's driver these symbols do not exist.
 */
#ifndef THAW_EMU_INSPECT_H
#define THAW_EMU_INSPECT_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ThawEmuDeviceStats {
  unsigned long long capacity_bytes;       /* total memory of the emulated device */
  unsigned long long device_bytes_in_use;  /* physical bytes held by all live processes */
  unsigned long long process_bytes_in_use; /* physical bytes this process holds a reference to */
  unsigned long long physical_allocations; /* live physical allocations referenced by this process
                                              (cuMemCreate/import and cuMemAlloc backings) */
  unsigned long long vmm_handle_refs;      /* outstanding CUmemGenericAllocationHandle references */
  unsigned long long vmm_mappings;         /* live cuMemMap mappings on this device's memory */
  unsigned long long legacy_allocations;   /* live cuMemAlloc allocations */
  unsigned long long ipc_mappings;         /* live cuIpcOpenMemHandle mappings */
} ThawEmuDeviceStats;

typedef struct ThawEmuProcessStats {
  unsigned long long contexts;       /* live contexts (primary contexts count while active) */
  unsigned long long streams;        /* live user-created streams */
  unsigned long long events;         /* live events */
  unsigned long long reservations;   /* live cuMemAddressReserve ranges */
  unsigned long long reserved_bytes; /* bytes of VA reserved */
  unsigned long long
      pinned_host_ranges;         /* cuMemHostAlloc / cuMemAllocHost / cuMemHostRegister ranges */
  unsigned long long trace_lines; /* lines written to THAW_EMU_TRACE so far */
} ThawEmuProcessStats;

/* Both return a CUresult value: CUDA_SUCCESS, CUDA_ERROR_NOT_INITIALIZED before cuInit,
 * CUDA_ERROR_INVALID_VALUE for a NULL out pointer, CUDA_ERROR_INVALID_DEVICE for a bad ordinal. */
int thawEmuGetDeviceStats(int device, ThawEmuDeviceStats* out);
int thawEmuGetProcessStats(ThawEmuProcessStats* out);

/* A canonical description of an executable graph or a graph, for comparing the graphs of two
 * processes node for node (the CUDA driver API has no query of an executable graph's nodes).
 * On success *json is a NUL-terminated JSON document the caller releases with free():
 *
 *   {"kind": "exec" | "graph",
 *    "nodes": [ {"type": "kernel", "name": "<mangled>", "module": "emu-fnv1a64:<16 hex>",
 *                "grid": [x,y,z], "block": [x,y,z], "shared_bytes": n, "priority": n,
 *                "params": "<hex of the parameter bank>", "cluster": [x,y,z] (0s: none),
 *                "cluster_policy": n, "cooperative": 0|1, "mem_sync_domain": n,
 *                "mem_sync_map": [default, remote], "carveout": n (4294967295: default)},
 *               {"type": "memset", "dst": "0x..", "pitch": n, "value": n, "element_size": n,
 *                "width": n, "height": n},
 *               {"type": "memcpy", "dst": "0x..", "src": "0x..", "bytes": n,
 *                "dst_device": bool, "src_device": bool},
 *               {"type": "batch_mem_op", "address": "0x..", "value": n, "size": n, "flags": n},
 *               {"type": "host" | "empty" | "wait_event" | "event_record" | ...}, ... ],
 *    "edges": [[from, to], ...]}
 *
 * Nodes are in a topological order in which ties (nodes ready at once) go by their
 * description, so two graphs built in different creation orders describe alike; edges are
 * index pairs into "nodes", sorted. Nothing process-specific is included: no handles, no
 * contexts, no host function or event identities. A kernel is its mangled name and its module,
 * "module" being a digest (FNV-1a 64) of what the emulator parsed from the image (SM, image
 * size, kernels and their parameter layouts, globals and their initial bytes) - equal for the
 * same image in any process, but not the SHA-256 of the image bytes that thaw's recorder uses
 * (the emulator does not keep the bytes). Device pointers (in "params" too) are equal across
 * processes only where allocations land at the same addresses (thaw's deterministic layout).
 *
 * Return a CUresult value: CUDA_SUCCESS, CUDA_ERROR_NOT_INITIALIZED before cuInit,
 * CUDA_ERROR_INVALID_VALUE for a NULL json pointer or a handle that names no live executable
 * graph (graph), CUDA_ERROR_OUT_OF_MEMORY when the document cannot be allocated. */
struct CUgraphExec_st;
struct CUgraph_st;
int thawEmuDescribeGraphExec(struct CUgraphExec_st* exec, char** json);
int thawEmuDescribeGraph(struct CUgraph_st* graph, char** json);

#ifdef __cplusplus
}
#endif
#endif
