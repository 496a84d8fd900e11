/* thaw_restore.h compiles as C (C99+): no C++ types, no C++ keywords. */
#include "thaw/thaw_restore.h"

int thaw_restore_header_c_struct_size(void);
int thaw_restore_header_c_struct_size(void) {
  thaw_restore_kv kv = {sizeof(thaw_restore_kv), 0, 0, 0, 0};
  return (int)kv.struct_size;
}
