#include "preload/runtime/driver_graph_queries.hpp"

#include <atomic>

#include "preload/interpose/real_driver.hpp"

namespace thaw::preload {

namespace {

template <typename Fn>
void resolve(Fn& out, const char* name) {
  out = reinterpret_cast<Fn>(driver_symbol(name));
}

class DriverGraphQueries final : public GraphDriver {
 public:
  bool load() {
    resolve(get_nodes_, "cuGraphGetNodes");
    resolve(get_edges_v2_, "cuGraphGetEdges_v2");
    resolve(get_edges_v1_, "cuGraphGetEdges");
    resolve(node_type_, "cuGraphNodeGetType");
    resolve(kernel_params_v2_, "cuGraphKernelNodeGetParams_v2");
    resolve(kernel_params_v1_, "cuGraphKernelNodeGetParams");
    resolve(kernel_attribute_, "cuGraphKernelNodeGetAttribute");
    resolve(memset_params_, "cuGraphMemsetNodeGetParams");
    resolve(memcpy_params_, "cuGraphMemcpyNodeGetParams");
    resolve(param_info_, "cuFuncGetParamInfo");
    resolve(func_name_, "cuFuncGetName");
    resolve(func_module_, "cuFuncGetModule");
    resolve(function_count_, "cuModuleGetFunctionCount");
    resolve(enumerate_functions_, "cuModuleEnumerateFunctions");
    resolve(kernel_count_, "cuLibraryGetKernelCount");
    resolve(enumerate_kernels_, "cuLibraryEnumerateKernels");
    resolve(kernel_name_, "cuKernelGetName");
    resolve(library_module_, "cuLibraryGetModule");
    resolve(kernel_function_, "cuKernelGetFunction");
    resolve(graph_create_, "cuGraphCreate");
    resolve(add_kernel_node_, "cuGraphAddKernelNode_v2");
    resolve(graph_destroy_, "cuGraphDestroy");
    return get_nodes_ != nullptr && node_type_ != nullptr &&
           (kernel_params_v2_ != nullptr || kernel_params_v1_ != nullptr) &&
           func_name_ != nullptr && func_module_ != nullptr;
  }

  CUresult graph_nodes(CUgraph graph, std::vector<CUgraphNode>& out) override {
    std::size_t n = 0;
    if (CUresult r = get_nodes_(graph, nullptr, &n); r != CUDA_SUCCESS) return r;
    out.resize(n);
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult r = get_nodes_(graph, out.data(), &n); r != CUDA_SUCCESS) return r;
    out.resize(n);
    return CUDA_SUCCESS;
  }

  CUresult graph_edges(CUgraph graph,
                       std::vector<std::pair<CUgraphNode, CUgraphNode>>& out) override {
    std::size_t n = 0;
    std::vector<CUgraphNode> from, to;
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (get_edges_v2_ != nullptr) {
      if (r = get_edges_v2_(graph, nullptr, nullptr, nullptr, &n); r != CUDA_SUCCESS) return r;
      from.resize(n);
      to.resize(n);
      if (n != 0) r = get_edges_v2_(graph, from.data(), to.data(), nullptr, &n);
    } else if (get_edges_v1_ != nullptr) {
      if (r = get_edges_v1_(graph, nullptr, nullptr, &n); r != CUDA_SUCCESS) return r;
      from.resize(n);
      to.resize(n);
      if (n != 0) r = get_edges_v1_(graph, from.data(), to.data(), &n);
    }
    if (r != CUDA_SUCCESS) return r;
    out.clear();
    for (std::size_t i = 0; i < n && i < from.size(); ++i) out.emplace_back(from[i], to[i]);
    return CUDA_SUCCESS;
  }

  CUresult node_type(CUgraphNode node, CUgraphNodeType& out) override {
    return node_type_(node, &out);
  }

  CUresult kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS& out) override {
    out = {};
    if (kernel_params_v2_ != nullptr) return kernel_params_v2_(node, &out);
    CUDA_KERNEL_NODE_PARAMS_v1 v1{};
    const CUresult r = kernel_params_v1_(node, &v1);
    if (r != CUDA_SUCCESS) return r;
    out.func = v1.func;
    out.gridDimX = v1.gridDimX;
    out.gridDimY = v1.gridDimY;
    out.gridDimZ = v1.gridDimZ;
    out.blockDimX = v1.blockDimX;
    out.blockDimY = v1.blockDimY;
    out.blockDimZ = v1.blockDimZ;
    out.sharedMemBytes = v1.sharedMemBytes;
    out.kernelParams = v1.kernelParams;
    out.extra = v1.extra;
    return CUDA_SUCCESS;
  }

  CUresult attribute_defaults(CUfunction f, const std::vector<graphs::ParamSlot>& params,
                              graphs::AttributeDefaults& out) override {
    if (graph_create_ == nullptr || add_kernel_node_ == nullptr || graph_destroy_ == nullptr ||
        kernel_attribute_ == nullptr) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    KernelNodeProbe probe;
    probe.graph_create = [this](CUgraph& g) { return graph_create_(&g, 0); };
    probe.add_kernel_node = [this](CUgraph g, const CUDA_KERNEL_NODE_PARAMS& p, CUgraphNode& n) {
      return add_kernel_node_(&n, g, nullptr, 0, &p);
    };
    probe.get_attribute = [this](CUgraphNode n, CUkernelNodeAttrID id, CUkernelNodeAttrValue& v) {
      return kernel_attribute_(n, id, &v);
    };
    probe.graph_destroy = [this](CUgraph g) { return graph_destroy_(g); };
    return probe_kernel_node_defaults(probe, f, params, out);
  }

  CUresult kernel_attribute(CUgraphNode node, CUkernelNodeAttrID id,
                            CUkernelNodeAttrValue& out) override {
    if (kernel_attribute_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return kernel_attribute_(node, id, &out);
  }

  CUresult memset_params(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS& out) override {
    if (memset_params_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return memset_params_(node, &out);
  }

  CUresult memcpy_params(CUgraphNode node, CUDA_MEMCPY3D& out) override {
    if (memcpy_params_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return memcpy_params_(node, &out);
  }

  CUresult param_info(CUfunction f, std::size_t index, std::size_t& offset,
                      std::size_t& size) override {
    if (param_info_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return param_info_(f, index, &offset, &size);
  }

  CUresult function_name(CUfunction f, std::string& out) override {
    const char* name = nullptr;
    if (CUresult r = func_name_(&name, f); r != CUDA_SUCCESS) return r;
    out = name != nullptr ? name : "";
    return CUDA_SUCCESS;
  }

  CUresult function_module(CUfunction f, CUmodule& out) override { return func_module_(&out, f); }

  CUresult module_functions(CUmodule m, std::vector<CUfunction>& out) override {
    if (function_count_ == nullptr || enumerate_functions_ == nullptr) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    unsigned n = 0;
    if (CUresult r = function_count_(&n, m); r != CUDA_SUCCESS) return r;
    out.assign(n, nullptr);
    if (n == 0) return CUDA_SUCCESS;
    return enumerate_functions_(out.data(), n, m);
  }

  CUresult library_kernels(CUlibrary l, std::vector<CUkernel>& out) override {
    if (kernel_count_ == nullptr || enumerate_kernels_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    if (CUresult r = kernel_count_(&n, l); r != CUDA_SUCCESS) return r;
    out.assign(n, nullptr);
    if (n == 0) return CUDA_SUCCESS;
    return enumerate_kernels_(out.data(), n, l);
  }

  CUresult kernel_name(CUkernel k, std::string& out) override {
    if (kernel_name_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    const char* name = nullptr;
    if (CUresult r = kernel_name_(&name, k); r != CUDA_SUCCESS) return r;
    out = name != nullptr ? name : "";
    return CUDA_SUCCESS;
  }

  CUresult library_module(CUlibrary l, CUmodule& out) override {
    if (library_module_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return library_module_(&out, l);
  }

  CUresult kernel_function(CUkernel k, CUfunction& out) override {
    if (kernel_function_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return kernel_function_(&out, k);
  }

 private:
  CUresult (*get_nodes_)(CUgraph, CUgraphNode*, size_t*) = nullptr;
  CUresult (*get_edges_v2_)(CUgraph, CUgraphNode*, CUgraphNode*, CUgraphEdgeData*,
                            size_t*) = nullptr;
  CUresult (*get_edges_v1_)(CUgraph, CUgraphNode*, CUgraphNode*, size_t*) = nullptr;
  CUresult (*node_type_)(CUgraphNode, CUgraphNodeType*) = nullptr;
  CUresult (*kernel_params_v2_)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*kernel_params_v1_)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1*) = nullptr;
  CUresult (*kernel_attribute_)(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue*) = nullptr;
  CUresult (*memset_params_)(CUgraphNode, CUDA_MEMSET_NODE_PARAMS*) = nullptr;
  CUresult (*memcpy_params_)(CUgraphNode, CUDA_MEMCPY3D*) = nullptr;
  CUresult (*param_info_)(CUfunction, size_t, size_t*, size_t*) = nullptr;
  CUresult (*func_name_)(const char**, CUfunction) = nullptr;
  CUresult (*func_module_)(CUmodule*, CUfunction) = nullptr;
  CUresult (*function_count_)(unsigned*, CUmodule) = nullptr;
  CUresult (*enumerate_functions_)(CUfunction*, unsigned, CUmodule) = nullptr;
  CUresult (*kernel_count_)(unsigned*, CUlibrary) = nullptr;
  CUresult (*enumerate_kernels_)(CUkernel*, unsigned, CUlibrary) = nullptr;
  CUresult (*kernel_name_)(const char**, CUkernel) = nullptr;
  CUresult (*library_module_)(CUmodule*, CUlibrary) = nullptr;
  CUresult (*kernel_function_)(CUfunction*, CUkernel) = nullptr;
  CUresult (*graph_create_)(CUgraph*, unsigned) = nullptr;
  CUresult (*add_kernel_node_)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                               const CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*graph_destroy_)(CUgraph) = nullptr;
};

}  // namespace

GraphDriver* driver_graph_queries() {
  // Lives for the whole process (hooks run during exit); built once a driver is there.
  static std::atomic<DriverGraphQueries*> built{nullptr};
  if (DriverGraphQueries* q = built.load(std::memory_order_acquire)) return q;
  auto* q = new DriverGraphQueries();
  if (!q->load()) {
    delete q;
    return nullptr;
  }
  DriverGraphQueries* expected = nullptr;
  if (!built.compare_exchange_strong(expected, q, std::memory_order_acq_rel)) {
    delete q;
    return expected;
  }
  return q;
}

}  // namespace thaw::preload
