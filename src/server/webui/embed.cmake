# Run at build time (cmake -P): writes the bytes of IN as a C array named by NAME into OUT, so
# that the binary carries the file and needs nothing beside it at run time.
file(READ ${IN} hex HEX)
get_filename_component(in_name ${IN} NAME)
string(LENGTH "${hex}" digits)
math(EXPR size "${digits} / 2")
# sixteen bytes a line keeps the generated file readable in a diff or a debugger
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n    " bytes "${bytes}")
file(WRITE ${OUT}
     "/* Generated from ${in_name} by embed.cmake at build time; edit that file instead. */\n"
     "#include \"server/server_webui.h\"\n\n"
     "const unsigned char ${NAME}[] = {\n    ${bytes}0};\n"
     "const size_t ${NAME}_len = ${size};\n")
