/**
 * The one fixed chat template (ChatML): every message becomes
 *
 *   <|im_start|>{role}\n{content}<|im_end|>\n
 *
 * and the prompt ends with `<|im_start|>assistant\n`, where the model continues. The markers are
 * tokenized as ordinary text by the GPT-2 tokenizer (the tiny models have no special tokens for them).
 */
export interface ChatMessage {
  role: string;
  content: string;
}

/** Where the model continues: the end of every templated prompt (vLLM's add_generation_prompt). */
export const ASSISTANT_TURN = '<|im_start|>assistant\n';

export function applyChatTemplate(messages: readonly ChatMessage[]): string {
  let out = '';
  for (const m of messages) out += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
  return out + ASSISTANT_TURN;
}
