/* libFuzzer entry point for the HTTP request line and headers (fuzz/fuzz_http_request.h). */
#include "fuzz_http_request.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_http_port();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_http_request(data, size);
}
