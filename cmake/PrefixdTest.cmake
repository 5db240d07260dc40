# prefixd_add_test(NAME name SOURCES a.cc ... [LIBS lib ...] [LABELS label ...])
#
# One test executable per test file, registered with ctest through gtest_discover_tests.
# Label "core" marks the tests that scripts/test also runs under ASan + UBSan.
include(GoogleTest)
function(prefixd_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${T_NAME} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${T_NAME} PRIVATE
    PREFIXD_TOKENIZER_DIR="${PREFIXD_TOKENIZER_DIR}"
    PREFIXD_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    PREFIXD_BINARY_DIR="${CMAKE_BINARY_DIR}")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${T_LABELS}")
endfunction()
