// A tokenizer.json for a model whose ids are bytes: GPT-2's byte-level alphabet as a BPE
// without merges, so that token id = byte (within the 256 ids) and a test can write any token
// sequence as text.
export function byteTokenizer() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const vocab = Object.fromEntries(bs.map((b, i) => [String.fromCodePoint(cs[i]), b]));
  const level = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  return { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null, pre_tokenizer: level,
    post_processor: null, decoder: level, model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] } };
}
