/* libFuzzer entry point: see fuzz_chat_nesting in fuzz_targets.h. */
#include "fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_chat_nesting(data, size);
}
