# Real CUDA kernels for the emulator's tests: nvcc compiles .cu files to cubins, the cubins are
# embedded in a static library, and the kernels' host twins (thaw/emu_twin.h) are built into a
# shared kernel library that the emulator loads through THAW_EMU_KERNELS.
#
#   thaw_cuda_kernels(<name> CU <file.cu>... TWINS <twin.cpp>... [ARCH 90] [FATBIN]
#                     [NVCC_FLAGS <flag>...])
#
# makes
#   <name>_cubins  static library; its generated header <name>_cubins.h declares, for every
#                  .cu file <stem>.cu,
#                    ThawCubin thaw_cubin_<stem>(void);   // {data, size}: the cubin's bytes
#                  and the macro THAW_CUBIN_PATH_<stem> (the cubin file, for cuModuleLoad).
#                  With FATBIN also thaw_fatbin_<stem>() and THAW_FATBIN_PATH_<stem>: an
#                  uncompressed fatbin (nvcc -fatbin --no-compress: sm_<ARCH> SASS + PTX).
#                  Linking it also builds <name>_twins.
#   <name>_twins   shared library of the host twins (THAW_EMU_KERNELS=<its path>). Twins are
#                  found by their exported mangled names, so it keeps default visibility.
#   <name>_TWIN_LIB  variable (in the caller's scope): the path of the twin library. The target
#                  property THAW_TWIN_LIB of <name>_twins holds it too.
#
# Images are rebuilt when a .cu file or anything it includes changes (nvcc writes a depfile),
# and the embedding object is rebuilt when an image changes. File names carry the
# architecture: <build dir>/<name>_cubins/<stem>.sm_<ARCH>.cubin (.fatbin).

set(THAW_NVCC "${CUDA_ROOT}/bin/nvcc" CACHE FILEPATH "nvcc that compiles the test kernels to cubins")

function(thaw_cuda_kernels name)
  cmake_parse_arguments(K "FATBIN" "ARCH" "CU;TWINS;NVCC_FLAGS" ${ARGN})
  if(K_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "thaw_cuda_kernels(${name}): unexpected arguments: ${K_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT K_CU)
    message(FATAL_ERROR "thaw_cuda_kernels(${name}): no CU files given")
  endif()
  if(NOT K_TWINS)
    message(FATAL_ERROR "thaw_cuda_kernels(${name}): no TWINS sources given")
  endif()
  if(NOT K_ARCH)
    set(K_ARCH 90)
  endif()
  if(NOT EXISTS "${THAW_NVCC}")
    message(FATAL_ERROR
      "thaw_cuda_kernels(${name}): nvcc not found at '${THAW_NVCC}'. The emulator's kernel tests "
      "compile real CUDA kernels: install the CUDA 13 toolkit's compiler (nvcc) under ${CUDA_ROOT}, "
      "pass -DTHAW_NVCC=/path/to/nvcc, or configure with -DTHAW_BUILD_TESTS=OFF.")
  endif()

  set(dir "${CMAKE_CURRENT_BINARY_DIR}/${name}_cubins")
  file(MAKE_DIRECTORY "${dir}")
  set(images "")
  set(decls "")
  set(defs "")
  foreach(cu IN LISTS K_CU)
    get_filename_component(src "${cu}" ABSOLUTE)
    get_filename_component(stem "${cu}" NAME_WE)
    if(NOT stem MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
      message(FATAL_ERROR "thaw_cuda_kernels(${name}): '${cu}': the file stem must be a C identifier")
    endif()
    set(kinds cubin)
    if(K_FATBIN)
      list(APPEND kinds fatbin)
    endif()
    foreach(kind IN LISTS kinds)
      set(out "${dir}/${stem}.sm_${K_ARCH}.${kind}")
      string(TOUPPER "${kind}" KIND)
      set(extra_flags "")
      if(kind STREQUAL "fatbin")
        set(extra_flags --no-compress)  # the emulator reads uncompressed fatbin containers
      endif()
      add_custom_command(
        OUTPUT "${out}"
        COMMAND "${THAW_NVCC}" -${kind} -arch=sm_${K_ARCH} ${extra_flags} ${K_NVCC_FLAGS}
                -MD -MF "${out}.d" -o "${out}" "${src}"
        DEPENDS "${src}" "${THAW_NVCC}"
        DEPFILE "${out}.d"
        COMMENT "nvcc -${kind} -arch=sm_${K_ARCH} ${cu}"
        VERBATIM)
      list(APPEND images "${out}")

      # The bytes go in with the assembler's .incbin (no giant byte-array source to compile);
      # the object depends on the image, so it is rebuilt whenever nvcc rewrites it.
      set(sym "thaw_${kind}_${name}_${stem}")
      string(APPEND decls
        "/* ${cu}: ${stem}.sm_${K_ARCH}.${kind} */\n"
        "ThawCubin thaw_${kind}_${stem}(void);\n"
        "#define THAW_${KIND}_PATH_${stem} \"${out}\"\n")
      string(APPEND defs
        "asm(\".pushsection .rodata.${sym},\\\"a\\\"\\n\"\n"
        "    \".balign 64\\n\"\n"
        "    \".globl ${sym}_begin\\n\"\n"
        "    \".hidden ${sym}_begin\\n\"\n"
        "    \"${sym}_begin:\\n\"\n"
        "    \".incbin \\\"${out}\\\"\\n\"\n"
        "    \".globl ${sym}_end\\n\"\n"
        "    \".hidden ${sym}_end\\n\"\n"
        "    \"${sym}_end:\\n\"\n"
        "    \".popsection\\n\");\n"
        "extern \"C\" const unsigned char ${sym}_begin[] __attribute__((visibility(\"hidden\")));\n"
        "extern \"C\" const unsigned char ${sym}_end[] __attribute__((visibility(\"hidden\")));\n"
        "extern \"C\" ThawCubin thaw_${kind}_${stem}(void) {\n"
        "  return ThawCubin{${sym}_begin, static_cast<size_t>(${sym}_end - ${sym}_begin)};\n"
        "}\n\n")
    endforeach()
  endforeach()

  set(header "${dir}/${name}_cubins.h")
  file(CONFIGURE OUTPUT "${header}" @ONLY CONTENT
"/* Generated by thaw_cuda_kernels(${name}) in cmake/ThawCuda.cmake: do not edit. */
#ifndef THAW_CUBINS_${name}_H
#define THAW_CUBINS_${name}_H

#include <stddef.h>

#ifndef THAW_CUBIN_TYPE_DEFINED
#define THAW_CUBIN_TYPE_DEFINED
/* An embedded cubin (an sm_${K_ARCH} ELF image), e.g. for cuModuleLoadData(&m, c.data). */
typedef struct ThawCubin {
  const unsigned char* data;
  size_t size;
} ThawCubin;
#endif

#ifdef __cplusplus
extern \"C\" {
#endif

${decls}
#ifdef __cplusplus
}
#endif
#endif
")
  set(embed "${dir}/${name}_cubins.cpp")
  file(CONFIGURE OUTPUT "${embed}" @ONLY CONTENT
"// Generated by thaw_cuda_kernels(${name}) in cmake/ThawCuda.cmake: do not edit.
#include \"${name}_cubins.h\"

${defs}")

  add_library(${name}_cubins STATIC "${embed}" "${header}" ${images})
  set_source_files_properties("${embed}" PROPERTIES OBJECT_DEPENDS "${images}")
  target_include_directories(${name}_cubins PUBLIC "${dir}")

  add_library(${name}_twins SHARED ${K_TWINS})
  # Twins are found by their exported (mangled) names: keep default visibility.
  set_target_properties(${name}_twins PROPERTIES
    CXX_VISIBILITY_PRESET default
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}"
    OUTPUT_NAME "${name}_twins")
  target_link_libraries(${name}_twins PRIVATE thaw_emu_inspect_headers ${CMAKE_DL_LIBS})
  set(lib "${CMAKE_CURRENT_BINARY_DIR}/${CMAKE_SHARED_LIBRARY_PREFIX}${name}_twins${CMAKE_SHARED_LIBRARY_SUFFIX}")
  set_target_properties(${name}_twins PROPERTIES THAW_TWIN_LIB "${lib}")
  # A program that embeds the cubins runs its kernels through these twins: build them with it.
  add_dependencies(${name}_cubins ${name}_twins)
  set(${name}_TWIN_LIB "${lib}" PARENT_SCOPE)
endfunction()
