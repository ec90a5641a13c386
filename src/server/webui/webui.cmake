# The chat page mlxcel-server serves at /: index.html becomes a C array in the build tree at
# build time (embed.cmake, CMake alone: no network, no other tool), compiled into the core.
set(MLXCEL_WEBUI_HTML ${CMAKE_SOURCE_DIR}/src/server/webui/index.html)
set(MLXCEL_WEBUI_C ${CMAKE_BINARY_DIR}/generated/server_webui_page.c)
add_custom_command(
  OUTPUT ${MLXCEL_WEBUI_C}
  COMMAND ${CMAKE_COMMAND} -DIN=${MLXCEL_WEBUI_HTML} -DOUT=${MLXCEL_WEBUI_C}
          -DNAME=server_webui_page -P ${CMAKE_SOURCE_DIR}/src/server/webui/embed.cmake
  DEPENDS ${MLXCEL_WEBUI_HTML} ${CMAKE_SOURCE_DIR}/src/server/webui/embed.cmake
  COMMENT "Embedding the chat page")
target_sources(mlxcel_core PRIVATE ${MLXCEL_WEBUI_C})
