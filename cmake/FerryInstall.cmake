# The shipped forms of the library and what `cmake --install` and
# `cpack -G DEB` put where (README, "Install"). Included at the end of the
# top-level CMakeLists.txt, once every folder has added its sources and
# dependencies to the internal `ferry` library.

# ---- libferry.so: the public API only --------------------------------------
# The objects of `ferry`, linked with its private dependencies (linking
# `ferry` itself brings those; its archive adds no object, since the objects
# already define every symbol it has). Hidden visibility keeps Ferry's own internals out of the
# dynamic symbol table; cmake/ferry.map also keeps out the instances of std::
# templates the objects define (libstdc++'s namespace is "default"), so
# nothing but ferry:: and ferry_ names is exported. tests/install/ checks it.
add_library(ferry_shared SHARED $<TARGET_OBJECTS:ferry>)
target_link_libraries(ferry_shared PRIVATE ferry)
target_include_directories(ferry_shared INTERFACE
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# The public headers use C++20 (std::span).
target_compile_features(ferry_shared INTERFACE cxx_std_20)
set_target_properties(ferry_shared PROPERTIES
  OUTPUT_NAME ferry
  EXPORT_NAME ferry
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cmake/ferry.map)
target_link_options(ferry_shared PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_SOURCE_DIR}/cmake/ferry.map")
# Every dependency is linked in (a sanitizer build leaves the runtime's
# symbols to the program, so there it cannot be checked).
if(NOT FERRY_SANITIZE)
  target_link_options(ferry_shared PRIVATE "LINKER:--no-undefined")
endif()

# ---- libferry.a: the same objects, for static linking ----------------------
# Archived apart from `ferry` (in <build>/static/, as libferry.a) so that its
# link interface is the installed one: what its users must link besides it.
add_library(ferry_static STATIC $<TARGET_OBJECTS:ferry>)
target_include_directories(ferry_static INTERFACE
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(ferry_static INTERFACE cxx_std_20)
set_target_properties(ferry_static PROPERTIES
  OUTPUT_NAME ferry
  EXPORT_NAME ferry_static
  ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/static)

# What libferry.a's users link besides it: each library `ferry` links, as the
# CMake package finds it (FerryConfig.cmake) and as ferry.pc's Libs.private
# names it. Not Requires.private: pkg-config would then want every one's
# development files even for `--cflags` of the shared library.
#   FERRY_STATIC_LINK  the installed Ferry::ferry_static's link interface
#   FERRY_STATIC_FIND  the config file's lines that find those targets
#   FERRY_PC_PRIVATE   ferry.pc's Libs.private
set(FERRY_STATIC_LINK)
set(FERRY_STATIC_FIND)
set(FERRY_PC_PRIVATE)
# ferry_pkg_dependency(MODULE LIB): a dependency found with pkg-config
# (MODULE), linked as -lLIB.
macro(ferry_pkg_dependency module lib)
  string(MAKE_C_IDENTIFIER "Ferry_${module}" prefix)
  list(APPEND FERRY_STATIC_LINK "$<LINK_ONLY:PkgConfig::${prefix}>")
  string(APPEND FERRY_STATIC_FIND
    "_ferry_static_pkg(${prefix} ${module})\n")
  list(APPEND FERRY_PC_PRIVATE "-l${lib}")
endmacro()
get_target_property(ferry_links ferry LINK_LIBRARIES)
foreach(dep IN LISTS ferry_links)
  if(dep MATCHES "^::@")
    # CMake's marker of links made from another folder: not a library.
  elseif(dep STREQUAL "Threads::Threads")
    list(APPEND FERRY_STATIC_LINK Threads::Threads)
    string(APPEND FERRY_STATIC_FIND "_ferry_static_dependency(Threads)\n")
    list(APPEND FERRY_PC_PRIVATE -pthread)
  elseif(dep STREQUAL "OpenSSL::Crypto")
    list(APPEND FERRY_STATIC_LINK "$<LINK_ONLY:OpenSSL::Crypto>")
    string(APPEND FERRY_STATIC_FIND "_ferry_static_dependency(OpenSSL 3)\n")
    list(APPEND FERRY_PC_PRIVATE -lcrypto)
  elseif(dep STREQUAL "PkgConfig::LIBFABRIC")
    ferry_pkg_dependency(libfabric fabric)
  elseif(dep STREQUAL "PkgConfig::LIBURING")
    ferry_pkg_dependency(liburing uring)
  elseif(dep STREQUAL "PkgConfig::HIREDIS")
    ferry_pkg_dependency(hiredis hiredis)
  elseif(dep STREQUAL "PkgConfig::HTTPLIB")
    ferry_pkg_dependency(cpp-httplib cpp-httplib)
  elseif(dep STREQUAL "nlohmann_json::nlohmann_json")
    # Header-only: nothing to link.
  elseif(dep IN_LIST CMAKE_DL_LIBS)
    list(APPEND FERRY_STATIC_LINK ${dep})
    list(APPEND FERRY_PC_PRIVATE -l${dep})
  else()
    message(FATAL_ERROR "The ferry library links '${dep}', which cmake/FerryInstall.cmake "
                        "does not know: say there how libferry.a's users link it (CMake package "
                        "and ferry.pc), or nothing for a header-only library.")
  endif()
endforeach()
# libferry.a is C++: a C program (the C API) links the C++ runtime too.
list(APPEND FERRY_PC_PRIVATE -lstdc++ -lm)
list(REMOVE_DUPLICATES FERRY_STATIC_LINK)
list(REMOVE_DUPLICATES FERRY_PC_PRIVATE)
list(JOIN FERRY_PC_PRIVATE " " FERRY_PC_PRIVATE)
# Only in the installed package: no program of this build links ferry_static.
set_property(TARGET ferry_static PROPERTY
  INTERFACE_LINK_LIBRARIES "$<INSTALL_INTERFACE:${FERRY_STATIC_LINK}>")

# ---- cmake --install ---------------------------------------------------------
include(CMakePackageConfigHelpers)
set(FERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Ferry)
install(TARGETS ferry_shared EXPORT FerryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ferry_static EXPORT FerryStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Every public header, FERRY_API's export.h included (a header added to
# include/ferry/ is installed with no change here).
install(DIRECTORY include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
if(TARGET ferry_cli)
  install(TARGETS ferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# The CMake package: find_package(Ferry CONFIG) in <prefix>/lib/cmake/Ferry.
install(EXPORT FerryTargets NAMESPACE Ferry:: DESTINATION ${FERRY_CMAKE_DIR})
install(EXPORT FerryStaticTargets NAMESPACE Ferry:: DESTINATION ${FERRY_CMAKE_DIR})
configure_package_config_file(cmake/FerryConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/FerryConfig.cmake INSTALL_DESTINATION ${FERRY_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/FerryConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/FerryConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/FerryConfigVersion.cmake
        DESTINATION ${FERRY_CMAKE_DIR})
# ferry.pc names the prefix it is installed under, which is known only at
# install time (`cmake --install --prefix P`; cpack installs under /usr):
# everything else is filled in now, the prefix by the install step.
set(ferry_pc_prefix "@ferry_pc_prefix@")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(ferry_pc_libdir "${CMAKE_INSTALL_LIBDIR}")
else()
  set(ferry_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ferry_pc_includedir "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(ferry_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/ferry.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ferry.pc.in @ONLY)
install(CODE "
  set(ferry_pc_prefix \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_CURRENT_BINARY_DIR}/ferry.pc.in\"
                 \"${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/ferry.pc\" @ONLY)")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/ferry.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# (The Python packages: python/CMakeLists.txt.)

# ---- cpack -G DEB --------------------------------------------------------------
# One package, `ferry`: the command, both libraries, the headers, the CMake
# and pkg-config files, and the Python packages (for the interpreter the
# extension was built for; with /usr as the prefix they land in
# /usr/lib/python3.X/dist-packages, which Debian's python3 reads). Build
# first, then `cd build && cpack -G DEB`.
set(CPACK_PACKAGE_NAME ferry)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "Ferry")
set(CPACK_PACKAGE_CONTACT "Ferry developers <ferry@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "transfer engine: batched one-sided reads and writes between processes and hosts")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "Ferry moves registered memory (KV-cache pages and the like) between processes and hosts\n"
  "over local, shm, tcp, libfabric and CUDA IPC transports. This package holds the ferry\n"
  "command, libferry (shared and static), its headers, CMake and pkg-config files, and the\n"
  "Python packages ferry and nixl.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
# Depends: the shared libraries the binaries link (dpkg-shlibdeps), and the
# interpreter the Python extension was built for, with numpy.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(FERRY_DEB_DEPENDS "")
if(TARGET ferry_python AND FERRY_PYTHON_INSTALL_DIR MATCHES "python3\\.([0-9]+)")
  math(EXPR next "${CMAKE_MATCH_1} + 1")
  set(FERRY_DEB_DEPENDS "python3 (>= 3.${CMAKE_MATCH_1}), python3 (<< 3.${next}), python3-numpy")
  # Python writes __pycache__ beside the modules when root imports them:
  # removing the package removes those too.
  set(FERRY_DEB_PYTHON_DIR ${CPACK_PACKAGING_INSTALL_PREFIX}/${FERRY_PYTHON_INSTALL_DIR})
  configure_file(cmake/deb-prerm.in ${CMAKE_CURRENT_BINARY_DIR}/deb/prerm @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                                  WORLD_READ WORLD_EXECUTE)
  set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_BINARY_DIR}/deb/prerm)
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${FERRY_DEB_DEPENDS}")
include(CPack)
