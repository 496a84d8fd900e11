// The GraphRecorder's driver (preload/artifact/graph_recorder.hpp): the driver library's own
// graph, module and library queries, looked up by name once. A query the driver does not
// export answers CUDA_ERROR_NOT_SUPPORTED (the recorder then leaves the graph out).
#pragma once

#include "preload/artifact/graph_recorder.hpp"

namespace thaw::preload {

// nullptr when no driver library is loaded yet, or it lacks what every walk needs
// (cuGraphGetNodes, cuGraphNodeGetType, cuGraphKernelNodeGetParams, cuFuncGetName,
// cuFuncGetModule).
GraphDriver* driver_graph_queries();

}  // namespace thaw::preload
