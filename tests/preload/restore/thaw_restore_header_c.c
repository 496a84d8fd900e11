/* thaw_restore.h compiles as C (C99+): no C++ types, no C++ keywords. */
#include "thaw/thaw_restore.h"

int thaw_restore_header_c_struct_size(void);
int thaw_restore_header_c_struct_size(void) {
  thaw_restore_kv kv = {sizeof(thaw_restore_kv), 0, 0, 0, 0};
  return (int)kv.struct_size;
}

/* Version 2's graph calls have C types too. */
typedef int (*graph_fn)(const char*, unsigned long long, struct CUgraphExec_st**, char*, size_t);
typedef int (*graph_label_fn)(const char*, char*, size_t);
int thaw_restore_header_c_graph_fns(graph_fn g, graph_label_fn l);
int thaw_restore_header_c_graph_fns(graph_fn g, graph_label_fn l) {
  return g != 0 && l != 0 && THAW_RESTORE_MISMATCH == 7;
}
