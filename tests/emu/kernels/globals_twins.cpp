// Host twins of the kernels in globals.cu (see thaw/emu_twin.h). The library's table is
// exported by samples_twins.cpp. read_globals has no twin: a twin cannot see device globals.
#include <atomic>

#include "thaw/emu_twin.h"

extern "C" void add_to(int* target, int by) {
  std::atomic_ref<int>(*target).fetch_add(by);  // atomicAdd(target, by)
}
THAW_EMU_TWIN_PER_THREAD(add_to);
