// How the tests fold the streams of the three APIs into what a client ends up with.

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

// A Responses API stream (the openai package's client.responses): the events' types, the
// text, reasoning and argument deltas, the items the output_item events carried, the last
// event, and whether the sequence numbers counted up from 0.
export async function collectResponse(stream) {
  const out = { types: [], text: '', reasoning: '', args: '', added: [], done: [], argsDone: [], seqOk: true, last: null };
  for await (const e of stream) {
    out.seqOk = out.seqOk && e.sequence_number === out.types.length;
    out.types.push(e.type);
    if (e.type === 'response.output_text.delta') out.text += e.delta;
    if (e.type === 'response.reasoning_text.delta') out.reasoning += e.delta;
    if (e.type === 'response.function_call_arguments.delta') out.args += e.delta;
    if (e.type === 'response.function_call_arguments.done') out.argsDone.push(e.arguments);
    if (e.type === 'response.output_item.added') out.added.push(e.item);
    if (e.type === 'response.output_item.done') out.done.push(e.item);
    out.last = e;
  }
  return out;
}

// A Messages API stream through @anthropic-ai/sdk's helper (client.messages.stream): the event
// types in order, the text, thinking and tool input deltas, the blocks started, the stop
// reason, and the message the helper accumulated.
export async function collectMessage(stream) {
  const out = { types: [], text: '', thinking: '', json: '', starts: [], stop: null };
  for await (const e of stream) {
    out.types.push(e.type);
    if (e.type === 'content_block_start') out.starts.push(e.content_block);
    if (e.type === 'content_block_delta') {
      if (e.delta.type === 'text_delta') out.text += e.delta.text;
      if (e.delta.type === 'thinking_delta') out.thinking += e.delta.thinking;
      if (e.delta.type === 'input_json_delta') out.json += e.delta.partial_json;
    }
    if (e.type === 'message_delta') out.stop = e.delta.stop_reason;
  }
  out.final = await stream.finalMessage();
  return out;
}
