/** Logger: pino, to stderr. HANDOFF_LOG_LEVEL sets the level (default info; tests set warn). */
import { pino, type Logger } from 'pino';

export type { Logger };

export function createLogger(name: string, level?: string): Logger {
  const lvl = level ?? process.env['HANDOFF_LOG_LEVEL'] ?? (process.env['NODE_TEST_CONTEXT'] ? 'warn' : 'info');
  return pino({ name, level: lvl, base: { name } }, pino.destination(2));
}
