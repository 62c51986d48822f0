# What `cmake --install` puts in place, and the package users find:
#   bin/optstated, bin/optstate-probe                      component daemon
#   lib/liboptstate_*.a, include/optstate/*.h,
#   lib/cmake/optstate/ (find_package(optstate CONFIG) gives optstate::client),
#   lib/pkgconfig/optstate.pc                              component dev
# Included from the top-level CMakeLists.txt when optstate is the top-level
# project, after the targets exist.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The static libraries the client consists of, in link order (each before the
# libraries it uses): the one list to change when the client's targets change.
# Each is exported as optstate::<name without "optstate_">, so optstate_client
# is optstate::client.
set(OPTSTATE_CLIENT_EXPORT_TARGETS
  optstate_client optstate_client_layer_wire optstate_client_layer_shared_memory
  optstate_client_layer_transport optstate_client_layer_call optstate_client_layer_step
  optstate_client_layer_placement
  optstate_proto optstate_region_protocol optstate_common)
# Folders holding the client's public headers (their optstate/ subfolder is
# installed as include/optstate/).
set(OPTSTATE_CLIENT_HEADER_DIRS
  ${PROJECT_SOURCE_DIR}/client/include ${PROJECT_SOURCE_DIR}/common/include)

set(OPTSTATE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/optstate)

# 1. The libraries. Their include folders are source or build paths, valid in
#    this build only: wrapped in $<BUILD_INTERFACE:...>, and the installed
#    include/ added. Position-independent, so they link into shared objects
#    (a Python extension, say) too.
foreach(target IN LISTS OPTSTATE_CLIENT_EXPORT_TARGETS)
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(wrapped "")
  if(dirs)
    foreach(dir IN LISTS dirs)
      if(dir MATCHES "^\\$<")
        list(APPEND wrapped "${dir}")
      else()
        list(APPEND wrapped "$<BUILD_INTERFACE:${dir}>")
      endif()
    endforeach()
  endif()
  list(APPEND wrapped "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  string(REGEX REPLACE "^optstate_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${wrapped}"
    EXPORT_NAME ${export_name}
    POSITION_INDEPENDENT_CODE ON)
endforeach()
install(TARGETS ${OPTSTATE_CLIENT_EXPORT_TARGETS} EXPORT optstateTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
foreach(dir IN LISTS OPTSTATE_CLIENT_HEADER_DIRS)
  install(DIRECTORY ${dir}/optstate DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
    FILES_MATCHING PATTERN "*.h")
endforeach()

# 2. The CMake package: the targets, and their dependencies found for the user.
install(EXPORT optstateTargets NAMESPACE optstate:: DESTINATION ${OPTSTATE_CMAKE_DIR}
  COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/optstateConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/optstateConfig.cmake INSTALL_DESTINATION ${OPTSTATE_CMAKE_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/optstateConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/optstateConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/optstateConfigVersion.cmake
  DESTINATION ${OPTSTATE_CMAKE_DIR} COMPONENT dev)

# 3. The pkg-config file. Libs: the libraries in link order. Requires: the
#    pkg-config module of every library they link (Debian ships one per
#    Abseil target, grpc++.pc and protobuf.pc); a dependency without a known
#    module stops the configure rather than leaving the .pc short. Static
#    libraries need their dependencies at the user's link, so they are in
#    Requires, not Requires.private.
set(OPTSTATE_PC_LIBS "")
set(OPTSTATE_PC_REQUIRES "")
foreach(target IN LISTS OPTSTATE_CLIENT_EXPORT_TARGETS)
  get_target_property(output_name ${target} OUTPUT_NAME)
  if(NOT output_name)
    set(output_name ${target})
  endif()
  string(APPEND OPTSTATE_PC_LIBS " -l${output_name}")
  get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
  if(NOT links)
    continue()
  endif()
  foreach(link IN LISTS links)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" link "${link}")
    if(TARGET ${link})
      get_target_property(aliased ${link} ALIASED_TARGET)
      if(aliased)
        set(link ${aliased})
      endif()
    endif()
    if(link IN_LIST OPTSTATE_CLIENT_EXPORT_TARGETS OR link STREQUAL "Threads::Threads")
      continue()  # One of ours (in Libs), or -pthread (in Libs).
    elseif(link MATCHES "^absl::(.+)$")
      list(APPEND OPTSTATE_PC_REQUIRES absl_${CMAKE_MATCH_1})
    elseif(link STREQUAL "gRPC::grpc++")
      list(APPEND OPTSTATE_PC_REQUIRES grpc++)
    elseif(link STREQUAL "protobuf::libprotobuf")
      list(APPEND OPTSTATE_PC_REQUIRES protobuf)
    elseif(link STREQUAL "OpenSSL::SSL")
      list(APPEND OPTSTATE_PC_REQUIRES libssl)
    elseif(link STREQUAL "OpenSSL::Crypto")
      list(APPEND OPTSTATE_PC_REQUIRES libcrypto)
    else()
      message(FATAL_ERROR "optstate: ${target} links ${link}, which is neither in "
                          "OPTSTATE_CLIENT_EXPORT_TARGETS (one of the client's own libraries: "
                          "add it to that list) nor a dependency whose pkg-config module "
                          "cmake/install.cmake knows (add it there)")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES OPTSTATE_PC_REQUIRES)
file(RELATIVE_PATH OPTSTATE_PC_PREFIX_FROM_PCFILEDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" OPTSTATE_PC_PREFIX_FROM_PCFILEDIR "${OPTSTATE_PC_PREFIX_FROM_PCFILEDIR}")
list(JOIN OPTSTATE_PC_REQUIRES " " OPTSTATE_PC_REQUIRES)
configure_file(${CMAKE_CURRENT_LIST_DIR}/optstate.pc.in ${CMAKE_CURRENT_BINARY_DIR}/optstate.pc
  @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/optstate.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# 4. The daemon and its health probe.
install(TARGETS optstated optstate-probe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  COMPONENT daemon)
# The example trainer, for the container test's trainer image only
# (`cmake --install build --component examples`); not in a plain install.
install(TARGETS train_linear_regression RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  COMPONENT examples EXCLUDE_FROM_ALL)
