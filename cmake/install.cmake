# cmake --install: the libraries (kvq::kvq static, kvq::kvq_shared), the headers (include/kvq/, detail/ included),
# the kvq command and the CMake package that find_package(kvq) reads (examples/cpp builds against it in
# scripts/test.sh).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set_target_properties(kvq_static PROPERTIES EXPORT_NAME kvq)
install(TARGETS kvq_static kvq_shared EXPORT kvqTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvq DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET kvq_tool)
  install(TARGETS kvq_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
set(kvq_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
install(EXPORT kvqTargets NAMESPACE kvq:: DESTINATION ${kvq_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvqConfig.cmake.in ${PROJECT_BINARY_DIR}/kvqConfig.cmake
                              INSTALL_DESTINATION ${kvq_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvqConfig.cmake ${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
        DESTINATION ${kvq_cmake_dir})
