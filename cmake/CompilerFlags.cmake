# Warnings, optimisation and sanitizers: the one place that sets compile flags.
# Optimisation comes from the build type (Release: -O3 -DNDEBUG); no target adds its own.
# No -march: a packaged binary must run on any x86-64 (and aarch64).

add_compile_options(-Wall -Wextra -Wno-unused-parameter)
if(LOCKSTEP_WERROR)
  add_compile_options(-Werror)
endif()

if(LOCKSTEP_SANITIZE)
  if(LOCKSTEP_SANITIZE MATCHES "thread" AND LOCKSTEP_SANITIZE MATCHES "address")
    message(FATAL_ERROR "LOCKSTEP_SANITIZE: thread cannot be combined with address")
  endif()
  add_compile_options(-fsanitize=${LOCKSTEP_SANITIZE} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${LOCKSTEP_SANITIZE})
  if(LOCKSTEP_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

# GCC 12 in C++20 (libtorch >= 2.14 builds) warns -Wrestrict on plain std::string
# assignments inlined at -O3 (GCC bug 105329, a false positive fixed in GCC 13).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13
   AND CMAKE_CXX_STANDARD GREATER_EQUAL 20)
  add_compile_options(-Wno-restrict)
endif()
