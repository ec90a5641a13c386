#!/usr/bin/env bash
# mlxcel run hides the thinking unless --show-reasoning: the demo model behind a chat template
# that opens <think> in its generation prompt (as Qwen3's does) never closes it, so its whole
# reply is thinking: nothing is shown without the flag, the reply with it.
set -euo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for f in config.json generation_config.json model.safetensors tokenizer.json; do
    ln -s "$src/models/demo/$f" "$dir/$f"
done
cat > "$dir/tokenizer_config.json" <<'JSON'
{"bos_token": "<s>", "eos_token": "</s>",
 "chat_template": "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n<think>\n{% endif %}"}
JSON
hidden=$(MLXCEL_DEMO_MODEL=$dir "$bin/mlxcel" run -p "Hello" -n 12 --temp 0 2>/dev/null)
shown=$(MLXCEL_DEMO_MODEL=$dir "$bin/mlxcel" run -p "Hello" -n 12 --temp 0 --show-reasoning 2>/dev/null)
passed=0 failed=0
if [ -z "$(printf '%s' "$hidden" | tr -d '[:space:]')" ]; then passed=$((passed + 1)); else
    echo "CHECK failed: the thinking was shown without --show-reasoning: [$hidden]"; failed=$((failed + 1)); fi
if [ -n "$(printf '%s' "$shown" | tr -d '[:space:]')" ]; then passed=$((passed + 1)); else
    echo "CHECK failed: --show-reasoning showed nothing"; failed=$((failed + 1)); fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
