# The API tests reach mlxcel_* through the shared library only (the core's static archive
# that every test links holds none of them), and a script checks what libmlxcel exports.
target_link_libraries(test_api PRIVATE libmlxcel)
target_link_libraries(test_api_engine PRIVATE libmlxcel)
add_test(NAME api/exports COMMAND sh ${CMAKE_SOURCE_DIR}/tests/api/exports.sh
         $<TARGET_FILE:libmlxcel> ${CMAKE_SOURCE_DIR}/include/mlxcel.h)
