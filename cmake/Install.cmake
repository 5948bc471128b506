# `cmake --install` and the package a user's project finds (docs/install.md):
#   <prefix>/include/lockstep/**                 the public headers
#   <prefix>/<libdir>/liblockstep_<layer>.a|.so   one library per layer (BUILD_SHARED_LIBS)
#   <prefix>/<libdir>/cmake/lockstep/            find_package(lockstep): lockstep::lockstep
#   <prefix>/<libdir>/pkgconfig/lockstep.pc      pkg-config --cflags --libs lockstep
#   <prefix>/bin/lockstep-run, lockstep-train (and lockstep-bench when built)
#   <prefix>/share/doc/lockstep/, <prefix>/share/lockstep/configs/
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOCKSTEP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/lockstep)
# The layers a user links, as lockstep::<layer>; lockstep::lockstep is all but launch.
set(LOCKSTEP_LAYERS comm compress numerics parallel data models train launch)
set(LOCKSTEP_LAYER_TARGETS)
foreach(layer ${LOCKSTEP_LAYERS})
  set_target_properties(lockstep_${layer} PROPERTIES EXPORT_NAME ${layer}
    INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH ON)
  list(APPEND LOCKSTEP_LAYER_TARGETS lockstep_${layer})
endforeach()
# The headers are C++17; libtorch >= 2.14 raises it to C++20 through its own target.
target_compile_features(lockstep INTERFACE cxx_std_17)

# Installed programs find the shared layers next to them and keep the paths of libraries
# outside the system directories (a libtorch from a pip wheel or a zip).
set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
foreach(prog lockstep-run lockstep-train lockstep-bench)
  if(TARGET ${prog})
    set_target_properties(${prog} PROPERTIES INSTALL_RPATH "${CMAKE_INSTALL_RPATH}"
                                             INSTALL_RPATH_USE_LINK_PATH ON)
    install(TARGETS ${prog} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

install(TARGETS lockstep ${LOCKSTEP_LAYER_TARGETS} EXPORT lockstepTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/lockstep
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT lockstepTargets NAMESPACE lockstep:: FILE lockstep-targets.cmake
  DESTINATION ${LOCKSTEP_CMAKE_DIR})

# lockstep-config.cmake finds what the targets name as usage requirements. Static layers
# carry their private dependencies too (as link-only), so a static install finds them all.
if(BUILD_SHARED_LIBS)
  set(LOCKSTEP_STATIC_DEPS OFF)
else()
  set(LOCKSTEP_STATIC_DEPS ON)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/lockstep-config.cmake.in
  ${PROJECT_BINARY_DIR}/lockstep-config.cmake INSTALL_DESTINATION ${LOCKSTEP_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lockstep-config-version.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lockstep-config.cmake
              ${PROJECT_BINARY_DIR}/lockstep-config-version.cmake
              ${CMAKE_CURRENT_LIST_DIR}/TorchFixups.cmake
  DESTINATION ${LOCKSTEP_CMAKE_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/PkgConfig.cmake)

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
  FILES_MATCHING PATTERN "*.md")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/lockstep/configs
  FILES_MATCHING PATTERN "*.toml")
