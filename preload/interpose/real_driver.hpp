// The real things behind the shim: glibc's dlsym and the CUDA driver library.
//
// glibc's dlsym is found with dlvsym(RTLD_NEXT, "dlsym", version) over the versions glibc
// has used (never the private _dl_sym, which broke in containers). The driver library is
// whichever one the engine reaches: the libcuda.so.1 a program links (found with
// RTLD_NEXT), or the handle an engine dlopen()ed and asked for a cu* symbol (recorded by
// the shim's dlsym). Its base address lets hooks tell the driver's own calls from the
// engine's.
#pragma once

#include <cuda.h>

namespace thaw::preload {

using DlsymFn = void* (*)(void*, const char*);
using GetProcAddressV2Fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult*);
using GetProcAddressV1Fn = CUresult (*)(const char*, void**, int, cuuint64_t);

// glibc's dlsym; never null on a glibc system (the shim aborts loading otherwise).
DlsymFn real_dlsym();

// Records the driver library the engine uses, from a handle it looked a cu* symbol up in
// (`symbol` is that symbol's address, to find the library's base).
void note_driver_symbol(void* handle, void* symbol);

// A symbol of the driver library by its exact exported name; nullptr if none is loaded.
void* driver_symbol(const char* name);

// The driver's cuGetProcAddress_v2 / cuGetProcAddress (v1).
GetProcAddressV2Fn real_get_proc_address_v2();
GetProcAddressV1Fn real_get_proc_address_v1();

// Whether `address` (a return address) lies inside the driver library.
bool inside_driver(const void* address);

}  // namespace thaw::preload
