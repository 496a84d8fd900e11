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

#ifdef __cplusplus
}
#endif
#endif
