# The parser core's sources, listed once for thaw_common_safetensors_core (CMakeLists.txt) and
# for tests/fuzz, which compiles them into its libFuzzer target with the fuzzer's coverage
# instrumentation (and, configured on its own with clang 14, has no thaw targets at all).
set(THAW_SAFETENSORS_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/dtype.cpp
  ${CMAKE_CURRENT_LIST_DIR}/error.cpp
  ${CMAKE_CURRENT_LIST_DIR}/header_parser.cpp
  ${CMAKE_CURRENT_LIST_DIR}/header_types.cpp
  ${CMAKE_CURRENT_LIST_DIR}/index_parser.cpp
  ${CMAKE_CURRENT_LIST_DIR}/strict_json.cpp
)
# The include root: #include "common/safetensors/header_parser.hpp".
get_filename_component(THAW_SAFETENSORS_INCLUDE_ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
