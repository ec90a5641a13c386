/* libFuzzer entry point for the HTTP routes' request bodies (fuzz/fuzz_http.h). One target
 * serves all six routes: their bodies share the JSON parse and most fields (messages, prompt
 * and token arrays), so an input found for one route seeds the others, and CI's fuzz step
 * grows by one target, not six. */
#include "fuzz_http.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_http_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_http_body(data, size);
}
