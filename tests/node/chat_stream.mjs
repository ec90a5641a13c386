// A streamed chat completion (the openai package's stream of chunks) folded into what a client
// shows: the content, the reasoning, each tool call by its index (id, name and arguments
// joined), the finish reason, and how many chunks came with a choice.
export async function collectChat(stream) {
  const out = { chunks: 0, content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    out.chunks++;
    out.content += c.delta?.content ?? '';
    out.reasoning += c.delta?.reasoning_content ?? '';
    for (const t of c.delta?.tool_calls ?? []) {
      const call = (out.calls[t.index] ??= { id: null, name: '', arguments: '' });
      if (t.id) call.id = t.id;
      call.name += t.function?.name ?? '';
      call.arguments += t.function?.arguments ?? '';
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}
